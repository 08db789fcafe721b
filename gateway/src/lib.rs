//! embatch gateway: a stateless HTTP server that speaks text-embeddings-inference's `/embed` API
//! and forwards every request as one NATS request to the embatch workers' queue group.
//!
//! # Layout
//! - [`config`]: every setting, as a CLI flag and an environment variable.
//! - [`routes`]: `POST /embed`, `GET /health`, `GET /metrics` and the error → HTTP mapping.
//! - [`telemetry`]: logging, the Prometheus recorder and metric names.

pub mod config;
pub mod routes;
pub mod telemetry;

use std::future::Future;

pub use config::Config;
pub use embatch_runtime::shutdown_signal;
pub use routes::{AppState, app};

/// Why the gateway could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The NATS server could not be reached.
    #[error("cannot connect to NATS at {url}: {source}")]
    Connect {
        /// The configured URL.
        url: String,
        /// The client's error.
        source: async_nats::ConnectError,
    },
    /// The listen address could not be bound, or serving failed.
    #[error("cannot serve HTTP on {addr}: {source}")]
    Serve {
        /// The configured address.
        addr: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The metrics recorder could not be installed.
    #[error("cannot install the metrics recorder: {0}")]
    Metrics(#[from] metrics_exporter_prometheus::BuildError),
}

/// Connects to NATS as the gateway.
///
/// `--nats-url` may list several servers, comma-separated (async-nats takes a string as one
/// URL, so the list is split here). They are tried in the order given, first to connect and
/// again on every reconnect: the gateway attaches to the node listed first (its nearest) and
/// falls back to the next ones while it is down.
///
/// # Errors
/// [`GatewayError::Connect`] when no server in `--nats-url` answers.
pub async fn connect(config: &Config) -> Result<async_nats::Client, GatewayError> {
    let servers: Vec<&str> = config.nats_url.split(',').map(str::trim).collect();
    async_nats::ConnectOptions::new()
        .name("embatch-gateway")
        .retain_servers_order()
        .connect(servers)
        .await
        .map_err(|source| GatewayError::Connect {
            url: config.nats_url.clone(),
            source,
        })
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets in-flight requests finish.
///
/// # Errors
/// [`GatewayError::Serve`] when serving fails.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), GatewayError> {
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    tracing::info!(%addr, subject = %state.subject, "gateway listening");
    axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|source| GatewayError::Serve { addr, source })
}
