//! `embatch`: bulk embedding jobs against an embatch gateway; see `embatch --help` and
//! docs/bulk.md.

use std::process::ExitCode;

use clap::Parser;
use embatch_cli::api::Api;
use embatch_cli::cli::{Cli, Command};
use embatch_cli::error::CliError;
use embatch_cli::job;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match Api::new(&cli.url).and_then(|api| api.with_key(cli.api_key.as_deref())) {
        Ok(api) => run(&api, &cli.command).await,
        Err(err) => Err(err),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}

async fn run(api: &Api, command: &Command) -> Result<(), CliError> {
    match command {
        Command::Batch(args) => job::batch(api, args).await.map(|s| {
            println!(
                "batch {} completed{}: {} output lines in {}, {} error lines in {}",
                s.batch_id,
                if s.resumed { " (resumed)" } else { "" },
                s.output_lines,
                s.output.display(),
                s.error_lines,
                s.errors.display()
            );
        }),
        Command::Cancel(args) => job::cancel(api, args).await.map(|b| {
            println!("batch {}: {}", b.id, b.status.as_str());
        }),
        Command::Usage(args) => api.usage(args.date.as_deref()).await.map(|usage| {
            println!("{usage}");
        }),
    }
}
