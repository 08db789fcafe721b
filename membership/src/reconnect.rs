//! What a worker does when its NATS connection comes back: it admits the backlog.
//!
//! While nats-server is away, clients hold their requests (an `embatch-client` waits for the
//! reconnect within each request's deadline rather than fail it) and resend what was in flight.
//! When the server is back, that backlog (the outage × the request rate) reaches the workers
//! within a few ms of their re-subscribing. `MAX_QUEUE_DELAY` would answer much of it 429,
//! though its callers' deadlines allow the queue to drain (what that cost, measured:
//! docs/design/recovery.md). So for [`BACKLOG_WINDOW`] after each reconnect the batcher admits by
//! deadline alone ([`embatch_batcher::BatcherHandle::absorb_backlog`]): `QUEUE_CAP`,
//! `MAX_QUEUE_BYTES` and each request's deadline still bound what it takes.
//!
//! The intake checks the connection's connect count before it admits each request (one atomic
//! load), so the window is open before the first request of the backlog is admitted: a task
//! polling the count would let the first milliseconds of the burst through unabsorbed.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use embatch_batcher::BatcherHandle;

/// How long after a reconnect `MAX_QUEUE_DELAY` is set aside: 3 s. The backlog arrives within
/// the clients' own reconnect pause (at most 100 ms with `embatch_client::reconnect_delay`) and
/// their "no responders" retries while workers re-subscribe; at half load it drains in about the
/// outage's length × the load's share of capacity (≈ 0.5 s for 5 s down, benchmark 16).
pub const BACKLOG_WINDOW: Duration = Duration::from_secs(3);

/// How many times `client` has connected to NATS (1 before any reconnect): the
/// [`embatch_protocol::headers::WORKER_CONNECTS`] of this worker's acknowledgements and
/// heartbeats, by which a client learns that a reply may have been lost with the server.
pub fn connects(client: &async_nats::Client) -> u64 {
    client.statistics().connects.load(Ordering::Relaxed)
}

/// The connect count of a NATS connection as last seen.
pub struct Reconnects {
    statistics: Arc<async_nats::Statistics>,
    seen: u64,
}

impl Reconnects {
    /// Starts from `client`'s current count.
    pub fn new(client: &async_nats::Client) -> Reconnects {
        let statistics = client.statistics();
        let seen = statistics.connects.load(Ordering::Relaxed);
        Reconnects { statistics, seen }
    }

    /// Opens a backlog window on `batcher` when the connection came back since the last call.
    pub fn check(&mut self, batcher: &BatcherHandle) {
        let now = self.statistics.connects.load(Ordering::Relaxed);
        if now != self.seen {
            self.seen = now;
            tracing::info!(
                window = ?BACKLOG_WINDOW,
                "reconnected to NATS: admitting the clients' backlog by deadline alone"
            );
            batcher.absorb_backlog(BACKLOG_WINDOW);
        }
    }
}
