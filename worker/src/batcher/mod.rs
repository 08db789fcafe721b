//! The batcher: an actor that turns many small requests into few full upstream calls.
//!
//! [`spawn`] starts one task, the actor, that owns all queue and admission state; callers send
//! it their request through a cloneable [`BatcherHandle`] and get the admit/refuse answer and
//! then the outcome on `oneshot` channels. The handle shares no lock with the actor: it runs
//! only the checks that need no state (400, 413, 504) and reads a copy of the admission ledger
//! the actor publishes after each step (for the queue-group membership's load).
//!
//! - `admission`: the queue bounds, the call-time estimate and the admit decision;
//! - `fair`: the upstream shared between tenants by weight ([`Share`]);
//! - `queue`: groups by options, due times, batch formation;
//! - `shape`: the token budget, the cost model and the length shaping of a batch;
//! - `actor`: the select loop, the supervised batch tasks, and every metric;
//! - `isolate`: one batch's upstream calls, and the bisection of a batch that failed because of an
//!   input;
//! - `unique`: each distinct input of a call sent once, its embedding fanned out to every
//!   position holding it.
//!
//! # How a batch forms
//! Requests are grouped by their [`EmbedOptions`] (requests whose options differ never share an
//! upstream call). At most `max_concurrent_batches` calls are in flight. Whenever a call slot is
//! free, the oldest group that is due leaves as one call of up to the batch limit (the smaller of
//! `max_batch_size` and the upstream's own limit) costing at most `max_batch_tokens` (see
//! `shape`: `longest × inputs` on a padded upstream, the sum of tokens on an unpadded one; an
//! input over the whole budget leaves alone). Every input carries its token count (see
//! [`BatcherHandle::submit`]). The batch is shaped by length: it holds the group's oldest waiting
//! input and, among the group's first 4 × batch-limit waiting inputs, those of the nearest
//! lengths (padded upstream; inputs of equal length in arrival order) or the oldest that fit the
//! budget (unpadded). So the oldest waiting input of a group is never passed over: it is in the
//! next batch of its group, and an input with `k` older inputs waiting in its group leaves with
//! one of the next `k + 1` batches of that group. Inside each call to a padded upstream the inputs
//! are sent shortest first (one grouping them in arrival order pads little); each request
//! still gets exactly its own embeddings, in its order. A group is due when:
//! - it holds a full batch (`max_batch_size` inputs, or tokens enough to fill
//!   `max_batch_tokens`): any free slot takes it;
//! - no call is in flight and `dispatch_when_idle` is on (the default): an idle upstream takes
//!   any waiting group at once, full or not;
//! - its oldest request has waited `max_wait` and fewer than `partial_batch_slots` calls are in
//!   flight (by default `max_concurrent_batches - 1`, at least 1): the slots beyond those take
//!   full batches only, so while the upstream is busy a batch that is not full keeps filling
//!   here rather than queueing inside the upstream;
//! - the batcher is shutting down: everything leaves.
//!
//! With the defaults (2 slots, 1 for partial batches, dispatch when idle) a batch that is not
//! full therefore leaves only when the upstream is idle, and `max_wait` never sends one (it still
//! enters the `auto` queue-delay bound below); it bounds the wait of a partial batch when
//! `dispatch_when_idle` is off or `partial_batch_slots` is above 1. A request with more inputs than the batch limit is split over several calls and
//! reassembled in order.
//!
//! # Overload
//! The actor decides admission when the request reaches it, before queueing it, and never
//! queues a request it expects to fail ([`BatcherHandle::submit`] delivers a refusal as the
//! outcome; [`BatcherHandle::try_submit`] waits for the answer):
//! - Bounds: at most `queue_cap` inputs and `max_queue_bytes` bytes of input text are accepted
//!   and not yet answered; beyond them a request gets 429 ([`EmbedError::Overloaded`]), and a
//!   request larger than a whole bound gets 413.
//! - A worker with nothing queued and a free upstream slot admits any request: the estimate
//!   below cannot lock it out.
//! - Otherwise the upstream call time, measured from completed calls, says when the request
//!   would start (the batches queued ahead, assumed full, pass `max_concurrent_batches` at a
//!   time; counted by inputs or by tokens, whichever needs more calls) and finish. It is
//!   admitted only if it would finish within 75 % of its deadline
//!   budget and, when it fits one upstream call, start within `max_queue_delay`; else 429, with
//!   a retry-after estimate ([`BatcherHandle::try_submit`], [`BatcherHandle::retry_after_hint`]).
//!   A request of several calls waits longer than the bound for its own work alone: its
//!   deadline, `queue_cap` and `max_queue_bytes` bound it (a closed-loop indexing client with
//!   8 requests of 512 inputs in flight is served, not shed).
//! - `max_queue_delay` defaults to `auto`: 2 × the measured call time + `max_wait`, but at
//!   least [`AUTO_FLOOR`] (500 ms) while fewer than [`AUTO_FLOOR_INPUTS`] (512) are queued. A
//!   queue longer than what keeps the upstream busy adds latency, never throughput: with every
//!   slot busy, the next batch of each slot must be ready when it frees, which is one call time
//!   of queued work; 2 calls allow as much again as slack for bursts and for the estimate's
//!   error (it assumes full batches), plus the `max_wait` a forming batch may spend. Beyond that
//!   a worker steers new work to peers with room (membership); it sheds there only once the
//!   queue is also long in inputs or in time: in front of a fast upstream, a closed loop of a
//!   few hundred callers keeps a standing queue of many calls with no overload, and a 429 only
//!   makes them resend, while an open loop over capacity fills 512 inputs within a second
//!   (docs/design/queue-delay-floor.md). For a request that fits one call, a client's deadline
//!   can only tighten the bound.
//! - The call-time estimate is a moving average that leans to fresh news: a sample's weight
//!   grows with the time since the previous one, a faster sample weighs at least 1/2 (a slower
//!   one 1/4: an estimate too high sheds the calls that would correct it, one too low corrects
//!   itself), and an estimate older than two call times shrinks with its age. When no call has
//!   started or ended for a call time, one request the estimate would refuse is let through as a
//!   probe, at admission and at dispatch (at most one probe call in flight).
//! - A request whose deadline passes while inputs of it wait in the queue gets 504
//!   ([`EmbedError::DeadlineExceeded`]) at its deadline, and its share of the bounds is free at
//!   once (a timer on the earliest deadline, no scan). One whose deadline comes before a call
//!   started now could finish (by a fresh estimate) gets 504 when its batch forms, and causes no
//!   upstream work, unless everything queued fits that one call: then it goes as a probe (a
//!   stale estimate costs a probe, not a failure).
//! - A request whose receiver is dropped (the caller went away) is removed from the queue at
//!   once, freeing its share of the bounds; its queued inputs cause no upstream work.
//!
//! # Faults
//! Batch tasks are supervised: a batch task that panics fails exactly its requests with 424
//! ([`EmbedError::Backend`], "upstream call crashed") and frees its upstream slot. When the
//! upstream blames an input of a batch of several requests, the batch is bisected by request and
//! retried until the offending request(s) are isolated; the others still get their embeddings.
//! A 424 (the model failed on the batch) is bisected too, within bounds that spare an upstream
//! failing for everyone (see `isolate`). Upstream failures (refused, 5xx, timeout) fail only the
//! requests of that call.
//!
//! # Tracing
//! Each accepted request has a span (`embed_request`: inputs, bytes, then outcome) from submit to
//! answer, a child of the submitter's current span; each batch task runs in a span
//! (`upstream_batch`: inputs, requests, probe) that follows from the spans of its requests, so
//! the upstream call's events carry it. Request spans are at `debug` level
//! (`RUST_LOG=embatch_worker=debug` turns them on), so the default `info` records none per
//! request; batch spans are at `info`.
//!
//! # Shutdown
//! When every [`BatcherHandle`] is dropped, the actor stops waiting for `max_wait`, sends all it
//! holds upstream, answers every accepted request and exits.

mod actor;
mod admission;
mod fair;
mod fastest;
mod isolate;
mod queue;
mod shape;
#[cfg(test)]
mod tests;
mod unique;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use embatch_protocol::{EmbedError, EmbedOptions, Input};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use admission::{AUTO_CALLS, AUTO_FLOOR, AUTO_FLOOR_INPUTS, QueueDelay, QueueDelayError};
use admission::{Ask, Ledger, Limits};
pub use fair::Share;
pub use shape::{
    BUILTIN_MAX_BATCH_TOKENS, BatchCost, TEI_DEFAULT_MAX_BATCH_TOKENS, TokenBudget,
    estimate_lengths,
};

use crate::upstream::{Backend, Embedding};

/// Every `reason` label of `embatch_worker_requests_shed_total`.
pub const SHED_REASONS: [&str; 6] = admission::ShedReason::LABELS;

/// Batching and overload limits (see the module docs).
#[derive(Debug, Clone)]
pub struct BatcherConfig {
    /// Most inputs in one upstream call (inputs, not requests).
    pub max_batch_size: usize,
    /// Most tokens one upstream call may cost, and how its cost is counted (see the module
    /// docs); an input over the whole budget is sent alone.
    pub tokens: TokenBudget,
    /// Longest time the first request of a batch waits for more to join.
    pub max_wait: Duration,
    /// Most upstream calls in flight at once.
    pub max_concurrent_batches: usize,
    /// A batch that is not full is sent only while fewer than this many calls are in flight
    /// (clamped to 1..=`max_concurrent_batches`); `None`: `max_concurrent_batches - 1` (at least
    /// 1), keeping the last slot for a full batch.
    pub partial_batch_slots: Option<usize>,
    /// Most inputs accepted and not yet answered; more are shed with 429.
    pub queue_cap: usize,
    /// Most bytes of input text (UTF-8) accepted and not yet answered; more are shed with 429,
    /// and a request larger than this alone gets 413.
    pub max_queue_bytes: usize,
    /// Longest expected queue wait (acceptance to first upstream call) a request is admitted
    /// with; longer is shed with 429.
    pub max_queue_delay: QueueDelay,
    /// While no upstream call is in flight, send a waiting group at once instead of after
    /// `max_wait` (an idle upstream slot is wasted throughput; requests arriving during a call
    /// still batch). On by default.
    pub dispatch_when_idle: bool,
}

impl Default for BatcherConfig {
    /// The worker's command-line defaults: 32 inputs, TEI's 16,384 padded tokens, 5 ms, 2 calls
    /// (the last one for a full batch), 4,096 inputs, 64 MiB, auto, dispatch when idle.
    fn default() -> Self {
        BatcherConfig {
            max_batch_size: 32,
            tokens: TokenBudget::default(),
            max_wait: Duration::from_millis(5),
            max_concurrent_batches: 2,
            partial_batch_slots: None,
            queue_cap: 4096,
            max_queue_bytes: 64 << 20,
            max_queue_delay: QueueDelay::Auto,
            dispatch_when_idle: true,
        }
    }
}

/// A successful answer: TEI's response body for exactly the request's inputs, in order.
#[derive(Debug, Clone)]
pub struct Reply {
    /// `[[f32, ...], ...]` as JSON bytes, assembled from the upstream's raw JSON vectors.
    pub payload: Bytes,
    /// Time from acceptance to the first upstream call that carried this request.
    pub queue_time: Duration,
    /// Time from that first call to the last result (the upstream's share).
    pub inference_time: Duration,
}

/// What a caller receives: its reply or the error that ended it.
pub type Outcome = Result<Reply, EmbedError>;

/// A request admission refused: the error to answer and, for 429s, when a retry could be
/// admitted (for a `Retry-After` header).
#[derive(Debug, Clone)]
pub struct Refused {
    /// The answer: 413, 429, 503 or 504.
    pub error: EmbedError,
    /// For [`EmbedError::Overloaded`]: the estimated time until this request would be admitted
    /// (at least one upstream call time; 1 s before the first measurement). `None` otherwise.
    pub retry_after: Option<Duration>,
}

impl From<Refused> for EmbedError {
    fn from(refused: Refused) -> EmbedError {
        refused.error
    }
}

/// A cloneable handle to submit requests to the batcher.
///
/// Dropping a receiver returned by [`BatcherHandle::submit`] cancels the request: its queued
/// inputs are removed before they cost upstream work.
#[derive(Clone)]
pub struct BatcherHandle {
    tx: mpsc::UnboundedSender<Sent>,
    shared: Arc<Shared>,
}

/// What the handle and the actor share: the limits (fixed), the failed-call count and the
/// published copy of the actor's [`Ledger`] (both written by the actor only).
struct Shared {
    limits: Limits,
    /// The actor's ledger as of its last step, for [`BatcherHandle::load`] and
    /// [`BatcherHandle::retry_after_hint`]; admission itself reads the actor's own.
    ledger: watch::Sender<Ledger>,
    /// Inputs the handles sent that the actor has not yet published as admitted or refused:
    /// counted into the load as queued, so the membership sees a request at once.
    in_transit: AtomicUsize,
    /// Upstream calls that failed as an unhealthy upstream fails, in a row (reset by a success
    /// or by [`BatcherHandle::reset_failures`]); watched by the queue-group membership.
    failed_calls: watch::Sender<u32>,
    /// Upstream calls answered with embeddings since the start; read by the queue-group
    /// membership, which takes answered calls as a sign of health stronger than a slow probe.
    answered_calls: AtomicU64,
    /// Set by [`BatcherHandle::absorb_backlog`], taken by the actor at its next admission.
    backlog_until: std::sync::Mutex<Option<Instant>>,
    /// Most calls in flight (of any kind) under which a batch of bulk inputs alone may start
    /// (see [`BulkGate::limit_calls`]; 1 until set).
    bulk_calls: AtomicUsize,
    /// Inputs of resent copies and when the last one came ([`BatcherHandle::absorb_resent`]),
    /// taken by the actor at its next admission.
    resent: std::sync::Mutex<Option<(usize, Instant)>>,
}

/// What the handles send the actor.
enum Sent {
    /// An interactive request, admitted or refused by the actor.
    Request(Job),
    /// A bulk request (see [`BulkGate`]).
    Bulk(BulkJob),
}

/// The outcome of a bulk request: an embedding per input, in order, or the error of the call
/// that carried it (the batcher's own isolation already split a rejected call by request).
pub type BulkOutcome = Result<Vec<Embedding>, EmbedError>;

/// A bulk request on its way to the actor.
struct BulkJob {
    inputs: Vec<Input>,
    /// Tokens of each input.
    lengths: Vec<u32>,
    options: EmbedOptions,
    /// The batch's tenant: bulk inputs are shared between tenants too.
    share: Share,
    reply: oneshot::Sender<BulkOutcome>,
}

/// A request on its way to the actor, which admits or refuses it.
struct Job {
    inputs: Vec<Input>,
    /// Tokens of each input.
    lengths: Vec<u32>,
    /// Bytes of input text.
    bytes: usize,
    options: EmbedOptions,
    /// Its tenant's share of the upstream.
    share: Share,
    deadline: Instant,
    accepted: Instant,
    reply: oneshot::Sender<Outcome>,
    /// Where the admission answer goes ([`BatcherHandle::try_submit`]); `None`: a refusal is
    /// the request's outcome, on `reply` ([`BatcherHandle::submit`]).
    admission: Option<oneshot::Sender<Result<(), Refused>>>,
    span: tracing::Span,
}

impl BatcherHandle {
    /// Admits by deadline, without `MAX_QUEUE_DELAY`, for `window` from now (or longer, if an
    /// earlier call asked for longer): after a NATS reconnect, the requests clients held
    /// through the outage arrive at once (see `Ledger::absorb_backlog_until`; resent copies
    /// are excused by their own inputs instead, [`BatcherHandle::absorb_resent`]). `QUEUE_CAP`, `MAX_QUEUE_BYTES` and each request's
    /// deadline still bound what is admitted.
    pub fn absorb_backlog(&self, window: Duration) {
        let until = Instant::now() + window;
        let mut pending = self
            .shared
            .backlog_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *pending = Some(pending.map_or(until, |earlier| earlier.max(until)));
    }

    /// A resent copy of a request (`Embatch-Attempt`, see
    /// `embatch_protocol::headers::ATTEMPT`) with `inputs` inputs reached the worker and is on
    /// its way: admission lets that many inputs in by deadline alone, without
    /// `MAX_QUEUE_DELAY`, for the next `RESEND_BACKLOG_WINDOW` (1 s), and leaves them out of the
    /// queue-delay check of the requests behind them while they wait
    /// (`Ledger::excuse_resent`). `QUEUE_CAP`, `MAX_QUEUE_BYTES` and every deadline still hold.
    pub fn absorb_resent(&self, inputs: usize) {
        let now = Instant::now();
        let mut pending = self
            .shared
            .resent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *pending = Some((pending.map_or(0, |(earlier, _)| earlier) + inputs, now));
    }

    /// Submits one request: its inputs, the token count of each (after truncation, special
    /// tokens included; from the model's tokenizer, or [`estimate_lengths`], or all equal to
    /// count inputs only), its options and absolute deadline, without waiting for the actor.
    /// Returns the receiver of its [`Outcome`]; dropping it cancels the request. `lengths` that
    /// do not hold one count per input are replaced by [`estimate_lengths`].
    ///
    /// A refusal by the actor's admission (429, [`EmbedError::Overloaded`]) is the outcome,
    /// sent at once, before any queueing.
    ///
    /// # Errors
    /// Answered at once, before the actor:
    /// - [`EmbedError::Empty`] (400) without inputs;
    /// - [`EmbedError::TooLarge`] (413) when the request alone holds more than `queue_cap`
    ///   inputs or `max_queue_bytes` bytes;
    /// - [`EmbedError::DeadlineExceeded`] (504) when `deadline` has already passed;
    /// - [`EmbedError::Unavailable`] (503) when the batcher has stopped.
    pub fn submit(
        &self,
        inputs: Vec<Input>,
        lengths: Vec<u32>,
        options: EmbedOptions,
        deadline: Instant,
    ) -> Result<oneshot::Receiver<Outcome>, EmbedError> {
        self.submit_as(Share::default(), (inputs, lengths), options, deadline)
    }

    /// [`BatcherHandle::submit`] for the tenant of `share`: under contention, the upstream is
    /// shared between tenants by weight, and a full queue sheds first from the tenant furthest
    /// over its share (see docs/design/fair-share.md).
    ///
    /// # Errors
    /// As [`BatcherHandle::submit`].
    pub fn submit_as(
        &self,
        share: Share,
        (inputs, lengths): (Vec<Input>, Vec<u32>),
        options: EmbedOptions,
        deadline: Instant,
    ) -> Result<oneshot::Receiver<Outcome>, EmbedError> {
        let (job, rx) = self.job(share, (inputs, lengths), options, deadline, None)?;
        self.send(job)?;
        Ok(rx)
    }

    /// Submits one request, like [`BatcherHandle::submit`], and waits for the actor's
    /// admission answer; on refusal it says when a retry could be admitted.
    ///
    /// # Errors
    /// As [`BatcherHandle::submit`], and [`EmbedError::Overloaded`] (429, with `retry_after`)
    /// when `queue_cap` or `max_queue_bytes` is reached, or when the work queued ahead is
    /// expected to delay the request past its deadline or (for a request that fits one upstream
    /// call) beyond `max_queue_delay`.
    pub async fn try_submit(
        &self,
        inputs: Vec<Input>,
        lengths: Vec<u32>,
        options: EmbedOptions,
        deadline: Instant,
    ) -> Result<oneshot::Receiver<Outcome>, Refused> {
        self.try_submit_as(Share::default(), (inputs, lengths), options, deadline)
            .await
    }

    /// [`BatcherHandle::try_submit`] for the tenant of `share` (see
    /// [`BatcherHandle::submit_as`]).
    ///
    /// # Errors
    /// As [`BatcherHandle::try_submit`].
    pub async fn try_submit_as(
        &self,
        share: Share,
        (inputs, lengths): (Vec<Input>, Vec<u32>),
        options: EmbedOptions,
        deadline: Instant,
    ) -> Result<oneshot::Receiver<Outcome>, Refused> {
        let refused = |error| Refused {
            error,
            retry_after: None,
        };
        let (answer, admission) = oneshot::channel();
        let (job, rx) = self
            .job(share, (inputs, lengths), options, deadline, Some(answer))
            .map_err(refused)?;
        self.send(job).map_err(refused)?;
        match admission.await {
            Ok(Ok(())) => Ok(rx),
            Ok(Err(refusal)) => Err(refusal),
            Err(_) => Err(refused(stopped())),
        }
    }

    /// The job for a request that passed [`admission::validate`], and its outcome's receiver.
    fn job(
        &self,
        share: Share,
        (inputs, lengths): (Vec<Input>, Vec<u32>),
        options: EmbedOptions,
        deadline: Instant,
        admission: Option<oneshot::Sender<Result<(), Refused>>>,
    ) -> Result<(Job, oneshot::Receiver<Outcome>), EmbedError> {
        let now = Instant::now();
        let lengths = if lengths.len() == inputs.len() {
            lengths
        } else {
            estimate_lengths(&inputs)
        };
        let ask = Ask {
            inputs: inputs.len(),
            tokens: lengths.iter().map(|&t| u64::from(t)).sum(),
            bytes: inputs.iter().map(Input::size_bytes).sum(),
            deadline,
            ahead: None,
        };
        if let Err(shed) = admission::validate(&self.shared.limits, ask, now) {
            actor::count_shed(shed.reason);
            return Err(shed.error);
        }
        let span = tracing::debug_span!(
            "embed_request",
            inputs = ask.inputs,
            bytes = ask.bytes,
            outcome = tracing::field::Empty
        );
        let (reply, rx) = oneshot::channel();
        let job = Job {
            inputs,
            lengths,
            bytes: ask.bytes,
            options,
            share,
            deadline,
            accepted: now,
            reply,
            admission,
            span,
        };
        Ok((job, rx))
    }

    fn send(&self, job: Job) -> Result<(), EmbedError> {
        let inputs = job.inputs.len();
        self.shared.in_transit.fetch_add(inputs, Ordering::Relaxed);
        self.tx.send(Sent::Request(job)).map_err(|_| {
            self.shared.in_transit.fetch_sub(inputs, Ordering::Relaxed);
            stopped()
        })
    }

    /// The worker's load as of the actor's last step, for queue-group membership (see
    /// `crate::membership`): the expected wait of a request queued now before its first
    /// upstream call (requests on their way to the actor count as queued), the estimated call
    /// time, the queue-delay bound admission enforces with it, and the failed calls in a row.
    pub fn load(&self) -> crate::membership::Load {
        let now = Instant::now();
        let mut ledger = self.shared.ledger.borrow().clone();
        ledger.queued_inputs += self.shared.in_transit.load(Ordering::Relaxed);
        let call = ledger.estimate.call_at(now);
        crate::membership::Load {
            start_wait: call.map(|call| ledger.start_wait(&self.shared.limits, call)),
            call,
            bound: call.map(|call| admission::steer_bound(&self.shared.limits, call)),
            failed_calls: *self.shared.failed_calls.borrow(),
            peer_has_room: false, // the batcher knows no peers; see `crate::group`
            stalled: ledger.stalled(
                now,
                crate::membership::STALL_CALLS,
                crate::membership::STALL_MIN,
            ),
        }
    }

    /// Forgets the failed calls in a row: the upstream's `/health` answered again.
    pub fn reset_failures(&self) {
        self.shared.failed_calls.send_replace(0);
    }

    /// Upstream calls answered with embeddings since the worker started (a count that only
    /// grows).
    pub fn answered_calls(&self) -> u64 {
        self.shared.answered_calls.load(Ordering::Relaxed)
    }

    /// Notified when the count of failed upstream calls in a row changes (the membership
    /// re-decides at once instead of at the next request or probe).
    pub fn failures(&self) -> watch::Receiver<u32> {
        self.shared.failed_calls.subscribe()
    }

    /// How long until this worker would admit a 1-input request with a generous deadline again:
    /// the estimated time for its queue to drain below `max_queue_delay`, `queue_cap` and
    /// `max_queue_bytes`; at least one upstream call time (1 s before the first measurement).
    /// For a `Retry-After` header on 429s.
    pub fn retry_after_hint(&self) -> Duration {
        self.shared
            .ledger
            .borrow()
            .retry_after(&self.shared.limits, Instant::now())
    }
}

/// The bulk lane's (`crate::bulk`) way into the batcher: bulk requests share the interactive
/// batches' upstream calls without competing with interactive requests.
///
/// A bulk request is queued apart from interactive ones and holds no share of the admission
/// bounds (`QUEUE_CAP`, `MAX_QUEUE_BYTES`, `MAX_QUEUE_DELAY`), so it never causes a 429. Its
/// inputs leave in two ways:
/// - they fill the room an interactive batch of the same options leaves (up to the batch limit
///   and the token budget), so interactive traffic below capacity carries bulk inputs at the
///   cost of the call's per-input time only;
/// - as a batch of their own, only while nothing interactive is queued or on its way to the
///   actor: on an idle upstream while interactive requests arrive (one arriving then waits
///   behind at most that one call), and under up to [`BulkGate::limit_calls`] calls in flight
///   once none arrived for 10 call times (so a bulk job alone keeps the upstream busy back to
///   back; the first interactive request after such a spell may wait behind that many calls).
///
/// It holds a weak sender, so it never keeps the actor alive.
#[derive(Clone)]
pub struct BulkGate {
    tx: mpsc::WeakUnboundedSender<Sent>,
    shared: Arc<Shared>,
}

impl BulkGate {
    /// Sets the most calls in flight (interactive and bulk alike) under which a batch of bulk
    /// inputs alone may start (`BULK_CALLS`, at least 1, at most `MAX_CONCURRENT_BATCHES`).
    pub fn limit_calls(&self, calls: usize) {
        self.shared
            .bulk_calls
            .store(calls.max(1), Ordering::Relaxed);
    }

    /// Embeds `inputs` (token counts `lengths`, or [`estimate_lengths`] when they do not hold
    /// one per input) with `options` as a bulk request: waits until the batcher has sent them
    /// (see [`BulkGate`]) and returns an embedding per input, in order. Dropping the future
    /// cancels the inputs not yet sent.
    ///
    /// # Errors
    /// The [`EmbedError`] of the upstream call that carried the request (a rejected input's
    /// request alone gets the rejection, as for interactive requests), or
    /// [`EmbedError::Unavailable`] when the batcher has stopped.
    pub async fn embed(
        &self,
        inputs: Vec<Input>,
        lengths: Vec<u32>,
        options: EmbedOptions,
    ) -> BulkOutcome {
        self.embed_as(Share::default(), inputs, lengths, options)
            .await
    }

    /// [`BulkGate::embed`] for the tenant of `share`: bulk inputs of several tenants are shared
    /// by weight too, behind every tenant's interactive traffic.
    ///
    /// # Errors
    /// As [`BulkGate::embed`].
    pub async fn embed_as(
        &self,
        share: Share,
        inputs: Vec<Input>,
        lengths: Vec<u32>,
        options: EmbedOptions,
    ) -> BulkOutcome {
        if inputs.is_empty() {
            return Ok(Vec::new());
        }
        let lengths = if lengths.len() == inputs.len() {
            lengths
        } else {
            estimate_lengths(&inputs)
        };
        let tx = self.tx.upgrade().ok_or_else(stopped)?;
        let (reply, rx) = oneshot::channel();
        tx.send(Sent::Bulk(BulkJob {
            inputs,
            lengths,
            options,
            share,
            reply,
        }))
        .map_err(|_| stopped())?;
        drop(tx);
        rx.await.unwrap_or_else(|_| Err(stopped()))
    }
}

impl BatcherHandle {
    /// The bulk lane's way into this batcher (see [`BulkGate`]).
    pub fn bulk_gate(&self) -> BulkGate {
        BulkGate {
            tx: self.tx.downgrade(),
            shared: Arc::clone(&self.shared),
        }
    }
}

fn stopped() -> EmbedError {
    EmbedError::Unavailable("the worker is shutting down".into())
}

/// Starts the batcher task for `upstream`.
///
/// The task ends after every [`BatcherHandle`] clone is dropped and every accepted request is
/// answered (or cancelled).
pub fn spawn<U: Backend>(
    upstream: Arc<U>,
    config: BatcherConfig,
) -> (BatcherHandle, JoinHandle<()>) {
    let slots = config.max_concurrent_batches.max(1);
    let limits = Limits {
        queue_cap: config.queue_cap.max(1),
        max_queue_bytes: config.max_queue_bytes.max(1),
        max_queue_delay: config.max_queue_delay,
        max_wait: config.max_wait,
        dispatch_when_idle: config.dispatch_when_idle,
        slots,
        partial_slots: config
            .partial_batch_slots
            .unwrap_or(slots - 1)
            .clamp(1, slots),
        batch_limit: config.max_batch_size.min(upstream.max_batch_size()).max(1),
        budget: TokenBudget {
            max_batch_tokens: match config.tokens.cost {
                BatchCost::Inputs => u64::MAX, // no token budget
                _ => config.tokens.max_batch_tokens.max(1),
            },
            cost: config.tokens.cost,
        },
    };
    tracing::info!(
        max_batch_size = limits.batch_limit,
        max_batch_tokens = limits.budget.max_batch_tokens,
        batch_cost = %limits.budget.cost,
        "batches by tokens and inputs"
    );
    let shared = Arc::new(Shared {
        limits,
        ledger: watch::Sender::new(Ledger::default()),
        in_transit: AtomicUsize::new(0),
        failed_calls: watch::Sender::new(0),
        answered_calls: AtomicU64::new(0),
        backlog_until: std::sync::Mutex::new(None),
        bulk_calls: AtomicUsize::new(1),
        resent: std::sync::Mutex::new(None),
    });
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(actor::Actor::new(upstream, Arc::clone(&shared), rx).run());
    (BatcherHandle { tx, shared }, task)
}
