//! `embatch-loadtest`: `run` generates load, `fake-upstream` serves a GPU-like TEI double.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use embatch_loadtest::cli::{Cli, Command, FakeUpstreamArgs, RunArgs};
use embatch_loadtest::{LoadtestError, run};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run_command(args).await,
        Command::FakeUpstream(args) => fake_upstream_command(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run_command(args: RunArgs) -> Result<(), LoadtestError> {
    let config = args.into_config()?;
    let report = run::run(&config).await?;
    run::write_report(&report, config.json.as_deref())
}

async fn fake_upstream_command(args: FakeUpstreamArgs) -> Result<(), LoadtestError> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| LoadtestError::Config(format!("cannot listen on {}: {e}", args.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| LoadtestError::Config(format!("cannot read the bound address: {e}")))?;
    println!("listening on {addr}");
    let _ = std::io::stdout().flush();
    let config = args.config();
    tracing::info!(?config, "TEI double ready");
    embatch_tei_double::serve_until(listener, config, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
    .map_err(|e| LoadtestError::Config(format!("TEI double failed: {e}")))
}
