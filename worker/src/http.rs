//! The worker's small HTTP server: `GET /metrics` (Prometheus text) and `GET /health`.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;

/// Shared state of the routes.
#[derive(Clone)]
pub struct HttpState {
    /// Renders the Prometheus text exposition.
    pub metrics: PrometheusHandle,
    /// The worker's NATS connection, for `/health`.
    pub client: async_nats::Client,
}

/// Installs the metrics recorder, binds `addr` and serves [`app`] in a background task for the
/// life of the process.
///
/// # Errors
/// [`crate::WorkerError::Metrics`] when a recorder is already installed,
/// [`crate::WorkerError::Http`] when `addr` cannot be bound.
pub async fn spawn(addr: SocketAddr, client: async_nats::Client) -> Result<(), crate::WorkerError> {
    let metrics = crate::telemetry::init_metrics()?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| crate::WorkerError::Http { addr, source })?;
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app(HttpState { metrics, client })).await {
            tracing::error!(%err, "metrics server stopped");
        }
    });
    tracing::info!(%addr, "serving /metrics and /health");
    Ok(())
}

/// The routes, apart from serving, so tests can call them without a socket.
pub fn app(state: HttpState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .with_state(state)
}

async fn metrics(State(state): State<HttpState>) -> String {
    state.metrics.render()
}

/// 200 while the NATS connection is up (the worker can receive and answer), else 503.
async fn health(State(state): State<HttpState>) -> StatusCode {
    match state.client.connection_state() {
        async_nats::connection::State::Connected => StatusCode::OK,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}
