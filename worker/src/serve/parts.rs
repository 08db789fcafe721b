//! What [`start`](super::start) builds before anything runs ([`Parts::build`]: the admin
//! server, discovery, `info`, the routes, the batcher, the cache, the queue group and the cancel
//! subjects), and the spawn of the task tree from it ([`Parts::spawn`]).

use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::Running;
use super::identity::{identity, service_id};
use super::subjects::{Endpoints, address, subscribe_cancels};
use crate::upstream::Upstream;
use crate::{
    Config, WorkerError, batcher, bulk, cache, group, heartbeat, http, info, intake, membership,
    micro, model, tokens,
};

/// What [`start`](super::start) subscribes and builds before it spawns anything of the intake.
pub(super) struct Parts<U> {
    admin: Option<http::AdminServer>,
    discovery: micro::Discovery,
    info: info::Endpoint<U>,
    probes: Option<crate::probes::Probes<U>>,
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

/// What the upstream reports of itself (TEI's `/info`), which decides the token budget's
/// defaults, the routes (and the capabilities discovery announces) and the model's identity for
/// the cache; `None` when it cannot be had. It was read at connect when the upstream answered
/// then; an upstream that hangs must not keep the worker out of discovery, so a second attempt
/// here is bounded as the `info` endpoint's is ([`info::UPSTREAM_INFO_WAIT`], 500 ms).
async fn startup_info<U: Upstream>(upstream: &U) -> Option<serde_json::Value> {
    tokio::time::timeout(info::UPSTREAM_INFO_WAIT, upstream.info())
        .await
        .ok()
        .and_then(Result::ok)
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
        intake::ClassifyRoutes::new(subjects, model, info)
            .normalizing_similarity(!upstream.unnormalized()),
    )
}

impl<U: Upstream> Parts<U> {
    /// Binds the admin server, subscribes discovery, `info`, the queue group and the cancel
    /// subjects, and starts the batcher and the cache (the cache's tasks on `tasks`, under
    /// `stop`).
    pub(super) async fn build(
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
        let upstream_info = startup_info(upstream.as_ref()).await;
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
            id,
        })
    }

    /// Spawns the tree: under `stop` discovery, the heartbeat, withdrawals and the admin
    /// server; under its child the intake, `info`, the probes and the bulk lane.
    pub(super) fn spawn(
        self,
        client: async_nats::Client,
        config: &Config,
        (served, tenants): (model::Served, crate::tenant::TenantPolicy),
        (stop, tasks): (CancellationToken, TaskTracker),
    ) -> Running {
        let intake_stop = stop.child_token();
        let replies = TaskTracker::new();
        let withdrawable = Arc::new(intake::Withdrawable::default());
        let acked = Arc::new(heartbeat::Acked::new(served.subjects.clone()));
        tasks.spawn(self.discovery.run(stop.clone()));
        tasks.spawn(heartbeat::run(
            heartbeat::Beat {
                client: client.clone(),
                id: self.id.clone(),
                state: self.heartbeat_state,
                acked: Arc::clone(&acked),
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
        tasks.spawn(embatch_bulk::run(
            client.clone(),
            bulk::host(&self.batcher, &self.counter, &tenants),
            bulk_config(config, &served),
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
            upstream_prompts: config.openai_url.is_none(),
        };
        let intake = tasks.spawn(intake::run(
            intake::Intake {
                group: self.group,
                serving: intake::Serving {
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
                acked,
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
    Option<crate::probes::Probes<U>>,
    Option<tokio::sync::mpsc::Receiver<bool>>,
) {
    match mode {
        membership::Mode::Adaptive => {
            let (probes, results) = crate::probes::Probes::new(Arc::clone(upstream), state);
            (Some(probes), Some(results))
        }
        membership::Mode::Static => (None, None),
    }
}

/// The bulk lane's settings: `BULK_*` and the served model (also the default model of bulk
/// lines that name none, unless set).
fn bulk_config(config: &Config, served: &model::Served) -> embatch_bulk::BulkConfig {
    let mut bulk_config = config.bulk();
    bulk_config.model = served.model.name.clone();
    if bulk_config.default_model.is_empty() {
        bulk_config.default_model = served.model.name.clone();
    }
    bulk_config
}
