//! Process plumbing shared by `embatch-gateway`, `embatch-worker` and `embatch-loadtest` (not
//! part of the wire contract, which lives in `embatch-protocol`): the settings every binary
//! shares ([`NatsArgs`], [`JetStreamArgs`], [`Secret`], [`OptionalAddr`]), log setup, distributed tracing over
//! OTLP ([`tracing_otel`]), the Prometheus recorder, the shutdown signal and the process's memory
//! setting ([`disable_transparent_huge_pages`]).

mod addr;
mod memory;
mod nats;
mod nats_thread;
pub mod replicas;
mod secret;
pub mod tenants;
pub mod tracing_otel;
pub mod usage;

pub use addr::OptionalAddr;
pub use memory::disable_transparent_huge_pages;
pub use nats::{NatsArgs, NatsAuth, NatsError, ServerList, install_crypto_provider};
pub use replicas::{JetStreamArgs, ReplicaTarget, Replicas};
pub use secret::Secret;

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

/// Log output format (`--log-format` / `LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global tracing subscriber; the filter comes from `RUST_LOG` (default `info`).
/// Text lines carry ANSI colours only when stdout is a terminal (never in a file or a log
/// collector). A second call is a no-op.
pub fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(log_filter())
        .with_ansi(std::io::stdout().is_terminal());
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    if result.is_err() {
        tracing::debug!("a tracing subscriber was already installed");
    }
}

/// The log filter: `RUST_LOG`, or `info` when it is unset or invalid.
pub(crate) fn log_filter() -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
}

/// Histogram buckets of every `*_seconds` metric: 0.5 ms to 30 s.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Installs the process's global Prometheus recorder with [`SECONDS_BUCKETS`] for every metric
/// named `*_seconds` plus `buckets` for the named metrics, runs its upkeep ([`metrics_upkeep`])
/// in a task of its own for the life of the process, and returns the handle that renders
/// `/metrics`. A binary that owns its tasks calls [`install_metrics_recorder`] and runs the
/// upkeep itself.
///
/// # Errors
/// When a recorder is already installed or a bucket list is empty.
pub fn install_metrics(buckets: &[(&str, &[f64])]) -> Result<PrometheusHandle, BuildError> {
    let handle = install_metrics_recorder(buckets)?;
    tokio::spawn(metrics_upkeep(handle.clone()));
    Ok(handle)
}

/// [`install_metrics`] without the upkeep task: the caller runs [`metrics_upkeep`].
///
/// # Errors
/// When a recorder is already installed or a bucket list is empty.
pub fn install_metrics_recorder(
    buckets: &[(&str, &[f64])],
) -> Result<PrometheusHandle, BuildError> {
    install_labelled_metrics_recorder(buckets, &[])
}

/// [`install_metrics_recorder`] with `labels` (`(name, value)`) added to every metric, e.g. the
/// worker's `model`.
///
/// # Errors
/// When a recorder is already installed or a bucket list is empty.
pub fn install_labelled_metrics_recorder(
    buckets: &[(&str, &[f64])],
    labels: &[(&str, &str)],
) -> Result<PrometheusHandle, BuildError> {
    let mut builder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)?;
    for (name, values) in buckets {
        builder = builder.set_buckets_for_metric(Matcher::Full((*name).to_string()), values)?;
    }
    for (name, value) in labels {
        builder = builder.add_global_label(*name, *value);
    }
    builder.install_recorder()
}

/// How often [`metrics_upkeep`] drains the recorder's histogram buffers: 5 s.
pub const METRICS_UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs the recorder's upkeep (draining histogram buffers, which otherwise grow until the next
/// scrape) every [`METRICS_UPKEEP_INTERVAL`]; never returns: drop it to stop.
pub async fn metrics_upkeep(handle: PrometheusHandle) {
    let mut tick = tokio::time::interval(METRICS_UPKEEP_INTERVAL);
    loop {
        tick.tick().await;
        handle.run_upkeep();
    }
}

/// The process exit code for the result of a binary's `run`: success, or the error logged and
/// failure.
pub fn exit_code<E: std::fmt::Display>(result: Result<(), E>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A binary's `main` once its configuration is parsed: tracing for `service` (logs in `format`,
/// spans as `otel` says; a setup that fails ends the process with `tracing_error`'s error),
/// transparent huge pages off, then `run`, its spans flushed at the end; the exit code of
/// [`exit_code`]. The gateway and the worker start this way.
pub async fn serve_main<E: std::fmt::Display>(
    (format, otel, service): (LogFormat, &tracing_otel::OtelArgs, &str),
    tracing_error: impl FnOnce(tracing_otel::OtelError) -> E,
    run: impl Future<Output = Result<(), E>>,
) -> std::process::ExitCode {
    let tracing = match tracing_otel::init(format, otel, service) {
        Ok(tracing) => tracing,
        Err(err) => return exit_code(Err(tracing_error(err))),
    };
    disable_transparent_huge_pages();
    let code = exit_code(run.await);
    tracing.shutdown().await;
    code
}

/// Declares a service binary's allocator and `main`: mimalloc as the global allocator instead of
/// glibc's malloc (a request allocates and frees many small buffers across threads,
/// docs/design/allocator.md), and a Tokio `main` that parses `$config` (a `clap::Parser` with
/// `log_format` and `otel`), then runs [`serve_main`] with tracing for `$service`,
/// `$tracing_error` and `$run(config)`. The gateway's and the worker's `main.rs` start this way.
#[macro_export]
macro_rules! service_main {
    ($config:ty, $service:literal, $tracing_error:expr, $run:path $(,)?) => {
        #[global_allocator]
        static ALLOCATOR: $crate::mimalloc::MiMalloc = $crate::mimalloc::MiMalloc;

        #[tokio::main]
        async fn main() -> std::process::ExitCode {
            let config = <$config as $crate::clap::Parser>::parse();
            let otel = config.otel.clone();
            let tracing = (config.log_format, &otel, $service);
            $crate::serve_main(tracing, $tracing_error, $run(config)).await
        }
    };
}

#[doc(hidden)] // For [`service_main!`]'s expansion.
pub use {clap, mimalloc};

/// Resolves on SIGINT or SIGTERM (logging which).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::error!(%err, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::error!(%err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("SIGINT received"),
        () = terminate => tracing::info!("SIGTERM received"),
    }
}
