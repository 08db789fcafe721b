//! embatch worker: joins the NATS queue group, collects requests into batches, calls the upstream
//! model once per batch and answers each request with exactly its own slice.
//!
//! # Layout
//! - [`config`]: every setting, as a CLI flag and an environment variable.
//! - `serve`: the task tree: starts every long-lived task under one cancellation token and one
//!   task tracker, and stops them in one ordered sequence (stop taking messages, answer what was
//!   accepted within `--shutdown-grace`, stop the rest, flush).
//! - `intake`: the `embed` endpoint: parse, validate, admit, reply; withdrawals by request id.
//! - queue-group membership ([`embatch_membership`]): [`membership`], when the worker is a member
//!   of the queue group (full, upstream unhealthy), as plain decisions; `group` holds or drains
//!   the subscription accordingly; `peers` is what the worker knows of the others' room;
//!   `micro`, NATS micro service discovery (`$SRV.PING`, `$SRV.INFO`, `$SRV.STATS`) and the
//!   per-endpoint counters; `heartbeat`, the liveness signal clients watch to resend what a lost
//!   worker held; `reconnect`, what a reconnect to NATS does to the queue. `probes` runs the
//!   upstream `/health` probes that feed the decision.
//! - `info`: the `info` endpoint (the upstream's `/info`); `respond`: the replies of both
//!   endpoints.
//! - [`bulk`]: the bulk lane ([`embatch_bulk`]: OpenAI-style batch jobs from NATS JetStream,
//!   behind interactive traffic), wired to the worker's batcher, token counter and tenants.
//! - [`batcher`]: the batching actor ([`embatch_batcher`]: batch formation, overload control,
//!   fault isolation), wired to the worker's traces and tenants.
//! - [`cache`]: the cache ([`embatch_cache`]: in-flight de-duplication, the in-process LRU and
//!   the shared JetStream KV bucket), which the intake plans each request through.
//! - [`tenant`]: the tenant a request is served for, from its NATS account or, from a trusted
//!   caller, its `Embatch-Tenant` header.
//! - [`tokens`]: token counts per input (the model's tokenizer), before the batcher.
//! - [`upstream`]: TEI over HTTP, an OpenAI-compatible `/v1/embeddings` server, or the built-in
//!   CPU model.
//! - [`http`]: the admin HTTP server, `/metrics` and `/health`.
//! - [`telemetry`]: logging, the Prometheus recorder and metric names; `trace`: the spans of a
//!   request in the worker, exported over OTLP with `--otlp-endpoint`.

pub mod batcher;
/// Queue-group membership's decisions ([`embatch_membership::decision`]).
pub use embatch_membership::decision as membership;
use embatch_membership::{group, heartbeat, micro, peers, reconnect};
pub mod bulk;
pub mod cache;
pub mod config;
pub mod http;
mod info;
mod intake;
mod model;
mod probes;
mod respond;
mod serve;
pub mod telemetry;
pub mod tenant;
pub mod tokens;
mod trace;
pub mod upstream;

use std::future::Future;

pub use config::Config;
pub use embatch_runtime::shutdown_signal;

use crate::upstream::{AnyUpstream, Upstream};

/// Why the worker could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// NATS could not be reached, or refused the credentials (the message names the servers,
    /// redacted).
    #[error(transparent)]
    Connect(#[from] embatch_runtime::NatsError),
    /// Service discovery, one of the endpoints' subscriptions or the cancel subscription could
    /// not be set up.
    #[error("cannot register the NATS service ({what}): {source}")]
    Service {
        /// What was being set up, e.g. `endpoint embed`.
        what: &'static str,
        /// The client's error.
        source: async_nats::Error,
    },
    /// The built-in model could not be loaded.
    #[error(
        "cannot load the model from {origin}: {source} (run scripts/fetch-model.sh, or set TEI_URL)"
    )]
    Model {
        /// The configured model directory or hub id.
        origin: String,
        /// What went wrong.
        source: ModelError,
    },
    /// The model's name cannot be served: empty, or it collides with a subject the workers
    /// already use (`MODEL_ALIAS` picks another).
    #[error("cannot serve the model: {0}")]
    ModelName(#[from] embatch_protocol::model::ModelNameError),
    /// The upstream client could not be built.
    #[error("cannot set up the upstream: {0}")]
    Upstream(#[from] embatch_protocol::EmbedError),
    /// TEI could not be set up: its client, TLS to it, or replicas that serve different models.
    #[error("cannot set up TEI: {0}")]
    Tei(#[from] upstream::tei::ConnectError),
    /// The metrics recorder could not be installed.
    #[error("cannot install the metrics recorder: {0}")]
    Metrics(#[from] metrics_exporter_prometheus::BuildError),
    /// The tenants file (`TENANTS_FILE`) could not be read or is not valid.
    #[error(transparent)]
    Tenants(#[from] embatch_runtime::tenants::TenantsError),
    /// Tracing could not be set up (`--otlp-endpoint`).
    #[error(transparent)]
    Tracing(#[from] embatch_runtime::tracing_otel::OtelError),
    /// The metrics/health server could not bind its address.
    #[error("cannot serve /metrics on {addr}: {source}")]
    Http {
        /// `--metrics-addr`.
        addr: std::net::SocketAddr,
        /// The bind error.
        source: std::io::Error,
    },
}

/// Why the built-in model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The files are missing or invalid, or the hub could not serve them.
    #[error(transparent)]
    Load(#[from] embatch_local_model::LoadError),
    /// This build cannot fetch from the hub.
    #[error("this build has no `hub` feature; use --model-dir")]
    NoHub,
    /// The loading task panicked or was cancelled.
    #[error("the loading task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Builds the upstream the configuration names: TEI when `--tei-url` is set, an
/// OpenAI-compatible server when `--openai-url` is (the two exclude each other), else the
/// built-in model from `--model-dir`.
///
/// # Errors
/// [`WorkerError::Model`] when the model cannot be loaded, [`WorkerError::Upstream`] when the
/// HTTP client cannot be built.
pub async fn build_upstream(config: &Config) -> Result<AnyUpstream, WorkerError> {
    if let (Some(url), Some(model)) = (&config.openai_url, &config.openai_model) {
        let openai = upstream::openai::OpenAiUpstream::new(&upstream::openai::OpenAiConfig {
            base_urls: url.urls().iter().map(ToString::to_string).collect(),
            model: model.clone(),
            api_key: config.openai_api_key.clone(),
            timeout: config.upstream_timeout,
            max_inputs: config.openai_max_inputs,
            max_input_tokens: config.openai_max_input_tokens,
        })?;
        return Ok(AnyUpstream::OpenAi(openai));
    }
    match &config.tei_url {
        Some(urls) => {
            let tei = upstream::tei::TeiUpstream::connect(&upstream::tei::TeiConfig {
                base_urls: urls.urls().iter().map(ToString::to_string).collect(),
                api_key: config.tei_api_key.clone(),
                tls_ca: config.tei_tls_ca.clone(),
                timeout: config.upstream_timeout,
                fallback_max_batch_size: config.max_batch_size,
            })
            .await?;
            Ok(AnyUpstream::Tei(tei))
        }
        None => {
            let origin = match &config.model_id {
                Some(id) => id.clone(),
                None => config.model_dir.display().to_string(),
            };
            let model_id = config.model_id.clone();
            let dir = config.model_dir.clone();
            let loaded = tokio::task::spawn_blocking(move || match model_id {
                Some(id) => load_from_hub(&id),
                None => Ok(embatch_local_model::LocalModel::load(&dir)?),
            })
            .await
            .map_err(ModelError::from)
            .and_then(|model| model);
            let model = loaded.map_err(|source| WorkerError::Model { origin, source })?;
            Ok(AnyUpstream::Local(upstream::local::LocalUpstream::new(
                model,
            )))
        }
    }
}

#[cfg(feature = "hub")]
fn load_from_hub(model_id: &str) -> Result<embatch_local_model::LocalModel, ModelError> {
    Ok(embatch_local_model::LocalModel::from_hub(model_id)?)
}

#[cfg(not(feature = "hub"))]
fn load_from_hub(_model_id: &str) -> Result<embatch_local_model::LocalModel, ModelError> {
    Err(ModelError::NoHub)
}

/// Runs a worker on `client` with `upstream` until `shutdown` resolves, then drains gracefully:
/// stops taking messages, answers every accepted request (for at most `--shutdown-grace`),
/// stops its other tasks, flushes the connection and returns. Serves `/metrics` and `/health`
/// on `--metrics-addr` meanwhile, when set. The tasks and the order they stop in: `serve`.
///
/// First it learns its model's name (`MODEL_ALIAS`, else the upstream's `/info`, read every
/// second until it answers): the name decides the subjects it answers (see `model`).
///
/// # Errors
/// [`WorkerError::ModelName`] when the model's name cannot be served;
/// [`WorkerError::Service`] when the NATS service cannot be registered;
/// [`WorkerError::Metrics`] or [`WorkerError::Http`] when the admin server cannot start.
pub async fn run<U: Upstream>(
    client: async_nats::Client,
    upstream: U,
    config: &Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WorkerError> {
    let mut shutdown = std::pin::pin!(shutdown);
    // The model's name decides the subjects: read it before joining anything.
    let model = tokio::select! {
        model = model::resolve(&upstream, config) => model,
        () = &mut shutdown => return Ok(()),
    };
    let served = model::Served::new(model, config)?;
    serve::start(client, upstream, config, served)
        .await?
        .serve_until(shutdown)
        .await;
    Ok(())
}

/// Connects to NATS as a worker (`embatch-worker`), to the servers of `--nats-url` in the order
/// given, with the configured credentials and TLS (see [`embatch_runtime::NatsArgs`]), and a
/// subscription buffer well above `QUEUE_CAP` so the worker's own bound is always the one that
/// bites. The connection runs on a thread of its own
/// ([`embatch_runtime::NatsArgs::connect_on_own_thread`]), so that the intake sees each request
/// as soon as it is read and can refuse a large one before the next ones pile up behind it.
///
/// # Errors
/// [`WorkerError::Connect`] when no server accepts the connection.
pub async fn connect(config: &Config) -> Result<async_nats::Client, WorkerError> {
    let options = async_nats::ConnectOptions::new()
        .subscription_capacity(config.queue_cap.saturating_mul(4).max(65_536));
    Ok(config
        .nats
        .connect_on_own_thread("embatch-worker", options)
        .await?)
}
