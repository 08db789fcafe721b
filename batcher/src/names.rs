//! The metric names the batcher records (prefix `embatch_worker_`, Prometheus unit suffixes):
//! the worker's, which re-exports them among its own (dashboards and alerts read these names).
//! The worker installs the recorder, its histogram buckets and the HELP texts.

/// Counter, label `outcome` (`ok`, an error kind such as `overloaded`, `cancelled` when
/// the caller went away first, or `duplicate` for a resent copy of a request this worker
/// already held): requests answered.
pub const REQUESTS: &str = "embatch_worker_requests_total";
/// Counter, label `reason`: requests shed at admission. `queue_full` (`QUEUE_CAP`),
/// `queue_bytes` (`MAX_QUEUE_BYTES`), `queue_delay` (`MAX_QUEUE_DELAY`), `deadline` (cannot
/// finish in time), `expired` (deadline already passed), `fair_share` (queued, then shed to
/// make room for a tenant under its share: its tenant held the most for its weight).
pub const SHED: &str = "embatch_worker_requests_shed_total";
/// Histogram: seconds from acceptance to the request's first upstream call.
pub const QUEUE_WAIT: &str = "embatch_worker_queue_wait_seconds";
/// Histogram: seconds per upstream call.
pub const UPSTREAM_TIME: &str = "embatch_worker_upstream_seconds";
/// Histogram: seconds from acceptance to answer.
pub const REQUEST_TIME: &str = "embatch_worker_request_seconds";
/// Histogram: inputs per upstream batch.
pub const BATCH_INPUTS: &str = "embatch_worker_batch_inputs";
/// Histogram: requests per upstream batch.
pub const BATCH_REQUESTS: &str = "embatch_worker_batch_requests";
/// Histogram: tokens per upstream batch (the sum of its inputs' token counts).
pub const BATCH_TOKENS: &str = "embatch_worker_batch_tokens";
/// Histogram: padded tokens per upstream batch (`longest × inputs`).
pub const BATCH_PADDED_TOKENS: &str = "embatch_worker_batch_padded_tokens";
/// Histogram: padding ratio per upstream batch (tokens / padded tokens, 0..=1).
pub const BATCH_PADDING_RATIO: &str = "embatch_worker_batch_padding_ratio";
/// Gauge: upstream calls in flight.
pub const BATCHES_IN_FLIGHT: &str = "embatch_worker_batches_in_flight";
/// Gauge: inputs accepted and not yet sent upstream.
pub const QUEUE_DEPTH: &str = "embatch_worker_queue_inputs";
/// Counter, label `outcome` (`ok`, `rejected`, `failed`): upstream calls.
pub const UPSTREAM_CALLS: &str = "embatch_worker_upstream_calls_total";
/// Counter: batch tasks that panicked (their requests were answered 424).
pub const BATCHES_CRASHED: &str = "embatch_worker_batches_crashed_total";
/// Counter: bulk inputs sent in the room an interactive batch left (the rest left in
/// batches of bulk inputs alone).
pub const BULK_TOP_UP_INPUTS: &str = "embatch_worker_bulk_top_up_inputs_total";
/// Counter, label `where` (`batch`: folded into an equal input of the same upstream call;
/// `flight`: waited for the same input already in flight for another request or earlier in
/// the same request): inputs that caused no upstream work of their own.
pub const DEDUP_INPUTS: &str = "embatch_worker_dedup_inputs_total";
