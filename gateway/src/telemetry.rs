//! Logs and metrics: the tracing subscriber, the Prometheus recorder and every metric name.

use metrics_exporter_prometheus::PrometheusHandle;

/// Metric names (prefix `embatch_gateway_`, Prometheus unit suffixes).
pub mod names {
    /// Counter, label `status` (HTTP status code): `/embed` requests answered.
    pub const REQUESTS: &str = "embatch_gateway_requests_total";
    /// Histogram: seconds per `/embed` request, as the gateway sees it.
    pub const REQUEST_TIME: &str = "embatch_gateway_request_seconds";
    /// Gauge: `/embed` requests in flight.
    pub const IN_FLIGHT: &str = "embatch_gateway_requests_in_flight";
    /// Gauge: open HTTP connections.
    pub const CONNECTIONS: &str = "embatch_gateway_connections";
    /// Counter: connections closed at once because `MAX_CONNECTIONS` were open.
    pub const CONNECTIONS_REFUSED: &str = "embatch_gateway_connections_refused_total";
}

pub use embatch_runtime::{LogFormat, init_logging};

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
        embatch_client::RETRIES,
        "NATS requests sent again, by reason: no_responders (no worker subscribed yet), \
         unavailable (a worker answered 503)."
    );
    for reason in ["no_responders", "unavailable"] {
        metrics::counter!(embatch_client::RETRIES, "reason" => reason).absolute(0);
    }
    Ok(handle)
}
