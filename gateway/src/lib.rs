//! embatch gateway: a stateless HTTP server that speaks text-embeddings-inference's `/embed` API
//! and forwards every request as one NATS request to the embatch workers' queue group.
//!
//! # Layout
//! - [`config`]: every setting, as a CLI flag and an environment variable.
//! - [`routes`]: `POST /embed`, `GET /health`, `GET /metrics` and the error → HTTP mapping.
//! - [`serve`]: the HTTP server loop: listen backlog, connection limit, header-read timeout.
//! - [`telemetry`]: logging, the Prometheus recorder and metric names.

pub mod config;
pub mod routes;
pub mod serve;
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

/// Connects to NATS as the gateway (`embatch-gateway`), to the servers of `--nats-url` in the
/// order given (see [`embatch_client::connect`]).
///
/// # Errors
/// [`GatewayError::Connect`] when no server in `--nats-url` answers.
pub async fn connect(config: &Config) -> Result<async_nats::Client, GatewayError> {
    embatch_client::connect(&config.nats_url, "embatch-gateway")
        .await
        .map_err(|source| GatewayError::Connect {
            url: config.nats_url.clone(),
            source,
        })
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets in-flight requests finish
/// (see [`serve::run`] for the connection limits).
///
/// # Errors
/// None today; the `Result` keeps room for serving errors.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), GatewayError> {
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    tracing::info!(%addr, subject = %state.client.subject(), "gateway listening");
    let limits = state.limits;
    serve::run(listener, app(state), limits, shutdown).await;
    Ok(())
}
