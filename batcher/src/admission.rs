//! Admission: the queue bounds, the upstream call-time estimate and the admit decision.
//!
//! Plain data and functions (no channels, no clock reads: every function takes `now`). The
//! actor owns the [`Ledger`]: it decides each request's admission, reports what left the queue
//! and how long calls took, and publishes a copy for the handle's read-only views (the load for
//! the queue-group membership, the retry-after hint). The handle runs only [`validate`], which
//! needs no state.

use std::time::Duration;

use embatch_protocol::EmbedError;
use tokio::time::Instant;

mod delay;

pub(super) use delay::steer_bound;
pub use delay::{AUTO_CALLS, AUTO_FLOOR, AUTO_FLOOR_REQUESTS, QueueDelay, QueueDelayError};

use super::fair::Ahead;
use super::fastest::Fastest;
use super::shape::TokenBudget;

/// The limits admission enforces (normalised: every count at least 1).
#[derive(Debug, Clone)]
pub(super) struct Limits {
    /// Most inputs accepted and not yet answered (`QUEUE_CAP`).
    pub queue_cap: usize,
    /// Most bytes of input text accepted and not yet answered (`MAX_QUEUE_BYTES`).
    pub max_queue_bytes: usize,
    /// Bound on the expected queue wait (`MAX_QUEUE_DELAY`).
    pub max_queue_delay: QueueDelay,
    /// `MAX_WAIT_TIME`.
    pub max_wait: Duration,
    /// `DISPATCH_WHEN_IDLE`: a waiting group leaves at once while no upstream call is in flight.
    pub dispatch_when_idle: bool,
    /// Upstream calls in flight at once (`MAX_CONCURRENT_BATCHES`).
    pub slots: usize,
    /// A batch that is not full is sent only while fewer calls than this are in flight
    /// (`PARTIAL_BATCH_SLOTS`, 1..=`slots`).
    pub partial_slots: usize,
    /// Most inputs per upstream call (the smaller of `MAX_BATCH_SIZE` and the upstream's limit).
    pub batch_limit: usize,
    /// Most tokens per upstream call (`MAX_BATCH_TOKENS`, at least 1) and how a call's cost is
    /// counted (`BATCH_COST`).
    pub budget: TokenBudget,
}

impl Limits {
    /// Upstream calls needed for `inputs` inputs of `tokens` tokens in all: by inputs
    /// (`batch_limit` per call) or by tokens (`MAX_BATCH_TOKENS` per call), whichever needs
    /// more, and never more calls than inputs (an input over the budget goes alone). Tokens are
    /// counted as their sum: a padded upstream's calls cost more, but shaped batches pad little.
    pub fn calls_for(&self, inputs: usize, tokens: u64) -> usize {
        let by_inputs = inputs.div_ceil(self.batch_limit);
        let by_tokens = tokens.div_ceil(self.budget.max_batch_tokens.max(1));
        let by_tokens = usize::try_from(by_tokens).unwrap_or(usize::MAX).min(inputs);
        by_inputs.max(by_tokens)
    }
}

/// Admission by deadline admits a request only when it is expected to finish within this share of
/// its remaining budget; the rest absorbs the estimate's error (inputs of different lengths, a CPU
/// shared with other processes).
pub(super) const ADMISSION_HEADROOM: f64 = 0.75;

/// Weight of a sample slower than the estimate (bad news is learnt at a normal pace: an estimate
/// that is too low corrects itself, because the calls it admits are measured).
const ALPHA_SLOWER: f64 = 0.25;
/// Weight of a sample faster than the estimate. Good news is learnt fast: an estimate that is
/// too high sheds the requests whose calls would prove it wrong, so it cannot correct itself.
const ALPHA_FASTER: f64 = 0.5;
/// An estimate is fresh for this many of its own call times after its last sample; older, it is
/// discounted (see [`Estimate::call_at`]).
const FRESH_CALLS: f64 = 2.0;
/// Retry-after hint when nothing has been measured yet.
const UNMEASURED_RETRY: Duration = Duration::from_secs(1);
/// Half-life of the longest call remembered for stall detection ([`Estimate::longest_at`]): 60 s.
const LONGEST_HALF_LIFE_S: f64 = 60.0;

/// Moving estimate of the duration of one upstream call, from completed calls.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Estimate {
    /// Seconds per call and the time of the last sample; `None` before the first.
    last: Option<(f64, Instant)>,
    /// The longest call seen (seconds) and when, remembered with a half-life of
    /// [`LONGEST_HALF_LIFE_S`]: call times spread with the batch's size and token cost (a
    /// 32 x 256-token call of a CPU model takes many times a one-input call), so "much slower
    /// than usual" is judged against the slow calls seen lately, not the average.
    longest: Option<(f64, Instant)>,
}

impl Estimate {
    /// Takes the duration of a completed call into the estimate.
    ///
    /// A sample's weight grows with the time since the previous one (`1 - e^(-gap / call)`: after
    /// a call time without news the old estimate counts for a third), and is at least
    /// [`ALPHA_FASTER`] or [`ALPHA_SLOWER`]. The prior is the discounted estimate
    /// ([`Estimate::call_at`]). A probe's sample replaces the estimate: the probe was sent
    /// because the estimate was in doubt.
    #[cfg(test)]
    pub fn record(&mut self, elapsed: Duration, now: Instant, probe: bool) {
        self.record_within(elapsed, now, probe, None);
    }

    /// [`Estimate::record`], remembering the call as the longest seen only when it took at
    /// most `longest_bound` (see [`Ledger::record_call`]).
    pub fn record_within(
        &mut self,
        elapsed: Duration,
        now: Instant,
        probe: bool,
        longest_bound: Option<Duration>,
    ) {
        let sample = elapsed.as_secs_f64().max(1e-6);
        let call = match (self.last, self.call_at(now)) {
            (Some((raw, at)), Some(old)) if !probe => {
                // The gap is measured in undiscounted call times.
                let old = old.as_secs_f64();
                let gap = now.saturating_duration_since(at).as_secs_f64();
                let floor = if sample < old {
                    ALPHA_FASTER
                } else {
                    ALPHA_SLOWER
                };
                let alpha = floor.max(1.0 - (-gap / raw).exp());
                old + alpha * (sample - old)
            }
            _ => sample,
        };
        self.last = Some((call, now));
        let longest = self.longest_at(now).map_or(0.0, |d| d.as_secs_f64());
        if sample >= longest && longest_bound.is_none_or(|bound| elapsed <= bound) {
            self.longest = Some((sample, now));
        }
    }

    /// The usual call to judge a stall by: the longer of the call time last measured
    /// (undiscounted) and the longest call seen lately; `None` before the first sample.
    fn usual(&self, now: Instant) -> Option<Duration> {
        let (call, _) = self.last?;
        Some(Duration::from_secs_f64(call).max(self.longest_at(now).unwrap_or_default()))
    }

    /// The longest call seen, halved for every [`LONGEST_HALF_LIFE_S`] since; `None` before the
    /// first sample.
    pub fn longest_at(&self, now: Instant) -> Option<Duration> {
        let (longest, at) = self.longest?;
        let age = now.saturating_duration_since(at).as_secs_f64();
        Some(Duration::from_secs_f64(
            longest * 0.5f64.powf(age / LONGEST_HALF_LIFE_S),
        ))
    }

    /// The call time to plan with at `now`, `None` before the first sample. Within
    /// [`FRESH_CALLS`] call times of the last sample it is the estimate; older, it shrinks in
    /// proportion to its age (halved at twice that age), so an idle worker does not keep
    /// planning with a slow phase long gone.
    pub fn call_at(&self, now: Instant) -> Option<Duration> {
        let (call, at) = self.last?;
        let age = now.saturating_duration_since(at).as_secs_f64();
        let fresh_for = call * FRESH_CALLS;
        let call = if age <= fresh_for {
            call
        } else {
            call * fresh_for / age
        };
        Some(Duration::from_secs_f64(call))
    }

    /// Whether the last sample is within [`FRESH_CALLS`] call times of `now`.
    pub fn is_fresh(&self, now: Instant) -> bool {
        self.last.is_some_and(|(call, at)| {
            now.saturating_duration_since(at).as_secs_f64() <= call * FRESH_CALLS
        })
    }

    /// When the last sample was taken.
    fn sampled_at(&self) -> Option<Instant> {
        self.last.map(|(_, at)| at)
    }
}

/// Why admission refused a request: the label of `embatch_worker_requests_shed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ShedReason {
    /// No inputs (400; not counted as shed).
    Empty,
    /// More than the whole bound in one request (413; not counted as shed).
    TooLarge,
    /// The deadline passed before admission (504).
    Expired,
    /// `QUEUE_CAP` inputs held (429).
    QueueFull,
    /// `MAX_QUEUE_BYTES` held (429).
    QueueBytes,
    /// Expected queue wait beyond `MAX_QUEUE_DELAY` (429).
    QueueDelay,
    /// Expected finish after the deadline (429).
    Deadline,
    /// Queued, then shed to make room under `QUEUE_CAP` / `MAX_QUEUE_BYTES` for a tenant under
    /// its share: its tenant was the furthest over its share (429).
    FairShare,
}

impl ShedReason {
    /// The metric label, `None` for requests that are not load shedding.
    pub fn label(self) -> Option<&'static str> {
        match self {
            ShedReason::Empty | ShedReason::TooLarge => None,
            ShedReason::Expired => Some("expired"),
            ShedReason::QueueFull => Some("queue_full"),
            ShedReason::QueueBytes => Some("queue_bytes"),
            ShedReason::QueueDelay => Some("queue_delay"),
            ShedReason::Deadline => Some("deadline"),
            ShedReason::FairShare => Some("fair_share"),
        }
    }

    /// Every label, for metrics that start at 0.
    pub const LABELS: [&'static str; 6] = [
        "queue_full",
        "queue_bytes",
        "queue_delay",
        "deadline",
        "expired",
        "fair_share",
    ];

    /// Whether this refusal is a full queue (`QUEUE_CAP`, `MAX_QUEUE_BYTES`), where queued work
    /// of a tenant over its share may make room.
    pub fn is_full(self) -> bool {
        matches!(self, ShedReason::QueueFull | ShedReason::QueueBytes)
    }
}

/// A refusal: the error to answer and, for 429s, an estimate of when a retry could be admitted.
#[derive(Debug, Clone)]
pub(super) struct Shed {
    pub reason: ShedReason,
    pub error: EmbedError,
    pub retry_after: Option<Duration>,
}

/// One request as admission sees it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ask {
    /// Inputs.
    pub inputs: usize,
    /// Tokens of its inputs.
    pub tokens: u64,
    /// Bytes of input text.
    pub bytes: usize,
    /// Absolute deadline.
    pub deadline: Instant,
    /// The queue's work ahead of it and beside it under the fair share, while other tenants'
    /// inputs wait (`None`: everything queued is ahead of it).
    pub ahead: Option<Ahead>,
}

/// What the worker holds and does: owned by the actor, published to the handle as a copy.
#[derive(Debug, Clone, Default)]
pub(super) struct Ledger {
    /// Inputs accepted and not yet answered.
    pub held_inputs: usize,
    /// Bytes of input text accepted and not yet answered.
    pub held_bytes: usize,
    /// Requests accepted and not yet answered ([`AUTO_FLOOR_REQUESTS`]).
    pub held_requests: usize,
    /// Inputs accepted and not yet sent upstream.
    pub queued_inputs: usize,
    /// Their tokens.
    pub queued_tokens: u64,
    /// Upstream calls in flight.
    pub in_flight: usize,
    /// Upstream call time.
    pub estimate: Estimate,
    /// The fastest recent calls by size: the floor no call is expected to beat.
    pub fastest: Fastest,
    /// When the last upstream call started.
    pub last_launch: Option<Instant>,
    /// A call sent despite the estimate (to re-measure it) is in flight.
    pub probe_in_flight: bool,
    /// When admission last let a request in despite the estimate.
    last_admission_probe: Option<Instant>,
    /// Until when `MAX_QUEUE_DELAY` is not applied ([`Ledger::absorb_backlog_until`]).
    backlog_until: Option<Instant>,
    /// Inputs that may still be admitted past `MAX_QUEUE_DELAY`, until `resent_until`: the
    /// inputs of the resent copies that reached this worker ([`Ledger::excuse_resent`]).
    resent_credit: usize,
    /// When `resent_credit` lapses.
    resent_until: Option<Instant>,
    /// Inputs admitted on `resent_credit` and still queued (at most `queued_inputs`): the
    /// queue-delay check of every other request leaves them out.
    excused_queued: usize,
}

/// Answers the checks that need no state: no inputs (400), more than a whole bound in one
/// request (413), a deadline already passed (504). The handle runs them before the request
/// reaches the actor.
pub(super) fn validate(limits: &Limits, ask: Ask, now: Instant) -> Result<(), Shed> {
    if ask.inputs == 0 {
        return Err(Shed::new(
            ShedReason::Empty,
            EmbedError::Empty("`inputs` cannot be empty".into()),
        ));
    }
    if ask.inputs > limits.queue_cap {
        return Err(Shed::new(
            ShedReason::TooLarge,
            EmbedError::TooLarge(format!(
                "`inputs` must have at most {} elements (the worker's QUEUE_CAP). Given: {}",
                limits.queue_cap, ask.inputs
            )),
        ));
    }
    if ask.bytes > limits.max_queue_bytes {
        return Err(Shed::new(
            ShedReason::TooLarge,
            EmbedError::TooLarge(format!(
                "`inputs` must hold at most {} bytes of text (the worker's MAX_QUEUE_BYTES). \
                 Given: {}",
                limits.max_queue_bytes, ask.bytes
            )),
        ));
    }
    if now >= ask.deadline {
        return Err(Shed::new(
            ShedReason::Expired,
            EmbedError::DeadlineExceeded(
                "the request's deadline passed before it reached a worker".into(),
            ),
        ));
    }
    Ok(())
}

impl Shed {
    fn new(reason: ShedReason, error: EmbedError) -> Shed {
        Shed {
            reason,
            error,
            retry_after: None,
        }
    }

    /// A 429 for `reason`, whose message ends with the retry estimate.
    fn overloaded(reason: ShedReason, message: &str, retry: Duration) -> Shed {
        Shed {
            reason,
            error: EmbedError::Overloaded(format!("{message}; retry in ~{} ms", retry.as_millis())),
            retry_after: Some(retry),
        }
    }
}

/// When a request would start and finish, by the estimate, against what it may take.
struct Plan {
    /// Expected wait before its first upstream call, leaving out the inputs admitted on resent
    /// copies' credit: what `MAX_QUEUE_DELAY` bounds.
    unexcused_start: Duration,
    /// Expected time until its last call ends.
    finish: Duration,
    /// Its remaining budget.
    budget: Duration,
    /// [`ADMISSION_HEADROOM`] of `budget`.
    allowed: Duration,
    /// `MAX_QUEUE_DELAY` in effect.
    bound: Duration,
    /// It needs more than one upstream call: `MAX_QUEUE_DELAY` does not apply to it.
    bulk: bool,
}

impl Ledger {
    /// Admits `ask` (and reserves its share of the bounds) or says why not, in order:
    /// [`validate`] (400, 413, 504); the bounds `QUEUE_CAP` and `MAX_QUEUE_BYTES`; then, unless
    /// the worker is idle (nothing queued, a free upstream slot) or has measured nothing, the
    /// timing: the request must be expected to finish within [`ADMISSION_HEADROOM`] of its
    /// budget and, when it fits one upstream call, to start within `MAX_QUEUE_DELAY`. When no
    /// call has started or ended for a whole call time, one request the timing would shed is
    /// admitted as a probe.
    ///
    /// While resent copies left credit ([`Ledger::excuse_resent`]), a request is admitted by
    /// its deadline alone and uses up credit for its inputs; the inputs so admitted are left
    /// out of the queue-delay check of the requests after them while they wait.
    pub fn admit(&mut self, limits: &Limits, ask: Ask, now: Instant) -> Result<(), Shed> {
        validate(limits, ask, now)?;
        self.beats_floor(ask, now)?;
        let call = self.estimate.call_at(now);
        self.within_bounds(limits, ask, call)?;
        let excused = self.credit_at(now) > 0;
        if let Some(call) = call
            && !self.idle(limits)
        {
            self.on_time(limits, ask, now, call, excused)?;
        }
        self.held_inputs += ask.inputs;
        self.held_bytes += ask.bytes;
        self.held_requests += 1;
        self.queued_inputs += ask.inputs;
        self.queued_tokens += ask.tokens;
        if excused {
            self.resent_credit = self.resent_credit.saturating_sub(ask.inputs);
            self.excused_queued += ask.inputs;
        }
        Ok(())
    }

    /// Inputs left the queue (sent upstream, cancelled or expired): they no longer count ahead
    /// of anyone. Inputs admitted on resent copies' credit are taken to leave first (their
    /// callers have waited longest, so their deadlines come first).
    pub fn unqueue(&mut self, inputs: usize, tokens: u64) {
        self.queued_inputs = self.queued_inputs.saturating_sub(inputs);
        self.queued_tokens = self.queued_tokens.saturating_sub(tokens);
        self.excused_queued = self
            .excused_queued
            .saturating_sub(inputs)
            .min(self.queued_inputs);
    }

    /// The deadline of `ask` is not sooner than the fastest recent call of its size
    /// ([`Fastest::floor`]) would end if it started now: otherwise no call could answer it in
    /// time, idle worker or not, and it gets 429 at once rather than a late 200 after upstream
    /// work nobody waits for.
    fn beats_floor(&self, ask: Ask, now: Instant) -> Result<(), Shed> {
        let Some(floor) = self.fastest.floor(ask.inputs, ask.tokens, now) else {
            return Ok(());
        };
        let budget = ask.deadline.saturating_duration_since(now);
        if budget >= floor {
            return Ok(());
        }
        let message = format!(
            "cannot finish before the deadline: the deadline is in {} ms, and the fastest \
             upstream call of this size lately took {} ms",
            budget.as_millis(),
            floor.as_millis()
        );
        Err(Shed::overloaded(ShedReason::Deadline, &message, floor))
    }

    /// `QUEUE_CAP` and `MAX_QUEUE_BYTES` hold with `ask` added.
    fn within_bounds(&self, limits: &Limits, ask: Ask, call: Option<Duration>) -> Result<(), Shed> {
        if self.held_inputs + ask.inputs > limits.queue_cap {
            let excess = self.held_inputs + ask.inputs - limits.queue_cap;
            let retry = self.drain_time(limits, excess, call);
            let message = format!(
                "the worker's queue is full (QUEUE_CAP = {} inputs)",
                limits.queue_cap
            );
            return Err(Shed::overloaded(ShedReason::QueueFull, &message, retry));
        }
        if self.held_bytes + ask.bytes > limits.max_queue_bytes {
            // Bytes drain in proportion to inputs; plan with the held inputs' share.
            let share = (self.held_bytes + ask.bytes - limits.max_queue_bytes) as f64
                / self.held_bytes.max(1) as f64;
            let excess = (share * self.held_inputs as f64).ceil() as usize;
            let retry = self.drain_time(limits, excess.max(1), call);
            let message = format!(
                "the worker's queue is full (MAX_QUEUE_BYTES = {} bytes of input text)",
                limits.max_queue_bytes
            );
            return Err(Shed::overloaded(ShedReason::QueueBytes, &message, retry));
        }
        Ok(())
    }

    /// Nothing queued and a free upstream slot: the request starts at once, whatever the
    /// estimate says (it is its own probe).
    fn idle(&self, limits: &Limits) -> bool {
        self.queued_inputs == 0 && self.in_flight < limits.slots
    }

    /// The request is expected to finish in time and, unless bulk, to start within
    /// `MAX_QUEUE_DELAY`; or it may go as a probe.
    /// `excused`: admitted on resent copies' credit, so by its deadline alone.
    fn on_time(
        &mut self,
        limits: &Limits,
        ask: Ask,
        now: Instant,
        call: Duration,
        excused: bool,
    ) -> Result<(), Shed> {
        let plan = self.plan(limits, ask, now, call);
        let refusal = if plan.finish > plan.allowed {
            let message = format!(
                "cannot finish before the deadline: {} inputs queued ahead need ~{} ms, the \
                 deadline is in {} ms",
                self.queued_inputs,
                plan.finish.as_millis(),
                plan.budget.as_millis()
            );
            (ShedReason::Deadline, plan.finish - plan.allowed, message)
        } else if plan.unexcused_start > plan.bound
            && !plan.bulk
            && !excused
            && !self.absorbing_backlog(now)
        {
            let message = format!(
                "the queue ahead needs ~{} ms, more than MAX_QUEUE_DELAY = {} ms ({})",
                plan.unexcused_start.as_millis(),
                plan.bound.as_millis(),
                delay::describe(limits, call)
            );
            (
                ShedReason::QueueDelay,
                plan.unexcused_start - plan.bound,
                message,
            )
        } else {
            return Ok(());
        };
        if self.probe_due(now, call) {
            self.last_admission_probe = Some(now);
            return Ok(());
        }
        let (reason, over, message) = refusal;
        Err(Shed::overloaded(reason, &message, over.max(call)))
    }

    /// Admits by deadline alone (`QUEUE_CAP`, `MAX_QUEUE_BYTES` and the deadline still bound
    /// each request, `MAX_QUEUE_DELAY` does not) until `until`: the requests clients held while
    /// NATS was away arrive together after a reconnect, as a backlog whose callers already
    /// waited, and a bound of a few call times would answer most of them 429 (benchmark 16: 717
    /// of 14,000 for a 1 s restart). The later of two ends holds. (Resent copies after a worker
    /// was lost are excused by their own inputs instead: [`Ledger::excuse_resent`].)
    pub fn absorb_backlog_until(&mut self, until: Instant) {
        self.backlog_until = Some(self.backlog_until.map_or(until, |end| end.max(until)));
    }

    /// Whether the upstream looks stalled at `now`: calls are in flight and none started or
    /// ended for `calls` × the longer of the call time last measured (undiscounted) and the
    /// longest call seen lately ([`Estimate::longest_at`]), and at least `floor`. `false` before
    /// the first measurement.
    pub fn stalled(&self, now: Instant, calls: u32, floor: Duration) -> bool {
        let (Some((_, sampled)), Some(bound)) =
            (self.estimate.last, self.stall_bound(now, calls, floor))
        else {
            return false;
        };
        let quiet_since = self
            .last_launch
            .map_or(sampled, |launch| launch.max(sampled));
        self.in_flight > 0 && now.saturating_duration_since(quiet_since) > bound
    }

    /// How long calls in flight may go without one starting or ending before the upstream is
    /// taken as stalled ([`Ledger::stalled`]): `calls` × the usual call, at least `floor`.
    fn stall_bound(&self, now: Instant, calls: u32, floor: Duration) -> Option<Duration> {
        self.estimate
            .usual(now)
            .map(|usual| usual.saturating_mul(calls).max(floor))
    }

    /// Takes a completed call of `elapsed` into the estimate. A call longer than `calls` × the
    /// longest call remembered, and than `floor` ([`Ledger::stalled`]'s bound without the
    /// average), counts in the average but is not remembered as the longest call: it was a
    /// stall (a stopped or hung upstream), not a slow batch, and remembering it would raise the
    /// bound tenfold for a minute, so the next stall would go unseen (measured with an upstream
    /// stopped for 1.5 s every 3 s: after the first stop, the worker no longer left the group
    /// as stalled).
    pub fn record_call(
        &mut self,
        elapsed: Duration,
        now: Instant,
        probe: bool,
        calls: u32,
        floor: Duration,
    ) {
        // Judged against the longest call remembered, not the average: the average takes a
        // stalled call in at once (its weight grows with the time since the last sample), so a
        // second call ending in the same stall would pass a bound computed from it.
        let bound = self
            .estimate
            .longest_at(now)
            .map(|longest| longest.saturating_mul(calls).max(floor));
        self.estimate.record_within(elapsed, now, probe, bound);
    }

    /// Whether `MAX_QUEUE_DELAY` is set aside at `now` ([`Ledger::absorb_backlog_until`]).
    fn absorbing_backlog(&self, now: Instant) -> bool {
        self.backlog_until.is_some_and(|until| now < until)
    }

    /// Resent copies of `inputs` inputs in all reached the worker at `at`: that many inputs
    /// more (on top of credit not yet used or lapsed) may be admitted by deadline alone, without
    /// `MAX_QUEUE_DELAY`, until `window` after `at`. A lost worker's requests come back as a
    /// burst of resent copies whose callers' deadlines let it drain; a bound of a few call
    /// times would refuse part of it, and the requests right behind it. The credit is the
    /// copies' own inputs, not a window of time for everything, so shedding stays on for the
    /// rest of the load: a steady trickle of resends sets it aside for their own inputs only.
    pub fn excuse_resent(&mut self, inputs: usize, at: Instant, window: Duration) {
        self.resent_credit = self.credit_at(at) + inputs;
        self.resent_until = Some(at + window);
    }

    /// Inputs that may still be admitted on resent copies' credit at `now`.
    fn credit_at(&self, now: Instant) -> usize {
        if self.resent_until.is_some_and(|until| now < until) {
            self.resent_credit
        } else {
            0
        }
    }

    /// When `ask` would start and finish with the work queued now (only the work
    /// [`Ask::ahead`] says, under the fair share).
    fn plan(&self, limits: &Limits, ask: Ask, now: Instant, call: Duration) -> Plan {
        let (ahead_inputs, ahead_tokens) = ask
            .ahead
            .map_or((self.queued_inputs, self.queued_tokens), |a| {
                (a.inputs.min(self.queued_inputs), a.tokens)
            });
        let start = self.start_wait_behind(limits, call, ahead_inputs, ahead_tokens);
        let unexcused = self.queued_inputs - self.excused_queued.min(self.queued_inputs);
        let unexcused_start = if unexcused == self.queued_inputs {
            start
        } else {
            // In proportion to inputs: which inputs and tokens are excused is not kept.
            let share = unexcused as f64 / self.queued_inputs.max(1) as f64;
            let inputs = (ahead_inputs as f64 * share) as usize;
            let tokens = (ahead_tokens as f64 * share) as u64;
            self.start_wait_behind(limits, call, inputs, tokens)
        };
        // Other tenants' inputs sent while its own are stretch its own work.
        let (beside_inputs, beside_tokens) = ask
            .ahead
            .map_or((0, 0), |a| (a.alongside_inputs, a.alongside_tokens));
        let own_batches = limits.calls_for(ask.inputs, ask.tokens);
        let stretched = limits.calls_for(ask.inputs + beside_inputs, ask.tokens + beside_tokens);
        let own_rounds = u32::try_from(stretched.div_ceil(limits.slots)).unwrap_or(u32::MAX);
        let budget = ask.deadline.saturating_duration_since(now);
        Plan {
            unexcused_start,
            finish: start.saturating_add(call.saturating_mul(own_rounds)),
            budget,
            allowed: budget.mul_f64(ADMISSION_HEADROOM),
            bound: delay::shed_bound(limits, call, self.held_requests),
            // A request that needs several upstream calls waits longer than the bound for its
            // own work alone: its deadline, QUEUE_CAP and MAX_QUEUE_BYTES bound it instead.
            bulk: own_batches > 1,
        }
    }

    /// Expected time until a request queued now gets its first upstream call: the batches queued
    /// ahead (assumed full, by inputs or by tokens: [`Limits::calls_for`]) pass `slots` at a
    /// time, after the free slots took theirs; with no free slot, a running call must end first.
    pub fn start_wait(&self, limits: &Limits, call: Duration) -> Duration {
        self.start_wait_behind(limits, call, self.queued_inputs, self.queued_tokens)
    }

    /// [`Ledger::start_wait`] behind `inputs` queued inputs of `tokens` tokens.
    fn start_wait_behind(
        &self,
        limits: &Limits,
        call: Duration,
        inputs: usize,
        tokens: u64,
    ) -> Duration {
        let ahead = limits.calls_for(inputs, tokens);
        let free = limits.slots.saturating_sub(self.in_flight);
        let batches = (ahead + 1).saturating_sub(free);
        call.mul_f64(batches as f64 / limits.slots as f64)
    }

    /// Time for `inputs` inputs to drain at the estimated pace, at least one call time.
    fn drain_time(&self, limits: &Limits, inputs: usize, call: Option<Duration>) -> Duration {
        let Some(call) = call else {
            return UNMEASURED_RETRY;
        };
        let batches = inputs.div_ceil(limits.batch_limit) as f64;
        call.mul_f64(batches / limits.slots as f64).max(call)
    }

    /// How long until a 1-input request without a tight deadline would be admitted again: the
    /// time for the queue to drain to `MAX_QUEUE_DELAY` and below `QUEUE_CAP` /
    /// `MAX_QUEUE_BYTES`; at least one upstream call time (1 s before the first measurement).
    pub fn retry_after(&self, limits: &Limits, now: Instant) -> Duration {
        let Some(call) = self.estimate.call_at(now) else {
            return UNMEASURED_RETRY;
        };
        let over_delay = self
            .start_wait(limits, call)
            .saturating_sub(delay::shed_bound(limits, call, self.held_requests));
        let over_cap = (self.held_inputs + 1).saturating_sub(limits.queue_cap);
        let over_cap = if over_cap > 0 {
            self.drain_time(limits, over_cap, Some(call))
        } else {
            Duration::ZERO
        };
        over_delay.max(over_cap).max(call)
    }

    /// Whether a call may be sent now despite the estimate, to re-measure it: none such is in
    /// flight, and either everything queued fits this one call (`lone`: sending it delays no
    /// one, so a stale estimate costs a probe, not a 504) or the upstream has neither started
    /// nor finished a call for one (discounted) call time.
    pub fn probe_allowed(&self, now: Instant, lone: bool) -> bool {
        let Some(call) = self.estimate.call_at(now) else {
            return false; // nothing to re-measure
        };
        !self.probe_in_flight && (lone || self.quiet_for(now, call))
    }

    fn probe_due(&self, now: Instant, call: Duration) -> bool {
        if self.probe_in_flight {
            return false;
        }
        let last_probe = self
            .last_admission_probe
            .is_none_or(|at| now.saturating_duration_since(at) >= call);
        last_probe && self.quiet_for(now, call)
    }

    fn quiet_for(&self, now: Instant, call: Duration) -> bool {
        let last = self.estimate.sampled_at().max(self.last_launch);
        last.is_none_or(|at| now.saturating_duration_since(at) >= call)
    }

    /// Releases an answered request's share of `QUEUE_CAP` and `MAX_QUEUE_BYTES`, and the
    /// request itself from the held count.
    pub fn release(&mut self, inputs: usize, bytes: usize) {
        self.held_requests = self.held_requests.saturating_sub(1);
        self.held_inputs = self.held_inputs.saturating_sub(inputs);
        self.held_bytes = self.held_bytes.saturating_sub(bytes);
    }
}

#[cfg(test)]
mod tests;
