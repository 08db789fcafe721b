//! The worker's small HTTP server: `GET /metrics` (Prometheus text) and `GET /health`.

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
