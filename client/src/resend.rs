//! When and how often a request is sent again ([`EmbedClient::embed`](crate::EmbedClient::embed)
//! and its delivery protocol, docs/design/recovery.md), and the withdrawal of the copies left.

use std::time::Duration;

use bytes::Bytes;
use embatch_protocol::headers;

/// How many times [`EmbedClient::embed`](crate::EmbedClient::embed) resends after a worker's 503
/// answer: 6.
pub const UNAVAILABLE_RETRIES: u32 = 6;

/// How often a request waiting for the NATS connection checks it: 5 ms.
pub const RECONNECT_POLL: Duration = Duration::from_millis(5);

/// A copy is resent only while at least this much of the budget is left: 5 ms.
pub(crate) const MIN_RESEND_BUDGET: Duration = Duration::from_millis(5);

/// Counter of the resends [`EmbedClient::embed`](crate::EmbedClient::embed) made, by `reason`:
/// `no_responders` (no worker subscribed yet), `unavailable` (a worker answered 503), `no_ack` (no
/// worker acknowledged the copy in time), `worker_lost` (the worker holding it stopped its
/// heartbeat), `reconnect` (the connection came back while it was in flight), and `disconnected` (a
/// request that waited for the connection before its first send). Recorded through the `metrics`
/// facade, so it appears in the `/metrics` of the process that installs a recorder (the gateway's).
pub const RETRIES: &str = "embatch_client_retries_total";

/// The pause before resend `n` (1-based) after a 503, without its jitter: `10·2^(n-1)` ms, at
/// most 200 ms. [`retry_jitter`] is added to it.
pub(crate) fn unavailable_pause(n: u32) -> Duration {
    let base = 10u64
        .saturating_mul(1 << n.saturating_sub(1).min(5))
        .min(200);
    Duration::from_millis(base)
}

/// 0–9 ms read off the clock, added to each [`unavailable_pause`], so callers that failed
/// together do not retry together.
pub(crate) fn retry_jitter() -> Duration {
    let jitter = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::from(d.subsec_nanos() % 10))
        .unwrap_or(0);
    Duration::from_millis(jitter)
}

/// How long [`EmbedClient::embed`](crate::EmbedClient::embed) keeps retrying a "no responders"
/// answer (within the request's budget) before it reports
/// [`RequestError::NoResponders`](crate::RequestError::NoResponders): 150 ms.
pub const NO_RESPONDERS_RETRY: Duration = Duration::from_millis(150);

/// After a reconnect that a request waited through, or for a request sent within this long of a
/// reconnect, "no responders" is retried until this long after the reconnect instead of for
/// [`NO_RESPONDERS_RETRY`] (within the budget): workers re-subscribe when they have reconnected
/// too, up to a reconnect pause ([`RECONNECT_DELAY_MAX`](crate::RECONNECT_DELAY_MAX)) after the
/// server is back: 1 s.
pub const RECONNECT_GRACE: Duration = Duration::from_secs(1);

/// Publishes `id` on the cancel subject of `subject` from a task of its own (a `Drop` cannot
/// wait; publishing only queues the message on the connection). Without a runtime (the caller's
/// runtime is shutting down) nothing can be sent, and the worker's deadline check drops the
/// request instead.
pub(crate) fn publish_cancel(nats: async_nats::Client, subject: &str, id: &str) {
    let subject = headers::cancel_subject(subject);
    let id = Bytes::copy_from_slice(id.as_bytes());
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            if let Err(err) = nats.publish(subject, id).await {
                tracing::debug!(%err, "cannot publish a cancel");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resend_pauses_grow_to_200_ms_with_under_10_ms_of_jitter() {
        for (n, base) in [
            (1, 10),
            (2, 20),
            (3, 40),
            (4, 80),
            (5, 160),
            (6, 200),
            (9, 200),
        ] {
            assert_eq!(
                unavailable_pause(n),
                Duration::from_millis(base),
                "resend {n}"
            );
        }
        for _ in 0..100 {
            assert!(retry_jitter() < Duration::from_millis(10));
        }
    }
}
