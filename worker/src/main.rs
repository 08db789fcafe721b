//! `embatch-worker`: parses the configuration, connects to NATS, loads the upstream and serves (see the library docs).

use clap::Parser;
use embatch_worker::{Config, WorkerError, telemetry};

/// mimalloc instead of glibc's malloc: a request allocates and frees many small buffers across
/// threads (docs/design/allocator.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    embatch_runtime::exit_code(run(Config::parse()).await)
}

/// Logs, connects, loads the upstream, then serves until SIGINT or SIGTERM (the library's
/// [`embatch_worker::run`] owns every task and the shutdown sequence).
async fn run(config: Config) -> Result<(), WorkerError> {
    telemetry::init_logging(config.log_format);
    embatch_runtime::disable_transparent_huge_pages();
    tracing::info!(config = ?config, "starting embatch-worker");
    let client = embatch_worker::connect(&config).await?;
    let upstream = embatch_worker::build_upstream(&config).await?;
    embatch_worker::run(client, upstream, &config, embatch_worker::shutdown_signal()).await
}
