//! Command-line arguments (clap derive) and their validation into a [`RunConfig`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::LoadtestError;
use crate::load::{Plan, Stop};
use crate::route::Route;
use embatch_tei_double::Config as TeiDoubleConfig;

/// Load generator and GPU-like upstream simulator for embatch benchmarks.
#[derive(Debug, Parser)]
#[command(name = "embatch-loadtest", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate load against a TEI-compatible /embed URL or the embatch NATS subject and print
    /// throughput, goodput and latency percentiles.
    Run(Box<RunArgs>),
    /// Serve a TEI-compatible /embed that simulates one GPU (a benchmark instrument and test
    /// double): each call sleeps base + per-input cost, at most --concurrency calls at once, and
    /// answers deterministic vectors derived from a hash of each input text.
    FakeUpstream(FakeUpstreamArgs),
    /// Answer embed requests on a NATS subject by POSTing each, unbatched, to a TEI-compatible
    /// upstream and publishing its body to the reply inbox: the least a NATS-to-TEI bridge does
    /// (a benchmark reference, not a worker: no validation, admission or deadlines).
    NatsRelay(NatsRelayArgs),
}

/// `embatch-loadtest nats-relay`.
#[derive(Debug, Clone, Args)]
pub struct NatsRelayArgs {
    /// NATS server URL(s), comma-separated.
    #[arg(long)]
    pub nats: String,

    /// Subject to answer on (the workers' EMBATCH_SUBJECT).
    #[arg(long, env = "EMBATCH_SUBJECT", default_value = embatch_protocol::DEFAULT_SUBJECT)]
    pub subject: String,

    /// The upstream's base URL (its `/embed` is called), e.g. http://127.0.0.1:8081.
    #[arg(long)]
    pub upstream: String,
}

/// `embatch-loadtest run`.
#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["url", "nats"])))]
pub struct RunArgs {
    /// Target: a TEI-compatible /embed URL (gateway, TEI or fake upstream), e.g.
    /// http://127.0.0.1:8080/embed, or the URL of --route's route. Plain http only.
    #[arg(long)]
    pub url: Option<String>,

    /// Target: NATS server URL(s), e.g. nats://127.0.0.1:4222 (comma-separated for a cluster;
    /// credentials in the URL are never logged); requests go to --subject.
    #[arg(long)]
    pub nats: Option<String>,

    /// NATS credentials and TLS (with --nats), as the gateway and the worker take them.
    #[command(flatten)]
    pub nats_auth: embatch_runtime::NatsAuth,

    /// NATS subject of the embed requests (with --nats).
    #[arg(long, env = "EMBATCH_SUBJECT", default_value = embatch_protocol::DEFAULT_SUBJECT)]
    pub subject: String,

    /// The model to ask for, by its name (as the gateway's `GET /v1/models` lists it): with
    /// --url sent as the `Embatch-Model` header (the gateway routes the request to that model's
    /// workers; TEI and the fake upstream ignore the header); with --nats the requests go to the
    /// model subject `<subject>.<token>` (`embatch_protocol::model::model_subject`). Unset: the
    /// default model.
    #[arg(long)]
    pub model: Option<String>,

    /// With --url: a tenant's API key, sent as `Authorization: Bearer <key>` (a gateway with a
    /// tenants file needs one; docs/tenants.md). Never printed.
    #[arg(
        long,
        env = "EMBATCH_API_KEY",
        hide_env_values = true,
        requires = "url"
    )]
    pub api_key: Option<String>,

    /// With --nats: the tenant to send as the `Embatch-Tenant` header (a worker takes it from
    /// its own NATS account; docs/tenants.md). Unset: no header (the tenant `default`).
    #[arg(long, requires = "nats")]
    pub tenant: Option<String>,

    /// Closed loop: this many workers, each sending its next request when the previous one
    /// completed (default 1 when --rate is not given).
    #[arg(long, short = 'c', conflicts_with = "rate")]
    pub concurrency: Option<usize>,

    /// Open loop: this many requests per second at a constant arrival rate, whatever the
    /// responses; latency is measured from each request's scheduled send time.
    #[arg(long, short = 'r')]
    pub rate: Option<f64>,

    /// Open loop: at most this many requests in flight; a due request beyond it is not sent and
    /// counted as a `not_sent` failure.
    #[arg(long, default_value_t = 10_000)]
    pub max_in_flight: usize,

    /// How long to measure after the warm-up, e.g. 10s, 1m (default 10s unless --requests).
    #[arg(long, short = 'd', value_parser = humantime::parse_duration, conflicts_with = "requests")]
    pub duration: Option<Duration>,

    /// Measure exactly this many requests after the warm-up instead of a duration.
    #[arg(long, short = 'n')]
    pub requests: Option<u64>,

    /// Send load for this long first without measuring it, e.g. 2s.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub warmup: Duration,

    /// Per-request timeout, e.g. 2s (HTTP: the whole request; NATS: the reply timeout and the
    /// Embatch-Deadline-Ms budget). Successes slower than this do not count as goodput.
    #[arg(long, short = 't', value_parser = humantime::parse_duration, default_value = "2s")]
    pub timeout: Duration,

    /// File of input texts, one per line (empty lines skipped), sampled uniformly.
    #[arg(long)]
    pub corpus: Option<PathBuf>,

    /// Without --corpus: words per generated sentence.
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u16).range(1..))]
    pub words: u16,

    /// Draw the texts from this many distinct generated sentences by a Zipf law (the one of
    /// rank k with probability ∝ 1/k^s, see --zipf-s) instead of --corpus or fresh sentences:
    /// repeated traffic for the workers' cache. The report then counts the distinct texts
    /// sent.
    #[arg(long, conflicts_with = "corpus")]
    pub zipf_unique: Option<u32>,

    /// The Zipf exponent s of --zipf-unique.
    #[arg(long, default_value_t = 1.1)]
    pub zipf_s: f64,

    /// Texts per request (1 sends `"inputs": "text"`, more an array).
    #[arg(long, short = 'k', default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub inputs_per_request: u32,

    /// The TEI route the bodies are shaped for; --url must name the same route (e.g.
    /// http://127.0.0.1:8080/rerank). `rerank` sends one query and --inputs-per-request texts
    /// (that many pairs, counted as the inputs); every reply must hold one element per input.
    #[arg(long, value_enum, default_value_t = Route::Embed)]
    pub route: Route,

    /// Seed of the input sampling.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,

    /// Send `"truncate": true` in every body: an input longer than the model's limit is cut to
    /// it instead of rejected (for corpora with over-long inputs).
    #[arg(long)]
    pub truncate: bool,

    /// Also write the report as JSON to this file (`-` for stdout; the human summary then goes
    /// to stderr).
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// No progress bar (it is also hidden when stderr is not a terminal).
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

/// The load model of a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LoadModel {
    /// `--concurrency` workers.
    Closed {
        /// Number of workers.
        concurrency: usize,
    },
    /// `--rate` requests per second.
    Open {
        /// Arrival rate, requests per second.
        rate: f64,
        /// In-flight cap.
        max_in_flight: usize,
    },
}

/// Where the load goes.
#[derive(Debug, Clone, PartialEq)]
pub enum TargetSpec {
    /// `--url` (and `--model`).
    Http {
        /// The /embed URL.
        url: String,
        /// `--model`: the `Embatch-Model` header's value; `None` sends no header.
        model: Option<String>,
        /// `--api-key`: sent as `Authorization: Bearer`; `None` sends no header.
        api_key: Option<embatch_runtime::Secret>,
    },
    /// `--nats`, `--subject` and the NATS credentials.
    Nats {
        /// The NATS server URL(s).
        url: String,
        /// The subject.
        subject: String,
        /// Credentials and TLS.
        auth: Box<embatch_runtime::NatsAuth>,
        /// `--tenant`: the `Embatch-Tenant` header's value; `None` sends none.
        tenant: Option<String>,
    },
}

/// A validated `run` configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct RunConfig {
    /// The target.
    pub target: TargetSpec,
    /// The load model.
    pub load: LoadModel,
    /// Warm-up and stop condition.
    pub plan: Plan,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Corpus file; `None` for generated sentences.
    pub corpus: Option<PathBuf>,
    /// Words per generated sentence.
    pub words: usize,
    /// `--zipf-unique` and `--zipf-s`: distinct texts and the exponent.
    pub zipf: Option<(usize, f64)>,
    /// Texts per request (>= 1).
    pub inputs_per_request: usize,
    /// The route the bodies are shaped for.
    pub route: Route,
    /// RNG seed.
    pub seed: u64,
    /// Ask for `"truncate": true`.
    pub truncate: bool,
    /// JSON report destination (`-` = stdout).
    pub json: Option<PathBuf>,
    /// Hide the progress bar.
    pub quiet: bool,
}

impl RunArgs {
    /// Validates the arguments.
    ///
    /// # Errors
    /// [`LoadtestError::Config`] for a zero concurrency, a non-positive rate, a zero timeout,
    /// zero `--requests`, or a `--model` with --nats that cannot be served (empty, or a
    /// reserved token).
    pub fn into_config(self) -> Result<RunConfig, LoadtestError> {
        let target = match (self.url, self.nats) {
            (Some(url), None) => TargetSpec::Http {
                url,
                model: self.model,
                api_key: self.api_key.map(embatch_runtime::Secret::from),
            },
            (None, Some(url)) => TargetSpec::Nats {
                url,
                subject: match &self.model {
                    Some(model) => {
                        embatch_protocol::model::check_name(model)
                            .map_err(|e| LoadtestError::Config(format!("--model: {e}")))?;
                        embatch_protocol::model::model_subject(&self.subject, model)
                    }
                    None => self.subject,
                },
                auth: Box::new(self.nats_auth),
                tenant: self.tenant,
            },
            _ => {
                return Err(LoadtestError::Config(
                    "give exactly one of --url and --nats".into(),
                ));
            }
        };
        let load = load_model(self.rate, self.concurrency, self.max_in_flight)?;
        let stop = match (self.requests, self.duration) {
            (Some(0), _) => {
                return Err(LoadtestError::Config(
                    "--requests must be at least 1".into(),
                ));
            }
            (Some(n), _) => Stop::Requests(n),
            (None, d) => Stop::Duration(d.unwrap_or(Duration::from_secs(10))),
        };
        if self.timeout.is_zero() {
            return Err(LoadtestError::Config("--timeout must be positive".into()));
        }
        if self.zipf_unique == Some(0) || !(self.zipf_s.is_finite() && self.zipf_s > 0.0) {
            return Err(LoadtestError::Config(
                "--zipf-unique must be at least 1 and --zipf-s positive".into(),
            ));
        }
        Ok(RunConfig {
            target,
            load,
            plan: Plan {
                warmup: self.warmup,
                stop,
            },
            timeout: self.timeout,
            corpus: self.corpus,
            words: usize::from(self.words),
            zipf: self.zipf_unique.map(|n| (n as usize, self.zipf_s)),
            inputs_per_request: self.inputs_per_request as usize,
            route: self.route,
            seed: self.seed,
            truncate: self.truncate,
            json: self.json,
            quiet: self.quiet,
        })
    }
}

/// The load: an open loop at `rate` requests/s with at most `max_in_flight` outstanding, else a
/// closed loop of `concurrency` (1 by default).
///
/// # Errors
/// [`LoadtestError::Config`] for a non-positive rate, `max_in_flight` 0 or concurrency 0.
fn load_model(
    rate: Option<f64>,
    concurrency: Option<usize>,
    max_in_flight: usize,
) -> Result<LoadModel, LoadtestError> {
    if let Some(rate) = rate {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(LoadtestError::Config(format!(
                "--rate must be a positive number of requests per second, got {rate}"
            )));
        }
        if max_in_flight == 0 {
            return Err(LoadtestError::Config(
                "--max-in-flight must be at least 1".into(),
            ));
        }
        return Ok(LoadModel::Open {
            rate,
            max_in_flight,
        });
    }
    let concurrency = concurrency.unwrap_or(1);
    if concurrency == 0 {
        return Err(LoadtestError::Config(
            "--concurrency must be at least 1".into(),
        ));
    }
    Ok(LoadModel::Closed { concurrency })
}

/// `embatch-loadtest fake-upstream`.
#[derive(Debug, Clone, Args)]
pub struct FakeUpstreamArgs {
    /// Address to listen on; port 0 picks a free port. The bound address is printed on stdout as
    /// the first line: `listening on 127.0.0.1:PORT`.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,

    /// Fixed cost of each /embed call, milliseconds.
    #[arg(long, default_value_t = 5)]
    pub base_ms: u64,

    /// Additional cost per input of a call, microseconds.
    #[arg(long, default_value_t = 20)]
    pub per_input_us: u64,

    /// Additional cost per token of a call, microseconds (fractions allowed): per token of the
    /// inputs (unpadded), or with --pad-group per padded token. Tokens are estimated from the
    /// text: 1 per 4 bytes + 2, at most 512.
    #[arg(long, default_value_t = 0.0)]
    pub per_token_us: f64,

    /// Padded: run a call's inputs this many at a time in arrival order, each group padded to
    /// its longest input (TEI's candle CPU backend: 4); /info then reports model_dtype float32.
    /// Unset: unpadded (GPU-like; /info reports float16).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub pad_group: Option<u32>,

    /// At most this many /embed calls are computed at once; others wait (1 = one GPU).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency: u32,

    /// Embedding dimension.
    #[arg(long, default_value_t = 384, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub dim: u32,

    /// Largest number of inputs one call may hold (413 above it), as TEI's
    /// --max-client-batch-size; announced by /info.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_client_batch_size: u32,

    /// For this long after start (e.g. 10s), every /embed call that arrives is delayed by
    /// --slow-delay on top of its cost (outside the concurrency limit: a stalled upstream, not a
    /// busy GPU); calls arriving later are not. A call that arrived before the switch keeps its
    /// delay. The server prints `slow until unix_ms=<ms>` after `listening on` and
    /// `fast since unix_ms=<ms>` at the switch (Unix epoch milliseconds).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub slow_for: Duration,

    /// The extra delay of each call during --slow-for, e.g. 4s.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub slow_delay: Duration,

    /// Serve as a reranker: /info's model_type is `reranker`, and /rerank and /predict score
    /// (query, text) pairs (deterministic scores, equal on both routes).
    #[arg(long)]
    pub reranker: bool,

    /// Serve as a SPLADE model: /info's model_type is an embedding model with `splade` pooling,
    /// and /embed_sparse answers deterministic sparse embeddings (the sparse benchmark).
    #[arg(long)]
    pub splade: bool,

    /// Serve as a sequence classifier (labels negative, neutral, positive): /info's model_type
    /// is `classifier`, and /predict answers every label's score of texts and pairs.
    #[arg(long)]
    pub classifier: bool,

    /// Serve TEI's /tokenize and /decode (a made-up tokenizer, one token per word). A worker
    /// then counts tokens with /tokenize, one extra call per request.
    #[arg(long)]
    pub tokenizer: bool,
}

impl FakeUpstreamArgs {
    /// The server configuration.
    pub fn config(&self) -> TeiDoubleConfig {
        TeiDoubleConfig {
            base: Duration::from_millis(self.base_ms),
            per_input: Duration::from_micros(self.per_input_us),
            per_token: Duration::from_secs_f64(self.per_token_us.max(0.0) / 1e6),
            pad_group: self.pad_group.map(|n| n as usize),
            concurrency: self.concurrency as usize,
            dim: self.dim as usize,
            max_client_batch_size: self.max_client_batch_size as usize,
            reranker: self.reranker,
            splade: self.splade,
            classifier: self.classifier,
            tokenizer: self.tokenizer,
            ..TeiDoubleConfig::default()
        }
    }

    /// The slow start: `Some((how long, extra delay per call))` when both `--slow-for` and
    /// `--slow-delay` are positive, `None` otherwise.
    pub fn slow_start(&self) -> Option<(Duration, Duration)> {
        (!self.slow_for.is_zero() && !self.slow_delay.is_zero())
            .then_some((self.slow_for, self.slow_delay))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("embatch-loadtest").chain(args.iter().copied()))
    }

    fn run_config(args: &[&str]) -> RunConfig {
        match parse(args).expect("parses").command {
            Command::Run(run) => run.into_config().expect("valid"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn defaults_to_one_closed_loop_worker_for_ten_seconds() {
        let c = run_config(&["run", "--url", "http://127.0.0.1:1/embed"]);
        assert_eq!(c.load, LoadModel::Closed { concurrency: 1 });
        assert_eq!(c.plan.stop, Stop::Duration(Duration::from_secs(10)));
        assert_eq!(c.route, Route::Embed);
        assert_eq!(c.timeout, Duration::from_secs(2));
        assert_eq!(c.inputs_per_request, 1);
    }

    #[test]
    fn open_loop_with_nats() {
        let c = run_config(&[
            "run",
            "--nats",
            "nats://127.0.0.1:4222",
            "--subject",
            "emb",
            "--rate",
            "150",
            "--requests",
            "300",
            "--warmup",
            "2s",
            "-k",
            "4",
        ]);
        assert_eq!(
            c.target,
            TargetSpec::Nats {
                url: "nats://127.0.0.1:4222".into(),
                auth: Box::default(),
                subject: "emb".into(),
                tenant: None,
            }
        );
        assert_eq!(
            c.load,
            LoadModel::Open {
                rate: 150.0,
                max_in_flight: 10_000
            }
        );
        assert_eq!(c.plan.stop, Stop::Requests(300));
        assert_eq!(c.plan.warmup, Duration::from_secs(2));
        assert_eq!(c.inputs_per_request, 4);
        let rerank = run_config(&["run", "--url", "http://h/rerank", "--route", "rerank"]);
        assert_eq!(rerank.route, Route::Rerank);
        let sparse = run_config(&["run", "--url", "http://h/x", "--route", "embed-sparse"]);
        assert_eq!(sparse.route, Route::EmbedSparse);
    }

    #[test]
    fn model_is_a_header_over_http_and_a_model_subject_over_nats() {
        let c = run_config(&[
            "run",
            "--url",
            "http://127.0.0.1:1/embed",
            "--model",
            "BAAI/bge-small-en-v1.5",
        ]);
        assert_eq!(
            c.target,
            TargetSpec::Http {
                url: "http://127.0.0.1:1/embed".into(),
                model: Some("BAAI/bge-small-en-v1.5".into()),
                api_key: None,
            }
        );
        let c = run_config(&[
            "run",
            "--nats",
            "nats://127.0.0.1:4222",
            "--model",
            "BAAI/bge-small-en-v1.5",
        ]);
        let TargetSpec::Nats { subject, .. } = c.target else {
            panic!("{:?}", c.target);
        };
        assert_eq!(subject, "embed.BAAI/bge-small-en-v1%2E5");
        let Command::Run(run) = parse(&["run", "--nats", "nats://x", "--model", "info"])
            .expect("parses")
            .command
        else {
            panic!("not run");
        };
        assert!(
            matches!(run.into_config(), Err(LoadtestError::Config(_))),
            "a reserved model token is refused"
        );
    }

    #[test]
    fn rejects_contradictions_and_nonsense() {
        assert!(parse(&["run"]).is_err(), "a target is required");
        assert!(parse(&["run", "--url", "http://x/embed", "--nats", "nats://x"]).is_err());
        assert!(parse(&["run", "--url", "http://x/embed", "-c", "2", "-r", "5"]).is_err());
        assert!(parse(&["run", "--url", "http://x/embed", "-d", "1s", "-n", "5"]).is_err());
        assert!(parse(&["run", "--url", "http://x/embed", "-d", "soon"]).is_err());
        for bad in [["-r", "0"], ["-r", "nan"], ["-c", "0"], ["-n", "0"]] {
            let Command::Run(args) = parse(&["run", "--url", "http://x/embed", bad[0], bad[1]])
                .expect("parses")
                .command
            else {
                panic!("run");
            };
            assert!(args.into_config().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn fake_upstream_args() {
        let Command::FakeUpstream(args) = parse(&[
            "fake-upstream",
            "--base-ms",
            "2",
            "--per-input-us",
            "7",
            "--dim",
            "8",
        ])
        .expect("parses")
        .command
        else {
            panic!("fake-upstream");
        };
        let config = args.config();
        assert_eq!(config.base, Duration::from_millis(2));
        assert_eq!(config.per_input, Duration::from_micros(7));
        assert_eq!(config.dim, 8);
        assert_eq!(config.concurrency, 1);
        assert_eq!(config.max_client_batch_size, 512);
        assert_eq!(args.listen.port(), 0);
        assert_eq!(args.slow_start(), None);
    }

    #[test]
    fn fake_upstream_slow_start() {
        let slow = |extra: &[&str]| {
            let argv: Vec<&str> = std::iter::once("fake-upstream")
                .chain(extra.iter().copied())
                .collect();
            match parse(&argv).expect("parses").command {
                Command::FakeUpstream(args) => args.slow_start(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            slow(&["--slow-for", "10s", "--slow-delay", "4s"]),
            Some((Duration::from_secs(10), Duration::from_secs(4)))
        );
        assert_eq!(slow(&["--slow-for", "10s"]), None, "no delay: not slow");
        assert_eq!(slow(&["--slow-delay", "4s"]), None, "for no time: not slow");
        assert!(parse(&["fake-upstream", "--slow-for", "soon"]).is_err());
    }
}
