//! The metric names the cache records (prefix `embatch_worker_`, Prometheus unit suffixes):
//! the worker's, which re-exports them among its own (dashboards and alerts read these names).
//! The worker installs the recorder and the HELP texts, and records the time of a request
//! answered from the cache (`embatch_worker_cache_hit_seconds`) itself, in its intake. The
//! in-flight de-duplication is counted in [`embatch_batcher::names::DEDUP_INPUTS`]
//! (`where="flight"`).

/// Counter, label `tier` (`local`: the in-process LRU; `shared`: the JetStream KV bucket):
/// inputs answered from the cache.
pub const CACHE_HITS: &str = "embatch_worker_cache_hits_total";
/// Counter: inputs the cache did not hold, sent upstream (while the cache is on).
pub const CACHE_MISSES: &str = "embatch_worker_cache_misses_total";
/// Gauge: bytes held by the in-process LRU (values plus an estimate of their bookkeeping).
pub const CACHE_BYTES: &str = "embatch_worker_cache_local_bytes";
/// Counter: entries evicted from the in-process LRU to stay within `CACHE_LOCAL_BYTES`.
pub const CACHE_EVICTIONS: &str = "embatch_worker_cache_evictions_total";
/// Counter, label `op` (`open`, `get`, `put`): JetStream KV calls that failed or timed out
/// (each one a miss or an entry not shared, never an error answered).
pub const CACHE_KV_ERRORS: &str = "embatch_worker_cache_kv_errors_total";
/// Counter: entries not written to the shared bucket because its write queue was full
/// (1,024 entries or 8 MiB queued or awaiting acknowledgement: the store is slower than
/// the misses, see the crate's `writer` module).
pub const CACHE_WRITES_DROPPED: &str = "embatch_worker_cache_writes_dropped_total";
/// Counter: misses of the LRU sent upstream without waiting for a shared-bucket lookup
/// while the bucket is cold (see the crate's `shared` module).
pub const CACHE_READS_SKIPPED: &str = "embatch_worker_cache_shared_reads_skipped_total";
