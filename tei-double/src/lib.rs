//! A TEI-compatible HTTP server for embatch's tests and benchmarks: the one TEI double of the
//! workspace (testkit's tests and `embatch-loadtest fake-upstream` both run this).
//!
//! It is not a model. Each `POST /embed` call costs `base + per_input × inputs` of wall time
//! (a sleep, no CPU, accurate to well under a millisecond), plus `per_token` × its tokens (see
//! [`Config::cost_of`]), and at most `concurrency` calls are "computed" at once while the others
//! wait, as on one GPU running one batch at a time. So a caller that batches many inputs into one
//! call gets much more throughput than one that sends them one by one, which is what embatch's
//! batching is meant to exploit and what a benchmark against this server measures.
//! [`Config::default`] is that GPU-like upstream; [`Config::instant`] answers at once (for
//! functional tests); [`Config::padded_cpu`] is a padded upstream that runs a call's inputs
//! 4 by 4 in arrival order, each group padded to its longest input, as TEI's candle backend on
//! CPU does (it forces `max_batch_requests = 4`).
//!
//! Token counts are estimated, as the worker does without a tokenizer: one token per 4 bytes of
//! text (rounded up) plus 2, at most `max_input_length` (512; longer inputs are truncated, as
//! TEI's `auto_truncate` would); token ids count exactly.
//!
//! Replies are deterministic: the vector of a text is derived from a hash of the text only (see
//! [`embedding`]), so a test can check identity (same text → same vector, different texts →
//! different vectors) and order. Errors have TEI's shape (`{"error": "...", "error_type": "..."}`)
//! and codes:
//! - more inputs than `max_client_batch_size` → 422 `Validation` (as TEI 1.9.3);
//! - an input containing [`POISON`] → 422 `Validation` (for tests of poison isolation), or
//!   [`Faults::poison_status`] after the call's compute time (a model that fails on one input,
//!   as TEI's 424 `Backend`);
//! - an empty `inputs` array → 400 `Empty`; a malformed body → 422 `Validation`;
//! - `dimensions` of 0 or above the dimension → 422 `Validation`;
//! - [`Faults::fail_with`] set → every call gets that status (after [`Faults::delay`]).
//!
//! With [`Config::reranker`], `/info` announces a reranker and `POST /rerank` and `POST /predict`
//! score (query, text) pairs in TEI 1.9.3's shapes, deterministically and equally on both routes
//! (see the `rerank` module and [`rerank_score`]); without it `/rerank` answers 424 as TEI does.
//! With [`Config::classifier`], `/info` announces a classifier and `POST /predict` answers every
//! label of [`CLASSIFIER_LABELS`] ([`predictions`]); with neither, `/predict` answers 424.
//!
//! `POST /embed_all` answers one vector per token of each input ([`token_embeddings`]) for an
//! embedding model without SPLADE pooling, else 424 as TEI does (the `embed_all` module).
//!
//! With [`Config::splade`], `/info` announces an embedding model with SPLADE pooling and
//! `POST /embed_sparse` answers deterministic sparse embeddings ([`sparse_embedding`]) in TEI
//! 1.9.3's shape; without it that route answers 424 as TEI does (the `sparse` module).
//!
//! With [`Config::tokenizer`], `POST /tokenize` and `POST /decode` answer in TEI 1.9.3's shapes
//! with a made-up tokenizer (one token per word, [`tokenized`], [`decoded`]; the `tokenize`
//! module); without it they answer 404, as a server without those routes.
//!
//! Rejections cost nothing (TEI validates before queueing). Every parsed `/embed` call, rejected
//! or not, is recorded in a [`CallLog`] that tests can read (not by the `fake-upstream` command,
//! see [`app`]).
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use embatch_tei_double::{Config, TeiDouble};
//! let tei = TeiDouble::spawn(Config::instant()).await?;
//! // POST to tei.embed_url(), then:
//! let calls = tei.calls();
//! # Ok(()) }
//! ```

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, serve};
use embatch_protocol::{EmbedError, ErrorResponse, ErrorType, Input};

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// An input containing this string is rejected with 422 `Validation`.
pub const POISON: &str = "__poison__";

/// Configuration of the TEI double (fixed for its life; see [`Faults`] for what can change).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Fixed cost of each `/embed` call.
    pub base: Duration,
    /// Additional cost per input of a call.
    pub per_input: Duration,
    /// Additional cost per token of a call: per token (unpadded, the sum of the inputs' tokens)
    /// or, with `pad_group`, per padded token.
    pub per_token: Duration,
    /// `Some(n)`: padded: a call's inputs run `n` at a time in arrival order, each group padded
    /// to its longest input (`n × longest` tokens per group; TEI's candle CPU backend with
    /// `max_batch_requests = n`); `/info` then reports `model_dtype` `float32` and
    /// `max_batch_requests` `n`. `None`: unpadded (GPU-like, `model_dtype` `float16`).
    pub pad_group: Option<usize>,
    /// At most this many calls are computed at once (at least 1; 1 = one GPU).
    pub concurrency: usize,
    /// Embedding dimension (number of floats per vector).
    pub dim: usize,
    /// Largest number of inputs one call may hold; more → 422 (as TEI 1.9.3). Announced by `/info`.
    pub max_client_batch_size: usize,
    /// `model_id` announced by `/info`.
    pub model_id: String,
    /// A reranker: `/info`'s `model_type` is `reranker` and `/rerank` and `/predict` score
    /// pairs (see the `rerank` module); else `embedding`, and those routes answer 424 as TEI
    /// does. `/embed` answers either way.
    pub reranker: bool,
    /// A SPLADE model: `/info`'s `model_type` is `{"embedding": {"pooling": "splade"}}` and
    /// `/embed_sparse` answers (see the `sparse` module); else that route answers 424 as TEI
    /// does. Ignored with `reranker`.
    pub splade: bool,
    /// A sequence classifier with the labels [`CLASSIFIER_LABELS`]: `/info`'s `model_type` is
    /// `classifier` and `/predict` answers every label's score (the `predict` module); `/embed`
    /// still answers (the double does not refuse it). Ignored with `reranker`.
    pub classifier: bool,
    /// Serve `POST /tokenize` and `POST /decode` (the `tokenize` module), as TEI does. Off by
    /// default: a worker then finds no `/tokenize` and counts inputs, as the tests written
    /// before these routes expect, and the routes answer 404, as a server without them.
    pub tokenizer: bool,
}

impl Default for Config {
    /// 5 ms + 20 µs per input, one call at a time, 384 dimensions, at most 512 inputs per call.
    fn default() -> Self {
        Config {
            base: Duration::from_millis(5),
            per_input: Duration::from_micros(20),
            per_token: Duration::ZERO,
            pad_group: None,
            concurrency: 1,
            dim: 384,
            max_client_batch_size: 512,
            model_id: "embatch/tei-double".into(),
            reranker: false,
            splade: false,
            classifier: false,
            tokenizer: false,
        }
    }
}

impl Config {
    /// A double that answers at once (no cost), up to 1,024 calls at a time, with 8-dimensional
    /// vectors and TEI's default client batch size (512): for functional tests.
    pub fn instant() -> Config {
        Config {
            base: Duration::ZERO,
            per_input: Duration::ZERO,
            concurrency: 1024,
            dim: 8,
            ..Config::default()
        }
    }

    /// A padded CPU-like upstream: TEI's candle backend on CPU as measured with
    /// all-MiniLM-L6-v2 on a small machine, roughly: 1 ms per call, `per_token` per padded
    /// token, inputs run 4 by 4 in arrival order ([`Config::pad_group`]), one call at a time.
    pub fn padded_cpu(per_token: Duration) -> Config {
        Config {
            base: Duration::from_millis(1),
            per_input: Duration::ZERO,
            per_token,
            pad_group: Some(4),
            ..Config::default()
        }
    }

    /// The simulated compute time of one call of `inputs` inputs, without their tokens:
    /// `base + per_input × inputs`.
    pub fn cost(&self, inputs: usize) -> Duration {
        self.base + self.per_input * u32::try_from(inputs).unwrap_or(u32::MAX)
    }

    /// The simulated compute time of one call of `inputs`: [`Config::cost`] plus `per_token` ×
    /// [`Config::tokens`] of the call.
    pub fn cost_of(&self, inputs: &[Input]) -> Duration {
        let tokens = u32::try_from(self.tokens(inputs)).unwrap_or(u32::MAX);
        self.cost(inputs.len()) + self.per_token * tokens
    }

    /// The tokens a call of `inputs` costs: their sum, or with `pad_group`, the sum over groups
    /// of `pad_group` inputs in arrival order of `inputs in group × longest in group`.
    pub fn tokens(&self, inputs: &[Input]) -> u64 {
        let lengths: Vec<u64> = inputs.iter().map(|i| u64::from(tokens_of(i))).collect();
        match self.pad_group {
            None => lengths.iter().sum(),
            Some(group) => lengths
                .chunks(group.max(1))
                .map(|g| g.len() as u64 * g.iter().copied().max().unwrap_or(0))
                .sum(),
        }
    }
}

/// The double's input limit in tokens (`max_input_length` of its /info).
pub const MAX_INPUT_LENGTH: u32 = 512;

/// The estimated token count of `input`: a text counts one token per 4 bytes (rounded up) plus 2
/// (`[CLS]`, `[SEP]`), token ids count exactly, at most [`MAX_INPUT_LENGTH`].
pub fn tokens_of(input: &Input) -> u32 {
    let n = match input {
        Input::Text(text) => text.len().div_ceil(4) + 2,
        Input::Ids(ids) => ids.len(),
        Input::Pair(query, text) => (query.len() + text.len()).div_ceil(4) + 3,
    };
    u32::try_from(n).unwrap_or(u32::MAX).min(MAX_INPUT_LENGTH)
}

struct AppState {
    config: Config,
    faults: SharedFaults,
    gpu: Semaphore,
    /// `None` when nobody can read the log (the `fake-upstream` command): recording would only
    /// grow memory and cost CPU for as long as the server runs.
    calls: Option<CallLog>,
}

/// The TEI double's router: `POST /embed`, `GET /info`, `GET /health`, without faults. Calls are
/// not recorded: with nobody to read the log, recording would only grow memory and cost CPU for
/// as long as the server runs (use [`TeiDouble::spawn`] for a readable log).
pub fn app(config: Config) -> Router {
    router(&new_state(config, None, SharedFaults::default()))
}

fn new_state(config: Config, calls: Option<CallLog>, faults: SharedFaults) -> Arc<AppState> {
    Arc::new(AppState {
        gpu: Semaphore::new(config.concurrency.max(1)),
        faults,
        config,
        calls,
    })
}

fn router(state: &Arc<AppState>) -> Router {
    Router::new()
        .route("/embed", post(embed::embed))
        .route("/rerank", post(rerank::rerank))
        .route("/predict", post(predict::predict))
        .route("/embed_sparse", post(sparse::embed_sparse))
        .route("/embed_all", post(embed_all::embed_all))
        .route("/info", get(meta::info))
        .route("/health", get(meta::health))
        .merge(tokenize::routes(state.config.tokenizer))
        .merge(openai::routes())
        .with_state(Arc::clone(state))
}

/// Serves the TEI double on `listener` until `shutdown` completes.
///
/// # Errors
/// I/O errors of the server.
pub async fn serve_until(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_until_with(listener, config, SharedFaults::default(), shutdown).await
}

/// [`serve_until`] with faults the caller keeps a handle on: whatever it stores in `faults`
/// applies to the calls that arrive afterwards (calls already waiting keep theirs), e.g. a delay
/// for the first seconds of the server's life (`embatch-loadtest fake-upstream --slow-for`).
/// Calls are not recorded (as with [`app`]).
///
/// # Errors
/// I/O errors of the server.
pub async fn serve_until_with(
    listener: TcpListener,
    config: Config,
    faults: SharedFaults,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve(listener, router(&new_state(config, None, faults)))
        .with_graceful_shutdown(shutdown)
        .await
}

/// A TEI double running in the background on a free loopback port, for tests and benchmarks.
/// Stops when dropped.
pub struct TeiDouble {
    /// The bound address.
    pub addr: SocketAddr,
    /// `http://127.0.0.1:PORT`: TEI's base URL, what a worker's `--tei-url` takes.
    pub url: String,
    /// The call log (shared with the server).
    pub calls: CallLog,
    state: Arc<AppState>,
    task: JoinHandle<()>,
}

impl TeiDouble {
    /// Binds `127.0.0.1:0` and serves in a background task.
    ///
    /// # Errors
    /// When the port cannot be bound.
    pub async fn spawn(config: Config) -> std::io::Result<TeiDouble> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let calls = CallLog::default();
        let state = new_state(config, Some(calls.clone()), SharedFaults::default());
        let router = router(&state);
        let task = tokio::spawn(async move {
            if let Err(err) = serve(listener, router).await {
                tracing::warn!(%err, "TEI double stopped");
            }
        });
        Ok(TeiDouble {
            addr,
            url: format!("http://{addr}"),
            calls,
            state,
            task,
        })
    }

    /// A copy of the `/embed` calls so far, in arrival order.
    pub fn calls(&self) -> Vec<RecordedCall> {
        self.calls.snapshot()
    }

    /// Changes the faults of later calls (calls already waiting keep theirs).
    pub fn set_faults(&self, faults: Faults) {
        *self.state.faults.lock().unwrap_or_else(|e| e.into_inner()) = faults;
    }

    /// `http://127.0.0.1:PORT/embed`.
    pub fn embed_url(&self) -> String {
        format!("http://{}/embed", self.addr)
    }
}

impl Drop for TeiDouble {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How much of a simulated call is left to a blocking `thread::sleep` rather than tokio's timer.
const FINE_SLEEP: Duration = Duration::from_millis(2);

/// Waits `d` with sub-millisecond accuracy. Tokio's timer rounds deadlines up to whole
/// milliseconds, which would add ~0.5–1 ms to every simulated call (20% of the default 5 ms) and
/// flatter batching; so the coarse part is a tokio sleep and the last ≤ 2 ms a `thread::sleep` on
/// the blocking pool (accurate to tens of µs on Linux, no busy-waiting).
async fn precise_sleep(d: Duration) {
    if d.is_zero() {
        return;
    }
    let deadline = Instant::now() + d;
    if d > FINE_SLEEP {
        tokio::time::sleep(d - FINE_SLEEP).await;
    }
    let rest = deadline.saturating_duration_since(Instant::now());
    if !rest.is_zero() {
        // A join error would mean the sleep panicked; the time has passed either way.
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(rest)).await;
    }
}

fn error_response(err: &EmbedError) -> Response {
    let status = StatusCode::from_u16(err.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(err.to_response())).into_response()
}

/// What a TEI would answer with `status`: TEI's error body, `error_type` as TEI gives for it.
fn injected_failure(status: u16) -> Response {
    failure(status, format!("injected failure ({status})"))
}

/// `status` with TEI's error body of `error`, `error_type` as TEI gives for the status.
fn failure(status: u16, error: String) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = ErrorResponse {
        error,
        error_type: ErrorType::for_status(status),
    };
    (code, Json(body)).into_response()
}

/// The index of the first input containing [`POISON`].
fn poisoned(inputs: &[Input]) -> Option<usize> {
    inputs
        .iter()
        .position(|input| input.as_text().is_some_and(|t| t.contains(POISON)))
}

mod calls;
mod embed;
mod embed_all;
mod meta;
mod openai;
mod predict;
mod rerank;
mod sparse;
mod tokenize;
mod vectors;
pub use calls::{CallLog, Faults, RecordedCall, SharedFaults};
pub use embed_all::token_embeddings;
pub use predict::{CLASSIFIER_LABELS, RERANKER_LABEL, predictions};
pub use sparse::{SPARSE_VOCAB, sparse_embedding};
pub use tokenize::{decoded, tokens_of as tokenized, word_id};
pub use vectors::{embedding, embedding_of, logit, rerank_score};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_classify;
