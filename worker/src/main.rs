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
    let tracing =
        embatch_runtime::tracing_otel::init(config.log_format, &config.otel, "embatch-worker");
    let tracing = match tracing {
        Ok(tracing) => tracing,
        Err(err) => return embatch_runtime::exit_code(Err(WorkerError::Tracing(err))),
    };
    let code = embatch_runtime::exit_code(run(config).await);
    tracing.shutdown().await;
    code
}

/// Connects, loads the upstream, then serves until SIGINT or SIGTERM (the library's
/// [`embatch_worker::run`] owns every task and the shutdown sequence).
async fn run(config: Config) -> Result<(), WorkerError> {
    embatch_runtime::disable_transparent_huge_pages();
    tracing::info!(config = ?config, "starting embatch-worker");
    let client = embatch_worker::connect(&config).await?;
    let upstream = embatch_worker::build_upstream(&config).await?;
    embatch_worker::run(client, upstream, &config, embatch_worker::shutdown_signal()).await
}
