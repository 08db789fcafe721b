//! The batcher's handle: its configuration, what callers submit and get back, what the handles
//! share with the actor, and [`spawn`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use embatch_protocol::{EmbedError, EmbedOptions, Input};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::Embedding;
use crate::admission::{self, Ask, Ledger, Limits};
use crate::{
    Backend, BatchCost, BulkOutcome, Load, QueueDelay, STALL_CALLS, STALL_MIN, Share, TokenBudget,
    Traces, actor, estimate_lengths,
};

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

/// A successful answer: the embeddings of exactly the request's inputs, in order.
///
/// Each is the upstream's own JSON bytes for that input (a slice of the upstream's reply, not a
/// copy). The caller joins them into its reply once, with whatever else it answers from (the
/// cache's hits): the batcher does not assemble a body that would be split again.
#[derive(Debug, Clone)]
pub struct Reply {
    /// One per input, in the request's order.
    pub embeddings: Vec<Embedding>,
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
    pub(crate) tx: mpsc::UnboundedSender<Sent>,
    pub(crate) shared: Arc<Shared>,
}

/// What the handle and the actor share: the limits (fixed), the failed-call count and the
/// published copy of the actor's [`Ledger`] (both written by the actor only).
pub(crate) struct Shared {
    pub(crate) limits: Limits,
    /// The actor's ledger as of its last step, for [`BatcherHandle::load`] and
    /// [`BatcherHandle::retry_after_hint`]; admission itself reads the actor's own. A lock, not
    /// a `watch`: nobody waits for a change, and a `watch` wakes its (absent) waiters on every
    /// step of the actor (docs/design/cpu-per-request.md).
    ledger: std::sync::RwLock<Ledger>,
    /// Inputs the handles sent that the actor has not yet published as admitted or refused:
    /// counted into the load as queued, so the membership sees a request at once.
    pub(crate) in_transit: AtomicUsize,
    /// Upstream calls that failed as an unhealthy upstream fails, in a row (reset by a success
    /// or by [`BatcherHandle::reset_failures`]); watched by the queue-group membership.
    pub(crate) failed_calls: watch::Sender<u32>,
    /// Upstream calls answered with embeddings since the start; read by the queue-group
    /// membership, which takes answered calls as a sign of health stronger than a slow probe.
    pub(crate) answered_calls: AtomicU64,
    /// Set by [`BatcherHandle::absorb_backlog`], taken by the actor at its next admission.
    pub(crate) backlog_until: std::sync::Mutex<Option<Instant>>,
    /// Most calls in flight (of any kind) under which a batch of bulk inputs alone may start
    /// (see [`BulkGate::limit_calls`]; 1 until set).
    pub(crate) bulk_calls: AtomicUsize,
    /// Inputs of resent copies and when the last one came ([`BatcherHandle::absorb_resent`]),
    /// taken by the actor at its next admission.
    pub(crate) resent: std::sync::Mutex<Option<(usize, Instant)>>,
    /// How the actor's spans join distributed traces.
    pub(crate) traces: Traces,
}

impl Shared {
    /// The ledger as the actor last published it (a lock poisoned by a panicking actor still
    /// holds its last copy).
    pub(crate) fn ledger(&self) -> std::sync::RwLockReadGuard<'_, Ledger> {
        self.ledger
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Publishes the actor's `ledger` (the actor's step, [`Shared::ledger`]'s readers).
    pub(crate) fn publish(&self, ledger: &Ledger) {
        self.ledger
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone_from(ledger);
    }
}

/// What the handles send the actor.
pub(crate) enum Sent {
    /// An interactive request, admitted or refused by the actor.
    Request(Job),
    /// A bulk request (see [`BulkGate`]).
    Bulk(BulkJob),
}

/// A bulk request on its way to the actor.
pub(crate) struct BulkJob {
    pub(crate) inputs: Vec<Input>,
    /// Tokens of each input.
    pub(crate) lengths: Vec<u32>,
    pub(crate) options: EmbedOptions,
    /// The batch's tenant: bulk inputs are shared between tenants too.
    pub(crate) share: Share,
    pub(crate) reply: oneshot::Sender<BulkOutcome>,
}

/// A request on its way to the actor, which admits or refuses it.
pub(crate) struct Job {
    pub(crate) inputs: Vec<Input>,
    /// Tokens of each input.
    pub(crate) lengths: Vec<u32>,
    /// Bytes of input text.
    pub(crate) bytes: usize,
    pub(crate) options: EmbedOptions,
    /// Its tenant's share of the upstream.
    pub(crate) share: Share,
    pub(crate) deadline: Instant,
    pub(crate) accepted: Instant,
    pub(crate) reply: oneshot::Sender<Outcome>,
    /// Where the admission answer goes ([`BatcherHandle::try_submit`]); `None`: a refusal is
    /// the request's outcome, on `reply` ([`BatcherHandle::submit`]).
    pub(crate) admission: Option<oneshot::Sender<Result<(), Refused>>>,
    pub(crate) span: tracing::Span,
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

    /// The worker's load as of the actor's last step, for the worker's queue-group membership:
    /// the expected wait of a request queued now before its first
    /// upstream call (requests on their way to the actor count as queued), the estimated call
    /// time, the queue-delay bound admission enforces with it, and the failed calls in a row.
    pub fn load(&self) -> Load {
        let now = Instant::now();
        let mut ledger = self.shared.ledger().clone();
        ledger.queued_inputs += self.shared.in_transit.load(Ordering::Relaxed);
        let call = ledger.estimate.call_at(now);
        Load {
            start_wait: call.map(|call| ledger.start_wait(&self.shared.limits, call)),
            call,
            bound: call.map(|call| admission::steer_bound(&self.shared.limits, call)),
            failed_calls: *self.shared.failed_calls.borrow(),
            peer_has_room: false, // the batcher knows no peers: the worker's queue group sets it
            stalled: ledger.stalled(now, STALL_CALLS, STALL_MIN),
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
            .ledger()
            .retry_after(&self.shared.limits, Instant::now())
    }
}

/// The answer to a request the batcher can no longer take: 503.
pub(crate) fn stopped() -> EmbedError {
    EmbedError::Unavailable("the worker is shutting down".into())
}

/// Starts the batcher task for `upstream`, its spans in no distributed trace
/// ([`Traces::default`]).
///
/// The task ends after every [`BatcherHandle`] clone is dropped and every accepted request is
/// answered (or cancelled).
pub fn spawn<U: Backend>(
    upstream: Arc<U>,
    config: BatcherConfig,
) -> (BatcherHandle, JoinHandle<()>) {
    spawn_traced(upstream, config, Traces::default())
}

/// [`spawn`], with `traces` joining the batcher's spans to the process's distributed traces
/// (the worker's OpenTelemetry export).
pub fn spawn_traced<U: Backend>(
    upstream: Arc<U>,
    config: BatcherConfig,
    traces: Traces,
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
        ledger: std::sync::RwLock::new(Ledger::default()),
        in_transit: AtomicUsize::new(0),
        failed_calls: watch::Sender::new(0),
        answered_calls: AtomicU64::new(0),
        backlog_until: std::sync::Mutex::new(None),
        bulk_calls: AtomicUsize::new(1),
        resent: std::sync::Mutex::new(None),
        traces,
    });
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(actor::Actor::new(upstream, Arc::clone(&shared), rx).run());
    (BatcherHandle { tx, shared }, task)
}
