//! The worker as a task tree: [`start`] spawns every long-lived task onto one [`TaskTracker`]
//! under one [`CancellationToken`], and [`Running::serve_until`] stops them in one ordered sequence.
//!
//! The tree:
//! - `stop` (the root token) ends the discovery responder (`$SRV.PING`/`INFO`/`STATS`,
//!   [`crate::micro`]), the heartbeat ([`crate::heartbeat`]; it beats while requests are held,
//!   until every accepted request is answered, so a graceful stop never looks like a death), the withdrawal of
//!   cancelled requests (`<subject>.cancel`) and the admin HTTP server (`/metrics`, `/health` and
//!   the metrics recorder's upkeep, [`crate::http`]);
//! - `intake` (a child of `stop`: cancelling the root cancels it too) ends what takes messages:
//!   the intake, which holds the queue-group membership ([`crate::group`]) and drains its
//!   subscription, the `info` endpoint ([`crate::info`]), the upstream `/health` probes and the
//!   bulk lane ([`crate::bulk`]; the items it holds are NAKed for another worker).
//!
//! Two kinds of task are not long-lived and are waited on by the sequence instead: the
//! batcher's actor, which ends when the intake drops the last [`crate::batcher::BatcherHandle`]
//! and it has answered what it holds, and the reply tasks, one per accepted request, on their
//! own tracker.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use embatch_protocol::model as model_keys;
use embatch_protocol::{CONTRACT_VERSION, PROTOCOL_VERSION, SERVICE_NAME};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::upstream::Upstream;
use crate::{
    Config, WorkerError, batcher, bulk, cache, group, heartbeat, http, info, intake, membership,
    micro, model, tokens,
};

mod subjects;

use subjects::{Endpoints, address, subscribe_cancels};

/// Longest the tasks of the tree may take to stop once cancelled (the admin server's open
/// requests), and longest the last flush of the connection may take, each.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// A started worker: the tree's tokens and tasks, and what its shutdown waits on.
pub(crate) struct Running {
    /// The root: cancelling it stops every task of the tree.
    stop: CancellationToken,
    /// A child of `stop`: cancelling it stops taking messages.
    intake_stop: CancellationToken,
    /// Every long-lived task.
    tasks: TaskTracker,
    /// The intake's task, also on `tasks`: it ends when it has drained the request subscription,
    /// or at once when the connection closes.
    intake: JoinHandle<()>,
    /// The batcher's actor: it ends after the intake, once it has answered what it holds.
    batcher: JoinHandle<()>,
    /// The reply tasks of accepted requests.
    replies: TaskTracker,
    client: async_nats::Client,
    shutdown_grace: Duration,
}

/// Joins the queue group on `client` with `upstream` under `config` and spawns the worker's
/// tasks; it serves until [`Running::serve_until`].
///
/// # Errors
/// [`WorkerError::Service`] when a subscription cannot be made, [`WorkerError::Metrics`] or
/// [`WorkerError::Http`] when the admin server (`--metrics-addr`) cannot start,
/// [`WorkerError::Tenants`] when `TENANTS_FILE` cannot be read or is not valid.
pub(crate) async fn start<U: Upstream>(
    client: async_nats::Client,
    upstream: U,
    config: &Config,
    served: model::Served,
) -> Result<Running, WorkerError> {
    let stop = CancellationToken::new();
    let tasks = TaskTracker::new();
    // Read before anything is joined: a broken file stops the worker at start.
    let tenants = crate::tenant::TenantPolicy::new(
        embatch_runtime::tenants::watch(config.tenants_file.as_deref(), stop.clone())?,
        config.trusted_account.clone(),
    );
    let upstream = Arc::new(upstream);
    let parts = Parts::build(&client, &upstream, config, &served, (&stop, &tasks)).await?;
    tracing::info!(
        model = %served.model,
        subjects = ?served.subjects,
        queue_group = %config.queue_group,
        membership = %config.membership,
        upstream_max_batch = upstream.max_batch_size(),
        "worker ready"
    );
    Ok(parts.spawn(client, config, (served, tenants), (stop, tasks)))
}

/// What [`start`] subscribes and builds before it spawns anything of the intake.
struct Parts<U> {
    admin: Option<http::AdminServer>,
    discovery: micro::Discovery,
    info: info::Endpoint<U>,
    probes: Option<group::Probes<U>>,
    counter: tokens::Counter,
    rerank: intake::RerankConfig,
    sparse: intake::SparseConfig,
    tokens: intake::TokenRoutes,
    classify: intake::ClassifyRoutes,
    batcher: batcher::BatcherHandle,
    batcher_task: JoinHandle<()>,
    cache: Arc<cache::Cache>,
    group: group::Group,
    cancels: futures::stream::SelectAll<async_nats::Subscriber>,
    embed_stats: micro::EndpointStats,
    heartbeat_state: tokio::sync::watch::Receiver<membership::MemberState>,
    busy: Arc<heartbeat::Busy>,
    id: String,
}

/// Subscribes discovery (`$SRV.PING/INFO/STATS`, answered as worker `id` of a model that does
/// `capabilities`, with the live membership of `state_rx`) and the `info` endpoints of
/// `info_subjects`.
///
/// # Errors
/// [`WorkerError::Service`] when a subscription cannot be made.
async fn subscribe_meta<U: Upstream>(
    client: &async_nats::Client,
    (id, served, capabilities): (&str, &model::Served, intake::Capabilities),
    (all, info_subjects, info_stats): (
        Vec<micro::EndpointStats>,
        Vec<String>,
        micro::EndpointStats,
    ),
    config: &Config,
    upstream: &Arc<U>,
    state_rx: tokio::sync::watch::Receiver<membership::MemberState>,
) -> Result<(micro::Discovery, info::Endpoint<U>), WorkerError> {
    let discovery = micro::Discovery::subscribe(
        client.clone(),
        id.to_owned(),
        identity(served, capabilities),
        all,
        state_rx,
    )
    .await
    .map_err(service_error("service discovery"))?;
    let info = info::Endpoint::subscribe(
        client.clone(),
        info_subjects,
        config.queue_group.clone(),
        Arc::clone(upstream),
        config.max_client_batch_size,
        info_stats,
    )
    .await
    .map_err(service_error("endpoint info"))?;
    Ok((discovery, info))
}

/// The routes beside `/embed` the worker serves, configured from the upstream's `/info`
/// (`info`): rerank, sparse embeddings, tokenize/decode, and predict/embed_all/similarity.
fn routes<U: Upstream>(
    upstream: &Arc<U>,
    served: &model::Served,
    info: Option<&serde_json::Value>,
) -> (
    intake::RerankConfig,
    intake::SparseConfig,
    intake::TokenRoutes,
    intake::ClassifyRoutes,
) {
    let (subjects, model) = (&served.subjects, &served.model.name);
    (
        intake::RerankConfig::new(subjects, model, info),
        intake::SparseConfig::new(subjects, model, info),
        intake::TokenRoutes::new(subjects, Arc::clone(upstream).route_caller()),
        intake::ClassifyRoutes::new(subjects, model, info),
    )
}

impl<U: Upstream> Parts<U> {
    /// Binds the admin server, subscribes discovery, `info`, the queue group and the cancel
    /// subjects, and starts the batcher and the cache (the cache's tasks on `tasks`, under
    /// `stop`).
    async fn build(
        client: &async_nats::Client,
        upstream: &Arc<U>,
        config: &Config,
        served: &model::Served,
        (stop, tasks): (&CancellationToken, &TaskTracker),
    ) -> Result<Parts<U>, WorkerError> {
        let admin = match config.metrics_addr.0 {
            Some(addr) => {
                Some(http::AdminServer::bind(addr, client.clone(), &served.model.name).await?)
            }
            None => None,
        };
        let endpoints = Endpoints::of(served, &config.queue_group);
        let membership = membership::Membership::new(config.membership);
        let (state, state_rx) = tokio::sync::watch::channel(membership.state());
        let id = service_id(client);
        // What the upstream reports of itself decides the token budget's defaults, the routes
        // (and the capabilities discovery announces) and the model's identity for the cache.
        let upstream_info = upstream.info().await.ok();
        let (rerank, sparse, tokens, classify) = routes(upstream, served, upstream_info.as_ref());
        let (discovery, info) = subscribe_meta(
            client,
            (&id, served, classify.capabilities),
            (endpoints.all, endpoints.info_subjects, endpoints.info_stats),
            config,
            upstream,
            state_rx.clone(),
        )
        .await?;
        let (probes, probe_results) = probes(config.membership, upstream, state_rx.clone());
        let counter = token_counter(upstream.as_ref(), config).await;
        let (token_subjects, classify_subjects) = (tokens.subjects(), classify.subjects());
        let routed = [
            &rerank.subjects,
            &sparse.subjects,
            &token_subjects,
            &classify_subjects,
        ];
        let (batcher, batcher_task) =
            batcher::spawn(Arc::clone(upstream), config.batcher(upstream_info.as_ref()));
        let cache_config = config.cache();
        let cache =
            cache::Cache::start(client, &cache_config, upstream_info.as_ref(), stop, tasks).await;
        let cache = Arc::new(cache);
        let group = group::Group::join(
            client.clone(),
            address(config, served, routed, (&id, &classify.capabilities)),
            membership,
            state,
            batcher.clone(),
            probe_results,
        )
        .await
        .map_err(service_error("endpoint embed"))?;
        let busy = group.busy();
        let cancels = subscribe_cancels(client, &served.subjects)
            .await
            .map_err(service_error("cancel subscription"))?;
        Ok(Parts {
            admin,
            discovery,
            info,
            probes,
            counter,
            rerank,
            sparse,
            tokens,
            classify,
            batcher,
            batcher_task,
            cache,
            group,
            cancels,
            embed_stats: endpoints.embed_stats,
            heartbeat_state: state_rx,
            busy,
            id,
        })
    }

    /// Spawns the tree: under `stop` discovery, the heartbeat, withdrawals and the admin
    /// server; under its child the intake, `info`, the probes and the bulk lane.
    fn spawn(
        self,
        client: async_nats::Client,
        config: &Config,
        (served, tenants): (model::Served, crate::tenant::TenantPolicy),
        (stop, tasks): (CancellationToken, TaskTracker),
    ) -> Running {
        let intake_stop = stop.child_token();
        let replies = TaskTracker::new();
        let withdrawable = Arc::new(intake::Withdrawable::default());
        tasks.spawn(self.discovery.run(stop.clone()));
        tasks.spawn(heartbeat::run(
            heartbeat::Beat {
                client: client.clone(),
                subjects: served.subjects.clone(),
                id: self.id.clone(),
                state: self.heartbeat_state,
                busy: self.busy,
                replies: replies.clone(),
            },
            stop.clone(),
        ));
        tasks.spawn(intake::withdraw(
            self.cancels,
            Arc::clone(&withdrawable),
            stop.clone(),
        ));
        if let Some(admin) = self.admin {
            tasks.spawn(admin.run(stop.clone()));
        }
        tasks.spawn(self.info.run(intake_stop.clone(), tasks.clone()));
        if let Some(probes) = self.probes {
            tasks.spawn(probes.run(intake_stop.clone()));
        }
        tasks.spawn(bulk::run(
            client.clone(),
            (self.batcher.bulk_gate(), self.counter.clone()),
            bulk_config(config, &served, &tenants),
            intake_stop.clone(),
        ));
        let intake_config = intake::IntakeConfig {
            default_deadline: config.default_deadline,
            max_client_batch_size: config.max_client_batch_size,
            max_payload: client.server_info().max_payload,
            worker_id: self.id,
            max_queue_bytes: config.max_queue_bytes,
            rerank: self.rerank,
            sparse: self.sparse,
            tokens: self.tokens,
            classify: self.classify,
        };
        let intake = tasks.spawn(intake::run(
            intake::Intake {
                group: self.group,
                batcher: self.batcher,
                counter: self.counter,
                config: intake_config,
                replies: replies.clone(),
                withdrawable,
                client: client.clone(),
                stats: self.embed_stats,
                cache: self.cache,
                tenants,
            },
            intake_stop.clone(),
        ));
        Running {
            stop,
            intake_stop,
            tasks,
            intake,
            batcher: self.batcher_task,
            replies,
            client,
            shutdown_grace: config.shutdown_grace,
        }
    }
}

/// The counter of each request's tokens: `TOKENIZER`, the TEI model's tokenizer, TEI's
/// `/tokenize`, or input counts; requests waiting for it bounded by `QUEUE_CAP` inputs and
/// `MAX_QUEUE_BYTES`.
async fn token_counter<U: Upstream>(upstream: &U, config: &Config) -> tokens::Counter {
    let counter = upstream
        .counter(&tokens::TokenizerLookup {
            path: config.tokenizer.clone(),
        })
        .await
        .with_pending_limit(config.queue_cap)
        .with_pending_bytes(config.max_queue_bytes);
    tracing::info!(source = %counter.source(), "token counts");
    counter
}

/// A subscription's failure as the worker's start error, naming `what` it was for.
fn service_error(what: &'static str) -> impl Fn(async_nats::SubscribeError) -> WorkerError {
    move |source| WorkerError::Service {
        what,
        source: source.into(),
    }
}

/// The upstream `/health` probes with `MEMBERSHIP=adaptive` and the receiver of their
/// results; none with `static`.
fn probes<U: Upstream>(
    mode: membership::Mode,
    upstream: &Arc<U>,
    state: tokio::sync::watch::Receiver<membership::MemberState>,
) -> (
    Option<group::Probes<U>>,
    Option<tokio::sync::mpsc::Receiver<bool>>,
) {
    match mode {
        membership::Mode::Adaptive => {
            let (probes, results) = group::Probes::new(Arc::clone(upstream), state);
            (Some(probes), Some(results))
        }
        membership::Mode::Static => (None, None),
    }
}

/// The bulk lane's settings: `BULK_*`, the tenants, and the served model (also the default
/// model of bulk lines that name none, unless set).
fn bulk_config(
    config: &Config,
    served: &model::Served,
    tenants: &crate::tenant::TenantPolicy,
) -> bulk::BulkConfig {
    let mut bulk_config = config.bulk();
    bulk_config.tenants = tenants.clone();
    bulk_config.model = served.model.name.clone();
    if bulk_config.default_model.is_empty() {
        bulk_config.default_model = served.model.name.clone();
    }
    bulk_config
}

impl Running {
    /// Serves until `signal` resolves (or the intake ends by itself: the connection closed),
    /// then shuts down in order:
    /// 1. stop taking messages: the intake drains its queue-group subscription and admits what
    ///    the server routed before the UNSUB; the `info` endpoint and the probes stop;
    /// 2. answer every accepted request, for at most `--shutdown-grace`: the intake dropped the
    ///    last batcher handle, so the batcher sends all it holds upstream and ends;
    /// 3. stop discovery, the heartbeat, withdrawals and the admin server, and wait for every task of the tree;
    /// 4. flush the connection, so the last replies leave.
    pub(crate) async fn serve_until(self, signal: impl Future<Output = ()>) {
        let Running {
            stop,
            intake_stop,
            tasks,
            mut intake,
            batcher,
            replies,
            client,
            shutdown_grace,
        } = self;
        let ended = tokio::select! {
            () = signal => None,
            ended = &mut intake => {
                tracing::warn!("the intake ended: the NATS connection closed");
                Some(ended)
            }
        };

        // 1. Stop taking messages.
        intake_stop.cancel();
        let ended = match ended {
            Some(ended) => ended,
            None => intake.await,
        };
        if let Err(err) = ended {
            tracing::error!(%err, "intake task failed");
        }

        // 2. Answer every accepted request, within the grace period.
        replies.close();
        let answered = async {
            if let Err(err) = batcher.await {
                tracing::error!(%err, "batcher task failed");
            }
            replies.wait().await;
        };
        if tokio::time::timeout(shutdown_grace, answered)
            .await
            .is_err()
        {
            tracing::warn!(grace = ?shutdown_grace, "shutdown grace period over; exiting with requests unanswered");
        }

        // 3. Stop discovery, the heartbeat, withdrawals and the admin server.
        stop.cancel();
        tasks.close();
        if tokio::time::timeout(STOP_TIMEOUT, tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("worker tasks still running after 5 s; exiting without them");
        }

        // 4. Flush the connection. Bounded: flushing waits for the server's PONG, which never
        // comes while disconnected.
        match tokio::time::timeout(STOP_TIMEOUT, client.flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(%err, "cannot flush replies"),
            Err(_) => tracing::warn!("cannot flush replies: NATS did not answer within 5 s"),
        }
        tracing::info!("worker stopped");
    }
}

/// The worker's service id: a NUID, as async-nats's own services make it (the last token of a
/// fresh inbox subject is one). Discovery reports it and membership announcements carry it.
fn service_id(client: &async_nats::Client) -> String {
    let inbox = client.new_inbox();
    inbox.rsplit('.').next().unwrap_or(&inbox).to_owned()
}

/// The service's identity as discovery reports it: the contract version and the model served
/// (`model`, `model_revision` when known, `default_model`: whether it answers the plain subject,
/// `capabilities`: what the model does, comma-separated).
fn identity(served: &model::Served, capabilities: intake::Capabilities) -> micro::Identity {
    let mut metadata: std::collections::HashMap<String, String> = [
        ("protocol_version", PROTOCOL_VERSION),
        ("contract_version", CONTRACT_VERSION),
        (model_keys::MODEL_METADATA, served.model.name.as_str()),
        (
            model_keys::DEFAULT_METADATA,
            if served.plain { "true" } else { "false" },
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    metadata.insert(
        model_keys::CAPABILITIES_METADATA.to_owned(),
        capabilities.names().join(","),
    );
    if let Some(revision) = &served.model.revision {
        metadata.insert(
            model_keys::MODEL_REVISION_METADATA.to_owned(),
            revision.clone(),
        );
    }
    micro::Identity {
        name: SERVICE_NAME.to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        description: "embatch: batches embedding requests for an upstream model".to_owned(),
        metadata,
    }
}
