//! Handles of the cache metrics recorded per request, registered once, on first use:
//! `metrics::counter!` and `metrics::gauge!` look their key up in the recorder's registry on
//! every call (a hash, a shard lock, an `Arc` clone); a handle records with one atomic
//! operation. The worker installs its recorder before it starts the cache, so the first use
//! finds it; a process without a recorder gets handles that record nothing, as the macros.

use std::sync::LazyLock;

use metrics::{Counter, Gauge};

use crate::names;

/// The per-request cache metrics ([`METERS`]).
pub(crate) struct Meters {
    /// [`names::CACHE_HITS`] with `tier="local"`.
    pub(crate) hits_local: Counter,
    /// [`names::CACHE_HITS`] with `tier="shared"`.
    pub(crate) hits_shared: Counter,
    /// [`names::CACHE_MISSES`].
    pub(crate) misses: Counter,
    /// [`names::CACHE_READS_SKIPPED`].
    pub(crate) reads_skipped: Counter,
    /// [`names::CACHE_BYTES`].
    pub(crate) bytes: Gauge,
    /// [`names::CACHE_EVICTIONS`]: with the in-process tier full, every insert evicts.
    pub(crate) evictions: Counter,
}

/// The process's handles, registered on first use.
pub(crate) static METERS: LazyLock<Meters> = LazyLock::new(|| Meters {
    hits_local: metrics::counter!(names::CACHE_HITS, "tier" => "local"),
    hits_shared: metrics::counter!(names::CACHE_HITS, "tier" => "shared"),
    misses: metrics::counter!(names::CACHE_MISSES),
    reads_skipped: metrics::counter!(names::CACHE_READS_SKIPPED),
    bytes: metrics::gauge!(names::CACHE_BYTES),
    evictions: metrics::counter!(names::CACHE_EVICTIONS),
});
