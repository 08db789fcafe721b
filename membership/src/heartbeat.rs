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
//! hangs ([`MemberState::UpstreamUnhealthy`], see [`crate::decision`]): a call that hangs in
//! the upstream would hold its requests until `UPSTREAM_TIMEOUT`, so the clients resend them to
//! the other workers after [`embatch_protocol::headers::HEARTBEAT_EXPIRY`], and the first reply
//! wins. (A worker whose upstream fails answers 503 for what it holds anyway.)
//!
//! Where: a request that names its client's heartbeat subject
//! ([`embatch_protocol::headers::HEARTBEAT_TO`], as the Rust client's do) is beaten for there,
//! once per interval per such subject however many of that client's requests the worker holds;
//! others on [`embatch_protocol::headers::heartbeat_subject`] of the served subject (`embed`, a
//! model's subject) the request came in on, which every client of that subject hears.
//!
//! Cost: one message of ~22 bytes of body and ~50 of header per interval and destination; with
//! per-client subjects each beat is delivered once, to the client that waits, so the beats grow
//! with the requests held long, not with workers × clients (docs/design/control-plane.md).

use std::array;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_nats::Client;
use bytes::Bytes;
use embatch_protocol::headers::{HEARTBEAT_INTERVAL, heartbeat_subject};
use tokio::sync::{Notify, watch};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::decision::MemberState;

/// Generations of acknowledgements counted apart: a request is counted in the slot of the
/// heartbeat tick it was acknowledged in (modulo this), so the heartbeat can tell the requests
/// acknowledged in the last interval from the older ones. A request held over `SLOTS`
/// intervals may share the newest slot for one tick: at most one beat is skipped for it (200 ms
/// between beats, within the client's 500 ms).
const SLOTS: usize = 8;

/// Acknowledged, unanswered requests of one destination, per generation modulo [`SLOTS`].
type Counts = [usize; SLOTS];

/// The acknowledged requests a worker holds, by where their heartbeat goes and the heartbeat
/// tick they were acknowledged in, and a wake-up for the heartbeat between busy spells.
///
/// A mutex over a small map: only requests still held [`embatch_protocol::headers::ACK_DELAY`]
/// after arrival are acknowledged and counted, so it is taken twice per slow request (hold and
/// drop) and once per tick, not per request.
#[derive(Debug)]
pub struct Acked {
    /// The served subjects (`embed`, a model's subject) and their shared heartbeat subjects,
    /// for requests that name none of their own.
    served: Vec<(String, Arc<str>)>,
    /// The heartbeat's tick count (advanced only while it beats or waits to).
    generation: AtomicU64,
    /// Per heartbeat destination with a request held; removed at none.
    held: Mutex<HashMap<Arc<str>, Counts>>,
    notify: Notify,
}

/// One acknowledged request, counted from its acknowledgement until this is dropped (its reply
/// task ended: answered, withdrawn or handed back).
#[derive(Debug)]
pub struct Held {
    acked: Arc<Acked>,
    to: Arc<str>,
    slot: usize,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.acked.lock();
        if let Some(counts) = held.get_mut(&self.to) {
            counts[self.slot] = counts[self.slot].saturating_sub(1);
            if counts.iter().all(|&c| c == 0) {
                held.remove(&self.to);
            }
        }
    }
}

impl Acked {
    /// Counts nothing yet, for a worker serving `subjects` (at least one).
    pub fn new(subjects: Vec<String>) -> Acked {
        let served = subjects
            .into_iter()
            .map(|s| {
                let beat = Arc::from(heartbeat_subject(&s));
                (s, beat)
            })
            .collect();
        Acked {
            served,
            generation: AtomicU64::new(0),
            held: Mutex::new(HashMap::new()),
            notify: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Arc<str>, Counts>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a request that came in on `subject` (a served subject, or a route of one such as
    /// `<subject>.rerank`) and named heartbeat subject `to`
    /// ([`embatch_protocol::headers::HEARTBEAT_TO`], validated by the intake), about to be
    /// acknowledged (call before sending the acknowledgement), and wakes the heartbeat.
    pub fn hold(self: &Arc<Self>, subject: &str, to: Option<&str>) -> Held {
        let to = to.map_or_else(
            || Arc::clone(&self.served[self.served(subject)].1),
            Arc::from,
        );
        let slot = slot_of(self.generation.load(Ordering::Acquire));
        self.lock()
            .entry(Arc::clone(&to))
            .or_insert_with(|| array::from_fn(|_| 0))[slot] += 1;
        self.notify.notify_one();
        Held {
            acked: Arc::clone(self),
            to,
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
        self.served
            .iter()
            .enumerate()
            .filter(|(_, (served, _))| belongs(served))
            .max_by_key(|(_, (served, _))| served.len())
            .map_or(0, |(index, _)| index)
    }

    /// Starts tick `generation + 1` and tells the destinations where a request acknowledged
    /// before the tick just ended is held (a beat is due there), and whether any acknowledged
    /// request is held.
    fn tick(&self) -> (Vec<Arc<str>>, bool) {
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        let young = slot_of(generation - 1);
        let held = self.lock();
        let due = held
            .iter()
            .filter(|(_, counts)| {
                counts
                    .iter()
                    .enumerate()
                    .any(|(slot, &count)| count > 0 && slot != young)
            })
            .map(|(to, _)| Arc::clone(to))
            .collect();
        (due, !held.is_empty())
    }

    fn any(&self) -> bool {
        !self.lock().is_empty()
    }
}

fn slot_of(generation: u64) -> usize {
    // The remainder is below SLOTS (8), so it fits any usize.
    (generation % SLOTS as u64) as usize
}

/// What the heartbeat follows: who beats, and what the worker holds on which subject.
pub struct Beat {
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
pub async fn run(beat: Beat, stop: CancellationToken) {
    let payload = Bytes::from(beat.id.clone().into_bytes());
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = beat.acked.notify.notified() => {}
        }
        if beat.acked.any() {
            spell(&beat, &payload, &stop).await;
        }
    }
}

/// One busy spell: a tick every interval, each beating where a request acknowledged before the
/// last tick is held, until none acknowledged is held (an acknowledgement after that wakes
/// [`run`] again: [`Notify`] keeps the wake-up). Returns early when `stop` is cancelled.
async fn spell(beat: &Beat, payload: &Bytes, stop: &CancellationToken) {
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
        if due.is_empty()
            || beat.client.connection_state() != async_nats::connection::State::Connected
            || *beat.state.borrow() == MemberState::UpstreamUnhealthy
        {
            continue;
        }
        publish(beat, &due, payload).await;
    }
}

/// One beat on each of `subjects`, with the connection's connect count: a larger count than
/// the acknowledgement's tells a client that replies sent before a reconnect may be lost.
async fn publish(beat: &Beat, subjects: &[Arc<str>], payload: &Bytes) {
    let mut connects = async_nats::HeaderMap::new();
    connects.insert(
        embatch_protocol::headers::WORKER_CONNECTS,
        crate::reconnect::connects(&beat.client)
            .to_string()
            .as_str(),
    );
    for subject in subjects {
        let sent = beat.client.publish_with_headers(
            subject.to_string(),
            connects.clone(),
            payload.clone(),
        );
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

    /// The destinations due at the next tick, sorted, and whether any request is held.
    fn tick(acked: &Acked) -> (Vec<String>, bool) {
        let (due, any) = acked.tick();
        let mut due: Vec<String> = due.iter().map(|s| s.to_string()).collect();
        due.sort();
        (due, any)
    }

    fn due(subjects: &[&str]) -> (Vec<String>, bool) {
        (subjects.iter().map(|s| s.to_string()).collect(), true)
    }

    #[test]
    fn a_beat_is_due_only_for_a_request_acknowledged_before_the_last_tick() {
        let acked = one();
        assert_eq!(tick(&acked), (vec![], false), "nothing held");
        let first = acked.hold("embed", None);
        assert_eq!(
            tick(&acked),
            due(&[]),
            "acknowledged in the tick just ended"
        );
        assert_eq!(tick(&acked), due(&["embed.alive"]), "one interval old");
        let second = acked.hold("embed", None);
        assert_eq!(
            tick(&acked),
            due(&["embed.alive"]),
            "the old one still held"
        );
        drop(first);
        assert_eq!(tick(&acked), due(&["embed.alive"]), "the second is old now");
        drop(second);
        assert_eq!(tick(&acked), (vec![], false), "all answered");
    }

    #[test]
    fn a_request_held_for_many_intervals_skips_at_most_one_beat() {
        let acked = one();
        let _held = acked.hold("embed", None);
        acked.tick();
        let mut skipped_in_a_row = 0;
        let mut most = 0;
        for _ in 0..(SLOTS * 4) {
            let (due, any) = acked.tick();
            assert!(any);
            skipped_in_a_row = if due.is_empty() {
                skipped_in_a_row + 1
            } else {
                0
            };
            most = most.max(skipped_in_a_row);
        }
        assert_eq!(most, 1, "one tick at each wrap of the slots");
    }

    #[test]
    fn a_beat_is_due_only_on_the_subject_the_request_came_in_on() {
        let acked = Arc::new(Acked::new(vec!["embed".into(), "embed.m%2E1".into()]));
        let _model = acked.hold("embed.m%2E1.rerank", None);
        acked.tick();
        assert_eq!(
            tick(&acked),
            due(&["embed.m%2E1.alive"]),
            "the model's subject"
        );
        let _plain = acked.hold("embed.rerank", None);
        acked.tick();
        assert_eq!(
            tick(&acked),
            due(&["embed.alive", "embed.m%2E1.alive"]),
            "and the default one"
        );
        assert_eq!(
            acked.served("embed.m%2E10"),
            0,
            "a longer token is another model"
        );
        assert_eq!(acked.served("other"), 0, "unknown: the first");
    }

    #[test]
    fn a_client_that_names_its_subject_gets_one_beat_for_all_it_has_held() {
        let acked = one();
        let a: Vec<Held> = (0..5)
            .map(|_| acked.hold("embed", Some("_INBOX.a.alive")))
            .collect();
        let b = acked.hold("embed", Some("_INBOX.b.alive"));
        acked.tick();
        assert_eq!(
            tick(&acked),
            due(&["_INBOX.a.alive", "_INBOX.b.alive"]),
            "one beat per client, none on the shared subject"
        );
        drop(b);
        assert_eq!(tick(&acked), due(&["_INBOX.a.alive"]), "b answered");
        drop(a);
        assert_eq!(tick(&acked), (vec![], false), "all answered");
        assert!(acked.lock().is_empty(), "no destination left behind");
    }
}
