//! The shared tier: a JetStream KV bucket every worker of the model reads and writes, so an
//! input embedded by one worker is a hit for all of them, and across restarts.
//!
//! # The bucket's bounds
//! KV has no LRU. The bucket is a stream (`KV_<bucket>`) that this module creates, when it does
//! not exist, with the settings of a KV bucket of history 1 and two bounds:
//! - `max_bytes` (`CACHE_SHARED_BYTES`): with the stream's discard policy `old` (a plain KV
//!   bucket has `new`, which rejects writes once full), a write into a full bucket drops the
//!   oldest entries: the bucket keeps the most recently written entries, first in first out.
//!   A hot entry is kept by the in-process LRU in front of it and written again after it
//!   leaves the bucket and misses once.
//! - `max_age` (`CACHE_MAX_AGE`): an entry older than this is dropped by the server.
//!
//! A bucket created beforehand (e.g. by `nats kv add`) is used as it is; with discard `new`, a
//! write into a full bucket fails, is counted as a KV error, and the request is answered
//! anyway: the entry is simply not shared.
//!
//! # Outages
//! Every KV call is bounded by `CACHE_KV_TIMEOUT`; a read that fails or times out is a miss,
//! and for [`BACKOFF`] after it reads are skipped (misses without a call), so an outage costs
//! at most one timeout per request, only for requests that arrive while a read is failing.
//! Writes never delay a reply: they are handed to one task after it, which sends them in
//! rounds, bounded in entries and bytes (more are dropped, see [`super::writer`]). A bucket that cannot be opened at start (JetStream disabled or down) is
//! tried again every [`REOPEN_EVERY`]; until then every read is a miss.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::entry::Entry;
use super::key::Key;
use super::writer::Writer;
use crate::names;

/// How long reads are skipped after one failed or timed out: 1 s.
pub(crate) const BACKOFF: Duration = Duration::from_secs(1);
/// How often a bucket that could not be opened is tried again: 5 s.
pub(crate) const REOPEN_EVERY: Duration = Duration::from_secs(5);

/// The bucket's name and bounds.
#[derive(Debug, Clone)]
pub(crate) struct BucketConfig {
    /// The KV bucket's name (`CACHE_BUCKET`).
    pub bucket: String,
    /// Most bytes the bucket holds (`CACHE_SHARED_BYTES`).
    pub max_bytes: u64,
    /// Age after which an entry is dropped (`CACHE_MAX_AGE`).
    pub max_age: Duration,
    /// Bound on each KV call (`CACHE_KV_TIMEOUT`).
    pub timeout: Duration,
    /// Replicas of the bucket's stream: created with them, or brought to them.
    pub replicas: embatch_runtime::ReplicaTarget,
}

/// The shared bucket, once open.
pub(crate) struct Shared {
    store: OnceLock<kv::Store>,
    config: BucketConfig,
    /// Which requests' misses are looked up (see [`ReadSampler`]).
    sampler: ReadSampler,
    /// Reads are skipped until this instant (ms after `epoch`) after a failure.
    skip_until_ms: AtomicU64,
    epoch: Instant,
    /// The writing task, started once the bucket is open.
    writer: OnceLock<Writer>,
    /// Ends the writing task (and the reopening one).
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl Shared {
    /// Opens (or creates) the bucket on `client`, waiting at most the KV timeout (at least 1 s);
    /// when that fails, tries again every [`REOPEN_EVERY`] in a task on `tasks` that `stop`
    /// ends.
    pub(crate) async fn open(
        client: &async_nats::Client,
        config: BucketConfig,
        stop: &CancellationToken,
        tasks: &TaskTracker,
    ) -> Arc<Shared> {
        let shared = Arc::new(Shared {
            store: OnceLock::new(),
            config,
            sampler: ReadSampler::default(),
            skip_until_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            writer: OnceLock::new(),
            stop: stop.clone(),
            tasks: tasks.clone(),
        });
        let context = jetstream::new(client.clone());
        if shared.try_open(&context).await {
            return shared;
        }
        let reopening = Arc::clone(&shared);
        let stop = stop.clone();
        tasks.spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(REOPEN_EVERY) => {}
                }
                if reopening.try_open(&context).await {
                    return;
                }
            }
        });
        shared
    }

    /// One attempt to open the bucket; `true` once it is open.
    async fn try_open(&self, context: &jetstream::Context) -> bool {
        let wait = self.config.timeout.max(Duration::from_secs(1));
        match tokio::time::timeout(wait, open_bucket(context, &self.config)).await {
            Ok(Ok(store)) => {
                let writer = Writer::start(
                    context.clone(),
                    &store,
                    self.config.timeout,
                    &self.stop,
                    &self.tasks,
                );
                let _ = self.writer.set(writer);
                let _ = self.store.set(store);
                tracing::info!(bucket = %self.config.bucket, "cache: the shared bucket is open");
                true
            }
            Ok(Err(err)) => {
                metrics::counter!(names::CACHE_KV_ERRORS, "op" => "open").increment(1);
                tracing::warn!(bucket = %self.config.bucket, %err, "cache: cannot open the shared bucket; shared reads miss until it opens");
                false
            }
            Err(_) => {
                metrics::counter!(names::CACHE_KV_ERRORS, "op" => "open").increment(1);
                tracing::warn!(bucket = %self.config.bucket, ?wait, "cache: opening the shared bucket timed out; shared reads miss until it opens");
                false
            }
        }
    }

    /// Whether reads go to the bucket now: it is open and no read failed in the last
    /// [`BACKOFF`].
    pub(crate) fn readable(&self) -> bool {
        self.store.get().is_some()
            && self.epoch.elapsed().as_millis() as u64 >= self.skip_until_ms.load(Ordering::Relaxed)
    }

    /// How a request's misses of the LRU use the bucket (see [`ReadSampler`]): looked up
    /// before they are sent upstream ([`Lookup::Read`]; the caller reports what it found with
    /// [`Shared::found`]), or sent upstream at once, `keys` then looked up by a background probe
    /// one request in [`SAMPLE_EVERY`] while the bucket is cold.
    pub(crate) fn lookup(self: &Arc<Self>, keys: impl FnOnce() -> Vec<Key>) -> Lookup {
        let lookup = self.sampler.lookup();
        if lookup == Lookup::Probe && self.readable() {
            self.probe(keys());
        }
        lookup
    }

    /// Reports a lookup of `reads` keys that found `hits` of them.
    pub(crate) fn found(&self, hits: usize, reads: usize) {
        self.sampler.record(hits, reads);
    }

    /// Looks `keys` up in a task of its own, only to learn the bucket's hit ratio: the request
    /// they belong to does not wait for it. One probe at a time; a probe due while one runs is
    /// not made.
    fn probe(self: &Arc<Self>, keys: Vec<Key>) {
        if keys.is_empty() || self.sampler.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let shared = Arc::clone(self);
        tokio::spawn(async move {
            let found = futures::future::join_all(keys.iter().map(|key| shared.get(*key))).await;
            let hits = found.iter().filter(|entry| entry.is_some()).count();
            shared.found(hits, found.len());
            shared.sampler.probing.store(false, Ordering::Release);
        });
    }

    /// The entry for `key`, or `None`: absent, unreadable, or the bucket not readable (a
    /// failure or a timeout is counted and starts the [`BACKOFF`]).
    pub(crate) async fn get(&self, key: Key) -> Option<Entry> {
        if !self.readable() {
            return None;
        }
        let store = self.store.get()?;
        match tokio::time::timeout(self.config.timeout, store.get(key.hex())).await {
            Ok(Ok(value)) => value.and_then(Entry::decode),
            Ok(Err(err)) => {
                self.failed(&err.to_string());
                None
            }
            Err(_) => {
                self.failed("timed out");
                None
            }
        }
    }

    fn failed(&self, why: &str) {
        metrics::counter!(names::CACHE_KV_ERRORS, "op" => "get").increment(1);
        let until = self.epoch.elapsed() + BACKOFF;
        self.skip_until_ms
            .store(until.as_millis() as u64, Ordering::Relaxed);
        tracing::debug!(why, "cache: a shared read failed; reads skipped for 1 s");
    }

    /// Queues `entries` (values as [`Entry::encode`] makes them) for the writing task (see
    /// [`super::writer`]); dropped, uncounted, while the bucket is not open.
    pub(crate) fn put(&self, entries: Vec<(Key, bytes::Bytes)>) {
        if let Some(writer) = self.writer.get() {
            writer.put(entries);
        }
    }
}

/// Reads looked at before the bucket's hit ratio is trusted: 256.
const SAMPLE_MIN_READS: u32 = 256;
/// The recent window: past this many reads, both counts are halved (1,024).
const SAMPLE_WINDOW: u32 = 1024;
/// Below one hit in this many reads, only one request in [`SAMPLE_EVERY`] is probed (100).
const SAMPLE_LOW_RATIO: u32 = 100;
/// While the bucket is cold, one request in this many has its misses probed: 16.
const SAMPLE_EVERY: u32 = 16;

/// How one request's misses of the LRU use the shared bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// Looked up before they are sent upstream: the bucket is warm (or not yet judged).
    Read,
    /// Sent upstream at once; looked up by a background probe that only measures the bucket.
    Probe,
    /// Sent upstream at once, not looked up.
    Skip,
}

/// Which requests look their LRU misses up in the bucket. A lookup is a round trip to
/// nats-server and a read of its store for each input; when the traffic is made of inputs never
/// seen before (embedding a new corpus), every lookup misses and this cost is all there is: at
/// 2,837 single-input requests/s on the benchmark machine, the bucket's reads and writes doubled
/// nats-server's CPU, and the requests that waited for a lookup were the slowest. So while the
/// recent lookups (about the last 1,024, halved as they come) found fewer than 1 in 100 of their
/// keys, no request waits for a lookup: every request sends its misses upstream at once (still
/// writing its results), and one in 16 also has its keys looked up by a background probe
/// ([`Lookup::Probe`]), which only measures the bucket. As soon as the probes find entries again
/// (another worker embedded them, or this one restarted and the corpus comes again) the ratio
/// climbs past 1 in 100 and every request looks up again: after 256 cold reads, a few hits
/// among the next probes do it. While cold, what this gives up is the hits a lookup would have
/// found: under 1% of the misses.
#[derive(Default)]
pub(crate) struct ReadSampler {
    reads: AtomicU32,
    hits: AtomicU32,
    requests: AtomicU32,
    /// Whether a probe is in flight.
    probing: AtomicBool,
}

impl ReadSampler {
    /// How this request's misses use the bucket.
    pub(crate) fn lookup(&self) -> Lookup {
        let reads = self.reads.load(Ordering::Relaxed);
        let hits = self.hits.load(Ordering::Relaxed);
        if reads < SAMPLE_MIN_READS || hits.saturating_mul(SAMPLE_LOW_RATIO) >= reads {
            return Lookup::Read;
        }
        if self
            .requests
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(SAMPLE_EVERY)
        {
            Lookup::Probe
        } else {
            Lookup::Skip
        }
    }

    /// Counts a lookup of `reads` keys that found `hits`; halves both counts past
    /// [`SAMPLE_WINDOW`] reads (two requests halving at once only forget more history).
    pub(crate) fn record(&self, hits: usize, reads: usize) {
        let reads = u32::try_from(reads).unwrap_or(u32::MAX);
        let hits = u32::try_from(hits).unwrap_or(u32::MAX);
        self.hits.fetch_add(hits, Ordering::Relaxed);
        let total = self
            .reads
            .fetch_add(reads, Ordering::Relaxed)
            .saturating_add(reads);
        if total >= SAMPLE_WINDOW {
            self.reads.store(total / 2, Ordering::Relaxed);
            let hits = self.hits.load(Ordering::Relaxed);
            self.hits.store(hits / 2, Ordering::Relaxed);
        }
    }
}

/// The bucket `config` names: created as a KV bucket of history 1 whose stream discards the
/// oldest entries when full (see the module docs) with `config.replicas` copies, or the existing
/// one as it is, brought to `config.replicas`.
async fn open_bucket(
    context: &jetstream::Context,
    config: &BucketConfig,
) -> Result<kv::Store, async_nats::Error> {
    let bucket = &config.bucket;
    embatch_runtime::replicas::ensure_stream(
        context,
        stream::Config {
            name: format!("KV_{bucket}"),
            description: Some("embatch: embeddings cache".into()),
            subjects: vec![format!("$KV.{bucket}.>")],
            max_messages_per_subject: 1,
            max_bytes: i64::try_from(config.max_bytes).unwrap_or(i64::MAX),
            max_age: config.max_age,
            storage: stream::StorageType::File,
            discard: stream::DiscardPolicy::Old,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            ..Default::default()
        },
        config.replicas,
    )
    .await?;
    Ok(context.get_key_value(bucket.as_str()).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests, of `requests`, whose misses are looked up (read or probed).
    fn reads_of(sampler: &ReadSampler, requests: u32) -> u32 {
        (0..requests)
            .filter(|_| sampler.lookup() != Lookup::Skip)
            .count() as u32
    }

    #[test]
    fn every_request_reads_until_the_bucket_is_seen_to_be_cold() {
        let sampler = ReadSampler::default();
        assert_eq!(reads_of(&sampler, 100), 100, "nothing known yet");
        sampler.record(0, 255);
        assert_eq!(reads_of(&sampler, 100), 100, "too few reads to judge");
        sampler.record(4, 100);
        assert_eq!(
            reads_of(&sampler, 100),
            100,
            "4 hits in 355 reads: still warm"
        );
        sampler.record(0, 50);
        assert!(reads_of(&sampler, 100) < 100, "4 hits in 405 reads: cold");
    }

    #[test]
    fn a_cold_bucket_is_probed_by_one_request_in_16_until_hits_come_back() {
        let sampler = ReadSampler::default();
        sampler.record(0, 600);
        let lookups: Vec<Lookup> = (0..160).map(|_| sampler.lookup()).collect();
        assert!(
            !lookups.contains(&Lookup::Read),
            "while cold no request waits for a lookup"
        );
        assert_eq!(
            lookups.iter().filter(|l| **l == Lookup::Probe).count(),
            10,
            "no hit in 600 reads: 1 in 16 probed"
        );
        // The probes start finding entries (a corpus seen before comes again).
        for _ in 0..7 {
            sampler.record(1, 1);
        }
        assert_eq!(
            reads_of(&sampler, 100),
            100,
            "7 hits in 607 reads: every request reads"
        );
    }

    #[test]
    fn old_reads_are_forgotten_by_halving() {
        let sampler = ReadSampler::default();
        sampler.record(500, 1000);
        sampler.record(0, 100);
        // 1,100 reads halved to 550, the 500 hits to 250.
        assert_eq!(sampler.reads.load(Ordering::Relaxed), 550);
        assert_eq!(sampler.hits.load(Ordering::Relaxed), 250);
        for _ in 0..20 {
            sampler.record(0, 1000);
        }
        assert!(
            reads_of(&sampler, 160) < 160,
            "after 20,000 cold reads the old hits no longer count"
        );
    }
}
