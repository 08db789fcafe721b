//! The delivery protocol of one request as a state machine without I/O: [`State`] holds what
//! lasts across the copies of a request and the copy out, [`State::on`] takes one [`Event`] at
//! an instant the caller passes and says what comes [`Next`]. Nothing here publishes, sleeps,
//! reads the clock or touches the inbox: the driver ([`super::deliver`]) does, so every
//! transition is a unit test (`delivery/tests.rs`).

use std::time::Duration;

use tokio::time::Instant;

use super::event::{Announcement, Event, Resend};
use crate::inbox::Generation;
use crate::{
    ACK_TIMEOUT_MAX, MIN_RESEND_BUDGET, NO_RESPONDERS_RETRY, RECONNECT_GRACE, Reply, RequestError,
    UNAVAILABLE_RETRIES, unavailable_pause,
};

/// The longest pause between two "no responders" retries: 100 ms.
pub(crate) const NO_RESPONDERS_BACKOFF_MAX: Duration = Duration::from_millis(100);

/// The first pause after a "no responders" answer: 10 ms.
pub(crate) const NO_RESPONDERS_BACKOFF_MIN: Duration = Duration::from_millis(10);

/// Where the request stands, as [`State::phase`] tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// No copy is out: the next one is to be sent (at the start, and after a resend decision).
    Sending,
    /// A copy is out that no worker acknowledged yet: it is resent at `ack_by` unless an
    /// acknowledgement or the reply comes first.
    AwaitingAck { ack_by: Instant },
    /// A copy is out and no acknowledgement is awaited (one came, the workers do not
    /// acknowledge, or the wait would end past the deadline): the reply, a lost holder, a
    /// reconnect or the deadline comes next.
    AwaitingReply,
}

/// The one timer the driver runs ([`State::timer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timer {
    /// Until when the copy out waits for an acknowledgement; fires [`Event::AckTimeout`].
    Ack(Instant),
    /// The request's deadline; fires [`Event::Deadline`].
    Deadline(Instant),
}

impl Timer {
    /// When it fires.
    pub(crate) fn at(self) -> Instant {
        match self {
            Timer::Ack(at) | Timer::Deadline(at) => at,
        }
    }

    /// The event it fires.
    pub(crate) fn event(self) -> Event {
        match self {
            Timer::Ack(_) => Event::AckTimeout,
            Timer::Deadline(_) => Event::Deadline,
        }
    }
}

/// What [`State::prepare`] says the next copy carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Send {
    /// Its number, 1-based ([`headers::ATTEMPT`](embatch_protocol::headers::ATTEMPT) from 2).
    pub attempt: u32,
    /// What is left of the budget: its deadline ([`headers::DEADLINE_MS`](embatch_protocol::headers::DEADLINE_MS)).
    pub remaining: Duration,
}

/// What the worker's reply taught about acknowledgements, for the client's inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Learnt {
    /// The worker acknowledges, after `ms` ([`Inbox::acknowledges_after`](crate::inbox::Inbox::acknowledges_after)).
    AcknowledgesAfter { ms: u64 },
    /// A success came with neither an acknowledgement nor an acknowledgement delay: a worker
    /// that predates acknowledgements ([`Inbox::unacknowledged_success`](crate::inbox::Inbox::unacknowledged_success)).
    Unacknowledged,
}

/// What the driver does after a transition.
#[derive(Debug)]
pub(crate) enum Next {
    /// Keep waiting for the copies out (until [`State::timer`]).
    Wait,
    /// Tell the inbox that `worker` acknowledged (with `connects`), `rtt` after the copy was
    /// sent ([`Inbox::acknowledged`](crate::inbox::Inbox::acknowledged)), then keep waiting.
    Acknowledged {
        worker: String,
        connects: Option<u64>,
        rtt: Duration,
    },
    /// Pause `after` (zero: none), count the resend under `reason`, and send another copy.
    Resend { reason: Resend, after: Duration },
    /// "No responders" for good: answer the caller with what discovery says of the fleet
    /// (nothing to withdraw: no worker holds a copy).
    AskDiscovery,
    /// A worker answered: tell the inbox what was `learnt`, withdraw the other copies when
    /// `withdraw` (more than one was sent), and answer the caller with `outcome`.
    Answer {
        outcome: Result<Reply, RequestError>,
        learnt: Option<Learnt>,
        withdraw: bool,
    },
    /// The request failed without an answer: the copies out are withdrawn (the armed cancel).
    Fail(RequestError),
}

/// A worker that acknowledged a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Holder {
    /// Its service id.
    worker: String,
    /// The largest connect count its acknowledgements carried ([`Event::Acknowledged`]).
    connects: Option<u64>,
}

/// The copy out.
#[derive(Debug, Clone, Copy)]
struct Copy {
    /// When it was sent.
    sent: Instant,
    /// The connection it went out on (the client's connect count): a reconnect announced later
    /// that this copy was sent after (the announcement lags by up to 50 ms) lost nothing of it.
    connects_at_send: u64,
    /// Until when an acknowledgement is awaited; `None` once one came, or when none is expected.
    ack_by: Option<Instant>,
    /// The inbox's counters as of its sending, then as of the last announcement.
    seen: Generation,
}

/// What lasts across the copies of one request, and the copy out.
#[derive(Debug)]
pub(crate) struct State {
    deadline: Instant,
    budget: Duration,
    /// How long a copy waits for an acknowledgement before it is resent; `None` while workers
    /// are not known to acknowledge.
    ack_wait: Option<Duration>,
    /// The pause before the next "no responders" retry.
    backoff: Duration,
    /// Since when "no responders" has been the answer.
    no_responders_since: Option<Instant>,
    /// Until when "no responders" is expected: workers re-subscribe after a reconnect.
    reconnect_grace_until: Instant,
    /// Copies sent so far.
    sends: u32,
    /// 503s resent so far.
    unavailable: u32,
    /// The workers that acknowledged a copy; cleared when their heartbeats stop or show a
    /// reconnect, or on a 503.
    holders: Vec<Holder>,
    /// Whether any copy was ever acknowledged. `holders` cannot tell a worker that predates
    /// acknowledgements from one whose heartbeat was merely late (a starved process): only a
    /// success with no acknowledgement at all, and without the acknowledgement delay that an
    /// acknowledging worker puts on every reply, turns acknowledgement waits off.
    acknowledged: bool,
    /// The copy out; `None` before the first and after a resend decision.
    copy: Option<Copy>,
}

impl State {
    /// A request started at `started` with `budget`; `ack_wait` is the client's
    /// acknowledgement wait ([`Inbox::ack_timeout`](crate::inbox::Inbox::ack_timeout)).
    pub(crate) fn new(started: Instant, budget: Duration, ack_wait: Option<Duration>) -> State {
        State {
            deadline: started + budget,
            budget,
            ack_wait,
            backoff: NO_RESPONDERS_BACKOFF_MIN,
            no_responders_since: None,
            reconnect_grace_until: started,
            sends: 0,
            unavailable: 0,
            holders: Vec::new(),
            acknowledged: false,
            copy: None,
        }
    }

    /// When the request's budget runs out.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Where the request stands.
    pub(crate) fn phase(&self) -> Phase {
        match self.copy {
            None => Phase::Sending,
            Some(Copy {
                ack_by: Some(ack_by),
                ..
            }) => Phase::AwaitingAck { ack_by },
            Some(_) => Phase::AwaitingReply,
        }
    }

    /// The timer to run while a copy is out: the acknowledgement wait while one runs, else
    /// the deadline.
    pub(crate) fn timer(&self) -> Timer {
        match self.phase() {
            Phase::AwaitingAck { ack_by } => Timer::Ack(ack_by),
            Phase::Sending | Phase::AwaitingReply => Timer::Deadline(self.deadline),
        }
    }

    /// The workers holding a copy, each with the connect count of its acknowledgement: the
    /// driver reads their liveness into an [`Announcement`].
    pub(crate) fn holders(&self) -> impl Iterator<Item = (&str, Option<u64>)> {
        self.holders.iter().map(|h| (h.worker.as_str(), h.connects))
    }

    /// The next copy, about to be published at `now`. `waited`: the request waited for a
    /// reconnect first; `reconnected_at`: this client's last reconnect
    /// ([`Generation::reconnected_at`]). A copy sent within [`RECONNECT_GRACE`] of either (even
    /// a reconnect this request did not wait through) expects "no responders" while workers
    /// re-subscribe, and waits the longest acknowledgement wait.
    pub(crate) fn prepare(
        &mut self,
        waited: bool,
        reconnected_at: Option<Instant>,
        now: Instant,
    ) -> Send {
        if waited {
            self.reconnect_grace_until = now + RECONNECT_GRACE;
        }
        if let Some(at) = reconnected_at {
            self.reconnect_grace_until = self.reconnect_grace_until.max(at + RECONNECT_GRACE);
        }
        Send {
            attempt: self.sends + 1,
            remaining: self.deadline.saturating_duration_since(now),
        }
    }

    /// The copy [`State::prepare`]d was published at `now`, on the connection `connects`, with
    /// the inbox's counters at `seen`.
    pub(crate) fn sent(&mut self, seen: Generation, connects: u64, now: Instant) {
        self.sends += 1;
        self.copy = Some(Copy {
            sent: now,
            connects_at_send: connects,
            ack_by: self.ack_by(now),
            seen,
        });
    }

    /// Until when a copy sent at `sent` waits for its acknowledgement; `None` when that would
    /// be past the deadline or none is expected. Within RECONNECT_GRACE of a reconnect, the
    /// requests clients held reach the workers together, and acknowledging them all takes the
    /// workers longer than a round trip: a copy sent then waits the longest acknowledgement
    /// wait, not a few round trips, before it is resent (a burst of spurious resends filled a
    /// worker's QUEUE_CAP, benchmark 16).
    fn ack_by(&self, sent: Instant) -> Option<Instant> {
        let after_reconnect = sent < self.reconnect_grace_until;
        self.ack_wait
            .map(|wait| {
                sent + if after_reconnect {
                    wait.max(ACK_TIMEOUT_MAX)
                } else {
                    wait
                }
            })
            .filter(|at| *at < self.deadline)
    }

    /// The transition: what `event`, at `now`, changes and what comes next. Before the first
    /// copy and after a resend decision no copy is out, and only [`Event::Deadline`] and
    /// [`Event::Closed`] change anything (the driver feeds no event then).
    pub(crate) fn on(&mut self, event: Event, now: Instant) -> Next {
        let next = match event {
            Event::Deadline => Next::Fail(RequestError::TimedOut {
                budget_ms: self.budget.as_millis(),
            }),
            Event::Closed => Next::Fail(RequestError::Transport("the reply inbox closed".into())),
            _ if self.copy.is_none() => Next::Wait,
            Event::Acknowledged { worker, connects } => self.on_ack(worker, connects, now),
            Event::Success {
                reply,
                ack_delay_ms,
            } => self.answer(Ok(reply), ack_delay_ms),
            Event::Unavailable {
                error,
                ack_delay_ms,
                jitter,
            } => self.on_unavailable(error, ack_delay_ms, jitter, now),
            Event::Error {
                error,
                ack_delay_ms,
            } => self.answer(Err(error), ack_delay_ms),
            Event::NoResponders => self.on_no_responders(now),
            Event::AckTimeout => self.on_ack_timeout(now),
            Event::Announced(announcement) => self.on_announced(&announcement, now),
        };
        if matches!(next, Next::Resend { .. }) {
            self.copy = None;
        }
        next
    }

    /// A message from a worker ends a run of "no responders": the next one starts afresh.
    fn heard_from_a_worker(&mut self) {
        self.no_responders_since = None;
        self.backoff = NO_RESPONDERS_BACKOFF_MIN;
    }

    /// An acknowledgement: the copy is held; wait for its reply.
    fn on_ack(&mut self, worker: String, connects: Option<u64>, now: Instant) -> Next {
        self.heard_from_a_worker();
        self.acknowledged = true;
        let mut sent = now;
        if let Some(copy) = &mut self.copy {
            sent = copy.sent;
            copy.ack_by = None;
        }
        // A later acknowledgement by the same worker (of a resent copy, on a newer
        // connection) says it holds the request now: its reply is not behind a reconnect.
        match self.holders.iter_mut().find(|h| h.worker == worker) {
            Some(holder) => holder.connects = holder.connects.max(connects),
            None => self.holders.push(Holder {
                worker: worker.clone(),
                connects,
            }),
        }
        Next::Acknowledged {
            worker,
            connects,
            rtt: now.saturating_duration_since(sent),
        }
    }

    /// A 503: resent after a growing pause, at most [`UNAVAILABLE_RETRIES`] times and only
    /// while the pause leaves [`MIN_RESEND_BUDGET`]; else it is the answer.
    fn on_unavailable(
        &mut self,
        error: RequestError,
        ack_delay_ms: Option<u64>,
        jitter: Duration,
        now: Instant,
    ) -> Next {
        self.heard_from_a_worker();
        if self.unavailable < UNAVAILABLE_RETRIES {
            let pause = unavailable_pause(self.unavailable + 1) + jitter;
            if now + pause + MIN_RESEND_BUDGET < self.deadline {
                self.unavailable += 1;
                self.holders.clear();
                return Next::Resend {
                    reason: Resend::Unavailable,
                    after: pause,
                };
            }
        }
        self.answer(Err(error), ack_delay_ms)
    }

    /// The final reply: the caller's answer, with what it says of acknowledgements.
    fn answer(&mut self, outcome: Result<Reply, RequestError>, ack_delay_ms: Option<u64>) -> Next {
        self.heard_from_a_worker();
        // An acknowledging worker says so on its reply, acknowledged or not.
        let learnt = match ack_delay_ms {
            Some(ms) => Some(Learnt::AcknowledgesAfter { ms }),
            None if outcome.is_ok() && !self.acknowledged => Some(Learnt::Unacknowledged),
            None => None,
        };
        Next::Answer {
            outcome,
            learnt,
            withdraw: self.sends > 1,
        }
    }

    /// "No responders": retried with back-off while workers may be re-subscribing, else
    /// discovery says why none is in the queue group.
    fn on_no_responders(&mut self, now: Instant) -> Next {
        // A copy resent while another worker holds one: that one answers.
        if !self.holders.is_empty() {
            return Next::Wait;
        }
        let since = *self.no_responders_since.get_or_insert(now);
        let give_up = (since + NO_RESPONDERS_RETRY)
            .max(self.reconnect_grace_until)
            .min(self.deadline);
        if now + self.backoff < give_up {
            let after = self.backoff;
            self.backoff = (self.backoff * 2).min(NO_RESPONDERS_BACKOFF_MAX);
            return Next::Resend {
                reason: Resend::NoResponders,
                after,
            };
        }
        Next::AskDiscovery
    }

    /// The acknowledgement wait ran out: resend, with a doubled wait, while the budget allows.
    fn on_ack_timeout(&mut self, now: Instant) -> Next {
        let awaited = self.copy.as_mut().and_then(|copy| copy.ack_by.take());
        if awaited.is_none() || !self.resend_in_time(now) {
            return Next::Wait;
        }
        self.ack_wait = self.ack_wait.map(|wait| (wait * 2).min(ACK_TIMEOUT_MAX));
        Next::Resend {
            reason: Resend::NoAck,
            after: Duration::ZERO,
        }
    }

    /// An inbox announcement: this client reconnected since the copy went out (copies sent
    /// before it may be lost), or a holder's heartbeat stopped or came from a later connection
    /// than its acknowledgement. Resends when the client reconnected, or when every holder is
    /// lost or reconnected: a reply sent before a reconnect may have been lost with its server.
    fn on_announced(&mut self, announcement: &Announcement, now: Instant) -> Next {
        let Some(copy) = &mut self.copy else {
            return Next::Wait;
        };
        let (generation, seen) = (announcement.generation, copy.seen);
        let reconnected = generation.reconnects != seen.reconnects
            && announcement.connects != copy.connects_at_send;
        let moved = |holder: &Holder| announcement.reconnected.contains(&holder.worker);
        let changed =
            generation.lost != seen.lost || generation.worker_reconnects != seen.worker_reconnects;
        let lost = changed
            && !self.holders.is_empty()
            && self
                .holders
                .iter()
                .all(|holder| announcement.lost.contains(&holder.worker) || moved(holder));
        let worker_reconnected = lost && self.holders.iter().any(moved);
        copy.seen = generation;
        if reconnected {
            self.reconnect_grace_until = now + RECONNECT_GRACE;
        }
        if lost {
            self.holders.clear();
        }
        if !(reconnected || lost) || !self.resend_in_time(now) {
            return Next::Wait;
        }
        let reason = if reconnected {
            Resend::Reconnect
        } else if worker_reconnected {
            Resend::WorkerReconnected
        } else {
            Resend::WorkerLost
        };
        Next::Resend {
            reason,
            after: Duration::ZERO,
        }
    }

    /// Whether a copy sent at `now` would still have [`MIN_RESEND_BUDGET`] before the deadline;
    /// when not, the request waits for the copies already out.
    fn resend_in_time(&self, now: Instant) -> bool {
        now + MIN_RESEND_BUDGET < self.deadline
    }
}
