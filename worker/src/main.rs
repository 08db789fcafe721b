//! `embatch-worker`: parses the configuration, connects to NATS, loads the upstream and serves (see the library docs).

use clap::Parser;
use embatch_worker::{Config, WorkerError, http, telemetry};

/// mimalloc instead of glibc's malloc: a request allocates and frees many small buffers across
/// threads (README, benchmark 4: CPU per request).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let config = Config::parse();
    telemetry::init_logging(config.log_format);
    embatch_runtime::exit_code(run(config).await)
}

async fn run(config: Config) -> Result<(), WorkerError> {
    tracing::info!(config = ?config, "starting embatch-worker");
    let client = embatch_worker::connect(&config).await?;
    let upstream = embatch_worker::build_upstream(&config).await?;
    if let Some(addr) = config.metrics_addr.0 {
        http::spawn(addr, client.clone()).await?;
    }
    embatch_worker::run(client, upstream, &config, embatch_worker::shutdown_signal()).await
}
