//! The worker as a task tree: [`start`] spawns every long-lived task onto one [`TaskTracker`]
//! under one [`CancellationToken`], and [`Running::serve_until`] stops them in one ordered sequence.
//!
//! The tree:
//! - `stop` (the root token) ends the discovery responder (`$SRV.PING`/`INFO`/`STATS`,
//!   [`crate::micro`]), the heartbeat ([`crate::heartbeat`]; it beats until every accepted
//!   request is answered, so a graceful stop never looks like a death), the withdrawal of
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
use embatch_protocol::{CONTRACT_VERSION, PROTOCOL_VERSION, SERVICE_NAME, headers};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::upstream::Upstream;
use crate::{
    Config, WorkerError, batcher, bulk, cache, group, heartbeat, http, info, intake, membership,
    micro, model, tokens,
};

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
    let intake_stop = stop.child_token();
    let tasks = TaskTracker::new();
    // Read before anything is joined: a broken file stops the worker at start.
    let tenants = crate::tenant::TenantPolicy::new(
        embatch_runtime::tenants::watch(config.tenants_file.as_deref(), stop.clone())?,
        config.trusted_account.clone(),
    );
    let upstream = Arc::new(upstream);
    let service_error = |what: &'static str| {
        move |source: async_nats::SubscribeError| WorkerError::Service {
            what,
            source: source.into(),
        }
    };
    let admin = match config.metrics_addr.0 {
        Some(addr) => {
            Some(http::AdminServer::bind(addr, client.clone(), &served.model.name).await?)
        }
        None => None,
    };

    // The model subject first, then the plain subject when this worker serves the default model.
    let info_subjects: Vec<String> = served
        .subjects
        .iter()
        .map(|s| headers::info_subject(s))
        .collect();
    let embed_stats = micro::EndpointStats::new("embed", &served.subjects[0], &config.queue_group);
    let info_stats =
        micro::EndpointStats::new(info::ENDPOINT, &info_subjects[0], &config.queue_group);
    let mut endpoints = vec![embed_stats.clone(), info_stats.clone()];
    for (subject, info_subject) in served.subjects.iter().zip(&info_subjects).skip(1) {
        endpoints.push(embed_stats.also_on(subject));
        endpoints.push(info_stats.also_on(info_subject));
    }
    // Rerank requests (contract v1.2) share the intake, and its counters, with embeddings.
    for subject in &served.subjects {
        let rerank_subject = embatch_protocol::rerank::rerank_subject(subject);
        endpoints.push(embed_stats.also_as("rerank", &rerank_subject));
    }
    let membership = membership::Membership::new(config.membership);
    let (state, state_rx) = tokio::sync::watch::channel(membership.state());
    let heartbeat_state = state_rx.clone();
    let id = service_id(&client);
    let discovery = micro::Discovery::subscribe(
        client.clone(),
        id.clone(),
        identity(&served),
        endpoints,
        state_rx.clone(),
    )
    .await
    .map_err(service_error("service discovery"))?;
    let info = info::Endpoint::subscribe(
        client.clone(),
        info_subjects,
        config.queue_group.clone(),
        Arc::clone(&upstream),
        config.max_client_batch_size,
        info_stats,
    )
    .await
    .map_err(service_error("endpoint info"))?;
    let (probes, probe_results) = match config.membership {
        membership::Mode::Adaptive => {
            let (probes, results) = group::Probes::new(Arc::clone(&upstream), state_rx);
            (Some(probes), Some(results))
        }
        membership::Mode::Static => (None, None),
    };
    let counter = upstream
        .counter(&tokens::TokenizerLookup {
            path: config.tokenizer.clone(),
        })
        .await
        .with_pending_limit(config.queue_cap)
        .with_pending_bytes(config.max_queue_bytes);
    tracing::info!(source = %counter.source(), "token counts");
    // The token budget's defaults come from what the upstream reports of itself.
    let upstream_info = upstream.info().await.ok();
    let rerank =
        intake::RerankConfig::new(&served.subjects, &served.model.name, upstream_info.as_ref());
    let (batcher, batcher_task) = batcher::spawn(
        Arc::clone(&upstream),
        config.batcher(upstream_info.as_ref()),
    );
    let bulk_gate = batcher.bulk_gate();
    // The model's identity for the cache key comes from the same /info.
    let cache = Arc::new(
        cache::Cache::start(
            &client,
            &config.cache(),
            upstream_info.as_ref(),
            &stop,
            &tasks,
        )
        .await,
    );
    let group = group::Group::join(
        client.clone(),
        group::Address {
            subject: config.subject.clone(),
            // The rerank subjects join and leave with the embedding subjects.
            subjects: served
                .subjects
                .iter()
                .chain(&rerank.subjects)
                .cloned()
                .collect(),
            queue_group: config.queue_group.clone(),
            speaker: crate::peers::Speaker {
                id: id.clone(),
                model: served.model.clone(),
                plain: served.plain,
            },
        },
        membership,
        state,
        batcher.clone(),
        probe_results,
    )
    .await
    .map_err(service_error("endpoint embed"))?;
    // Requests sent on either subject are withdrawn on that subject's cancel subject.
    let mut cancels = futures::stream::SelectAll::new();
    for subject in &served.subjects {
        cancels.push(
            client
                .subscribe(headers::cancel_subject(subject))
                .await
                .map_err(service_error("cancel subscription"))?,
        );
    }

    let replies = TaskTracker::new();
    let withdrawable = Arc::new(intake::Withdrawable::default());
    tasks.spawn(discovery.run(stop.clone()));
    tasks.spawn(heartbeat::run(
        client.clone(),
        served.subjects.clone(),
        id.clone(),
        heartbeat_state,
        stop.clone(),
    ));
    tasks.spawn(intake::withdraw(
        cancels,
        Arc::clone(&withdrawable),
        stop.clone(),
    ));
    if let Some(admin) = admin {
        tasks.spawn(admin.run(stop.clone()));
    }
    tasks.spawn(info.run(intake_stop.clone(), tasks.clone()));
    if let Some(probes) = probes {
        tasks.spawn(probes.run(intake_stop.clone()));
    }
    let mut bulk_config = config.bulk();
    bulk_config.tenants = tenants.clone();
    bulk_config.model = served.model.name.clone();
    if bulk_config.default_model.is_empty() {
        bulk_config.default_model = served.model.name.clone();
    }
    tasks.spawn(bulk::run(
        client.clone(),
        (bulk_gate, counter.clone()),
        bulk_config,
        intake_stop.clone(),
    ));
    let intake = tasks.spawn(intake::run(
        intake::Intake {
            group,
            batcher,
            counter,
            config: intake::IntakeConfig {
                default_deadline: config.default_deadline,
                max_client_batch_size: config.max_client_batch_size,
                max_payload: client.server_info().max_payload,
                worker_id: id,
                max_queue_bytes: config.max_queue_bytes,
                rerank,
            },
            replies: replies.clone(),
            withdrawable,
            client: client.clone(),
            stats: embed_stats,
            cache,
            tenants,
        },
        intake_stop.clone(),
    ));
    tracing::info!(
        model = %served.model,
        subjects = ?served.subjects,
        queue_group = %config.queue_group,
        membership = %config.membership,
        upstream_max_batch = upstream.max_batch_size(),
        "worker ready"
    );
    Ok(Running {
        stop,
        intake_stop,
        tasks,
        intake,
        batcher: batcher_task,
        replies,
        client,
        shutdown_grace: config.shutdown_grace,
    })
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
/// (`model`, `model_revision` when known, `default_model`: whether it answers the plain subject).
fn identity(served: &model::Served) -> micro::Identity {
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
