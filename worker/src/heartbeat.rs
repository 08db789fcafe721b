//! The worker's liveness signal for clients: its service id (and its connect count,
//! [`embatch_protocol::headers::WORKER_CONNECTS`]) on
//! [`embatch_protocol::headers::heartbeat_subject`] every
//! [`embatch_protocol::headers::HEARTBEAT_INTERVAL`] while it holds requests, and for
//! [`HEARTBEAT_LINGER`] after it answered the last one. An idle worker is silent.
//!
//! A client that asked for an acknowledgement ([`embatch_protocol::headers::ACK`]) knows which
//! worker holds its request, and watches that worker from the acknowledgement until the reply;
//! when its heartbeat stops for [`embatch_protocol::headers::HEARTBEAT_EXPIRY`] (the process was
//! killed, or lost NATS), the client resends the request to the queue group. A worker holds a
//! request from its reading until its reply task ends, so it beats through every
//! acknowledgement it sent (the first beat goes out as the first request after a silence is
//! read, before the acknowledgement 20 ms later). The linger covers a beat and an
//! acknowledgement that cross; the heartbeat runs until every accepted request is answered, so a
//! graceful stop never looks like a death.
//!
//! It is silent while the worker is out of the queue group because its upstream fails or
//! hangs ([`MemberState::UpstreamUnhealthy`], see [`crate::membership`]): a call that hangs in
//! the upstream would hold its requests until `UPSTREAM_TIMEOUT`, so the clients resend them to
//! the other workers after [`embatch_protocol::headers::HEARTBEAT_EXPIRY`], and the first reply
//! wins. (A worker whose upstream fails answers 503 for what it holds anyway.)
//!
//! Cost: one message of ~22 bytes of body and ~50 of header per interval per subject served (10 per second; 20 for a
//! worker of the default model, which serves two subjects) while the worker is busy, fanned out
//! by the NATS server to every client that listens on that subject: at most 10 × busy workers ×
//! listening clients per second, none while idle (docs/design/control-plane.md).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_nats::Client;
use bytes::Bytes;
use embatch_protocol::headers::{HEARTBEAT_INTERVAL, HEARTBEAT_LINGER, heartbeat_subject};
use tokio::sync::{Notify, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::membership::MemberState;

/// The requests read, counted, and a wake-up for the heartbeat between busy spells.
#[derive(Debug, Default)]
pub(crate) struct Busy {
    reads: AtomicU64,
    notify: Notify,
}

impl Busy {
    /// A request was read (by [`crate::group::Group::next`], before its reply task starts).
    pub(crate) fn read(&self) {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.notify.notify_one();
    }

    fn reads(&self) -> u64 {
        self.reads.load(Ordering::SeqCst)
    }
}

/// What the heartbeat follows: who beats, on which subjects, and what the worker holds.
pub(crate) struct Beat {
    /// The NATS connection.
    pub client: Client,
    /// Every subject the worker serves: clients watch the one they sent to.
    pub subjects: Vec<String>,
    /// The worker's service id (the payload).
    pub id: String,
    /// The membership state: silent while [`MemberState::UpstreamUnhealthy`].
    pub state: watch::Receiver<MemberState>,
    /// The requests read ([`crate::group::Group::busy`]).
    pub busy: Arc<Busy>,
    /// The reply tasks, one per accepted request: the worker holds requests while it has any.
    pub replies: TaskTracker,
}

/// Beats while the worker holds requests, until `stop` is cancelled (the last step of the
/// worker's shutdown, after it answered what it held). Between busy spells it waits for
/// [`Beat::busy`] and sends nothing. A failed publish (the connection is closed) is logged at
/// debug and retried at the next tick; while disconnected the client does not send (async-nats
/// would buffer the beats and flush them, stale, at the reconnect).
pub(crate) async fn run(beat: Beat, stop: CancellationToken) {
    let subjects: Vec<String> = beat.subjects.iter().map(|s| heartbeat_subject(s)).collect();
    let payload = Bytes::from(beat.id.clone().into_bytes());
    // The reads seen by the last spell: a wake-up left over from a request it covered starts
    // no new spell (reads are counted before the wake-up, so none is missed).
    let mut seen = 0;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = beat.busy.notify.notified() => {}
        }
        if beat.busy.reads() == seen {
            continue;
        }
        seen = spell(&beat, &subjects, &payload, &stop).await;
    }
}

/// One busy spell: a beat now, then one every interval while requests are held (or read since
/// the last tick) and for the linger after the last one. Returns the reads it covered; returns
/// early when `stop` is cancelled.
async fn spell(beat: &Beat, subjects: &[String], payload: &Bytes, stop: &CancellationToken) -> u64 {
    let mut tick = tokio::time::interval(HEARTBEAT_INTERVAL);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut held_at = Instant::now();
    let mut reads = beat.busy.reads();
    loop {
        tokio::select! {
            () = stop.cancelled() => return reads,
            _ = tick.tick() => {}
        }
        let now = Instant::now();
        let read = beat.busy.reads();
        if read != reads || !beat.replies.is_empty() {
            held_at = now;
            reads = read;
        } else if now.saturating_duration_since(held_at) > HEARTBEAT_LINGER {
            return reads;
        }
        if beat.client.connection_state() != async_nats::connection::State::Connected
            || *beat.state.borrow() == MemberState::UpstreamUnhealthy
        {
            continue;
        }
        // The connect count tells a client that replies sent before a reconnect may be lost.
        let mut connects = async_nats::HeaderMap::new();
        connects.insert(
            embatch_protocol::headers::WORKER_CONNECTS,
            crate::reconnect::connects(&beat.client)
                .to_string()
                .as_str(),
        );
        for subject in subjects {
            let sent = beat.client.publish_with_headers(
                subject.clone(),
                connects.clone(),
                payload.clone(),
            );
            if let Err(err) = sent.await {
                tracing::debug!(%err, "cannot publish the heartbeat");
            }
        }
    }
}
