//! The actor: one task owning the queue, the supervised batch tasks and the replies; the one
//! place that records metrics.

mod admit;
mod answer;
mod call;
mod meters;

use std::collections::HashMap;
use std::sync::Arc;

use embatch_protocol::EmbedError;
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::admission::{Ledger, ShedReason};
use super::isolate::Done;
use super::queue::{Formed, Queue, Removed, Take};
use super::{Sent, Shared};
use crate::Backend;
use crate::names;
use answer::{Pending, answer};
use meters::Meters;

/// Counts a request refused at admission (by the actor, or by the handle's stateless checks).
pub(super) fn count_shed(reason: ShedReason) {
    if let Some(label) = reason.label() {
        metrics::counter!(names::SHED, "reason" => label).increment(1);
    }
}

/// A batch task in flight.
struct Running {
    requests: Vec<u64>,
    probe: bool,
    /// When it was launched.
    launched: Instant,
    /// Inputs and tokens of the batch: the size its call time is remembered with.
    inputs: usize,
    tokens: u64,
}

pub(super) struct Actor<U> {
    upstream: Arc<U>,
    shared: Arc<Shared>,
    rx: mpsc::UnboundedReceiver<Sent>,
    /// Admission state: what is held, queued and in flight, and the call-time estimate.
    ledger: Ledger,
    queue: Queue,
    /// Bulk requests (see [`super::BulkGate`]): never admitted against the bounds, sent only to
    /// fill a batch of the same options or while nothing interactive waits.
    bulk: Queue,
    requests: HashMap<u64, Pending>,
    /// Interactive inputs held (accepted, not answered) by tenant, and the tenant's weight:
    /// whose share of the bounds is the largest when a full queue must shed.
    held: HashMap<Arc<str>, (usize, u32)>,
    batches: JoinSet<Done>,
    running: HashMap<tokio::task::Id, Running>,
    /// One per request: forwards its outcome to the caller, or reports that the caller went away.
    relays: FuturesUnordered<BoxFuture<'static, Option<u64>>>,
    next_id: u64,
    closed: bool,
    /// Inputs received from the handles since the last [`Actor::publish`].
    received: usize,
    /// When the last interactive request reached the actor (see [`Actor::bulk_batch`]).
    last_interactive: Option<Instant>,
    meters: Meters,
}

impl<U: Backend> Actor<U> {
    pub(super) fn new(
        upstream: Arc<U>,
        shared: Arc<Shared>,
        rx: mpsc::UnboundedReceiver<Sent>,
    ) -> Self {
        Actor {
            upstream,
            shared,
            rx,
            ledger: Ledger::default(),
            queue: Queue::default(),
            bulk: Queue::default(),
            requests: HashMap::new(),
            held: HashMap::new(),
            batches: JoinSet::new(),
            running: HashMap::new(),
            relays: FuturesUnordered::new(),
            next_id: 0,
            closed: false,
            received: 0,
            last_interactive: None,
            meters: Meters::new(),
        }
    }

    pub(super) async fn run(mut self) {
        loop {
            self.dispatch_ready();
            self.publish();
            self.meters.queue_depth.set(self.queue.inputs() as f64);
            self.meters.in_flight.set(self.batches.len() as f64);
            if self.closed
                && self.requests.is_empty()
                && self.batches.is_empty()
                && self.relays.is_empty()
            {
                break;
            }
            let flush_at = if self.partial_allowed() {
                self.queue.next_due(self.shared.limits.max_wait)
            } else {
                None // only a completion or a filling group can make progress
            };
            // One timer for both: the next group due by MAX_WAIT_TIME and the earliest deadline
            // of a waiting request (expiring is a no-op when only a group is due).
            // A handoff already past made its dispatch (or found nothing it may send): the
            // next arrival or completion dispatches again.
            let handoff = self.handoff_at().filter(|&at| at > Instant::now());
            let wake_at = [flush_at, self.queue.next_deadline(), handoff]
                .into_iter()
                .flatten()
                .min();
            tokio::select! {
                biased;
                Some(joined) = self.batches.join_next_with_id() => match joined {
                    Ok((id, done)) => self.complete(id, done),
                    Err(err) => self.crashed(err),
                },
                Some(relayed) = self.relays.next(), if !self.relays.is_empty() => {
                    if let Some(id) = relayed {
                        self.cancel(id);
                    }
                }
                sent = self.rx.recv(), if !self.closed => match sent {
                    Some(Sent::Request(job)) => self.enqueue(job),
                    Some(Sent::Bulk(job)) => self.enqueue_bulk(job),
                    None => self.closed = true,
                },
                () = sleep_until_opt(wake_at) => self.expire(),
            }
        }
        tracing::debug!("batcher stopped");
    }

    /// Publishes the ledger for the handle's views, then stops counting the requests it now
    /// holds (or refused) as in transit.
    fn publish(&mut self) {
        self.shared.publish(&self.ledger);
        let received = std::mem::take(&mut self.received);
        if received > 0 {
            self.shared
                .in_transit
                .fetch_sub(received, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Removes what is left of request `id` from its queue (interactive or bulk); returns what
    /// was removed.
    fn dequeue(&mut self, id: u64) -> Removed {
        if self.requests.get(&id).is_some_and(Pending::is_bulk) {
            self.bulk.remove(id)
        } else {
            let removed = self.queue.remove(id);
            self.unqueue(removed);
            removed
        }
    }

    /// The caller went away: forget the request, its queued inputs and its share of the bounds.
    /// Inputs already in flight are still answered by the upstream, and dropped.
    fn cancel(&mut self, id: u64) {
        let removed = self.dequeue(id);
        if let Some(request) = self.take(id) {
            if request.is_bulk() {
                return;
            }
            request.span.record("outcome", "cancelled");
            metrics::counter!(names::REQUESTS, "outcome" => "cancelled").increment(1);
            tracing::debug!(parent: &request.span, removed = removed.inputs, "request cancelled by its caller");
        }
    }

    /// Answers 504 to every request whose deadline passed while inputs of it still waited,
    /// and frees its share of the bounds: at its deadline, not when a call slot frees.
    fn expire(&mut self) {
        for (id, removed) in self.queue.expire(Instant::now()) {
            self.unqueue(removed);
            if let Some(request) = self.take(id) {
                answer(
                    &self.meters,
                    request,
                    Err(EmbedError::DeadlineExceeded(
                        "the request's deadline passed while it waited in the queue".into(),
                    )),
                );
            }
        }
    }

    fn unqueue(&mut self, removed: Removed) {
        self.ledger.unqueue(removed.inputs, removed.tokens);
    }

    /// Forgets a request about to be answered (or cancelled) and frees its share of the bounds.
    fn take(&mut self, id: u64) -> Option<Pending> {
        let request = self.requests.remove(&id)?;
        if !request.is_bulk() {
            self.ledger.release(request.results.len(), request.bytes);
            if let Some(held) = self.held.get_mut(&request.tenant) {
                held.0 = held.0.saturating_sub(request.results.len());
                if held.0 == 0 {
                    self.held.remove(&request.tenant);
                }
            }
        }
        Some(request)
    }

    /// While bulk inputs wait and one call runs: the instant, a quarter of a call time before
    /// that call is expected to end (launch + the call-time estimate), from which the next
    /// batch may be sent, partial interactive groups and bulk fill included, to wait at the
    /// upstream rather than leave it idle for the worker's turnaround (its reply, the next
    /// batch's forming and request). Measured with a backlog behind interactive traffic at
    /// half the upstream's capacity: without it about a fifth of the upstream's time was
    /// idle between calls. Interactive requests arriving in that quarter wait for one call
    /// more, which the bulk lane's one-call bound allows; with no bulk input waiting, dispatch
    /// is as before. `None` otherwise.
    fn handoff_at(&self) -> Option<Instant> {
        if self.closed
            || self.bulk.inputs() == 0
            || self.batches.len() != 1
            || self.shared.limits.slots < 2
        {
            return None;
        }
        let running = self.running.values().next()?;
        let call = self.ledger.estimate.call_at(running.launched)?;
        Some(running.launched + call - call / 4)
    }

    /// A batch that is not full may take a slot now: fewer than `partial_slots` calls are in
    /// flight, or the batcher is closing (everything leaves).
    fn partial_allowed(&self) -> bool {
        self.closed || self.batches.len() < self.shared.limits.partial_slots
    }

    /// Sends every due group upstream while call slots are free, oldest first. The slots beyond
    /// `partial_slots` take only full batches: while the upstream is busy, a batch that waited
    /// `MAX_WAIT_TIME` keeps filling in the queue rather than waiting inside the upstream.
    fn dispatch_ready(&mut self) {
        let (slots, batch_limit, budget, max_wait, when_idle) = {
            let limits = &self.shared.limits;
            (
                limits.slots,
                limits.batch_limit,
                limits.budget,
                limits.max_wait,
                limits.dispatch_when_idle,
            )
        };
        while self.batches.len() < slots {
            let now = Instant::now();
            let handoff = self.handoff_at().is_some_and(|at| at <= now);
            let fresh = self.ledger.estimate.is_fresh(now);
            let call = self.ledger.estimate.call_at(now).filter(|_| fresh);
            let lone = self.queue.inputs() <= batch_limit;
            let probe_allowed = self.ledger.probe_allowed(now, lone);
            let take = Take {
                now,
                batch_limit,
                budget,
                max_wait,
                // Closing flushes everything; an idle upstream takes any waiting group at once.
                flush_all: self.closed || (when_idle && (self.batches.is_empty() || handoff)),
                partial: self.partial_allowed() || handoff,
                cutoff: now + call.unwrap_or_default(),
                probe_allowed,
                floor: self.ledger.fastest.clone(),
            };
            let Some(mut formed) = self.queue.take(take) else {
                match self.bulk_batch(now) {
                    Some(formed) => {
                        self.launch(formed, now);
                        continue;
                    }
                    None => break,
                }
            };
            let mut left = Removed {
                inputs: formed.inputs.len(),
                tokens: formed.lengths.iter().map(|&t| u64::from(t)).sum(),
            };
            for (_, expired) in &formed.expired {
                left.inputs += expired.inputs;
                left.tokens += expired.tokens;
            }
            self.unqueue(left);
            for &(id, _) in &formed.expired {
                if let Some(request) = self.take(id) {
                    answer(
                        &self.meters,
                        request,
                        Err(EmbedError::DeadlineExceeded(
                            "the request's deadline passes before an upstream call could finish"
                                .into(),
                        )),
                    );
                }
            }
            if !formed.inputs.is_empty() {
                // Bulk inputs of the same options fill what the interactive batch leaves.
                let added = self.bulk.top_up(&mut formed, batch_limit, budget);
                if added.inputs > 0 {
                    metrics::counter!(names::BULK_TOP_UP_INPUTS).increment(added.inputs as u64);
                }
                self.launch(formed, now);
            }
        }
    }

    /// A batch of bulk inputs alone, when nothing interactive is queued or on its way to the
    /// actor and fewer calls are in flight than bulk may run ahead of interactive requests: 1
    /// (an idle upstream) while interactive requests arrive, so one arriving waits behind at
    /// most one bulk call; the bulk lane's `BULK_CALLS` once none arrived for
    /// [`BULK_QUIET_CALLS`] call times (a bulk job alone keeps the upstream busy back to back).
    /// `None` otherwise, or when no bulk input waits.
    fn bulk_batch(&mut self, now: Instant) -> Option<Formed> {
        let limits = &self.shared.limits;
        if self.bulk.inputs() == 0
            || self.queue.inputs() > 0
            || self
                .shared
                .in_transit
                .load(std::sync::atomic::Ordering::Relaxed)
                > self.received
        {
            return None;
        }
        let call = self
            .ledger
            .estimate
            .call_at(now)
            .unwrap_or(BULK_QUIET_FALLBACK / BULK_QUIET_CALLS);
        let quiet = self
            .last_interactive
            .is_none_or(|at| now.saturating_duration_since(at) >= call * BULK_QUIET_CALLS);
        let calls = if quiet {
            self.shared
                .bulk_calls
                .load(std::sync::atomic::Ordering::Relaxed)
        } else {
            1
        };
        if self.batches.len() >= calls.min(limits.slots) {
            return None;
        }
        self.bulk.take(Take {
            now,
            batch_limit: limits.batch_limit,
            budget: limits.budget,
            max_wait: limits.max_wait,
            flush_all: true,
            partial: true,
            cutoff: now,
            probe_allowed: false,
            floor: Default::default(),
        })
    }

    /// Answers `err` to request `id` and drops what is left of it in the queue.
    fn fail(&mut self, id: u64, err: EmbedError) {
        self.dequeue(id);
        if let Some(request) = self.take(id) {
            answer(&self.meters, request, Err(err));
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Call times without an interactive request after which bulk inputs alone may take more than
/// an idle upstream (see [`Actor::bulk_batch`]).
const BULK_QUIET_CALLS: u32 = 10;

/// The quiet spell before the first call time is measured.
const BULK_QUIET_FALLBACK: std::time::Duration = std::time::Duration::from_millis(100);

/// How long a bulk request may wait in the batcher: the bulk lane cancels it (drops its
/// receiver) long before; this only gives the queue a deadline to order by.
const BULK_DEADLINE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
