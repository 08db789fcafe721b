//! The worker's liveness signal for clients: its service id (and its connect count,
//! [`embatch_protocol::headers::WORKER_CONNECTS`]) on
//! [`embatch_protocol::headers::heartbeat_subject`], sent only while some client could take the
//! worker's silence for its death.
//!
//! A client that asked for an acknowledgement ([`embatch_protocol::headers::ACK`]) knows which
//! worker holds its request, and watches that worker from the acknowledgement until the reply;
//! when it hears nothing from it (no acknowledgement, no heartbeat) for
//! [`embatch_protocol::headers::HEARTBEAT_EXPIRY`] (500 ms: the process was killed, or lost
//! NATS), the client resends the request to the queue group. So the worker beats every
//! [`embatch_protocol::headers::HEARTBEAT_INTERVAL`] (100 ms) while it holds a request it
//! acknowledged more than one interval ago: a client hears the worker within 200 ms of an
//! acknowledgement and every 100 ms after, while a request answered within 100 ms of its
//! acknowledgement (most of them, on a worker that keeps up) costs no beat at all. An idle
//! worker, and one whose requests are answered before they are acknowledged, is silent. The
//! heartbeat runs until every acknowledged request is answered, so a graceful stop never looks
//! like a death.
//!
//! It is silent while the worker is out of the queue group because its upstream fails or
//! hangs ([`MemberState::UpstreamUnhealthy`], see [`crate::membership`]): a call that hangs in
//! the upstream would hold its requests until `UPSTREAM_TIMEOUT`, so the clients resend them to
//! the other workers after [`embatch_protocol::headers::HEARTBEAT_EXPIRY`], and the first reply
//! wins. (A worker whose upstream fails answers 503 for what it holds anyway.)
//!
//! Cost: one message of ~22 bytes of body and ~50 of header per interval, on each served subject
//! (`embed`, a model's subject) that a request acknowledged over 100 ms ago came in on (a client
//! watches the heartbeat of the subject it sent to), fanned out by the NATS server to every
//! client that listens there (docs/design/control-plane.md).

use std::array;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use async_nats::Client;
use bytes::Bytes;
use embatch_protocol::headers::{HEARTBEAT_INTERVAL, heartbeat_subject};
use tokio::sync::{Notify, watch};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::membership::MemberState;

/// Generations of acknowledgements counted apart: a request is counted in the slot of the
/// heartbeat tick it was acknowledged in (modulo this), so the heartbeat can tell the requests
/// acknowledged in the last interval from the older ones without a lock. A request held over
/// `SLOTS` intervals may share the newest slot for one tick: at most one beat is skipped for it
/// (200 ms between beats, within the client's 500 ms).
const SLOTS: usize = 8;

/// The acknowledged requests a worker holds, by the subject served they came in on and the
/// heartbeat tick they were acknowledged in, and a wake-up for the heartbeat between busy
/// spells.
#[derive(Debug)]
pub(crate) struct Acked {
    /// The subjects the worker serves (`embed`, a model's subject): a client watches the
    /// heartbeat of the one it sent to.
    subjects: Vec<String>,
    /// The heartbeat's tick count (advanced only while it beats or waits to).
    generation: AtomicU64,
    /// Acknowledged and unanswered requests, per subject, per generation modulo [`SLOTS`].
    slots: Vec<[AtomicUsize; SLOTS]>,
    notify: Notify,
}

/// One acknowledged request, counted from its acknowledgement until this is dropped (its reply
/// task ended: answered, withdrawn or handed back).
#[derive(Debug)]
pub(crate) struct Held {
    acked: Arc<Acked>,
    subject: usize,
    slot: usize,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.acked.slots[self.subject][self.slot].fetch_sub(1, Ordering::AcqRel);
    }
}

impl Acked {
    /// Counts nothing yet, for a worker serving `subjects` (at least one).
    pub(crate) fn new(subjects: Vec<String>) -> Acked {
        let slots = subjects
            .iter()
            .map(|_| array::from_fn(|_| AtomicUsize::new(0)))
            .collect();
        Acked {
            subjects,
            generation: AtomicU64::new(0),
            slots,
            notify: Notify::new(),
        }
    }

    /// Counts a request that came in on `subject` (a served subject, or a route of one such as
    /// `<subject>.rerank`), about to be acknowledged (call before sending the acknowledgement),
    /// and wakes the heartbeat.
    pub(crate) fn hold(self: &Arc<Self>, subject: &str) -> Held {
        let subject = self.served(subject);
        let generation = self.generation.load(Ordering::Acquire);
        let slot = slot_of(generation);
        self.slots[subject][slot].fetch_add(1, Ordering::AcqRel);
        self.notify.notify_one();
        Held {
            acked: Arc::clone(self),
            subject,
            slot,
        }
    }

    /// The served subject `subject` belongs to: the longest that is `subject` or a prefix of it
    /// up to a `.` (a model's subject `embed.<model>` before `embed`); the first when none is.
    fn served(&self, subject: &str) -> usize {
        let belongs = |served: &str| {
            subject
                .strip_prefix(served)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
        };
        self.subjects
            .iter()
            .enumerate()
            .filter(|(_, served)| belongs(served))
            .max_by_key(|(_, served)| served.len())
            .map_or(0, |(index, _)| index)
    }

    /// Starts tick `generation + 1` and tells, per served subject, whether a request
    /// acknowledged before the tick just ended is held (a beat is due there), and whether any
    /// acknowledged request is held.
    fn tick(&self) -> (Vec<bool>, bool) {
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        let young = slot_of(generation - 1);
        let mut any = false;
        let due = self
            .slots
            .iter()
            .map(|slots| {
                let mut due = false;
                for (slot, count) in slots.iter().enumerate() {
                    if count.load(Ordering::Acquire) > 0 {
                        any = true;
                        due |= slot != young;
                    }
                }
                due
            })
            .collect();
        (due, any)
    }

    fn any(&self) -> bool {
        self.slots
            .iter()
            .flatten()
            .any(|c| c.load(Ordering::Acquire) > 0)
    }
}

fn slot_of(generation: u64) -> usize {
    // The remainder is below SLOTS (8), so it fits any usize.
    (generation % SLOTS as u64) as usize
}

/// What the heartbeat follows: who beats, and what the worker holds on which subject.
pub(crate) struct Beat {
    /// The NATS connection.
    pub client: Client,
    /// The worker's service id (the payload).
    pub id: String,
    /// The membership state: silent while [`MemberState::UpstreamUnhealthy`].
    pub state: watch::Receiver<MemberState>,
    /// The acknowledged requests held (shared with the intake's reply tasks).
    pub acked: Arc<Acked>,
}

/// Beats while the worker holds requests acknowledged over an interval ago, until `stop` is
/// cancelled (the last step of the worker's shutdown, after it answered what it held). Between
/// busy spells it waits for an acknowledgement and sends nothing. A failed publish (the
/// connection is closed) is logged at debug and retried at the next tick; while disconnected the
/// client does not send (async-nats would buffer the beats and flush them, stale, at the
/// reconnect).
pub(crate) async fn run(beat: Beat, stop: CancellationToken) {
    let subjects: Vec<String> = beat
        .acked
        .subjects
        .iter()
        .map(|s| heartbeat_subject(s))
        .collect();
    let payload = Bytes::from(beat.id.clone().into_bytes());
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = beat.acked.notify.notified() => {}
        }
        if beat.acked.any() {
            spell(&beat, &subjects, &payload, &stop).await;
        }
    }
}

/// One busy spell: a tick every interval, each beating when a request acknowledged before the
/// last tick is held, until none acknowledged is held (an acknowledgement after that wakes
/// [`run`] again: [`Notify`] keeps the wake-up). Returns early when `stop` is cancelled.
async fn spell(beat: &Beat, subjects: &[String], payload: &Bytes, stop: &CancellationToken) {
    let start = tokio::time::Instant::now() + HEARTBEAT_INTERVAL;
    let mut tick = tokio::time::interval_at(start, HEARTBEAT_INTERVAL);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let (due, any) = beat.acked.tick();
        if !any {
            return;
        }
        if !due.contains(&true)
            || beat.client.connection_state() != async_nats::connection::State::Connected
            || *beat.state.borrow() == MemberState::UpstreamUnhealthy
        {
            continue;
        }
        let due = subjects
            .iter()
            .zip(due)
            .filter_map(|(s, due)| due.then_some(s));
        publish(beat, due, payload).await;
    }
}

/// One beat on each of `subjects`, with the connection's connect count: a larger count than
/// the acknowledgement's tells a client that replies sent before a reconnect may be lost.
async fn publish(beat: &Beat, subjects: impl Iterator<Item = &String>, payload: &Bytes) {
    let mut connects = async_nats::HeaderMap::new();
    connects.insert(
        embatch_protocol::headers::WORKER_CONNECTS,
        crate::reconnect::connects(&beat.client)
            .to_string()
            .as_str(),
    );
    for subject in subjects {
        let sent =
            beat.client
                .publish_with_headers(subject.clone(), connects.clone(), payload.clone());
        if let Err(err) = sent.await {
            tracing::debug!(%err, "cannot publish the heartbeat");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one() -> Arc<Acked> {
        Arc::new(Acked::new(vec!["embed".into()]))
    }

    #[test]
    fn a_beat_is_due_only_for_a_request_acknowledged_before_the_last_tick() {
        let acked = one();
        assert_eq!(acked.tick(), (vec![false], false), "nothing held");
        let first = acked.hold("embed");
        let young = (vec![false], true);
        assert_eq!(acked.tick(), young, "acknowledged in the tick just ended");
        assert_eq!(acked.tick(), (vec![true], true), "one interval old");
        let second = acked.hold("embed");
        assert_eq!(acked.tick(), (vec![true], true), "the old one still held");
        drop(first);
        assert_eq!(acked.tick(), (vec![true], true), "the second is old now");
        drop(second);
        assert_eq!(acked.tick(), (vec![false], false), "all answered");
    }

    #[test]
    fn a_request_held_for_many_intervals_skips_at_most_one_beat() {
        let acked = one();
        let _held = acked.hold("embed");
        acked.tick();
        let mut skipped_in_a_row = 0;
        let mut most = 0;
        for _ in 0..(SLOTS * 4) {
            let (due, any) = acked.tick();
            assert!(any);
            skipped_in_a_row = if due[0] { 0 } else { skipped_in_a_row + 1 };
            most = most.max(skipped_in_a_row);
        }
        assert_eq!(most, 1, "one tick at each wrap of the slots");
    }

    #[test]
    fn a_beat_is_due_only_on_the_subject_the_request_came_in_on() {
        let acked = Arc::new(Acked::new(vec!["embed".into(), "embed.m%2E1".into()]));
        let _model = acked.hold("embed.m%2E1.rerank");
        acked.tick();
        assert_eq!(
            acked.tick(),
            (vec![false, true], true),
            "the model's subject"
        );
        let _plain = acked.hold("embed.rerank");
        acked.tick();
        assert_eq!(
            acked.tick(),
            (vec![true, true], true),
            "and the default one"
        );
        assert_eq!(
            acked.served("embed.m%2E10"),
            0,
            "a longer token is another model"
        );
        assert_eq!(acked.served("other"), 0, "unknown: the first");
    }
}
