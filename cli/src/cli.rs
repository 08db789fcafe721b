//! Command-line arguments (clap derive; every flag also reads an environment variable).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::input::Format;

/// Bulk embedding jobs against an embatch gateway (OpenAI's Files + Batches API).
#[derive(Debug, Parser)]
#[command(name = "embatch", version, about)]
pub struct Cli {
    /// The gateway's base URL (the routes are under `/v1`).
    #[arg(
        long,
        env = "EMBATCH_URL",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    pub url: String,
    /// The API key of your tenant, sent as `Authorization: Bearer <key>`; needed when the
    /// gateway has a tenants file (it then shows each key only its tenant's files and batches).
    #[arg(long, env = "EMBATCH_API_KEY", global = true, hide_env_values = true)]
    pub api_key: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Submit FILE as a batch (or find the batch an earlier run submitted for it), show its
    /// progress, and write its results: the output lines to --output, the failed requests to
    /// --errors. Interrupt it at any time; the same command resumes.
    Batch(BatchArgs),
    /// Cancel the batch submitted for FILE; it still delivers what it finished (run `batch`
    /// again to fetch that).
    Cancel(InputArgs),
    /// Print your tenant's usage of one day (UTC) as JSON: requests, inputs, tokens, shed and
    /// failed, and the lines, inputs and tokens its bulk jobs embedded.
    Usage(UsageArgs),
}

/// `embatch usage`.
#[derive(Debug, Clone, Args)]
pub struct UsageArgs {
    /// The day, `YYYY-MM-DD` (UTC). Default: today.
    #[arg(long)]
    pub date: Option<String>,
}

/// What identifies a job: the input file and how it is read.
#[derive(Debug, Clone, Args)]
pub struct InputArgs {
    /// The input: OpenAI batch request lines (JSONL), or plain text with one input per line.
    pub file: PathBuf,
    /// How to read FILE: `auto` takes JSONL when the first non-empty line is a JSON object with a
    /// `custom_id`.
    #[arg(long, env = "EMBATCH_FORMAT", value_enum, default_value_t = Format::Auto)]
    pub format: Format,
    /// The `model` of requests made from plain text lines. Default: the gateway's `GET /info`
    /// `model_id`.
    #[arg(long, env = "EMBATCH_MODEL")]
    pub model: Option<String>,
    /// Plain text: consecutive lines per request (its `input` is then an array; the custom_id is
    /// `line-N` of its first line). More than 1 lets one file carry more inputs than the
    /// gateway's requests-per-file limit.
    #[arg(long, env = "EMBATCH_INPUTS_PER_REQUEST", default_value_t = 1)]
    pub inputs_per_request: usize,
}

/// `embatch batch`.
#[derive(Debug, Clone, Args)]
pub struct BatchArgs {
    /// The job's input.
    #[command(flatten)]
    pub input: InputArgs,
    /// Where the output lines go (`{"id", "custom_id", "response": {"status_code", "request_id",
    /// "body"}, "error": null}`, in the server's order).
    #[arg(short, long, env = "EMBATCH_OUTPUT")]
    pub output: PathBuf,
    /// Where the failed requests' lines go. Default: the output path with `.errors.jsonl`
    /// appended.
    #[arg(long, env = "EMBATCH_ERRORS")]
    pub errors: Option<PathBuf>,
    /// The batch's completion window: past it the batch expires and delivers what it finished.
    #[arg(long, env = "EMBATCH_COMPLETION_WINDOW", default_value = "24h")]
    pub completion_window: String,
    /// How often the batch is polled.
    #[arg(long, env = "EMBATCH_POLL_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub poll_interval: Duration,
    /// How long polling keeps retrying while the gateway is unreachable or answers 502/503/504
    /// (e.g. during a gateway restart) before giving up.
    #[arg(long, env = "EMBATCH_RETRY_FOR", default_value = "5m", value_parser = humantime::parse_duration)]
    pub retry_for: Duration,
    /// Submit a new batch even when one for this input exists.
    #[arg(long)]
    pub new: bool,
    /// No progress bar; one line per status change instead.
    #[arg(short, long)]
    pub quiet: bool,
}

impl BatchArgs {
    /// `--errors`, or `<output>.errors.jsonl`.
    pub fn errors_path(&self) -> PathBuf {
        self.errors.clone().unwrap_or_else(|| {
            let mut name = self.output.clone().into_os_string();
            name.push(".errors.jsonl");
            PathBuf::from(name)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_flags_parse_with_their_defaults() {
        let cli =
            Cli::try_parse_from(["embatch", "batch", "in.txt", "-o", "out.jsonl"]).expect("parses");
        let Command::Batch(args) = cli.command else {
            panic!("not batch")
        };
        assert_eq!(args.input.format, Format::Auto);
        assert_eq!(args.input.inputs_per_request, 1);
        assert_eq!(args.poll_interval, Duration::from_secs(1));
        assert_eq!(args.completion_window, "24h");
        assert_eq!(args.errors_path(), PathBuf::from("out.jsonl.errors.jsonl"));
    }

    #[test]
    fn the_url_flag_works_after_the_subcommand() {
        let cli = Cli::try_parse_from([
            "embatch",
            "cancel",
            "in.txt",
            "--url",
            "http://h:1",
            "--format",
            "text",
        ])
        .expect("parses");
        assert_eq!(cli.url, "http://h:1");
        let Command::Cancel(args) = cli.command else {
            panic!("not cancel")
        };
        assert_eq!(args.format, Format::Text);
    }

    #[test]
    fn output_is_required() {
        assert!(Cli::try_parse_from(["embatch", "batch", "in.txt"]).is_err());
    }
}
