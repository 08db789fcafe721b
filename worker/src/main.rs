//! `embatch-worker`: parses the configuration, connects to NATS, loads the upstream and serves (see the library docs).

use clap::Parser;
use embatch_worker::{Config, WorkerError};

/// mimalloc instead of glibc's malloc: a request allocates and frees many small buffers across
/// threads (docs/design/allocator.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let config = Config::parse();
    let otel = config.otel.clone();
    let tracing = (config.log_format, &otel, "embatch-worker");
    embatch_runtime::serve_main(tracing, WorkerError::Tracing, run(config)).await
}

/// Connects, loads the upstream, then serves until SIGINT or SIGTERM (the library's
/// [`embatch_worker::run`] owns every task and the shutdown sequence).
async fn run(config: Config) -> Result<(), WorkerError> {
    tracing::info!(config = ?config, "starting embatch-worker");
    let client = embatch_worker::connect(&config).await?;
    let upstream = embatch_worker::build_upstream(&config).await?;
    embatch_worker::run(client, upstream, &config, embatch_worker::shutdown_signal()).await
}
