//! NATS intake: the worker's `embed` endpoint, from message to batcher and back.
//!
//! Requests arrive on the request subject in the shared queue group while the worker is a
//! member ([`crate::group`]); they are counted under the `embed` endpoint of the worker's NATS
//! micro service ([`crate::micro`]: `$SRV.PING`, `$SRV.INFO`, `$SRV.STATS`).
//!
//! The intake loop never waits on the batcher: it parses, validates, admits (or answers an error
//! at once) and moves on, so the client's subscription buffer, which would drop messages silently
//! when full, never fills; our own bound (`QUEUE_CAP`) bites first. Counting a request's tokens
//! ([`crate::tokens`]) is CPU work, so it runs in the request's own reply task, which then
//! submits the request to the batcher: the loop never waits on a tokenizer. A large body (over
//! [`held::LARGE_BODY_BYTES`]) is refused before it is parsed when the worker holds too much
//! input for it, and otherwise parsed outside the loop ([`held`]): the loop keeps up with the
//! subscription, whose waiting messages each pin about twice their size.
//!
//! Two things are answered here rather than left to time out:
//! - withdrawal: a message on `<subject>.cancel` carrying a request's [`headers::REQUEST_ID`]
//!   drops it (no reply, no upstream work);
//! - replies over the NATS server's `max_payload`: the server would refuse them and the caller
//!   would wait its whole deadline. Once the worker has seen one embedding, it knows the reply
//!   size per input and refuses a request whose reply cannot fit at once with 413 naming the
//!   limit; a reply that still turns out too large is replaced by that 413.

mod admit;
mod capabilities;
mod classify;
mod held;
mod reply;
mod rerank;
mod shape;
mod sparse;
mod tokenize;
mod withdraw;
mod work;

use std::sync::Arc;
use std::time::Duration;

use async_nats::{HeaderMap, Message};
use embatch_client::{header, header_in};
use embatch_protocol::{EmbedError, PROTOCOL_VERSION, headers};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::batcher::BatcherHandle;
use crate::cache::Cache;
use crate::group::{Event, Group};
use crate::micro::EndpointStats;
use crate::tenant::{Caller, TenantPolicy};
use crate::tokens::Counter;
pub use capabilities::Capabilities;
pub use classify::ClassifyRoutes;
pub use held::LARGE_BODY_BYTES;
use held::{Held, HeldShare};
use reply::ReplyLimit;
pub use rerank::RerankConfig;
pub use sparse::SparseConfig;
pub use tokenize::TokenRoutes;
use withdraw::Registration;
pub(crate) use withdraw::{Withdrawable, withdraw};

/// Settings of the intake loop.
#[derive(Debug, Clone)]
pub struct IntakeConfig {
    /// Deadline applied when a request carries no [`headers::DEADLINE_MS`].
    pub default_deadline: Duration,
    /// Most inputs in one request (413 beyond).
    pub max_client_batch_size: usize,
    /// The NATS server's `max_payload` in bytes (from its INFO): the largest reply it relays.
    pub max_payload: usize,
    /// This worker's service id: the [`headers::ACCEPTED_BY`] of its acknowledgements.
    pub worker_id: String,
    /// Most bytes of input held, accepted and not yet answered (`MAX_QUEUE_BYTES`): a body over
    /// [`LARGE_BODY_BYTES`] that would take the worker past it is refused before it is parsed.
    pub max_queue_bytes: usize,
    /// The rerank subjects and whether the model reranks.
    pub rerank: RerankConfig,
    /// The sparse-embedding subjects and whether the model has sparse output.
    pub sparse: SparseConfig,
    /// The tokenize and decode subjects and the upstream's routes.
    pub tokens: TokenRoutes,
    /// The predict, embed_all and similarity subjects and what the model does.
    pub classify: ClassifyRoutes,
    /// Whether the upstream takes a `prompt_name` (TEI, the built-in model; an OpenAI-compatible
    /// server does not): a `prompt_hint` the worker cannot resolve is passed on only then.
    pub upstream_prompts: bool,
}

/// What the intake runs on ([`run`]): where requests come from, and what admits them.
pub(crate) struct Intake {
    /// The request subject's queue subscription and the membership deciding it.
    pub group: Group,
    /// Where accepted requests go and where their answers are sent.
    pub serving: Serving,
    /// The acknowledged requests held, which the heartbeat follows.
    pub acked: Arc<crate::heartbeat::Acked>,
}

/// Where accepted requests go and where their answers are sent: what every admission uses, in
/// the loop and in the tasks that admit large bodies ([`Admitter`]).
pub(crate) struct Serving {
    /// Where accepted requests are submitted; the intake holds the last handle (a reply task
    /// holds a clone only until it has submitted), so the batcher ends after the intake does.
    pub batcher: BatcherHandle,
    /// Counts each request's tokens before it is submitted.
    pub counter: Counter,
    /// Limits and defaults.
    pub config: IntakeConfig,
    /// The reply tasks, one per accepted request: close and wait on it (after the batcher ends)
    /// to know every accepted request was answered.
    pub replies: TaskTracker,
    /// The requests that may be withdrawn, shared with [`withdraw`].
    pub withdrawable: Arc<Withdrawable>,
    /// The connection replies are sent on.
    pub client: async_nats::Client,
    /// The `embed` endpoint's `$SRV.STATS` counters.
    pub stats: EndpointStats,
    /// The cache and in-flight de-duplication every request goes through first.
    pub cache: Arc<Cache>,
    /// Decides each request's tenant.
    pub tenants: TenantPolicy,
}

/// How long shutdown waits for the server to confirm the drain (its PONG) while still admitting
/// the requests it delivered before the unsubscribe.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Reads requests from `intake.group` until `stop` is cancelled, then leaves the queue group for
/// good: the subscription drains (NATS drain: UNSUB, then PING; the server routes nothing here
/// after its PONG), and every request delivered until then is admitted. Requests and membership
/// events alternate in one loop, so admitting a request and re-deciding membership never race
/// (a large body, parsed outside the loop, is submitted a moment later).
/// Also ends, at once, when the connection closes.
pub(crate) async fn run(intake: Intake, stop: CancellationToken) {
    let Intake {
        mut group,
        serving,
        acked,
    } = intake;
    let mut reconnects = crate::reconnect::Reconnects::new(&serving.client);
    let max_payload = serving.config.max_payload;
    let admitter = Arc::new(Admitter {
        reply_limit: Arc::new(ReplyLimit::new(max_payload)),
        token_vectors_limit: Arc::new(ReplyLimit::new(max_payload)),
        acks: Acks {
            worker_id: Arc::from(serving.config.worker_id.as_str()),
            delay_ms: headers::ACK_DELAY.as_millis().to_string().into(),
            acked,
        },
        held: Arc::new(Held::default()),
        parsing: tokio::sync::Semaphore::new(
            std::thread::available_parallelism().map_or(1, |n| n.get()),
        ),
        serving,
    });
    loop {
        let event = tokio::select! {
            event = group.next() => event,
            () = stop.cancelled() => break,
        };
        match event {
            Event::Request(request) => {
                reconnects.check(&admitter.serving.batcher);
                let span = crate::trace::request_span(&request);
                let member = group.state().is_member();
                admitter.receive(request, member).instrument(span).await;
                group.admitted().await;
            }
            Event::Control(control) => group.control(control).await,
            Event::Ended => return,
        }
    }
    tracing::info!("shutdown: draining the request subscription");
    group.stop().await;
    // Ends when the drained subscription ends; what is lost around the UNSUB was never
    // acknowledged, and acknowledging clients resend it (see `crate::group`).
    while let Ok(event) = tokio::time::timeout(DRAIN_TIMEOUT, group.next()).await {
        match event {
            Event::Request(request) => {
                let span = crate::trace::request_span(&request);
                admitter.receive(request, false).instrument(span).await;
            }
            Event::Ended => break,
            Event::Control(_) => {}
        }
    }
}

/// What this worker puts in acknowledgements: its id ([`headers::ACCEPTED_BY`]) and its delay
/// ([`headers::ACK_DELAY_MS`]), shared by the reply tasks, and the count of acknowledged
/// requests the heartbeat follows.
#[derive(Clone)]
struct Acks {
    worker_id: Arc<str>,
    delay_ms: Arc<str>,
    acked: Arc<crate::heartbeat::Acked>,
}

/// Whether `request` asks for an acknowledgement ([`headers::ACK`]).
fn wants_ack(request: &Message) -> bool {
    header(request, headers::ACK) == Some("1")
}

/// A request's time budget: its [`headers::DEADLINE_MS`], else `default`.
///
/// # Errors
/// 422 `Validation` for a [`headers::VERSION`] of another major version than
/// [`PROTOCOL_VERSION`], a [`headers::HEARTBEAT_TO`] that is not a subject without wildcards, or
/// a deadline that is not a whole number of milliseconds.
fn budget(message_headers: Option<&HeaderMap>, default: Duration) -> Result<Duration, EmbedError> {
    if let Some(version) = header_in(message_headers, headers::VERSION) {
        let major = version.split('.').next().unwrap_or_default();
        if major != PROTOCOL_VERSION {
            return Err(EmbedError::Validation(format!(
                "header `{}`: version {} is not supported; this worker speaks {PROTOCOL_VERSION}",
                headers::VERSION,
                version
            )));
        }
    }
    if let Some(to) = header_in(message_headers, headers::HEARTBEAT_TO)
        && !headers::valid_heartbeat_to(to)
    {
        return Err(EmbedError::Validation(format!(
            "header `{}` must be a NATS subject without wildcards of at most {} bytes. Given: {:?}",
            headers::HEARTBEAT_TO,
            headers::HEARTBEAT_TO_MAX,
            to
        )));
    }
    match header_in(message_headers, headers::DEADLINE_MS) {
        Some(value) => headers::parse_deadline(value).ok_or_else(|| {
            EmbedError::Validation(format!(
                "header `{}` must be a whole number of milliseconds. Given: {:?}",
                headers::DEADLINE_MS,
                value
            ))
        }),
        None => Ok(default),
    }
}

/// Sleeps until `at`, or forever when `None`.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Acks {
    /// Tells the client of `request` that this worker holds it: an empty message with
    /// [`headers::ACCEPTED_BY`] (and the connection's [`headers::WORKER_CONNECTS`]) on its reply
    /// subject, so the client can resend what it never saw acknowledged or answered, or what a
    /// worker that went silent or reconnected held. The request counts for the heartbeat until
    /// the returned guard is dropped (when its task ends).
    async fn send(&self, client: &async_nats::Client, request: &Message) -> crate::heartbeat::Held {
        let held = self.acked.hold(&request.subject, heartbeat_to(request));
        acknowledge(client, request, &self.worker_id).await;
        held
    }
}

/// Where the heartbeat for `request` goes: its [`headers::HEARTBEAT_TO`] when valid, unless the
/// request crossed a service import from another account (it carries
/// [`headers::REQUEST_INFO`], or its reply subject is nats-server's `_R_.` mapping): a subject of
/// the client's account is out of this worker's reach there, while the shared heartbeat subject
/// is exported to it. `None`: the shared subject.
fn heartbeat_to(request: &Message) -> Option<&str> {
    let crossed = header(request, headers::REQUEST_INFO).is_some()
        || request
            .reply
            .as_ref()
            .is_some_and(|reply| reply.starts_with("_R_."));
    header(request, headers::HEARTBEAT_TO).filter(|to| !crossed && headers::valid_heartbeat_to(to))
}

/// The acknowledgement itself ([`Acks::send`]).
async fn acknowledge(client: &async_nats::Client, request: &Message, worker_id: &str) {
    let Some(inbox) = request.reply.clone() else {
        return;
    };
    let mut ack = HeaderMap::new();
    ack.insert(headers::ACCEPTED_BY, worker_id);
    ack.insert(
        headers::WORKER_CONNECTS,
        crate::reconnect::connects(client).to_string().as_str(),
    );
    if let Err(err) = client
        .publish_with_headers(inbox, ack, bytes::Bytes::new())
        .await
    {
        tracing::debug!(%err, "cannot acknowledge a request");
    }
}

/// What admitting a request needs, shared by the intake loop and the tasks that admit large
/// bodies outside it. Such a task holds it only while it admits (the batcher ends once the
/// intake and these tasks are done: a reply task holds the batcher only until it has submitted).
struct Admitter {
    serving: Serving,
    /// Checked, and taught, by every embedding reply (`/embed`, `/embed_sparse`).
    reply_limit: Arc<ReplyLimit>,
    /// Checked, and taught, by every `/embed_all` reply (see [`shape::Limit`]).
    token_vectors_limit: Arc<ReplyLimit>,
    acks: Acks,
    /// The bodies held, from arrival to answer.
    held: Arc<Held>,
    /// One permit per CPU: large bodies parsed at a time ([`Admitter::admit_large`]).
    parsing: tokio::sync::Semaphore,
}

/// A request as it arrived, and what the loop decided of it.
struct Arrival {
    request: Message,
    received: Instant,
    wants_ack: bool,
    /// Its tenant.
    caller: Caller,
    /// Its entry among the withdrawable requests, when it carries an id.
    registered: Registration,
    /// Cancelled when it is withdrawn.
    cancelled: CancellationToken,
    /// Its body's share of what the worker holds.
    share: HeldShare,
    /// Out of the queue group (full, which it leaves only for a peer with room; its upstream
    /// failing or stalled; stopping) when it arrived, and it asks for an acknowledgement: a 429
    /// would fail it only because of where it was routed, so a client that resends gets a 503
    /// to resend on instead.
    hand_back: bool,
}

impl Admitter {
    /// Takes one request from the loop: ignores one without a reply subject, acknowledges a copy
    /// of a request held already, refuses a large body that cannot fit (429, before parsing),
    /// else admits it ([`Admitter::admit`]): here, or for a large body in a task of its own.
    /// `member`: whether the worker is in the queue group now. A request that asks for an
    /// acknowledgement ([`headers::ACK`]) gets one when it is still held [`headers::ACK_DELAY`]
    /// after it arrived (at once for a copy of a request held already); its reply carries
    /// [`headers::ACK_DELAY_MS`].
    async fn receive(self: &Arc<Self>, request: Message, member: bool) {
        let received = Instant::now();
        let serving = &self.serving;
        if request.reply.is_none() {
            metrics::counter!(crate::telemetry::names::REQUESTS, "outcome" => "no_reply_subject")
                .increment(1);
            tracing::debug!(
                "ignoring a message without a reply subject: it was published, not requested"
            );
            return;
        }
        let wants_ack = wants_ack(&request);
        // Who it is for comes first, as authentication would (400 or 403 before anything).
        let caller = match serving.tenants.resolve(request.headers.as_ref()) {
            Ok(caller) => caller,
            Err(err) => {
                let err = err.into();
                return self.refuse(err, &request, wants_ack, received, None).await;
            }
        };
        let id = header(&request, headers::REQUEST_ID).map(Arc::<str>::from);
        if self.answer_copy(&request, id.as_deref(), wants_ack).await {
            return;
        }
        let body = request.payload.len();
        let max = serving.config.max_queue_bytes;
        if let Some(held) = self.held.refuses(body, max) {
            let err = EmbedError::Overloaded(format!(
                "the worker holds {held} bytes of input, no room for a request of {body} bytes \
                 (MAX_QUEUE_BYTES = {max}); retry in ~{} ms",
                serving.batcher.retry_after_hint().as_millis().max(1)
            ));
            return self
                .refuse(err, &request, wants_ack, received, Some(&caller))
                .await;
        }
        let cancelled = CancellationToken::new();
        let registered = Registration(id.map(|id| {
            serving.withdrawable.insert(id.clone(), cancelled.clone());
            (Arc::clone(&serving.withdrawable), id)
        }));
        let arrival = Arrival {
            request,
            received,
            wants_ack,
            caller,
            registered,
            cancelled,
            share: self.held.take(body),
            hand_back: wants_ack && !member,
        };
        if let Some(route) = serving.config.tokens.route_of(&arrival.request.subject) {
            self.pass_through(route, arrival);
            return;
        }
        if body > LARGE_BODY_BYTES {
            // Copied out of the connection's read buffer first (a tenth of what parsing costs):
            // the buffer, about twice the body's size, is freed now, not once it is parsed.
            let mut arrival = arrival;
            arrival.request.payload = bytes::Bytes::copy_from_slice(&arrival.request.payload);
            let admit = Arc::clone(self).admit_large(arrival);
            serving
                .replies
                .spawn(admit.instrument(crate::trace::current()));
        } else {
            self.admit(arrival).await;
        }
    }

    /// Whether `request` is a copy its client resent (see `embatch_client::EmbedClient::embed`)
    /// of the request `id` this worker already holds: that one answers on the same reply
    /// subject. The client resent it for want of an acknowledgement, so it gets one now (the
    /// heartbeat follows the copy held, which asked for an acknowledgement too), and the copy is
    /// counted as a duplicate.
    async fn answer_copy(&self, request: &Message, id: Option<&str>, wants_ack: bool) -> bool {
        if !id.is_some_and(|id| self.serving.withdrawable.holds(id)) {
            return false;
        }
        if wants_ack {
            acknowledge(&self.serving.client, request, &self.acks.worker_id).await;
        }
        metrics::counter!(crate::telemetry::names::REQUESTS, "outcome" => "duplicate").increment(1);
        true
    }

    /// Passes a tokenize or decode request (`route`) to the upstream in a task of its own
    /// ([`tokenize::PassTask`]): no batch, no admission.
    fn pass_through(&self, route: &'static str, arrival: Arrival) {
        let budget = budget(
            arrival.request.headers.as_ref(),
            self.serving.config.default_deadline,
        );
        let ack = arrival.wants_ack.then(|| self.acks.clone());
        let task = tokenize::PassTask {
            route,
            arrival,
            budget,
            max_inputs: self.serving.config.max_client_batch_size,
            caller: self.serving.config.tokens.caller(),
            client: self.serving.client.clone(),
            stats: self.serving.stats.clone(),
            ack,
        };
        self.serving
            .replies
            .spawn(task.run().instrument(crate::trace::current()));
    }
}
