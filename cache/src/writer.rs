//! The shared bucket's writes, off every request's path: one task per worker sends them in
//! rounds.
//!
//! A request hands its new entries over once its reply is sent ([`Writer::put`]: a budget check
//! and a channel send, never a wait). The task takes everything queued at that moment (the
//! writes of every request answered since its last round: the results of one upstream call
//! arrive together) and publishes them back to back: all but the last as plain messages on the
//! bucket's subjects (no reply subject, so nats-server sends no acknowledgement and the worker
//! tracks none), the last as a JetStream publish whose acknowledgement, awaited within the KV
//! timeout, vouches for the round: nats-server ingests one connection's messages to a stream
//! in order, so once the last is stored the others were processed before it. Only then does
//! the next round start; while it waits the next round gathers, so the slower the store, the
//! larger the rounds. One acknowledgement per round instead of one per entry is what saves the
//! worker's CPU (see `docs/design/cache.md`).
//!
//! Entries queued or in a round are bounded by [`QUEUE_ENTRIES`] and [`QUEUE_BYTES`]: a store
//! slower than the misses (a hung or overloaded server) sheds writes, counted in
//! `embatch_worker_cache_writes_dropped_total`, instead of holding memory without bound. A
//! round whose last write fails or is not acknowledged within the KV timeout counts all its
//! entries in `embatch_worker_cache_kv_errors_total{op="put"}` (a full bucket of discard policy
//! `new` may have taken some of them: the count is an upper bound). Either way the entries are
//! simply not shared: a request is never delayed or failed by a write.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::key::Key;
use crate::names;

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

    /// Publishes `round` back to back, all but the last without a reply subject; the last
    /// one's acknowledgement, awaited within the KV timeout, vouches for the round (nats-server
    /// ingests one connection's messages to a stream in order); gives its room in the budget
    /// back.
    async fn write(&self, mut round: Batch) {
        let entries = round.len();
        let bytes: usize = round.iter().map(|(_, value)| value.len()).sum();
        let deadline = Instant::now() + self.timeout;
        let Some((last_key, last_value)) = round.pop() else {
            return;
        };
        let client = self.context.client();
        let subject = |key: Key| {
            let mut subject = String::with_capacity(self.prefix.len() + 64);
            subject.push_str(&self.prefix);
            subject.push_str(&key.hex());
            subject
        };
        let sent = async {
            for (key, value) in round {
                client.publish(subject(key), value).await?;
            }
            let ack = self.context.publish(subject(last_key), last_value).await?;
            ack.await?;
            Ok::<(), async_nats::Error>(())
        };
        let failed = match tokio::time::timeout_at(deadline, sent).await {
            Ok(Ok(())) => false,
            Ok(Err(err)) => {
                tracing::debug!(%err, entries, "cache: shared writes failed");
                true
            }
            Err(_) => {
                tracing::debug!(entries, "cache: shared writes timed out");
                true
            }
        };
        if failed {
            metrics::counter!(names::CACHE_KV_ERRORS, "op" => "put").increment(entries as u64);
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
