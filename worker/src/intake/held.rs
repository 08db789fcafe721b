//! The bytes of input the worker holds for requests it accepted and has not answered, and the
//! refusal of a large request that cannot fit before it is parsed.
//!
//! The batcher bounds what it queues by `MAX_QUEUE_BYTES`, but a large request it refuses has
//! been received, parsed (its text copied out of the message) and hashed for the cache key by
//! then. Under a burst of large requests that work is what the intake loop spends its time on,
//! while the next messages wait in the NATS subscription's buffer, each pinning the socket read
//! buffer it arrived in (about twice its size: the buffer grows by doubling and holds the start
//! of the next message too). Counting every accepted request's body from the moment it arrives,
//! the intake refuses a large body that cannot fit with 429 without parsing it, and parses the
//! large ones it accepts outside its loop, which so keeps up with the subscription.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A request body larger than this (64 KiB) is refused with 429 before it is parsed when the
/// worker holds so much input that it cannot fit, and is parsed outside the intake loop when it
/// is accepted.
pub const LARGE_BODY_BYTES: usize = 64 << 10;

/// Bytes of the bodies of the requests accepted and not yet answered (wherever they are: being
/// parsed, counted, looked up, queued, in an upstream call, waiting for an equal input in
/// flight). A body's bytes stand for its text's: slightly more (the JSON around it).
#[derive(Default)]
pub(crate) struct Held(AtomicUsize);

/// A request's share of [`Held`], released when dropped (when its reply task ends, or when it
/// is answered at once).
pub(crate) struct HeldShare {
    held: Arc<Held>,
    bytes: usize,
}

impl Held {
    /// Counts `bytes` as held until the share returned is dropped.
    pub(crate) fn take(self: &Arc<Held>, bytes: usize) -> HeldShare {
        self.0.fetch_add(bytes, Ordering::Relaxed);
        HeldShare {
            held: Arc::clone(self),
            bytes,
        }
    }

    /// The bytes held now, when a request whose body is `body` bytes cannot fit beside them
    /// within `max` bytes; `None` when it may be parsed. A request alone is let through (the
    /// batcher answers one larger than `max` with 413), and so is a body of at most
    /// [`LARGE_BODY_BYTES`] (it costs little to parse, and may be answered from the cache).
    pub(crate) fn refuses(&self, body: usize, max: usize) -> Option<usize> {
        let held = self.0.load(Ordering::Relaxed);
        (body > LARGE_BODY_BYTES && held > 0 && held.saturating_add(body) > max).then_some(held)
    }
}

impl Drop for HeldShare {
    fn drop(&mut self) {
        self.held.0.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_body_that_cannot_fit_is_refused_and_room_comes_back() {
        let held = Arc::new(Held::default());
        let max = 10 * LARGE_BODY_BYTES;
        let large = 4 * LARGE_BODY_BYTES;
        assert_eq!(held.refuses(20 * LARGE_BODY_BYTES, max), None, "alone");
        let first = held.take(large);
        let second = held.take(large);
        assert_eq!(held.refuses(large, max), Some(2 * large), "no room");
        assert_eq!(
            held.refuses(2 * LARGE_BODY_BYTES, max),
            None,
            "exactly fits"
        );
        assert_eq!(
            held.refuses(LARGE_BODY_BYTES, 0),
            None,
            "small bodies are parsed"
        );
        drop(first);
        assert_eq!(held.refuses(large, max), None, "room again");
        drop(second);
        assert_eq!(
            held.refuses(20 * LARGE_BODY_BYTES, max),
            None,
            "alone again"
        );
    }
}
