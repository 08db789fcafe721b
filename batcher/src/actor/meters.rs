//! The actor's metric handles, registered once when it starts. `metrics::counter!` and its
//! kin look their key up in the recorder's registry on every call (a hash of the name and
//! labels, a shard lock, an `Arc` clone); a handle records with one atomic operation. These
//! are the metrics recorded per request or per actor wake-up; rarer ones (errors, sheds)
//! keep the macros.

use metrics::{Counter, Gauge, Histogram};

use crate::names;

/// Handles of the metrics the actor records on its common path, bound to the recorder
/// installed when [`Meters::new`] runs (the worker installs its recorder before it builds a
/// batcher; without one they record nothing, as the macros would).
pub(super) struct Meters {
    /// [`names::QUEUE_DEPTH`]: inputs queued, set on every wake-up.
    pub(super) queue_depth: Gauge,
    /// [`names::BATCHES_IN_FLIGHT`]: upstream calls in progress, set on every wake-up.
    pub(super) in_flight: Gauge,
    /// [`names::QUEUE_WAIT`]: seconds from acceptance to a request's first call.
    pub(super) queue_wait: Histogram,
    /// [`names::REQUEST_TIME`]: seconds from acceptance to the answer.
    pub(super) request_time: Histogram,
    /// [`names::REQUESTS`] with `outcome="ok"`.
    pub(super) requests_ok: Counter,
    /// [`names::BATCH_INPUTS`], [`names::BATCH_REQUESTS`], [`names::BATCH_TOKENS`],
    /// [`names::BATCH_PADDED_TOKENS`] and [`names::BATCH_PADDING_RATIO`], per call.
    pub(super) batch: [Histogram; 5],
    /// [`names::UPSTREAM_TIME`]: seconds per upstream call.
    pub(super) upstream_time: Histogram,
}

impl Meters {
    /// Registers every handle with the installed recorder.
    pub(super) fn new() -> Meters {
        Meters {
            queue_depth: metrics::gauge!(names::QUEUE_DEPTH),
            in_flight: metrics::gauge!(names::BATCHES_IN_FLIGHT),
            queue_wait: metrics::histogram!(names::QUEUE_WAIT),
            request_time: metrics::histogram!(names::REQUEST_TIME),
            requests_ok: metrics::counter!(names::REQUESTS, "outcome" => "ok"),
            batch: [
                metrics::histogram!(names::BATCH_INPUTS),
                metrics::histogram!(names::BATCH_REQUESTS),
                metrics::histogram!(names::BATCH_TOKENS),
                metrics::histogram!(names::BATCH_PADDED_TOKENS),
                metrics::histogram!(names::BATCH_PADDING_RATIO),
            ],
            upstream_time: metrics::histogram!(names::UPSTREAM_TIME),
        }
    }
}
