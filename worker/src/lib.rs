//! embatch worker: joins the NATS queue group, collects requests into batches, calls the upstream
//! model once per batch and answers each request with exactly its own slice.
//!
//! # Layout
//! - [`config`]: every setting, as a CLI flag and an environment variable.
//! - [`intake`]: the NATS micro service endpoint: parse, validate, admit, reply.
//! - [`batcher`]: the batching actor: batch formation, overload control, fault isolation.
//! - [`upstream`]: TEI over HTTP, or the built-in CPU model.
//! - [`http`]: the worker's small HTTP server for `/metrics` and `/health`.
//! - [`telemetry`]: logging, the Prometheus recorder and metric names.

pub mod batcher;
pub mod config;
pub mod http;
pub mod intake;
pub mod telemetry;
pub mod upstream;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::service::ServiceExt;
use embatch_protocol::{PROTOCOL_VERSION, SERVICE_NAME};
use tokio_util::task::TaskTracker;

pub use config::Config;
pub use embatch_runtime::shutdown_signal;

use crate::upstream::{AnyUpstream, Upstream};

/// Why the worker could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The NATS server could not be reached.
    #[error("cannot connect to NATS at {url}: {source}")]
    Connect {
        /// The configured URL.
        url: String,
        /// The client's error.
        source: async_nats::ConnectError,
    },
    /// The NATS micro service or its endpoint could not be registered.
    #[error("cannot register the NATS service: {0}")]
    Service(String),
    /// The built-in model could not be loaded.
    #[error(
        "cannot load the model from {origin}: {message} (run scripts/fetch-model.sh, or set TEI_URL)"
    )]
    Model {
        /// The configured model directory or hub id.
        origin: String,
        /// What went wrong.
        message: String,
    },
    /// The upstream client could not be built.
    #[error("cannot set up the upstream: {0}")]
    Upstream(#[from] embatch_protocol::EmbedError),
    /// The metrics/health server could not start.
    #[error("cannot serve /metrics on {addr}: {message}")]
    Http {
        /// The configured address.
        addr: String,
        /// What went wrong.
        message: String,
    },
}

/// Builds the upstream the configuration names: TEI when `--tei-url` is set, else the built-in
/// model from `--model-dir`.
///
/// # Errors
/// [`WorkerError::Model`] when the model cannot be loaded, [`WorkerError::Upstream`] when the
/// HTTP client cannot be built.
pub async fn build_upstream(config: &Config) -> Result<AnyUpstream, WorkerError> {
    match &config.tei_url {
        Some(url) => {
            let tei = upstream::tei::TeiUpstream::connect(&upstream::tei::TeiConfig {
                base_url: url.clone(),
                api_key: config.tei_api_key.clone(),
                timeout: config.upstream_timeout,
                fallback_max_batch_size: config.max_batch_size,
            })
            .await?;
            Ok(AnyUpstream::Tei(tei))
        }
        None => {
            let source = match &config.model_id {
                Some(id) => id.clone(),
                None => config.model_dir.display().to_string(),
            };
            let model_error = |message: String| WorkerError::Model {
                origin: source.clone(),
                message,
            };
            let model_id = config.model_id.clone();
            let dir = config.model_dir.clone();
            let model = tokio::task::spawn_blocking(move || match model_id {
                Some(id) => load_from_hub(&id),
                None => embatch_local_model::LocalModel::load(&dir).map_err(|e| e.to_string()),
            })
            .await
            .map_err(|e| model_error(e.to_string()))?
            .map_err(model_error)?;
            Ok(AnyUpstream::Local(upstream::local::LocalUpstream::new(
                model,
            )))
        }
    }
}

#[cfg(feature = "hub")]
fn load_from_hub(model_id: &str) -> Result<embatch_local_model::LocalModel, String> {
    embatch_local_model::LocalModel::from_hub(model_id).map_err(|e| e.to_string())
}

#[cfg(not(feature = "hub"))]
fn load_from_hub(model_id: &str) -> Result<embatch_local_model::LocalModel, String> {
    Err(format!(
        "cannot fetch {model_id}: this build has no `hub` feature; use --model-dir"
    ))
}

/// Runs a worker on `client` with `upstream` until `shutdown` resolves, then drains gracefully:
/// stops taking messages, answers every accepted request (for at most `--shutdown-grace`),
/// flushes the connection and returns.
///
/// # Errors
/// [`WorkerError::Service`] when the NATS service cannot be registered.
pub async fn run<U: Upstream>(
    client: async_nats::Client,
    upstream: U,
    config: &Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WorkerError> {
    let upstream = Arc::new(upstream);
    let (batcher, batcher_task) = batcher::spawn(Arc::clone(&upstream), config.batcher());
    let service = client
        .service_builder()
        .description("embatch: batches embedding requests for an upstream model")
        .metadata(
            [("protocol_version".to_string(), PROTOCOL_VERSION.to_string())]
                .into_iter()
                .collect(),
        )
        .queue_group(&config.queue_group)
        .start(SERVICE_NAME, env!("CARGO_PKG_VERSION"))
        .await
        .map_err(|e| WorkerError::Service(e.to_string()))?;
    let endpoint = service
        .endpoint_builder()
        .name("embed")
        .add(&config.subject)
        .await
        .map_err(|e| WorkerError::Service(e.to_string()))?;
    tracing::info!(
        subject = %config.subject,
        queue_group = %config.queue_group,
        upstream_max_batch = upstream.max_batch_size(),
        "worker ready"
    );

    let replies = TaskTracker::new();
    let intake_config = intake::IntakeConfig {
        default_deadline: config.default_deadline,
        max_client_batch_size: config.max_client_batch_size,
        max_payload: client.server_info().max_payload,
    };
    let cancels = client
        .subscribe(embatch_protocol::headers::cancel_subject(&config.subject))
        .await
        .map_err(|e| {
            WorkerError::Service(format!("cannot subscribe to the cancel subject: {e}"))
        })?;
    intake::run(
        endpoint,
        cancels,
        batcher,
        intake_config,
        replies.clone(),
        shutdown,
    )
    .await;

    // The intake dropped the last batcher handle: the batcher flushes and answers what it holds.
    replies.close();
    let drained = async {
        if let Err(err) = batcher_task.await {
            tracing::error!(%err, "batcher task failed");
        }
        replies.wait().await;
    };
    if tokio::time::timeout(config.shutdown_grace, drained)
        .await
        .is_err()
    {
        tracing::warn!(grace = ?config.shutdown_grace, "shutdown grace period over; exiting with requests unanswered");
    }
    // Bounded: flushing waits for the server's PONG, which never comes while disconnected.
    match tokio::time::timeout(Duration::from_secs(5), client.flush()).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::warn!(%err, "cannot flush replies"),
        Err(_) => tracing::warn!("cannot flush replies: NATS did not answer within 5 s"),
    }
    if let Err(err) = service.stop().await {
        tracing::debug!(%err, "service stop");
    }
    tracing::info!("worker stopped");
    Ok(())
}

/// Connects to NATS as a worker: named, with a subscription buffer well above `QUEUE_CAP` so
/// the worker's own bound is always the one that bites.
///
/// `--nats-url` may list several servers, comma-separated, tried in the order given (see
/// [`embatch_client::connect`]).
///
/// # Errors
/// [`WorkerError::Connect`] when no server in `--nats-url` answers.
pub async fn connect(config: &Config) -> Result<async_nats::Client, WorkerError> {
    let options = async_nats::ConnectOptions::new()
        .name("embatch-worker")
        .subscription_capacity(config.queue_cap.saturating_mul(4).max(65_536));
    embatch_client::connect_with(&config.nats_url, options)
        .await
        .map_err(|source| WorkerError::Connect {
            url: config.nats_url.clone(),
            source,
        })
}
