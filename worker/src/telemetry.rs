//! Logs and metrics: the tracing subscriber, the Prometheus recorder and every metric name.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use metrics::Counter;
use metrics_exporter_prometheus::PrometheusHandle;

/// Metric names (prefix `embatch_worker_`, Prometheus unit suffixes).
pub mod names {
    /// The batcher's metric names (see [`embatch_batcher::names`]).
    pub use embatch_batcher::names::*;
    /// The bulk lane's metric names (see [`embatch_bulk::names`]).
    pub use embatch_bulk::names::*;
    /// The cache's metric names (see [`embatch_cache::names`]).
    pub use embatch_cache::names::*;

    /// The membership's metric names (see [`embatch_membership::names`]).
    pub use embatch_membership::names::*;
    /// Histogram: seconds from a request's arrival to its reply for requests answered entirely
    /// from the cache (what a hit costs in the worker).
    pub const CACHE_HIT_TIME: &str = "embatch_worker_cache_hit_seconds";
    /// Counter, labels `tenant` (bounded by the configuration, see `crate::tenant`), `lane`
    /// (`interactive`: requests answered; `bulk`: bulk lines embedded) and `outcome` (`ok`;
    /// `shed`: 429; `failed`: 424, 503, 504 and any other 5xx; `refused`: any other 4xx):
    /// requests per tenant. A request refused before its tenant is known (400 or 403 for its
    /// tenant) is counted in [`REQUESTS`] only.
    pub const TENANT_REQUESTS: &str = "embatch_worker_tenant_requests_total";
    /// Counter, labels `tenant` and `lane`: inputs of the tenant's requests answered 200 (bulk:
    /// of its lines embedded).
    pub const TENANT_INPUTS: &str = "embatch_worker_tenant_inputs_total";
    /// Counter, labels `tenant` and `lane`: tokens of the tenant's requests answered 200, as
    /// the model's tokenizer counted them (none when the worker has no tokenizer; bulk lines
    /// are not counted by one and add none).
    pub const TENANT_TOKENS: &str = "embatch_worker_tenant_tokens_total";
}

/// The `lane` label of the per-tenant metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Traffic {
    /// Requests on the request subjects.
    Interactive,
    /// Lines of bulk jobs.
    Bulk,
}

impl Traffic {
    fn label(self) -> &'static str {
        match self {
            Traffic::Interactive => "interactive",
            Traffic::Bulk => "bulk",
        }
    }
}

/// The `outcome` of [`names::TENANT_REQUESTS`] for an answer of HTTP-style `status`.
pub fn tenant_outcome(status: u16) -> &'static str {
    match status {
        200..=299 => "ok",
        429 => "shed",
        424 | 500..=599 => "failed",
        _ => "refused",
    }
}

/// Counts one request (or bulk line) of the tenant labelled `tenant` in `lane`, answered with
/// `status`; for a 200, its `inputs` and, when counted, its `tokens`.
pub fn count_tenant(
    tenant: &Arc<str>,
    lane: Traffic,
    status: u16,
    (inputs, tokens): (usize, Option<u64>),
) {
    let outcome = tenant_outcome(status);
    let meters = TenantMeters::of(tenant, lane);
    meters.requests(outcome).increment(1);
    if outcome != "ok" {
        return;
    }
    meters.inputs.increment(inputs as u64);
    if let Some(tokens) = tokens {
        meters.tokens.increment(tokens);
    }
}

/// One tenant's and lane's counter handles, registered on its first request: the macros look
/// a key with a tenant label up in the recorder's registry on every call (building the key,
/// hashing it, cloning the label), a handle records with one atomic operation. Labels are
/// bounded by the configuration (see `crate::tenant`), so the map is too.
struct TenantMeters {
    /// [`names::TENANT_REQUESTS`], by outcome: `ok`, `shed`, `failed`, `refused`.
    requests: [Counter; 4],
    inputs: Counter,
    tokens: Counter,
}

/// Each tenant label's and lane's handles.
type TenantMetersMap = HashMap<(Arc<str>, Traffic), Arc<TenantMeters>>;

/// Every tenant's and lane's handles, made on first use.
static TENANT_METERS: LazyLock<Mutex<TenantMetersMap>> = LazyLock::new(Mutex::default);

impl TenantMeters {
    const OUTCOMES: [&'static str; 4] = ["ok", "shed", "failed", "refused"];

    /// The handles of `tenant` in `lane`, registered when first asked for.
    fn of(tenant: &Arc<str>, lane: Traffic) -> Arc<TenantMeters> {
        let mut all = TENANT_METERS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let made = all.entry((tenant.clone(), lane)).or_insert_with(|| {
            let counter = |name: &'static str, outcome: Option<&'static str>| {
                let mut labels = vec![
                    metrics::Label::new("tenant", tenant.to_string()),
                    metrics::Label::new("lane", lane.label()),
                ];
                labels.extend(outcome.map(|o| metrics::Label::new("outcome", o)));
                metrics::counter!(name, labels)
            };
            Arc::new(TenantMeters {
                requests: Self::OUTCOMES.map(|o| counter(names::TENANT_REQUESTS, Some(o))),
                inputs: counter(names::TENANT_INPUTS, None),
                tokens: counter(names::TENANT_TOKENS, None),
            })
        });
        Arc::clone(made)
    }

    /// The requests counter of `outcome` (one of [`TenantMeters::OUTCOMES`]).
    fn requests(&self, outcome: &str) -> &Counter {
        let at = Self::OUTCOMES.iter().position(|o| *o == outcome);
        &self.requests[at.unwrap_or(Self::OUTCOMES.len() - 1)]
    }
}

pub use embatch_runtime::{LogFormat, init_logging};

/// Installs the process's Prometheus recorder (batch-size buckets in inputs and requests) and
/// returns the handle that renders `/metrics`. Its upkeep runs in the admin server's task
/// ([`crate::http::AdminServer::run`]).
///
/// # Errors
/// When a recorder is already installed.
pub fn init_metrics() -> Result<PrometheusHandle, metrics_exporter_prometheus::BuildError> {
    init_model_metrics(None)
}

/// [`init_metrics`] with the global label `model="<name>"` on every metric when `model` is
/// set (the model this worker serves: a fleet of several models is told apart by it).
///
/// # Errors
/// When a recorder is already installed.
pub fn init_model_metrics(
    model: Option<&str>,
) -> Result<PrometheusHandle, metrics_exporter_prometheus::BuildError> {
    const COUNTS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];
    const TOKENS: &[f64] = &[
        16.0, 64.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0,
    ];
    const RATIOS: &[f64] = &[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0];
    // A hit costs microseconds: buckets from 1 µs to 50 ms.
    const HIT_SECONDS: &[f64] = &[
        0.000_001,
        0.000_002_5,
        0.000_005,
        0.000_007_5,
        0.000_01,
        0.000_025,
        0.000_05,
        0.000_075,
        0.000_1,
        0.000_15,
        0.000_2,
        0.000_3,
        0.000_5,
        0.000_75,
        0.001,
        0.002,
        0.005,
        0.01,
        0.05,
    ];
    let labels: Vec<(&str, &str)> = model.map(|m| ("model", m)).into_iter().collect();
    let handle = embatch_runtime::install_labelled_metrics_recorder(
        &[
            (names::BATCH_INPUTS, COUNTS),
            (names::BATCH_REQUESTS, COUNTS),
            (names::BATCH_TOKENS, TOKENS),
            (names::BATCH_PADDED_TOKENS, TOKENS),
            (names::BATCH_PADDING_RATIO, RATIOS),
            (names::CACHE_HIT_TIME, HIT_SECONDS),
        ],
        &labels,
    )?;
    describe();
    Ok(handle)
}

/// HELP texts for every metric, and the shed counters at 0 so that dashboards and alerts see
/// them before the first request is shed.
fn describe() {
    describe_requests();
    describe_batches();
    describe_bulk();
    describe_cache();
    for reason in crate::batcher::SHED_REASONS {
        metrics::counter!(names::SHED, "reason" => reason).absolute(0);
    }
}

/// HELP texts of the requests' counters (all, shed, per tenant) and latencies.
fn describe_requests() {
    use metrics::{describe_counter, describe_histogram};
    describe_counter!(
        names::REQUESTS,
        "Requests answered, by outcome (ok or the error kind)."
    );
    describe_counter!(names::SHED, "Requests shed at admission, by reason.");
    describe_counter!(
        names::TENANT_REQUESTS,
        "Requests (and bulk lines) per tenant, by lane and outcome (ok, shed, failed, refused)."
    );
    describe_counter!(
        names::TENANT_INPUTS,
        "Inputs of requests answered 200 per tenant, by lane."
    );
    describe_counter!(
        names::TENANT_TOKENS,
        "Tokens of requests answered 200 per tenant, by lane (as the tokenizer counts them)."
    );
    describe_histogram!(
        names::QUEUE_WAIT,
        metrics::Unit::Seconds,
        "Acceptance to first upstream call."
    );
    describe_histogram!(
        names::UPSTREAM_TIME,
        metrics::Unit::Seconds,
        "Duration of one upstream call."
    );
    describe_histogram!(
        names::REQUEST_TIME,
        metrics::Unit::Seconds,
        "Acceptance to answer."
    );
}

/// HELP texts of the upstream calls, the queue and the queue-group membership.
fn describe_batches() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_histogram!(names::BATCH_INPUTS, "Inputs per upstream call.");
    describe_histogram!(names::BATCH_REQUESTS, "Requests per upstream call.");
    describe_histogram!(names::BATCH_TOKENS, "Tokens per upstream call.");
    describe_histogram!(
        names::BATCH_PADDED_TOKENS,
        "Padded tokens per upstream call: longest input x inputs."
    );
    describe_histogram!(
        names::BATCH_PADDING_RATIO,
        "Tokens / padded tokens per upstream call (1: no padding)."
    );
    describe_gauge!(names::BATCHES_IN_FLIGHT, "Upstream calls in progress.");
    describe_gauge!(names::QUEUE_DEPTH, "Inputs waiting for an upstream call.");
    describe_counter!(names::UPSTREAM_CALLS, "Upstream calls, by outcome.");
    describe_counter!(
        names::BATCHES_CRASHED,
        "Batch tasks that panicked; their requests were answered 424."
    );
    metrics::counter!(names::BATCHES_CRASHED).absolute(0);
    describe_gauge!(
        names::MEMBER,
        "1 while the worker is a member of the queue group, else 0."
    );
    describe_counter!(
        names::MEMBERSHIP_CHANGES,
        "Queue-group membership changes, by event (joined, left) and new state (full, upstream_unhealthy, ...)."
    );
}

/// HELP texts of the bulk lane.
fn describe_bulk() {
    use metrics::{describe_counter, describe_histogram};
    describe_counter!(
        names::BULK_LINES,
        "Bulk lines embedded through the batcher, by outcome (ok, rejected, failed)."
    );
    describe_counter!(names::BULK_INPUTS, "Inputs embedded for the bulk lane.");
    describe_counter!(
        names::BULK_TOP_UP_INPUTS,
        "Bulk inputs sent in the room an interactive batch left."
    );
    describe_histogram!(
        names::BULK_UPSTREAM_TIME,
        metrics::Unit::Seconds,
        "Seconds from a bulk line's submission to the batcher to its embeddings."
    );
    describe_counter!(
        names::BULK_ITEMS,
        "Bulk work items handled, by outcome (ack, term, nak)."
    );
    describe_counter!(
        names::BULK_SWEPT,
        "Bulk work-stream messages given back from below a consumer's ack floor."
    );
    describe_counter!(
        names::BULK_JOBS_STALLED,
        "Bulk jobs (validation, finalization) abandoned for making no progress, and redelivered."
    );
}

/// HELP texts of the cache and of dedup.
fn describe_cache() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        names::DEDUP_INPUTS,
        "Inputs that caused no upstream work of their own, by where they were folded (batch, flight)."
    );
    describe_counter!(
        names::CACHE_HITS,
        "Inputs answered from the cache, by tier (local, shared)."
    );
    describe_counter!(
        names::CACHE_MISSES,
        "Inputs the cache did not hold, sent upstream."
    );
    describe_gauge!(names::CACHE_BYTES, "Bytes held by the in-process LRU.");
    describe_counter!(
        names::CACHE_EVICTIONS,
        "Entries evicted from the in-process LRU."
    );
    describe_counter!(
        names::CACHE_KV_ERRORS,
        "JetStream KV calls of the cache that failed or timed out, by op (open, get, put)."
    );
    describe_counter!(
        names::CACHE_WRITES_DROPPED,
        "Cache entries not written to the shared bucket: its write queue was full."
    );
    describe_counter!(
        names::CACHE_READS_SKIPPED,
        "LRU misses sent upstream without waiting for a shared-bucket lookup while it found under 1 in 100 (1 request in 16 is probed in the background)."
    );
    describe_histogram!(
        names::CACHE_HIT_TIME,
        metrics::Unit::Seconds,
        "Arrival to reply of requests answered entirely from the cache."
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenants_answers_fall_in_four_outcomes() {
        let cases = [
            (200, "ok"),
            (429, "shed"),
            (424, "failed"),
            (503, "failed"),
            (504, "failed"),
            (400, "refused"),
            (403, "refused"),
            (413, "refused"),
            (422, "refused"),
        ];
        for (status, outcome) in cases {
            assert_eq!(tenant_outcome(status), outcome, "{status}");
        }
    }
}
