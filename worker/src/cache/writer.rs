//! The shared bucket's writes, off every request's path: one task per worker sends them in
//! rounds.
//!
//! A request hands its new entries over once its reply is sent ([`Writer::put`]: a budget check
//! and a channel send, never a wait). The task takes everything queued at that moment (the
//! writes of every request answered since its last round: the results of one upstream call
//! arrive together), publishes them one after another without waiting for their
//! acknowledgements, then waits for all of those together, bounded by the KV timeout, before
//! the next round. While a round's acknowledgements are awaited the next round gathers, so the
//! slower the store, the larger the rounds; the messages of a round reach nats-server back to
//! back, the cheapest way it ingests them short of holding writes back (see
//! `docs/design/cache.md`).
//!
//! Entries queued or in a round are bounded by [`QUEUE_ENTRIES`] and [`QUEUE_BYTES`]: a store
//! slower than the misses (a hung or overloaded server) sheds writes, counted in
//! `embatch_worker_cache_writes_dropped_total`, instead of holding memory without bound. A
//! write that fails or is not acknowledged within the KV timeout is counted in
//! `embatch_worker_cache_kv_errors_total{op="put"}`. Either way the entry is simply not shared:
//! a request is never delayed or failed by a write.

use std::future::IntoFuture;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::key::Key;
use crate::telemetry::names;

/// Most entries queued or in a round at once; a request's writes beyond them are dropped:
/// 1,024 (at 2,837 new inputs/s, about 360 ms of writes).
pub(crate) const QUEUE_ENTRIES: usize = 1024;
/// Most bytes of values queued or in a round at once: 8 MiB (about 1,900 vectors of 384
/// dimensions as JSON text).
pub(crate) const QUEUE_BYTES: usize = 8 << 20;

/// One request's new entries: `(key, value)`, values as `Entry::encode` makes them.
type Batch = Vec<(Key, Bytes)>;

/// The handle requests write through; the task ends when the worker stops.
pub(crate) struct Writer {
    queue: mpsc::UnboundedSender<Batch>,
    budget: Arc<Budget>,
}

/// What is queued or in a round, against [`QUEUE_ENTRIES`] and [`QUEUE_BYTES`].
#[derive(Default)]
struct Budget {
    entries: AtomicUsize,
    bytes: AtomicUsize,
}

impl Budget {
    /// Takes room for `entries` entries of `bytes` bytes; `false` (nothing taken) when either
    /// bound would be passed. Two requests taking room at once may both be refused near the
    /// bound: a write dropped, never a bound passed.
    fn take(&self, entries: usize, bytes: usize) -> bool {
        let held = self.entries.fetch_add(entries, Ordering::AcqRel);
        let held_bytes = self.bytes.fetch_add(bytes, Ordering::AcqRel);
        if held + entries > QUEUE_ENTRIES || held_bytes + bytes > QUEUE_BYTES {
            self.give(entries, bytes);
            return false;
        }
        true
    }

    fn give(&self, entries: usize, bytes: usize) {
        self.entries.fetch_sub(entries, Ordering::AcqRel);
        self.bytes.fetch_sub(bytes, Ordering::AcqRel);
    }
}

impl Writer {
    /// Starts the task writing into `store` through `context` (the JetStream context that
    /// opened it), each round bounded by `timeout`, on `tasks`; `stop` ends it: a round under
    /// way is abandoned, and what is queued while none is, written in one last round.
    pub(crate) fn start(
        context: jetstream::Context,
        store: &kv::Store,
        timeout: Duration,
        stop: &CancellationToken,
        tasks: &TaskTracker,
    ) -> Writer {
        let (queue, receiver) = mpsc::unbounded_channel();
        let budget = Arc::new(Budget::default());
        let task = Rounds {
            context,
            // As `kv::Store::put` builds it: the bucket's subject prefix, then the key. (The
            // JetStream API prefix that `use_jetstream_prefix` adds applies only to a context
            // with a domain or an API prefix, which the cache does not use.)
            prefix: store.put_prefix.clone().unwrap_or(store.prefix.clone()),
            timeout,
            budget: Arc::clone(&budget),
            receiver,
        };
        let stop = stop.clone();
        tasks.spawn(task.run(stop));
        Writer { queue, budget }
    }

    /// Queues `entries` for the next round, or drops them (counted) when the queue is full or
    /// the task has ended. Never waits.
    pub(crate) fn put(&self, entries: Batch) {
        if entries.is_empty() {
            return;
        }
        let count = entries.len();
        let bytes = entries.iter().map(|(_, value)| value.len()).sum();
        if !self.budget.take(count, bytes) {
            metrics::counter!(names::CACHE_WRITES_DROPPED).increment(count as u64);
            return;
        }
        if self.queue.send(entries).is_err() {
            self.budget.give(count, bytes);
            metrics::counter!(names::CACHE_WRITES_DROPPED).increment(count as u64);
        }
    }
}

/// The writing task's state.
struct Rounds {
    context: jetstream::Context,
    /// The subject prefix of the bucket's keys (`$KV.<bucket>.`).
    prefix: String,
    timeout: Duration,
    budget: Arc<Budget>,
    receiver: mpsc::UnboundedReceiver<Batch>,
}

impl Rounds {
    async fn run(mut self, stop: CancellationToken) {
        loop {
            let first = tokio::select! {
                biased;
                () = stop.cancelled() => {
                    self.last_round().await;
                    return;
                }
                batch = self.receiver.recv() => match batch {
                    Some(batch) => batch,
                    None => return,
                },
            };
            // The other replies of the same upstream call are being sent right now: let them
            // queue their writes so that the round carries them too.
            tokio::task::yield_now().await;
            let round = self.gather(first);
            tokio::select! {
                biased;
                // A round stuck on a hung store must not hold the worker's stop up to the KV
                // timeout: its writes are abandoned (they may still land).
                () = stop.cancelled() => return,
                () = self.write(round) => {}
            }
        }
    }

    /// `first` and every batch queued behind it.
    fn gather(&mut self, mut round: Batch) -> Batch {
        while let Ok(more) = self.receiver.try_recv() {
            round.extend(more);
        }
        round
    }

    /// On stop: what is queued, in one round.
    async fn last_round(&mut self) {
        self.receiver.close();
        if let Ok(first) = self.receiver.try_recv() {
            let round = self.gather(first);
            // Bounded by the KV timeout, like every round.
            self.write(round).await;
        }
    }

    /// Publishes `round` back to back, then waits for its acknowledgements, all within the
    /// KV timeout; gives its room in the budget back.
    async fn write(&self, round: Batch) {
        let entries = round.len();
        let bytes: usize = round.iter().map(|(_, value)| value.len()).sum();
        let deadline = Instant::now() + self.timeout;
        let mut acks = FuturesUnordered::new();
        let mut failed = 0;
        for (key, value) in round {
            let mut subject = String::with_capacity(self.prefix.len() + 64);
            subject.push_str(&self.prefix);
            subject.push_str(&key.hex());
            match tokio::time::timeout_at(deadline, self.context.publish(subject, value)).await {
                Ok(Ok(ack)) => acks.push(ack.into_future()),
                Ok(Err(err)) => {
                    failed += 1;
                    tracing::debug!(%err, "cache: a shared write failed");
                }
                Err(_) => failed += 1,
            }
        }
        let mut pending = acks.len();
        while pending > 0 {
            match tokio::time::timeout_at(deadline, acks.next()).await {
                Ok(Some(Ok(_))) => pending -= 1,
                Ok(Some(Err(err))) => {
                    pending -= 1;
                    failed += 1;
                    tracing::debug!(%err, "cache: a shared write failed");
                }
                Ok(None) => break,
                Err(_) => {
                    tracing::debug!(pending, "cache: shared writes timed out");
                    failed += pending;
                    break;
                }
            }
        }
        if failed > 0 {
            metrics::counter!(names::CACHE_KV_ERRORS, "op" => "put").increment(failed as u64);
        }
        self.budget.give(entries, bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_refuses_what_would_pass_a_bound_and_takes_it_back_when_given() {
        let budget = Budget::default();
        assert!(budget.take(QUEUE_ENTRIES - 1, 100));
        assert!(!budget.take(2, 100), "one entry too many");
        assert!(budget.take(1, 100), "exactly the bound");
        budget.give(QUEUE_ENTRIES, 200);
        assert!(!budget.take(1, QUEUE_BYTES + 1), "one byte too many");
        assert!(budget.take(1, QUEUE_BYTES));
        assert_eq!(budget.entries.load(Ordering::Relaxed), 1);
        assert_eq!(budget.bytes.load(Ordering::Relaxed), QUEUE_BYTES);
    }
}
