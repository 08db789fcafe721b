//! `embatch-gateway`: parses the configuration, connects to NATS and serves HTTP (see the library docs).

use embatch_gateway::{AppState, Config, GatewayError, telemetry};

embatch_runtime::service_main!(Config, "embatch-gateway", GatewayError::Tracing, run);

async fn run(mut config: Config) -> Result<(), GatewayError> {
    tracing::info!(config = ?config, "starting embatch-gateway");
    config.max_connections = embatch_gateway::fd_limit::raise_and_cap(config.max_connections);
    let metrics = telemetry::init_metrics()?;
    let client = embatch_gateway::connect(&config).await?;
    let listener =
        embatch_gateway::serve::bind(config.listen, config.listen_backlog).map_err(|source| {
            GatewayError::Serve {
                addr: config.listen,
                source,
            }
        })?;
    let stop = tokio_util::sync::CancellationToken::new();
    let _stop_on_exit = stop.clone().drop_guard();
    let tenants = embatch_runtime::tenants::watch(config.tenants_file.as_deref(), stop)?;
    let state = AppState::new(client, &config, Some(metrics)).with_tenants(tenants);
    embatch_gateway::serve(listener, state, embatch_gateway::shutdown_signal()).await
}
