//! The metric names the bulk lane records (prefix `embatch_worker_`, Prometheus unit suffixes):
//! the worker's, which re-exports them among its own (dashboards and alerts read these names).
//! The worker installs the recorder and the HELP texts.

/// Counter, label `outcome` (`ok`, `rejected` when the upstream blamed an input of it,
/// `failed`): bulk input lines embedded through the batcher (their upstream calls, shared
/// with interactive requests, are in [`embatch_batcher::names::UPSTREAM_CALLS`]).
pub const BULK_LINES: &str = "embatch_worker_bulk_lines_total";
/// Counter: inputs embedded for the bulk lane.
pub const BULK_INPUTS: &str = "embatch_worker_bulk_inputs_total";
/// Histogram: seconds from a bulk line's submission to the batcher to its embeddings.
pub const BULK_UPSTREAM_TIME: &str = "embatch_worker_bulk_upstream_seconds";
/// Counter, label `outcome` (`ack` done, `term` done with a line the upstream refused, `nak`
/// given back for redelivery): work items (chunks of input lines) this worker handled.
pub const BULK_ITEMS: &str = "embatch_worker_bulk_items_total";
/// Counter: work-stream messages given back by the sweep (found below a consumer's ack
/// floor).
pub const BULK_SWEPT: &str = "embatch_worker_bulk_swept_total";
/// Counter: bulk jobs (a batch's validation or finalization) abandoned after making no
/// progress for the stall limit, and given back for redelivery.
pub const BULK_JOBS_STALLED: &str = "embatch_worker_bulk_jobs_stalled_total";
