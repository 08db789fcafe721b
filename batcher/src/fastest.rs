//! The fastest upstream calls lately: a lower bound on how long the call that carries a request
//! will take, so a request whose deadline comes sooner is never sent upstream.
//!
//! The moving estimate ([`super::admission::Estimate`]) plans with the usual call and forgets an
//! idle spell's calls on purpose (a slow phase long gone must not shed requests). It therefore
//! says nothing on an idle worker, where a request with a 1 ms deadline would otherwise be sent
//! to a 22 ms upstream and answered 200 after its caller gave up. A call that carries a request
//! carries at least its inputs and its tokens; the fastest recent call that carried no more of
//! either is a floor no such call is expected to beat, idle or busy, fresh or stale. Without
//! such samples there is no floor, and the estimate's rules alone apply.
//!
//! A floor that is too high would refuse requests the upstream could serve, and nothing would
//! correct it if every request were refused (no call, no new sample). Three rules keep it low:
//! it is the fastest call, not the usual one; it needs [`AGREE`] calls of the size, so one slow
//! call (a cold upstream's first) sets none; and a sample counts for [`TTL`] only.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// Calls remembered: the floor follows the upstream within this many calls when it gets
/// faster or slower for good.
pub(super) const SAMPLES: usize = 32;

/// Calls of no more than a request's size needed before they set a floor for it.
pub(super) const AGREE: usize = 2;

/// How long a call counts towards the floor: 10 minutes, so a floor left by a slow phase cannot
/// refuse requests for longer, whatever the traffic.
pub(super) const TTL: Duration = Duration::from_secs(600);

/// One completed call, as the floor needs it.
#[derive(Debug, Clone, Copy)]
struct Sample {
    elapsed: Duration,
    inputs: usize,
    tokens: u64,
    /// When it ended.
    at: Instant,
}

/// The last [`SAMPLES`] clean calls (the whole batch answered in one call) with their size.
///
/// Shared, copied on write: the actor's ledger, which holds it, is copied to the handle at every
/// step of the actor and the floor into every batch's take, and the 1.5 KB ring was most of each
/// copy. It changes once per completed call.
#[derive(Debug, Clone, Default)]
pub(super) struct Fastest(Arc<Ring>);

/// [`Fastest`]'s samples.
#[derive(Debug, Clone, Default)]
struct Ring {
    samples: [Option<Sample>; SAMPLES],
    /// Where the next sample goes.
    next: usize,
}

impl Fastest {
    /// Remembers a clean call of `inputs` inputs and `tokens` tokens that took `elapsed` and
    /// ended at `at`, forgetting the oldest beyond [`SAMPLES`].
    pub fn record(&mut self, elapsed: Duration, inputs: usize, tokens: u64, at: Instant) {
        let ring = Arc::make_mut(&mut self.0);
        ring.samples[ring.next] = Some(Sample {
            elapsed,
            inputs,
            tokens,
            at,
        });
        ring.next = (ring.next + 1) % SAMPLES;
    }

    /// The shortest call of the last [`TTL`] that carried at most `inputs` inputs and at most
    /// `tokens` tokens: the call carrying a request of that size is not expected to end sooner
    /// after it starts. `None` unless [`AGREE`] such calls were measured.
    pub fn floor(&self, inputs: usize, tokens: u64, now: Instant) -> Option<Duration> {
        let (count, fastest) = self
            .0
            .samples
            .iter()
            .flatten()
            .filter(|s| s.inputs <= inputs && s.tokens <= tokens)
            .filter(|s| now.saturating_duration_since(s.at) < TTL)
            .fold((0, None::<Duration>), |(n, min), s| {
                (n + 1, Some(min.map_or(s.elapsed, |m| m.min(s.elapsed))))
            });
        fastest.filter(|_| count >= AGREE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_floor_is_the_fastest_call_no_larger_than_the_request() {
        let now = Instant::now();
        let mut fastest = Fastest::default();
        assert_eq!(fastest.floor(1, 10, now), None, "nothing measured");
        fastest.record(22 * MS, 1, 10, now);
        assert_eq!(fastest.floor(1, 10, now), None, "one call is not enough");
        fastest.record(25 * MS, 1, 8, now);
        fastest.record(80 * MS, 32, 320, now);
        assert_eq!(fastest.floor(1, 10, now), Some(22 * MS));
        // Only one call (8 tokens) is no larger than a 9-token request.
        assert_eq!(fastest.floor(1, 9, now), None);
        // The big call is no floor for a small request, but counts for a big one.
        assert_eq!(fastest.floor(32, 320, now), Some(22 * MS));
        assert_eq!(fastest.floor(2, 20, now), Some(22 * MS));
    }

    #[test]
    fn old_calls_are_forgotten_after_samples_calls_or_the_ttl() {
        let t0 = Instant::now();
        let mut fastest = Fastest::default();
        fastest.record(MS, 1, 1, t0);
        for _ in 0..SAMPLES - 1 {
            fastest.record(20 * MS, 1, 1, t0);
        }
        assert_eq!(fastest.floor(1, 1, t0), Some(MS), "still remembered");
        fastest.record(20 * MS, 1, 1, t0);
        assert_eq!(
            fastest.floor(1, 1, t0),
            Some(20 * MS),
            "the fast call left the window: the upstream got slower for good"
        );
        assert_eq!(fastest.floor(1, 1, t0 + TTL), None, "too old to trust");
    }
}
