//! Transparent huge pages off for the process.
//!
//! mimalloc (the gateway's and the worker's allocator, docs/design/allocator.md) asks the
//! kernel for transparent huge pages on the memory it maps (`madvise(MADV_HUGEPAGE)`), so on the
//! common `madvise` setting of `/sys/kernel/mm/transparent_hugepage/enabled` the first touch of
//! each fresh 2 MiB region is one page fault that zeroes (and may first compact) 2 MiB, inside
//! whatever task touched it. A worker whose embeddings cache is filling takes fresh memory at
//! about 4.4 MB/s per 1,000 new inputs/s; the faults landed in the batcher's reply fan-out and
//! cost it about a tenth of its p99 at 1,000 req/s (`loadtest/cache_cost.sh`,
//! docs/design/allocator.md). Turning them off is the advice latency-sensitive
//! servers give too (Redis, MongoDB); it is the process-wide switch mimalloc's own
//! `MIMALLOC_ALLOW_THP=0` flips, made the default.

/// Turns transparent huge pages off for this process and its children
/// (`prctl(PR_SET_THP_DISABLE)`, checked by the kernel at each page fault, so memory mapped
/// before the call is covered too). Logs the outcome; a kernel that refuses leaves the process
/// as it was (a warning), never an error.
pub fn disable_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    match rustix::thread::disable_transparent_huge_pages(true) {
        Ok(()) => tracing::debug!("transparent huge pages are off for this process"),
        Err(err) => {
            tracing::warn!(%err, "could not turn transparent huge pages off; memory growth may stall requests")
        }
    }
}
