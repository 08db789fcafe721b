//! The worker's liveness signal for clients: its service id on
//! [`embatch_protocol::headers::heartbeat_subject`] every
//! [`embatch_protocol::headers::HEARTBEAT_INTERVAL`] while it runs.
//!
//! A client that asked for an acknowledgement ([`embatch_protocol::headers::ACK`]) knows which
//! worker holds its request; when that worker's heartbeat stops for
//! [`embatch_protocol::headers::HEARTBEAT_EXPIRY`] (the process was killed, or lost NATS), the
//! client resends the request to the queue group. The heartbeat runs from start until the worker
//! has answered everything it holds, so a graceful stop never looks like a death.
//!
//! It is silent while the worker is out of the queue group because its upstream fails or
//! hangs ([`MemberState::UpstreamUnhealthy`], see [`crate::membership`]): a call that hangs in
//! the upstream would hold its requests until `UPSTREAM_TIMEOUT`, so the clients resend them to
//! the other workers after [`embatch_protocol::headers::HEARTBEAT_EXPIRY`], and the first reply
//! wins. (A worker whose upstream fails answers 503 for what it holds anyway.)
//!
//! Cost: one message of ~22 bytes per interval per subject served (10 per second; 20 for a
//! worker of the default model, which serves two subjects), fanned out by the
//! NATS server to every client that listens.

use async_nats::Client;
use bytes::Bytes;
use embatch_protocol::headers::{HEARTBEAT_INTERVAL, heartbeat_subject};
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::membership::MemberState;

/// Publishes `id` on the heartbeat subject of each of `subjects` (every subject the worker
/// serves: clients watch the one they sent to) every interval until `stop` is
/// cancelled (the last step of the worker's shutdown, after it answered what it held), except
/// while `state` is [`MemberState::UpstreamUnhealthy`]. A failed
/// publish (the connection is closed) is logged at debug and retried at the next tick; while
/// disconnected the client does not send (async-nats would buffer the beats and flush them,
/// stale, at the reconnect).
pub(crate) async fn run(
    client: Client,
    subjects: Vec<String>,
    id: String,
    state: watch::Receiver<MemberState>,
    stop: CancellationToken,
) {
    let subjects: Vec<String> = subjects.iter().map(|s| heartbeat_subject(s)).collect();
    let payload = Bytes::from(id.into_bytes());
    let mut tick = tokio::time::interval(HEARTBEAT_INTERVAL);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if client.connection_state() != async_nats::connection::State::Connected
            || *state.borrow() == MemberState::UpstreamUnhealthy
        {
            continue;
        }
        for subject in &subjects {
            if let Err(err) = client.publish(subject.clone(), payload.clone()).await {
                tracing::debug!(%err, "cannot publish the heartbeat");
            }
        }
    }
}
