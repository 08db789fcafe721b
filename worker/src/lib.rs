//! embatch worker: joins the NATS queue group, collects requests into batches, calls the upstream
//! model once per batch and answers each request with exactly its own slice.
//!
//! # Layout
//! - [`config`]: every setting, as a CLI flag and an environment variable.
//! - `intake`: the `embed` endpoint: parse, validate, admit, reply.
//! - [`membership`]: when the worker is a member of the queue group (full, upstream unhealthy);
//!   `group` holds or drains the subscription accordingly.
//! - `heartbeat`: the liveness signal clients watch to resend what a lost worker held.
//! - `micro`: NATS micro service discovery (`$SRV.PING`, `$SRV.INFO`, `$SRV.STATS`).
//! - [`batcher`]: the batching actor: batch formation, overload control, fault isolation.
//! - [`upstream`]: TEI over HTTP, or the built-in CPU model.
//! - [`http`]: the worker's small HTTP server for `/metrics` and `/health`.
//! - [`telemetry`]: logging, the Prometheus recorder and metric names.

pub mod batcher;
pub mod config;
mod group;
mod heartbeat;
pub mod http;
mod info;
mod intake;
pub mod membership;
mod micro;
mod peers;
mod respond;
pub mod telemetry;
pub mod upstream;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use embatch_protocol::{PROTOCOL_VERSION, SERVICE_NAME};
use tokio_util::task::TaskTracker;

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
    /// The upstream client could not be built.
    #[error("cannot set up the upstream: {0}")]
    Upstream(#[from] embatch_protocol::EmbedError),
    /// The metrics recorder could not be installed.
    #[error("cannot install the metrics recorder: {0}")]
    Metrics(#[from] metrics_exporter_prometheus::BuildError),
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
                base_url: url.to_string(),
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
    let service_error = |what: &'static str| {
        move |source: async_nats::SubscribeError| WorkerError::Service {
            what,
            source: source.into(),
        }
    };
    let info_subject = embatch_protocol::headers::info_subject(&config.subject);
    let embed_stats = micro::EndpointStats::new("embed", &config.subject, &config.queue_group);
    let info_stats = micro::EndpointStats::new(info::ENDPOINT, &info_subject, &config.queue_group);
    let membership = membership::Membership::new(config.membership);
    let (state, state_rx) = tokio::sync::watch::channel(membership.state());
    // The service id (a NUID, as async-nats's own services use): discovery reports it, and
    // membership announcements carry it.
    let id = nuid::next().to_string();
    let discovery = micro::serve(
        client.clone(),
        id.clone(),
        micro::Identity {
            name: SERVICE_NAME.to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            description: "embatch: batches embedding requests for an upstream model".to_owned(),
            metadata: [("protocol_version".to_owned(), PROTOCOL_VERSION.to_owned())]
                .into_iter()
                .collect(),
        },
        vec![embed_stats.clone(), info_stats.clone()],
        state_rx.clone(),
    )
    .await
    .map_err(service_error("service discovery"))?;
    let info_requests = client
        .queue_subscribe(info_subject, config.queue_group.clone())
        .await
        .map_err(service_error("endpoint info"))?;
    let probes = match config.membership {
        membership::Mode::Adaptive => Some(group::spawn_probes(Arc::clone(&upstream), state_rx)),
        membership::Mode::Static => None,
    };
    let (probes, probe_task) = probes.unzip();
    let heartbeat = heartbeat::spawn(client.clone(), &config.subject, &id);
    let group = group::Group::join(
        client.clone(),
        group::Address {
            subject: config.subject.clone(),
            queue_group: config.queue_group.clone(),
            id: id.clone(),
        },
        membership,
        state,
        batcher.clone(),
        probes,
    )
    .await
    .map_err(service_error("endpoint embed"))?;
    let cancels = client
        .subscribe(embatch_protocol::headers::cancel_subject(&config.subject))
        .await
        .map_err(service_error("cancel subscription"))?;
    tracing::info!(
        subject = %config.subject,
        queue_group = %config.queue_group,
        membership = %config.membership,
        upstream_max_batch = upstream.max_batch_size(),
        "worker ready"
    );

    let replies = TaskTracker::new();
    let intake_config = intake::IntakeConfig {
        default_deadline: config.default_deadline,
        max_client_batch_size: config.max_client_batch_size,
        max_payload: client.server_info().max_payload,
        worker_id: id,
    };
    let info_task = tokio::spawn(info::serve(
        info_requests,
        client.clone(),
        Arc::clone(&upstream),
        config.max_client_batch_size,
        info_stats,
    ));
    intake::run(
        group,
        cancels,
        batcher,
        intake_config,
        replies.clone(),
        shutdown,
        client.clone(),
        embed_stats,
    )
    .await;
    info_task.abort();
    if let Some(task) = probe_task {
        task.abort();
    }

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
    discovery.abort();
    heartbeat.abort();
    tracing::info!("worker stopped");
    Ok(())
}

/// Connects to NATS as a worker (`embatch-worker`), to the servers of `--nats-url` in the order
/// given, with the configured credentials and TLS (see [`embatch_runtime::NatsArgs`]), and a
/// subscription buffer well above `QUEUE_CAP` so the worker's own bound is always the one that
/// bites.
///
/// # Errors
/// [`WorkerError::Connect`] when no server accepts the connection.
pub async fn connect(config: &Config) -> Result<async_nats::Client, WorkerError> {
    let options = async_nats::ConnectOptions::new()
        .subscription_capacity(config.queue_cap.saturating_mul(4).max(65_536));
    Ok(config.nats.connect("embatch-worker", options).await?)
}
