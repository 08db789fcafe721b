//! What a worker does when its NATS connection comes back: it admits the backlog.
//!
//! While nats-server is away, clients hold their requests (an `embatch-client` waits for the
//! reconnect within each request's deadline rather than fail it) and resend what was in flight.
//! When the server is back, that backlog (the outage × the request rate) reaches the workers
//! within a few ms. `MAX_QUEUE_DELAY` (`auto`: 2 upstream calls + `MAX_WAIT_TIME`) would answer
//! most of it 429, though its callers' deadlines allow the queue to drain (benchmark 16 before
//! this: 717 × 429 of 14,000 requests for a 1 s restart at 1,000 req/s, 2,255 for 5 s). So for
//! [`BACKLOG_WINDOW`] after each reconnect the batcher admits by deadline alone
//! ([`crate::batcher::BatcherHandle::absorb_backlog`]): `QUEUE_CAP`, `MAX_QUEUE_BYTES` and
//! each request's deadline still bound what it takes.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::batcher::BatcherHandle;

/// How long after a reconnect `MAX_QUEUE_DELAY` is set aside: 3 s. The backlog arrives within
/// the clients' own reconnect pause (at most 100 ms with `embatch_client::reconnect_delay`) and
/// their "no responders" retries while workers re-subscribe; at half load it drains in about the
/// outage's length × the load's share of capacity (≈ 0.5 s for 5 s down, benchmark 16).
pub const BACKLOG_WINDOW: Duration = Duration::from_secs(3);

/// How often the connection's reconnect count is read: 20 ms.
const CHECK_EVERY: Duration = Duration::from_millis(20);

/// Watches `client`'s connects count until `stop` is cancelled (with the intake: the batcher
/// ends only once every handle is dropped) and opens a backlog window on `batcher` at each
/// reconnect.
pub(crate) async fn run(
    client: async_nats::Client,
    batcher: BatcherHandle,
    stop: CancellationToken,
) {
    let statistics = client.statistics();
    let mut connects = statistics.connects.load(Ordering::Relaxed);
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = statistics.connects.load(Ordering::Relaxed);
        if now != connects {
            connects = now;
            tracing::info!(
                window = ?BACKLOG_WINDOW,
                "reconnected to NATS: admitting the clients' backlog by deadline alone"
            );
            batcher.absorb_backlog(BACKLOG_WINDOW);
        }
    }
}
