//! Logs and metrics: the tracing subscriber, the Prometheus recorder and every metric name.

use metrics_exporter_prometheus::PrometheusHandle;

/// Metric names (prefix `embatch_gateway_`, Prometheus unit suffixes).
pub mod names {
    /// Counter, labels `status` (HTTP status code) and `model` (the model routed to; absent for
    /// the plain subject when no default model is configured): `/embed` requests answered.
    pub const REQUESTS: &str = "embatch_gateway_requests_total";
    /// Histogram, label `model`: seconds per `/embed` request, as the gateway sees it.
    pub const REQUEST_TIME: &str = "embatch_gateway_request_seconds";
    /// Gauge: `/embed` requests in flight.
    pub const IN_FLIGHT: &str = "embatch_gateway_requests_in_flight";
    /// Gauge: open HTTP connections.
    pub const CONNECTIONS: &str = "embatch_gateway_connections";
    /// Counter: connections closed at once because `MAX_CONNECTIONS` were open.
    pub const CONNECTIONS_REFUSED: &str = "embatch_gateway_connections_refused_total";
    /// Counter, labels `tenant` and `status`: embedding requests answered, per tenant (429s
    /// are shed or over quota; 5xx and 424 failed).
    pub const TENANT_REQUESTS: &str = "embatch_gateway_tenant_requests_total";
    /// Counter, label `tenant`: inputs of the embedding requests answered 200.
    pub const TENANT_INPUTS: &str = "embatch_gateway_tenant_inputs_total";
    /// Counter, label `tenant`: tokens of the embedding requests answered 200, as the workers
    /// counted them.
    pub const TENANT_TOKENS: &str = "embatch_gateway_tenant_tokens_total";
    /// Counter, labels `tenant` and `limit` (`requests`, `tokens`): requests refused 429 by the
    /// tenant's quota.
    pub const TENANT_QUOTA_REFUSED: &str = "embatch_gateway_tenant_quota_refused_total";
}

pub use embatch_runtime::{LogFormat, init_logging};

/// Statuses whose `embatch_gateway_requests_total` counter [`RequestMetrics`] registers up front:
/// every status the embedding routes answer themselves (`499`: the client hung up first, as
/// nginx logs it). A worker's error status outside this list is counted all the same, through
/// the registry.
const COUNTED_STATUSES: [u16; 13] = [
    200, 400, 408, 413, 415, 422, 424, 429, 499, 500, 502, 503, 504,
];

/// The handles of one model's per-request metrics ([`names::IN_FLIGHT`], shared by every
/// model: the in-flight cap is the gateway's; [`names::REQUEST_TIME`] and [`names::REQUESTS`]
/// by status, labelled `model`), registered once per model with the process's recorder: looking
/// a metric up by name (and by label) hashes its key on every call, and the embedding routes
/// record four per request. Without a recorder (tests) every handle is a no-op.
#[derive(Clone)]
pub struct RequestMetrics {
    in_flight: metrics::Gauge,
    time: metrics::Histogram,
    by_status: [(u16, metrics::Counter); COUNTED_STATUSES.len()],
    model: String,
}

impl RequestMetrics {
    /// Registers the handles of `model` with the recorder installed now (install it first).
    pub fn register(model: &str) -> RequestMetrics {
        RequestMetrics {
            in_flight: metrics::gauge!(names::IN_FLIGHT),
            time: metrics::histogram!(names::REQUEST_TIME, model_label(model, None)),
            by_status: COUNTED_STATUSES.map(|status| {
                (
                    status,
                    metrics::counter!(names::REQUESTS, model_label(model, Some(status))),
                )
            }),
            model: model.to_owned(),
        }
    }

    /// A request started: one more in flight.
    pub fn started(&self) {
        self.in_flight.increment(1.0);
    }

    /// A request ended with `status` (`499` when the client hung up) after `elapsed`.
    pub fn ended(&self, status: u16, elapsed: std::time::Duration) {
        self.in_flight.decrement(1.0);
        match self.by_status.iter().find(|(s, _)| *s == status) {
            Some((_, counter)) => counter.increment(1),
            None => {
                metrics::counter!(names::REQUESTS, model_label(&self.model, Some(status)))
                    .increment(1);
            }
        }
        self.time.record(elapsed.as_secs_f64());
    }
}

/// The labels `status` (when given) and `model` (left out when `""`: the plain subject without a
/// default model keeps the series a single-model gateway always had).
fn model_label(model: &str, status: Option<u16>) -> Vec<metrics::Label> {
    let mut labels = Vec::with_capacity(2);
    if let Some(status) = status {
        labels.push(metrics::Label::new("status", status.to_string()));
    }
    if !model.is_empty() {
        labels.push(metrics::Label::new("model", model.to_owned()));
    }
    labels
}

/// Installs the process's Prometheus recorder (upkeep every 5 s) and returns the handle that
/// renders `/metrics`.
///
/// # Errors
/// When a recorder is already installed.
pub fn init_metrics() -> Result<PrometheusHandle, metrics_exporter_prometheus::BuildError> {
    let handle = embatch_runtime::install_metrics(&[])?;
    metrics::describe_counter!(names::REQUESTS, "/embed requests answered, by HTTP status.");
    metrics::describe_histogram!(
        names::REQUEST_TIME,
        metrics::Unit::Seconds,
        "/embed latency in the gateway."
    );
    metrics::describe_gauge!(names::IN_FLIGHT, "/embed requests in progress.");
    metrics::describe_gauge!(names::CONNECTIONS, "Open HTTP connections.");
    metrics::describe_counter!(
        names::CONNECTIONS_REFUSED,
        "Connections closed at once because MAX_CONNECTIONS were open."
    );
    metrics::counter!(names::CONNECTIONS_REFUSED).absolute(0);
    metrics::describe_counter!(
        names::TENANT_REQUESTS,
        "Embedding requests answered, by tenant and HTTP status."
    );
    metrics::describe_counter!(
        names::TENANT_INPUTS,
        "Inputs of the embedding requests answered 200, by tenant."
    );
    metrics::describe_counter!(
        names::TENANT_TOKENS,
        "Tokens of the embedding requests answered 200, by tenant."
    );
    metrics::describe_counter!(
        names::TENANT_QUOTA_REFUSED,
        "Requests refused by their tenant's quota, by tenant and limit."
    );
    metrics::describe_counter!(
        embatch_client::RETRIES,
        "NATS requests sent again, by reason: no_responders (no worker subscribed yet), \
         unavailable (a worker answered 503)."
    );
    for reason in ["no_responders", "unavailable"] {
        metrics::counter!(embatch_client::RETRIES, "reason" => reason).absolute(0);
    }
    Ok(handle)
}
