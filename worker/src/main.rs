//! `embatch-worker`: parses the configuration, connects to NATS, loads the upstream and serves (see the library docs).

use embatch_worker::{Config, WorkerError};

embatch_runtime::service_main!(Config, "embatch-worker", WorkerError::Tracing, run);

/// Connects, loads the upstream, then serves until SIGINT or SIGTERM (the library's
/// [`embatch_worker::run`] owns every task and the shutdown sequence).
async fn run(config: Config) -> Result<(), WorkerError> {
    tracing::info!(config = ?config, "starting embatch-worker");
    let client = embatch_worker::connect(&config).await?;
    let upstream = embatch_worker::build_upstream(&config).await?;
    embatch_worker::run(client, upstream, &config, embatch_worker::shutdown_signal()).await
}
