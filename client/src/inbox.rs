//! One reply inbox per client, shared by all its requests, and what the client knows of the
//! workers' liveness.
//!
//! A request that asks for an acknowledgement ([`headers::ACK`]) gets two messages on its reply
//! subject, which async-nats's `request` (one message per request) cannot take. So the client
//! subscribes once to `<inbox>.*` and routes each message by its last token to the request
//! waiting for it ([`Inbox::register`]): one subscription, one hash-map insert and removal per
//! request.
//!
//! The same task listens for the heartbeats of the workers that hold its requests: on a subject
//! of its own, `_INBOX.<nuid>.alive`, which every request names ([`headers::HEARTBEAT_TO`]), so
//! the worker beats there for this client alone; and on [`headers::heartbeat_subject`], where
//! workers that predate that header beat for every client. A worker is watched while it holds
//! one of this client's requests: from its acknowledgement (seen here, on the inbox) until that
//! request ends. Each acknowledgement and each heartbeat from it counts as word that it lives; a
//! watched worker not heard for [`HEARTBEAT_EXPIRY`] is lost, and the requests it had
//! acknowledged are resent ([`Inbox::is_lost`]). Workers beat only while they hold a request
//! acknowledged over [`headers::HEARTBEAT_INTERVAL`] ago, so a worker that holds nothing of this
//! client is not watched: its silence says nothing. It also watches the connection: after a reconnect every request in
//! flight is resent, since a reply the worker published while this client was away was dropped
//! by the server. Both are announced through [`Inbox::events`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::Message;
use embatch_protocol::headers::{self, HEARTBEAT_EXPIRY};
use futures::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};

/// How often the liveness of workers and the connection are checked: 50 ms.
const CHECK_EVERY: Duration = Duration::from_millis(50);

/// Shortest wait for an acknowledgement beyond the workers' acknowledgement delay
/// ([`headers::ACK_DELAY`]) before a request is resent: 100 ms (a loaded host stalls processes
/// for tens of ms; each spurious resend is upstream work twice).
pub const ACK_TIMEOUT_MIN: Duration = Duration::from_millis(100);

/// Longest wait for an acknowledgement before a request is resent: 1 s. Each further resend of
/// the same request doubles its wait, up to this.
pub const ACK_TIMEOUT_MAX: Duration = Duration::from_secs(1);

/// The acknowledgement wait is the workers' acknowledgement delay plus this many times the
/// smoothed round trip of an acknowledgement (its arrival less that delay).
const ACK_TIMEOUT_FACTOR: u32 = 10;

/// The longest acknowledgement delay a worker's [`headers::ACK_DELAY_MS`] is taken at: half of
/// [`ACK_TIMEOUT_MAX`], so a wrong header cannot put off resends for long.
const ACK_DELAY_MAX: Duration = Duration::from_millis(500);

/// What changed since a request last looked: counters, so a request compares its own copy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Generation {
    /// Workers found lost so far.
    pub lost: u64,
    /// Reconnects of the NATS connection so far.
    pub reconnects: u64,
    /// When the last reconnect was seen (checked every 50 ms).
    pub reconnected_at: Option<Instant>,
    /// Watched workers heard with a larger connect count ([`headers::WORKER_CONNECTS`]) so far.
    pub worker_reconnects: u64,
}

/// What the client heard of one worker it watches.
#[derive(Debug)]
struct Heard {
    last: Instant,
    lost: bool,
    /// This client's requests it acknowledged and that have not ended: watched while over 0.
    holding: usize,
    /// The largest connect count ([`headers::WORKER_CONNECTS`]) heard from it, if any.
    connects: Option<u64>,
}

/// One request's route: where its messages go, and the workers that acknowledged it.
#[derive(Debug)]
struct Route {
    tx: mpsc::UnboundedSender<Message>,
    held_by: Vec<String>,
}

/// State shared by the routing task and the requests.
#[derive(Debug)]
struct Shared {
    prefix: String,
    /// This client's heartbeat subject, `_INBOX.<nuid>.alive` ([`headers::HEARTBEAT_TO`]).
    alive: String,
    next: AtomicU64,
    routes: Mutex<HashMap<u64, Route>>,
    workers: Mutex<HashMap<String, Heard>>,
    events: watch::Sender<Generation>,
    /// Smoothed acknowledgement round trip less the acknowledgement delay, µs (0: none measured
    /// yet).
    ack_rtt_us: AtomicU64,
    /// The workers' acknowledgement delay, µs: [`headers::ACK_DELAY`] until a reply says
    /// otherwise ([`headers::ACK_DELAY_MS`]).
    ack_delay_us: AtomicU64,
    /// `false` after a success came with neither an acknowledgement nor
    /// [`headers::ACK_DELAY_MS`] (a worker that predates acknowledgements): requests are then not
    /// resent for want of one. `true` again at the next sign of an acknowledging worker.
    acking: AtomicBool,
}

/// The client's shared inbox; the routing task ends when the last clone is dropped.
#[derive(Debug)]
pub(crate) struct Inbox {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Inbox {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One request's route: its reply subject; the route is removed when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    shared: Arc<Shared>,
    token: u64,
    /// The reply subject, `<inbox>.<token>`; also the request's [`headers::REQUEST_ID`].
    pub subject: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let route = lock(&self.shared.routes).remove(&self.token);
        if let Some(route) = route {
            self.shared.release(&route.held_by);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Inbox {
    /// Subscribes to a fresh `<inbox>.*`, to a fresh heartbeat subject and to the shared
    /// heartbeats of the workers on `subject`, and starts the routing task.
    ///
    /// # Errors
    /// When a subscription cannot be made (the connection is closed).
    pub(crate) async fn start(
        nats: &async_nats::Client,
        subject: &str,
    ) -> Result<Inbox, async_nats::SubscribeError> {
        let prefix = nats.new_inbox();
        let mut replies = nats.subscribe(format!("{prefix}.*")).await?;
        let alive = format!("{}.alive", nats.new_inbox());
        let mut own_beats = nats.subscribe(alive.clone()).await?;
        let mut beats = nats.subscribe(headers::heartbeat_subject(subject)).await?;
        let (events, _) = watch::channel(Generation::default());
        let shared = Arc::new(Shared {
            prefix,
            alive,
            next: AtomicU64::new(0),
            routes: Mutex::new(HashMap::new()),
            workers: Mutex::new(HashMap::new()),
            events,
            ack_rtt_us: AtomicU64::new(0),
            ack_delay_us: AtomicU64::new(micros(headers::ACK_DELAY)),
            acking: AtomicBool::new(true),
        });
        let statistics = nats.statistics();
        let task = tokio::spawn({
            let shared = Arc::clone(&shared);
            async move {
                let mut connects = statistics.connects.load(Ordering::Relaxed);
                let mut tick = tokio::time::interval(CHECK_EVERY);
                tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        Some(message) = replies.next() => shared.route(message),
                        Some(beat) = own_beats.next() => shared.heard(&beat.payload, connects_of(&beat)),
                        Some(beat) = beats.next() => shared.heard(&beat.payload, connects_of(&beat)),
                        _ = tick.tick() => {
                            let now = statistics.connects.load(Ordering::Relaxed);
                            let reconnected = now != connects;
                            connects = now;
                            shared.check(Instant::now(), reconnected);
                        }
                        else => return,
                    }
                }
            }
        });
        Ok(Inbox { shared, task })
    }

    /// A route for one request: its reply subject and the receiver of what arrives on it.
    pub(crate) fn register(&self) -> (Slot, mpsc::UnboundedReceiver<Message>) {
        let token = self.shared.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.shared.routes).insert(
            token,
            Route {
                tx,
                held_by: Vec::new(),
            },
        );
        let slot = Slot {
            shared: Arc::clone(&self.shared),
            token,
            subject: format!("{}.{token}", self.shared.prefix),
        };
        (slot, rx)
    }

    /// This client's heartbeat subject, for [`headers::HEARTBEAT_TO`].
    pub(crate) fn alive(&self) -> &str {
        &self.shared.alive
    }

    /// Notified when a worker is found lost or the connection came back.
    pub(crate) fn events(&self) -> watch::Receiver<Generation> {
        self.shared.events.subscribe()
    }

    /// Whether worker `id` stopped sending heartbeats ([`HEARTBEAT_EXPIRY`]).
    pub(crate) fn is_lost(&self, id: &str) -> bool {
        lock(&self.shared.workers).get(id).is_some_and(|w| w.lost)
    }

    /// Whether worker `id`, which acknowledged a request on its connection number `acked`
    /// ([`headers::WORKER_CONNECTS`]), was heard on a later connection since: the reply it sent
    /// before it reconnected may have been lost with its server. `false` when either count is
    /// unknown (a worker that predates the header).
    pub(crate) fn reconnected_since(&self, id: &str, acked: Option<u64>) -> bool {
        let now = lock(&self.shared.workers).get(id).and_then(|w| w.connects);
        matches!((acked, now), (Some(acked), Some(now)) if now > acked)
    }

    /// Takes an acknowledgement from worker `id`, `rtt` after the request was sent: a sign of
    /// life of the worker (watched from the acknowledgement on: the routing task saw it first),
    /// and the round trip less the acknowledgement delay smooths the acknowledgement wait.
    pub(crate) fn acknowledged(&self, id: &str, connects: Option<u64>, rtt: Duration) {
        self.shared.acking.store(true, Ordering::Relaxed);
        self.shared.heard(id.as_bytes(), connects);
        let delay = self.shared.ack_delay_us.load(Ordering::Relaxed);
        let sample = micros(rtt).saturating_sub(delay);
        let old = self.shared.ack_rtt_us.load(Ordering::Relaxed);
        // EWMA with weight 1/8; races between requests lose a sample, which is harmless.
        let new = if old == 0 {
            sample
        } else {
            old - old / 8 + sample / 8
        };
        self.shared.ack_rtt_us.store(new.max(1), Ordering::Relaxed);
    }

    /// A reply came carrying the worker's acknowledgement delay ([`headers::ACK_DELAY_MS`], whole
    /// ms): the worker acknowledges, and waits this long before it does (taken at most at
    /// [`ACK_DELAY_MAX`]).
    pub(crate) fn acknowledges_after(&self, delay_ms: u64) {
        self.shared.acking.store(true, Ordering::Relaxed);
        let delay = Duration::from_millis(delay_ms).min(ACK_DELAY_MAX);
        self.shared
            .ack_delay_us
            .store(micros(delay), Ordering::Relaxed);
    }

    /// A success came with neither an acknowledgement nor [`headers::ACK_DELAY_MS`]: a worker
    /// that predates acknowledgements serves this subject, so waiting for one says nothing.
    pub(crate) fn unacknowledged_success(&self) {
        self.shared.acking.store(false, Ordering::Relaxed);
    }

    /// How long to wait for an acknowledgement before resending: the workers' acknowledgement
    /// delay plus `ACK_TIMEOUT_FACTOR` × the smoothed round trip (at least
    /// [`ACK_TIMEOUT_MIN`]), at most [`ACK_TIMEOUT_MAX`] in all; `None` while the workers do
    /// not acknowledge.
    pub(crate) fn ack_timeout(&self) -> Option<Duration> {
        if !self.shared.acking.load(Ordering::Relaxed) {
            return None;
        }
        let rtt = Duration::from_micros(self.shared.ack_rtt_us.load(Ordering::Relaxed));
        let delay = Duration::from_micros(self.shared.ack_delay_us.load(Ordering::Relaxed));
        Some((delay + (rtt * ACK_TIMEOUT_FACTOR).max(ACK_TIMEOUT_MIN)).min(ACK_TIMEOUT_MAX))
    }
}

/// The [`headers::WORKER_CONNECTS`] of a worker's acknowledgement or heartbeat, if it has one.
pub(crate) fn connects_of(message: &Message) -> Option<u64> {
    crate::message::header(message, headers::WORKER_CONNECTS).and_then(|v| v.parse().ok())
}

/// `d` in whole µs (saturating).
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Shared {
    /// Hands `message` to the request whose token ends its subject (dropped if it is gone). An
    /// acknowledgement ([`headers::ACCEPTED_BY`]) starts watching its worker for that request.
    fn route(&self, message: Message) {
        let token = message
            .subject
            .as_str()
            .rsplit('.')
            .next()
            .and_then(|t| t.parse::<u64>().ok());
        let Some(token) = token else {
            return;
        };
        let accepted_by = crate::message::header(&message, headers::ACCEPTED_BY).map(str::to_owned);
        let mut routes = lock(&self.routes);
        let Some(route) = routes.get_mut(&token) else {
            return;
        };
        if let Some(id) = accepted_by
            && !route.held_by.contains(&id)
        {
            self.watch(&id, Instant::now());
            self.heard(id.as_bytes(), connects_of(&message));
            route.held_by.push(id);
        }
        let _ = route.tx.send(message);
    }

    /// Watches worker `id` for one more request, from `now`: a worker watched afresh counts as
    /// just heard (it acknowledged).
    fn watch(&self, id: &str, now: Instant) {
        let mut workers = lock(&self.workers);
        let heard = workers.entry(id.to_owned()).or_insert(Heard {
            last: now,
            lost: false,
            holding: 0,
            connects: None,
        });
        if heard.holding == 0 {
            heard.last = now;
            heard.lost = false;
        }
        heard.holding += 1;
    }

    /// A request ended: the workers that held it are watched for one request less, and
    /// forgotten at none.
    fn release(&self, held_by: &[String]) {
        let mut workers = lock(&self.workers);
        for id in held_by {
            if let Some(heard) = workers.get_mut(id) {
                heard.holding = heard.holding.saturating_sub(1);
                if heard.holding == 0 {
                    workers.remove(id);
                }
            }
        }
    }

    /// Takes a heartbeat (the worker's id as the payload, its connect count as `connects`) of
    /// a watched worker; others are ignored. A larger count than heard before is announced
    /// ([`Generation::worker_reconnects`]).
    fn heard(&self, payload: &[u8], connects: Option<u64>) {
        let Ok(id) = std::str::from_utf8(payload) else {
            return;
        };
        let reconnected = {
            let mut workers = lock(&self.workers);
            let Some(heard) = workers.get_mut(id) else {
                return;
            };
            heard.last = Instant::now();
            heard.lost = false;
            let before = heard.connects;
            heard.connects = heard.connects.max(connects);
            before.is_some() && heard.connects > before
        };
        if reconnected {
            tracing::debug!(worker = id, "a worker reconnected; resending what it held");
            self.events
                .send_modify(|generation| generation.worker_reconnects += 1);
        }
    }

    /// Marks the watched workers not heard for [`HEARTBEAT_EXPIRY`] as lost, and announces losses and a reconnect. After a reconnect every worker's clock restarts: the
    /// heartbeats missed while this client was away say nothing about the workers.
    fn check(&self, now: Instant, reconnected: bool) {
        let mut lost = 0;
        {
            let mut workers = lock(&self.workers);
            for heard in workers.values_mut() {
                if reconnected {
                    heard.last = now;
                    heard.lost = false;
                } else if !heard.lost
                    && now.saturating_duration_since(heard.last) > HEARTBEAT_EXPIRY
                {
                    heard.lost = true;
                    lost += 1;
                }
            }
        }
        if lost > 0 || reconnected {
            if lost > 0 {
                tracing::warn!(
                    lost,
                    "workers stopped sending heartbeats; resending what they held"
                );
            }
            self.events.send_modify(|generation| {
                generation.lost += lost;
                generation.reconnects += u64::from(reconnected);
                if reconnected {
                    generation.reconnected_at = Some(now);
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared() -> Shared {
        Shared {
            prefix: "_INBOX.x".into(),
            alive: "_INBOX.y.alive".into(),
            next: AtomicU64::new(0),
            routes: Mutex::new(HashMap::new()),
            workers: Mutex::new(HashMap::new()),
            events: watch::channel(Generation::default()).0,
            ack_rtt_us: AtomicU64::new(0),
            ack_delay_us: AtomicU64::new(micros(headers::ACK_DELAY)),
            acking: AtomicBool::new(true),
        }
    }

    #[test]
    fn a_worker_silent_for_the_expiry_is_lost_until_heard_again() {
        let shared = shared();
        let mut events = shared.events.subscribe();
        let start = Instant::now();
        shared.watch("w1", start);
        shared.check(start + HEARTBEAT_EXPIRY, false);
        assert!(
            !lock(&shared.workers)["w1"].lost,
            "silent for exactly the expiry"
        );
        assert!(!events.has_changed().unwrap_or(true));
        shared.check(start + HEARTBEAT_EXPIRY + CHECK_EVERY, false);
        assert!(lock(&shared.workers)["w1"].lost);
        assert_eq!(events.borrow_and_update().lost, 1);
        shared.heard(b"w1", None);
        assert!(!lock(&shared.workers)["w1"].lost, "heard again");
    }

    #[test]
    fn a_reconnect_restarts_every_clock_and_is_announced() {
        let shared = shared();
        let mut events = shared.events.subscribe();
        shared.watch("w1", Instant::now());
        let later = Instant::now() + HEARTBEAT_EXPIRY * 4;
        shared.check(later, true);
        assert!(!lock(&shared.workers)["w1"].lost);
        assert_eq!(
            *events.borrow_and_update(),
            Generation {
                lost: 0,
                reconnects: 1,
                reconnected_at: Some(later),
                worker_reconnects: 0,
            }
        );
    }

    #[test]
    fn a_worker_heard_on_a_later_connection_is_announced() {
        let shared = shared();
        let mut events = shared.events.subscribe();
        shared.watch("w1", Instant::now());
        shared.heard(b"w1", Some(1));
        shared.heard(b"w1", None);
        assert!(
            !events.has_changed().unwrap_or(true),
            "the first count heard"
        );
        shared.heard(b"w1", Some(2));
        assert_eq!(events.borrow_and_update().worker_reconnects, 1);
        shared.heard(b"w1", Some(1));
        assert!(!events.has_changed().unwrap_or(true), "a stale beat");
        let inbox = Inbox {
            shared: Arc::new(shared),
            task: tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("a runtime")
                .spawn(async {}),
        };
        assert!(inbox.reconnected_since("w1", Some(1)));
        assert!(
            !inbox.reconnected_since("w1", Some(2)),
            "acknowledged since"
        );
        assert!(!inbox.reconnected_since("w1", None), "an older worker");
        assert!(!inbox.reconnected_since("w2", Some(1)), "not watched");
    }

    fn acknowledgement(token: u64, worker: &str) -> Message {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(headers::ACCEPTED_BY, worker);
        headers.insert(headers::WORKER_CONNECTS, "1");
        Message {
            subject: format!("_INBOX.x.{token}").into(),
            reply: None,
            payload: bytes::Bytes::new(),
            headers: Some(headers),
            status: None,
            description: None,
            length: 0,
        }
    }

    #[test]
    fn a_worker_is_watched_only_while_it_holds_a_request_of_this_client() {
        let shared = Arc::new(shared());
        let inbox_of = |shared: &Arc<Shared>| Inbox {
            shared: Arc::clone(shared),
            task: tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("a runtime")
                .spawn(async {}),
        };
        let inbox = inbox_of(&shared);
        shared.heard(b"idle", Some(1));
        assert!(
            lock(&shared.workers).is_empty(),
            "a beat of a worker that holds nothing of ours"
        );
        let (first, mut first_rx) = inbox.register();
        let (second, _second_rx) = inbox.register();
        shared.route(acknowledgement(first.token, "w1"));
        shared.route(acknowledgement(first.token, "w1"));
        shared.route(acknowledgement(second.token, "w1"));
        assert!(first_rx.try_recv().is_ok(), "the acknowledgement is routed");
        assert_eq!(lock(&shared.workers)["w1"].holding, 2, "two requests");
        let later = Instant::now() + HEARTBEAT_EXPIRY * 2;
        shared.check(later, false);
        assert!(inbox.is_lost("w1"), "silent while holding ours");
        drop(first);
        assert_eq!(lock(&shared.workers)["w1"].holding, 1);
        drop(second);
        assert!(
            lock(&shared.workers).is_empty(),
            "forgotten once it holds nothing of ours"
        );
        assert!(!inbox.is_lost("w1"));
        // Acknowledging again: watched afresh, not lost from the last spell.
        let (third, _third_rx) = inbox.register();
        shared.route(acknowledgement(third.token, "w1"));
        assert!(!inbox.is_lost("w1"));
    }
}
