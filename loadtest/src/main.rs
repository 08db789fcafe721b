//! `embatch-loadtest`: `run` generates load, `fake-upstream` serves a GPU-like TEI double,
//! `nats-relay` is a bare NATS-to-TEI bridge (a benchmark reference).

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use embatch_loadtest::cli::{Cli, Command, FakeUpstreamArgs, NatsRelayArgs, RunArgs};
use embatch_loadtest::{LoadtestError, run};
use embatch_tei_double::SharedFaults;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run_command(*args).await,
        Command::FakeUpstream(args) => fake_upstream_command(args).await,
        Command::NatsRelay(args) => nats_relay_command(args).await,
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
    let faults = SharedFaults::default();
    if let Some((slow_for, slow_delay)) = args.slow_start() {
        set_delay(&faults, slow_delay);
        println!(
            "slow until unix_ms={}",
            unix_ms(SystemTime::now() + slow_for)
        );
        let faults = faults.clone();
        tokio::spawn(async move {
            tokio::time::sleep(slow_for).await;
            set_delay(&faults, Duration::ZERO);
            println!("fast since unix_ms={}", unix_ms(SystemTime::now()));
            let _ = std::io::stdout().flush();
        });
    }
    let _ = std::io::stdout().flush();
    let config = args.config();
    tracing::info!(?config, "TEI double ready");
    embatch_tei_double::serve_until_with(listener, config, faults, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
    .map_err(|e| LoadtestError::Config(format!("TEI double failed: {e}")))
}

async fn nats_relay_command(args: NatsRelayArgs) -> Result<(), LoadtestError> {
    let nats = embatch_client::connect(&args.nats, "embatch-loadtest-relay")
        .await
        .map_err(|e| LoadtestError::Config(format!("cannot connect to NATS: {e}")))?;
    embatch_loadtest::relay::serve(nats, args.subject, args.upstream).await
}

/// Sets the extra delay of the calls that arrive from now on.
fn set_delay(faults: &SharedFaults, delay: Duration) {
    faults.lock().unwrap_or_else(|e| e.into_inner()).delay = delay;
}

/// Milliseconds since the Unix epoch (0 for a clock set before 1970).
fn unix_ms(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis())
}
