//! Logs and metrics: the tracing subscriber, the Prometheus recorder and every metric name.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Metric names (prefix `embatch_worker_`, Prometheus unit suffixes).
pub mod names {
    /// Counter, label `outcome` (`ok` or an error kind such as `overloaded`): requests answered.
    pub const REQUESTS: &str = "embatch_worker_requests_total";
    /// Counter, label `reason` (`queue_full`, `deadline`, `expired`): requests shed at admission.
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
    /// Gauge: upstream calls in flight.
    pub const BATCHES_IN_FLIGHT: &str = "embatch_worker_batches_in_flight";
    /// Gauge: inputs accepted and not yet sent upstream.
    pub const QUEUE_DEPTH: &str = "embatch_worker_queue_inputs";
    /// Counter, label `outcome` (`ok`, `rejected`, `failed`): upstream calls.
    pub const UPSTREAM_CALLS: &str = "embatch_worker_upstream_calls_total";
}

/// Log output format (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global tracing subscriber; the filter comes from `RUST_LOG` (default `info`).
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    if result.is_err() {
        tracing::debug!("a tracing subscriber was already installed");
    }
}

/// Installs the global Prometheus recorder, with upkeep every 5 s, and returns the handle that renders `/metrics`.
///
/// # Errors
/// When a recorder is already installed or a bucket list is invalid.
pub fn init_metrics() -> Result<PrometheusHandle, metrics_exporter_prometheus::BuildError> {
    const SECONDS: &[f64] = &[
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    ];
    const COUNTS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS)?
        .set_buckets_for_metric(Matcher::Full(names::BATCH_INPUTS.into()), COUNTS)?
        .set_buckets_for_metric(Matcher::Full(names::BATCH_REQUESTS.into()), COUNTS)?
        .install_recorder()?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}
