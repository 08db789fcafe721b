//! The worker's small admin HTTP server: `GET /metrics` (Prometheus text) and `GET /health`,
//! bound at start-up ([`AdminServer::bind`]) and stopped with the worker's other tasks.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

/// Shared state of the routes.
#[derive(Clone)]
pub struct HttpState {
    /// Renders the Prometheus text exposition.
    pub metrics: PrometheusHandle,
    /// The worker's NATS connection, for `/health`.
    pub client: async_nats::Client,
}

/// The admin server, bound and not yet serving.
pub struct AdminServer {
    listener: tokio::net::TcpListener,
    state: HttpState,
}

impl AdminServer {
    /// Installs the metrics recorder (every metric labelled `model="<model>"`) and binds
    /// `addr`.
    ///
    /// # Errors
    /// [`crate::WorkerError::Metrics`] when a recorder is already installed,
    /// [`crate::WorkerError::Http`] when `addr` cannot be bound.
    pub async fn bind(
        addr: SocketAddr,
        client: async_nats::Client,
        model: &str,
    ) -> Result<AdminServer, crate::WorkerError> {
        let metrics = crate::telemetry::init_model_metrics(Some(model))?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| crate::WorkerError::Http { addr, source })?;
        tracing::info!(%addr, "serving /metrics and /health");
        Ok(AdminServer {
            listener,
            state: HttpState { metrics, client },
        })
    }

    /// Serves [`app`] and runs the metrics recorder's upkeep until `stop` is cancelled, then
    /// stops accepting and lets open requests finish (axum's graceful shutdown; the worker bounds
    /// the wait).
    pub async fn run(self, stop: CancellationToken) {
        let upkeep = embatch_runtime::metrics_upkeep(self.state.metrics.clone());
        let served = axum::serve(self.listener, app(self.state))
            .with_graceful_shutdown(stop.cancelled_owned());
        tokio::select! {
            served = served => {
                if let Err(err) = served {
                    tracing::error!(%err, "metrics server stopped");
                }
            }
            () = upkeep => {}
        }
    }
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
