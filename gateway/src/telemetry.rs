//! Logs and metrics: the tracing subscriber, the Prometheus recorder and every metric name.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Metric names (prefix `embatch_gateway_`, Prometheus unit suffixes).
pub mod names {
    /// Counter, label `status` (HTTP status code): `/embed` requests answered.
    pub const REQUESTS: &str = "embatch_gateway_requests_total";
    /// Histogram: seconds per `/embed` request, as the gateway sees it.
    pub const REQUEST_TIME: &str = "embatch_gateway_request_seconds";
    /// Gauge: `/embed` requests in flight.
    pub const IN_FLIGHT: &str = "embatch_gateway_requests_in_flight";
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

/// Installs the global Prometheus recorder, with upkeep every 5 s, and returns the handle that
/// renders `/metrics`.
///
/// # Errors
/// When a recorder is already installed.
pub fn init_metrics() -> Result<PrometheusHandle, metrics_exporter_prometheus::BuildError> {
    const SECONDS: &[f64] = &[
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    ];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS)?
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
