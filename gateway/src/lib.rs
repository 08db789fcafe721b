//! embatch gateway: a stateless HTTP server that speaks text-embeddings-inference's `/embed` API
//! and forwards every request as one NATS request to the embatch workers' queue group.
//!
//! # Layout
//! - [`config`]: every setting, as a CLI flag and an environment variable.
//! - [`body`]: the embedding routes' request body, read within `BODY_READ_TIMEOUT` (408).
//! - [`app`]: the router: every route, which need an API key, which count against quotas.
//! - [`state`]: [`AppState`], what the routes share.
//! - [`routes`]: `POST /embed` (and `POST /`), `POST /v1/embeddings` (and `POST /embeddings`),
//!   `GET /info`, `GET /health`, `GET /metrics`, `GET /openapi.json` and the error → HTTP mapping.
//! - [`bulk`]: OpenAI's Files and Batches APIs (`/v1/files`, `/v1/batches`): bulk embedding
//!   jobs on NATS JetStream.
//! - [`openai`]: OpenAI's embeddings shapes and their translation to and from TEI's.
//! - [`cohere`], [`cohere_embed`]: Cohere's rerank and embed shapes, translated likewise.
//! - [`info`]: `GET /info`, asked of the workers over NATS.
//! - [`models`]: the models served, live from NATS discovery (`GET /v1/models`), and the route
//!   of each request to its model's subject.
//! - [`openapi`]: the OpenAPI 3.1 document of these routes, served at `GET /openapi.json` and
//!   `GET /api-doc/openapi.json`.
//! - [`serve`]: the HTTP server loop: listen backlog, connection limit, header-read timeout.
//! - [`fd_limit`]: the open-file limit, raised at start, and the connection cap it allows.
//! - [`tenancy`]: the caller's tenant from its API key (`Authorization: Bearer`), or 401.
//! - [`metering`], [`quota`], [`usage`]: each tenant's quotas (fleet-wide, on NATS), usage per
//!   day (JetStream KV, `GET /v1/usage`) and metrics.
//! - [`telemetry`]: logging, the Prometheus recorder and metric names.
//! - [`trace`]: each HTTP request's span and the W3C trace context sent on to the workers.

pub mod app;
pub mod body;
pub mod bulk;
pub mod cohere;
pub mod cohere_embed;
pub mod config;
pub mod fd_limit;
pub mod info;
pub mod metering;
pub mod models;
pub mod openai;
pub mod openapi;
pub mod quota;
pub mod routes;
pub mod serve;
pub mod state;
pub mod telemetry;
pub mod tenancy;
pub mod trace;
pub mod usage;

use std::future::Future;

pub use app::app;
pub use config::Config;
pub use embatch_runtime::shutdown_signal;
pub use state::AppState;

/// Why the gateway could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// NATS could not be reached, or refused the credentials (the message names the servers,
    /// redacted).
    #[error(transparent)]
    Connect(#[from] embatch_runtime::NatsError),
    /// The listen address could not be bound, or serving failed.
    #[error("cannot serve HTTP on {addr}: {source}")]
    Serve {
        /// The configured address.
        addr: std::net::SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The tenants file could not be read or is not valid.
    #[error(transparent)]
    Tenants(#[from] embatch_runtime::tenants::TenantsError),
    /// The metrics recorder could not be installed.
    #[error("cannot install the metrics recorder: {0}")]
    Metrics(#[from] metrics_exporter_prometheus::BuildError),
    /// Tracing could not be set up (`--otlp-endpoint`).
    #[error(transparent)]
    Tracing(#[from] embatch_runtime::tracing_otel::OtelError),
}

/// Connects to NATS as the gateway (`embatch-gateway`), to the servers of `--nats-url` in the
/// order given, with the configured credentials and TLS (see [`embatch_runtime::NatsArgs`]).
///
/// # Errors
/// [`GatewayError::Connect`] when no server in `--nats-url` answers.
pub async fn connect(config: &Config) -> Result<async_nats::Client, GatewayError> {
    Ok(config
        .nats
        .connect("embatch-gateway", async_nats::ConnectOptions::new())
        .await?)
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
    let mut app = app(state);
    if embatch_runtime::tracing_otel::enabled() {
        // Only with tracing on: a middleware layer costs every request a boxed service call.
        app = app.layer(axum::middleware::from_fn(trace::request_span));
    }
    serve::run(listener, app, limits, shutdown).await;
    Ok(())
}
