//! embatch-loadtest: a load generator for TEI-compatible `POST /embed` endpoints and the embatch
//! NATS subject, plus a GPU-like fake upstream for benchmarks and tests.
//!
//! # Layout
//! - [`cli`]: command-line arguments (clap) and their validation into a [`cli::RunConfig`].
//! - [`corpus`]: input texts (a file or a seeded sentence generator) and request bodies.
//! - [`route`]: the TEI route the bodies are shaped for (`--route`).
//! - [`targets`]: where requests go: HTTP (`--url`) or NATS request-reply (`--nats`).
//! - [`load`]: the load models: closed loop (`--concurrency`) and open loop (`--rate`).
//! - [`stats`]: outcome classification, latency histograms and counters.
//! - [`report`]: the run's summary, human-readable and JSON.
//! - [`progress`]: the progress bar shown while running.
//! - [`run`]: ties the above together for `embatch-loadtest run`.
//! - [`relay`]: `embatch-loadtest nats-relay`, a bare NATS-to-TEI bridge (the benchmarks'
//!   reference for what the NATS hops alone cost).
//!
//! `embatch-loadtest fake-upstream` serves [`embatch_tei_double`], the workspace's one TEI double
//! (a GPU-like cost model).

pub mod cli;
pub mod corpus;
pub mod load;
pub mod progress;
pub mod relay;
pub mod report;
pub mod route;
pub mod run;
pub mod stats;
pub mod targets;

/// Errors that stop a run before or while it starts (bad configuration, unreachable NATS).
/// Per-request failures are never errors: they are counted in [`stats::Stats`].
#[derive(Debug, thiserror::Error)]
pub enum LoadtestError {
    /// An argument has an invalid value or arguments contradict each other.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The corpus file could not be read.
    #[error("cannot read corpus {path}: {source}")]
    Corpus {
        /// The corpus path as given.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The HTTP client could not be built.
    #[error("cannot build HTTP client: {0}")]
    Http(#[from] reqwest::Error),
    /// `--nats` is not a list of NATS server URLs.
    #[error("--nats: {0}")]
    NatsUrl(embatch_client::ServerListError),
    /// The initial connection to NATS failed (the message names the servers, redacted).
    #[error(transparent)]
    NatsConnect(#[from] embatch_runtime::NatsError),
    /// Writing the report failed.
    #[error("cannot write report to {path}: {source}")]
    Output {
        /// The output path as given.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
}
