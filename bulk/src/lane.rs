//! The workers' side of the bulk lane: batch jobs read from NATS JetStream, embedded in the
//! capacity interactive traffic leaves.
//!
//! Two loops share the worker's upstream with the interactive batcher:
//! - [`jobs`]: the durable pull consumer `bulk-jobs` (job messages): [`validate`] reads a
//!   batch's input file ([`input`]), checks every line ([`lines`]) and publishes its work items;
//!   [`finalize`] reads the results back, writes the output and error files and sets the final
//!   status. A job that keeps failing ends its batch `failed` after `BULK_MAX_DELIVER`
//!   deliveries.
//! - [`items`]: the durable pull consumer `bulk-items` (work items, one chunk of input lines
//!   each): each line goes to the batcher as a bulk request ([`BulkGate`]), which fills the
//!   room interactive batches of the same options leave with bulk inputs and sends bulk inputs
//!   alone only while nothing interactive waits and fewer than `BULK_CALLS` calls are in
//!   flight; the chunk's output lines are published to the results stream, the batch's
//!   progress is updated by compare-and-set, and the message is acked.
//!
//! A third, [`sweep`], gives back messages stranded below a consumer's ack floor (seen after a
//! nats-server restart), so no batch can stay `in_progress` for want of a delivery.
//!
//! Every worker runs both loops on the same two consumers: each message goes to one worker, and
//! a worker that dies leaves its messages unacked, so JetStream redelivers them to another after
//! `BULK_ACK_WAIT` (in-progress acks keep a long call's message from being redelivered). The
//! contract is `embatch_protocol::bulk`; docs/design/bulk-jobs.md explains the choices.
//!
//! The lane starts only when JetStream answers; until then (a server without `-js`) it retries
//! every [`RETRY`] and the interactive path is unaffected.

mod claim;
mod error;
mod finalize;
mod input;
mod items;
mod jobs;
mod lines;
mod progress;
mod render;
mod sweep;
mod validate;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{self, AckPolicy};
use async_nats::jetstream::{AckKind, Message};
use embatch_protocol::bulk::{JOBS_CONSUMER, JOBS_FILTER, items_consumer, items_filter};
use embatch_runtime::usage::UsageBook;
use tokio_util::sync::CancellationToken;

pub use lines::LineLimits;

use crate::{BulkError, BulkStore, Host, Owners, TokenCounter};

/// How long the lane waits before asking JetStream again after it did not answer.
pub const RETRY: Duration = Duration::from_secs(5);

/// The bulk lane's settings (the worker's `BULK_*` settings).
#[derive(Debug, Clone)]
pub struct BulkConfig {
    /// Take bulk work at all.
    pub enabled: bool,
    /// Inputs per work item: lines are grouped until a chunk holds at least this many inputs
    /// (a line is never split), so a chunk fills one upstream call of `MAX_BATCH_SIZE`.
    pub chunk_inputs: usize,
    /// Most bytes of input text per work item, so an item and its results stay well under the
    /// server's `max_payload`.
    pub chunk_bytes: usize,
    /// Most upstream calls in flight (interactive and bulk alike) under which a batch of bulk
    /// inputs alone may start (see [`embatch_batcher::BulkGate::limit_calls`]).
    pub calls: usize,
    /// Deliveries of a work item whose upstream call fails before its lines go to the error
    /// file (`upstream_failed`); and of a job (`validate`, `finalize`) that keeps failing before
    /// its batch is `failed` (see [`BulkConfig::give_up_bound`]).
    pub max_deliver: i64,
    /// How long a delivered message may go without an ack or in-progress ack before JetStream
    /// redelivers it.
    pub ack_wait: Duration,
    /// The limits input lines are checked against.
    pub limits: LineLimits,
    /// The model this worker serves: it takes the work items of that model's batches only
    /// ([`embatch_protocol::bulk::items_consumer`]). Set once the model is known.
    pub model: String,
    /// The model of a batch whose lines name none: `EMBATCH_DEFAULT_MODEL`, else `model` (every
    /// worker then answers the plain subject: a fleet of one model).
    pub default_model: String,
    /// `EMBATCH_SUBJECT`: where discovery finds the models served (a line naming another model
    /// fails validation).
    pub subject: String,
    /// Replicas of the bulk streams, buckets and object store (`JETSTREAM_REPLICAS`), resolved
    /// against the cluster when the store is bound; the consumers follow their stream's.
    pub replicas: embatch_runtime::Replicas,
}

impl BulkConfig {
    /// The longest a job whose runs keep failing holds its batch before the batch is `failed`,
    /// beyond the time its runs spend making progress: `max_deliver` deliveries, each ending
    /// at most its stall limit (twice `ack_wait`, at least 30 s) after its last progress and
    /// delivered again at most `ack_wait` later. 450 s with the worker's defaults (5, 30 s),
    /// as docs/bulk.md says.
    pub fn give_up_bound(&self) -> Duration {
        jobs::give_up_bound(self.max_deliver, self.ack_wait)
    }
}

/// Runs the bulk lane until `stop`: binds the store (retrying every [`RETRY`] while JetStream
/// does not answer), then runs the jobs and items loops. Lines go to the batcher through
/// `host.gate`, their tokens counted by `host.tokens` as the worker counts a request's, each
/// batch's owner decided and counted by `host.owners`.
pub async fn run(
    client: async_nats::Client,
    host: Host,
    config: BulkConfig,
    stop: CancellationToken,
) {
    if !config.enabled {
        return;
    }
    let mut told = false;
    let store = loop {
        match BulkStore::open_with(client.clone(), config.replicas.resolve(&client)).await {
            Ok(store) => break store,
            Err(err) => {
                // Once at info (a server without JetStream is a normal set-up), then at debug.
                if told {
                    tracing::debug!(%err, "bulk lane still waiting for JetStream");
                } else {
                    tracing::info!(%err, "bulk lane waiting for JetStream; interactive requests are served meanwhile");
                    told = true;
                }
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(RETRY) => {}
                }
            }
        }
    };
    let (jobs, items) = match consumers(&store, &config).await {
        Ok(consumers) => consumers,
        Err(err) => {
            tracing::error!(%err, "cannot create the bulk consumers; bulk lane off");
            return;
        }
    };
    let max_payload = client.server_info().max_payload;
    let usage = UsageBook::start(client.clone(), config.replicas, stop.clone());
    let Host {
        gate,
        tokens,
        owners,
    } = host;
    let lane = Arc::new(Lane {
        store,
        config,
        max_payload,
        client: client.clone(),
        tokens,
        owners,
        usage,
    });
    tracing::info!(
        chunk_inputs = lane.config.chunk_inputs,
        calls = lane.config.calls,
        failing_job_ends_within = ?lane.config.give_up_bound(),
        "bulk lane ready"
    );
    tokio::join!(
        sweep::run(Arc::clone(&lane), jobs.clone(), items.clone(), stop.clone()),
        jobs::run(Arc::clone(&lane), jobs, stop.clone()),
        items::run(lane, items, gate, stop),
    );
}

/// What both loops share.
pub(crate) struct Lane {
    pub store: BulkStore,
    pub config: BulkConfig,
    /// The server's `max_payload` in bytes.
    pub max_payload: usize,
    /// The connection (service discovery of the models served).
    pub client: async_nats::Client,
    /// Counts each line's tokens, for batching and for the line's `usage`.
    pub tokens: Arc<dyn TokenCounter>,
    /// Decides each batch's owner and counts its lines under it.
    pub owners: Arc<dyn Owners>,
    /// The owners' usage per day, where `GET /v1/usage` reads it.
    pub usage: UsageBook,
}

type PullConsumer = consumer::Consumer<consumer::pull::Config>;

/// The two durable pull consumers: the jobs', which all workers share, and the items' of this
/// worker's model, which that model's workers share. Their `num_replicas` is left at 0: the
/// work stream's count (JetStream requires a work-queue stream's consumers to match it, and
/// moves them with it when it changes). Explicit acks, `ack_wait`, unlimited
/// deliveries on the server (the worker applies `BULK_MAX_DELIVER` itself, so a message is
/// never left stuck unacked past the server's limit).
async fn consumers(
    store: &BulkStore,
    config: &BulkConfig,
) -> Result<(PullConsumer, PullConsumer), BulkError> {
    let make = |name: &str, filter: &str| consumer::pull::Config {
        durable_name: Some(name.to_owned()),
        filter_subject: filter.to_owned(),
        ack_policy: AckPolicy::Explicit,
        ack_wait: config.ack_wait,
        max_deliver: -1,
        max_ack_pending: 10_000,
        ..Default::default()
    };
    let js = |e: &dyn std::fmt::Display| BulkError::JetStream(e.to_string());
    let jobs = store
        .work
        .get_or_create_consumer(JOBS_CONSUMER, make(JOBS_CONSUMER, JOBS_FILTER))
        .await
        .map_err(|e| js(&e))?;
    let items_name = items_consumer(&config.model);
    let items = store
        .work
        .get_or_create_consumer(&items_name, make(&items_name, &items_filter(&config.model)))
        .await
        .map_err(|e| {
            js(&format!(
                "{e} (a `bulk-items` consumer left by an older version overlaps the per-model \
                 ones: `nats consumer rm EMBATCH_BULK bulk-items`)"
            ))
        })?;
    Ok((jobs, items))
}

/// Runs `work` while sending an in-progress ack for `message` every third of `ack_wait`, so a
/// long upstream call, split or finalization is not redelivered meanwhile.
pub(crate) async fn with_progress<T>(
    message: &Message,
    ack_wait: Duration,
    work: impl std::future::Future<Output = T>,
) -> T {
    let every = (ack_wait / 3).max(Duration::from_millis(100));
    tokio::pin!(work);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = ticks.tick() => {
                if let Err(err) = message.ack_with(AckKind::Progress).await {
                    tracing::debug!(%err, "cannot send an in-progress ack");
                }
            }
        }
    }
}

/// The delivery count of `message` (1 on the first delivery).
pub(crate) fn delivered(message: &Message) -> i64 {
    message.info().map(|i| i.delivered).unwrap_or(1)
}

/// A new id `<prefix><nuid>`, as OpenAI's ids look (`batch_req_...`, `req_...`).
pub(crate) fn new_id(prefix: &str) -> String {
    format!("{prefix}{}", nuid::next())
}

/// How long one pull request waits on the server for a message before it is renewed.
const PULL_EXPIRES: Duration = Duration::from_secs(5);

/// The next message of `consumer` (one per pull request), or `None` once `stop` is cancelled. A
/// failed pull is logged (naming `what`) and retried after 1 s; an empty pull is renewed.
async fn next_message(
    consumer: &consumer::PullConsumer,
    stop: &CancellationToken,
    what: &str,
) -> Option<Message> {
    use futures::StreamExt;
    loop {
        let pulled = tokio::select! {
            () = stop.cancelled() => return None,
            pulled = async {
                let mut batch = consumer
                    .batch()
                    .max_messages(1)
                    .expires(PULL_EXPIRES)
                    .messages()
                    .await?;
                batch.next().await.transpose()
            } => pulled,
        };
        match pulled {
            Ok(Some(message)) => return Some(message),
            Ok(None) => {}
            Err::<_, async_nats::Error>(err) => {
                tracing::warn!(%err, "cannot pull {what}");
                tokio::select! {
                    () = stop.cancelled() => return None,
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    }
}
