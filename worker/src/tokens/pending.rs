//! The bound on the inputs waiting to be counted ([`Pending`]), and the reservations in it that
//! [`Counter::reserve`] hands out.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use embatch_protocol::EmbedError;

use super::Counter;

/// The inputs waiting to be counted: bounded like the batcher's queue (`QUEUE_CAP` inputs and
/// `MAX_QUEUE_BYTES` bytes), so that requests arriving faster than they can be tokenized are
/// shed with 429 instead of piling up in memory ahead of the batcher's own bounds.
pub(super) struct Pending {
    inputs: AtomicUsize,
    limit: AtomicUsize,
    /// Bytes of input held by the waiting requests (`Input::size_bytes`).
    bytes: AtomicUsize,
    /// Most bytes of input waiting (`MAX_QUEUE_BYTES`).
    bytes_limit: AtomicUsize,
}

/// A reservation of inputs and bytes in [`Counter`]'s pending bound ([`Counter::reserve`]),
/// released when dropped (once the request is submitted or answered).
pub struct Reservation {
    pending: Arc<Pending>,
    inputs: usize,
    bytes: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.pending
            .inputs
            .fetch_sub(self.inputs, Ordering::Relaxed);
        self.pending.bytes.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl Pending {
    /// No bound until [`Counter::with_pending_limit`] and [`Counter::with_pending_bytes`] set
    /// them.
    pub(super) fn unbounded() -> Pending {
        Pending {
            inputs: AtomicUsize::new(0),
            limit: AtomicUsize::new(usize::MAX),
            bytes: AtomicUsize::new(0),
            bytes_limit: AtomicUsize::new(usize::MAX),
        }
    }
}

impl Counter {
    /// Bounds the inputs waiting to be counted to `inputs` (the worker's `QUEUE_CAP`).
    pub fn with_pending_limit(self, inputs: usize) -> Counter {
        self.pending.limit.store(inputs, Ordering::Relaxed);
        self
    }

    /// Bounds the bytes of input waiting to be counted to `bytes` (the worker's
    /// `MAX_QUEUE_BYTES`).
    pub fn with_pending_bytes(self, bytes: usize) -> Counter {
        self.pending.bytes_limit.store(bytes, Ordering::Relaxed);
        self
    }

    /// Reserves room for a request of `inputs` inputs holding `bytes` bytes of input
    /// (`Input::size_bytes`) to be counted, before its reply task counts it; the reservation
    /// ends when dropped.
    ///
    /// # Errors
    /// [`EmbedError::Overloaded`] (429) when more than the pending limit of inputs or of bytes
    /// would wait to be counted (the tokenizer cannot keep up: load shedding, as the batcher's
    /// queue bounds).
    pub fn reserve(&self, inputs: usize, bytes: usize) -> Result<Reservation, EmbedError> {
        let limit = self.pending.limit.load(Ordering::Relaxed);
        let bytes_limit = self.pending.bytes_limit.load(Ordering::Relaxed);
        let before = self.pending.inputs.fetch_add(inputs, Ordering::Relaxed);
        let bytes_before = self.pending.bytes.fetch_add(bytes, Ordering::Relaxed);
        let reservation = Reservation {
            pending: Arc::clone(&self.pending),
            inputs,
            bytes,
        };
        // A request alone over a limit is let through when nothing waits: the batcher's own
        // bounds answer it.
        if before > 0 && before + inputs > limit {
            return Err(EmbedError::Overloaded(format!(
                "{before} inputs are waiting to be tokenized (QUEUE_CAP {limit})"
            )));
        }
        if before > 0 && bytes_before.saturating_add(bytes) > bytes_limit {
            return Err(EmbedError::Overloaded(format!(
                "{bytes_before} bytes of input are waiting to be tokenized \
                 (MAX_QUEUE_BYTES {bytes_limit})"
            )));
        }
        Ok(reservation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pending_bound_sheds_and_frees_on_drop() {
        let counter = Counter::inputs().with_pending_limit(4);
        let first = counter.reserve(3, 30).expect("room");
        let err = counter.reserve(2, 20).err().expect("over the bound");
        assert_eq!(err.status(), 429);
        let second = counter.reserve(1, 10).expect("exactly the bound");
        drop((first, second));
        let alone = counter
            .reserve(10, 100)
            .expect("a request alone is let through");
        assert!(counter.reserve(1, 1).is_err(), "behind one over the bound");
        drop(alone);
        assert!(counter.reserve(4, 40).is_ok(), "all freed");
    }

    #[test]
    fn the_pending_bytes_bound_sheds_and_frees_on_drop() {
        let counter = Counter::inputs()
            .with_pending_limit(100)
            .with_pending_bytes(1000);
        let first = counter.reserve(1, 600).expect("room");
        let err = counter.reserve(1, 401).err().expect("over the bytes bound");
        assert_eq!(err.status(), 429);
        assert!(err.to_string().contains("MAX_QUEUE_BYTES 1000"), "{err}");
        let second = counter.reserve(1, 400).expect("exactly the bound");
        drop((first, second));
        let alone = counter
            .reserve(1, 5000)
            .expect("a request alone is let through");
        assert!(counter.reserve(1, 1).is_err(), "behind one over the bound");
        drop(alone);
        assert!(counter.reserve(2, 1000).is_ok(), "all freed");
    }
}
