//! Token counts of a request's inputs, computed before the request reaches the batcher.
//!
//! [`Counter::count`] gives, for each input, the number of tokens the model will see: special
//! tokens included, after the prompt is prepended and after truncation, exactly as TEI 1.9.3
//! tokenizes (the built-in model's own [`Encoder`], or the same code over the tokenizer of the
//! model a TEI server names). Those counts are what the batcher's token budget, the reply's
//! [`headers::TOKENS`](embatch_protocol::headers::TOKENS) header and the OpenAI route's `usage`
//! are made of. An input over the model's limit is refused here with `truncate: false` (422,
//! TEI's message), so it never reaches the upstream and never fails its batch-mates.
//!
//! Where the counts come from ([`Source`], logged once at start):
//! - the built-in model: its own tokenizer;
//! - TEI: the `tokenizer.json` named by `--tokenizer` (`TOKENIZER`), else the one of the
//!   `model_id` TEI's `/info` names, from the Hugging Face cache (filled from the hub when it can
//!   be reached; `HF_HUB_OFFLINE=1` reads the cache alone), else TEI's own `POST /tokenize`
//!   (one extra call per request), else none: each input counts as 1, the request's input
//!   count (what batching by inputs assumes), and replies carry no token count.
//!
//! Tokenizing is CPU work of a few µs to a few hundred µs per input (`docs/design/tokenizer.md`):
//! it runs on tokio's blocking pool, at most one task per CPU at a time, from the task that
//! answers the request, never in the intake loop.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use embatch_local_model::Encoder;
use embatch_local_model::model::truncation;
use embatch_protocol::{EmbedError, EmbedOptions, Input, TruncationDirection};
use serde::Deserialize;
use tokio::sync::Semaphore;

/// Where a [`Counter`]'s counts come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A `tokenizer.json` (the built-in model's, or the TEI model's from a path or the Hugging
    /// Face cache): real token counts, computed in the worker.
    Tokenizer(String),
    /// TEI's `POST /tokenize`: real token counts, one extra upstream call per request.
    TeiTokenize,
    /// No tokenizer: every input counts as 1 token (the input count), and no count is reported.
    Inputs,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Tokenizer(origin) => write!(f, "tokenizer {origin}"),
            Source::TeiTokenize => f.write_str("TEI POST /tokenize"),
            Source::Inputs => f.write_str("none (counting inputs)"),
        }
    }
}

/// A request's inputs and options with the token count of each input, ready for the batcher.
#[derive(Debug, Clone)]
pub struct Counted {
    /// The inputs, as received.
    pub inputs: Vec<Input>,
    /// The request's options (its batching key).
    pub options: EmbedOptions,
    /// Tokens per input, in input order: special tokens included, after truncation (each at
    /// most the model's `max_input_length`). With [`Source::Inputs`] (or when TEI's `/tokenize`
    /// failed), 1 per input.
    pub lengths: Vec<u32>,
    /// Whether `lengths` are tokens, not the 1 per input of a count without a tokenizer.
    exact: bool,
}

impl Counted {
    /// The request's tokens (the sum of [`Counted::lengths`]); `None` when inputs were counted,
    /// not tokens (no tokenizer, or TEI's `/tokenize` failed): never an estimate.
    pub fn tokens(&self) -> Option<u64> {
        self.exact
            .then(|| self.lengths.iter().map(|&n| u64::from(n)).sum())
    }
}

/// Counts tokens per input (see the module docs). Cheap to clone: clones share the tokenizer
/// and the bound on concurrent tokenizations.
#[derive(Clone)]
pub struct Counter {
    kind: Arc<Kind>,
    /// At most one tokenization per CPU at a time on the blocking pool.
    slots: Arc<Semaphore>,
    /// Inputs accepted for counting and not yet handed to the batcher, and their bound.
    pending: Arc<Pending>,
    /// At most [`LARGE_TOKENIZATIONS`] requests of more than [`LARGE_REQUEST_BYTES`] are
    /// tokenized at a time (their transient memory is tens of bytes per character).
    large: Arc<Semaphore>,
}

/// A request holding more bytes of text than this (64 KiB) is tokenized under the bound of
/// [`LARGE_TOKENIZATIONS`] as well as the one per CPU.
pub const LARGE_REQUEST_BYTES: usize = 64 << 10;

/// Most requests of more than [`LARGE_REQUEST_BYTES`] tokenized at a time: 2 (or the CPUs, when
/// fewer). A text the model refuses when too long (`truncate: false`) is tokenized whole up to
/// TEI's character limit (`max_input_length` × 250 characters), and the tokenizer's transient
/// memory is ~100 bytes per character of it (`docs/design/tokenizer.md`).
pub const LARGE_TOKENIZATIONS: usize = 2;

/// The inputs waiting to be counted: bounded like the batcher's queue (`QUEUE_CAP` inputs and
/// `MAX_QUEUE_BYTES` bytes), so that requests arriving faster than they can be tokenized are
/// shed with 429 instead of piling up in memory ahead of the batcher's own bounds.
struct Pending {
    inputs: AtomicUsize,
    limit: AtomicUsize,
    /// Bytes of input held by the waiting requests (`Input::size_bytes`).
    bytes: AtomicUsize,
    /// Most bytes of input waiting (`MAX_QUEUE_BYTES`).
    bytes_limit: AtomicUsize,
}

/// A reservation of inputs and bytes in [`Counter`]'s pending bound ([`Counter::reserve`]),
/// released when dropped (once the request is submitted or answered).
pub struct Reservation {
    pending: Arc<Pending>,
    inputs: usize,
    bytes: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.pending
            .inputs
            .fetch_sub(self.inputs, Ordering::Relaxed);
        self.pending.bytes.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

enum Kind {
    Tokenizer {
        encoder: Arc<Encoder>,
        origin: String,
        /// What an absent `truncate` means (TEI's `auto_truncate`).
        auto_truncate: bool,
        /// Refuse an unknown `prompt_name` (the built-in model, whose prompts are all known);
        /// for TEI it is counted without the prompt and TEI answers it.
        strict_prompts: bool,
    },
    Tei(TeiTokenize),
    Inputs,
}

impl Counter {
    /// Counts with `encoder` (its limit and prompts), from `origin` (a path or a model id, for
    /// the log). `auto_truncate`: whether an absent `truncate` truncates (TEI's `auto_truncate`,
    /// `true` by default). `strict_prompts`: refuse an unknown `prompt_name` (422) rather than
    /// count without it.
    pub fn tokenizer(
        encoder: Arc<Encoder>,
        origin: impl Into<String>,
        auto_truncate: bool,
        strict_prompts: bool,
    ) -> Counter {
        Counter::new(Kind::Tokenizer {
            encoder,
            origin: origin.into(),
            auto_truncate,
            strict_prompts,
        })
    }

    /// Counts with TEI's `POST /tokenize` at `base_url`, for a model of `max_input_length`
    /// tokens, on `client`.
    pub fn tei_tokenize(
        client: reqwest::Client,
        base_url: &str,
        max_input_length: usize,
        auto_truncate: bool,
    ) -> Counter {
        Counter::new(Kind::Tei(TeiTokenize {
            client,
            url: format!("{}/tokenize", base_url.trim_end_matches('/')),
            max_input_length,
            auto_truncate,
        }))
    }

    /// No tokenizer: every input counts as 1.
    pub fn inputs() -> Counter {
        Counter::new(Kind::Inputs)
    }

    fn new(kind: Kind) -> Counter {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Counter {
            kind: Arc::new(kind),
            slots: Arc::new(Semaphore::new(cpus)),
            pending: Arc::new(Pending {
                inputs: AtomicUsize::new(0),
                limit: AtomicUsize::new(usize::MAX),
                bytes: AtomicUsize::new(0),
                bytes_limit: AtomicUsize::new(usize::MAX),
            }),
            large: Arc::new(Semaphore::new(LARGE_TOKENIZATIONS.min(cpus))),
        }
    }

    /// Bounds the inputs waiting to be counted to `inputs` (the worker's `QUEUE_CAP`).
    pub fn with_pending_limit(self, inputs: usize) -> Counter {
        self.pending.limit.store(inputs, Ordering::Relaxed);
        self
    }

    /// Bounds the bytes of input waiting to be counted to `bytes` (the worker's
    /// `MAX_QUEUE_BYTES`).
    pub fn with_pending_bytes(self, bytes: usize) -> Counter {
        self.pending.bytes_limit.store(bytes, Ordering::Relaxed);
        self
    }

    /// Reserves room for a request of `inputs` inputs holding `bytes` bytes of input
    /// (`Input::size_bytes`) to be counted, before its reply task counts it; the reservation
    /// ends when dropped.
    ///
    /// # Errors
    /// [`EmbedError::Overloaded`] (429) when more than the pending limit of inputs or of bytes
    /// would wait to be counted (the tokenizer cannot keep up: load shedding, as the batcher's
    /// queue bounds).
    pub fn reserve(&self, inputs: usize, bytes: usize) -> Result<Reservation, EmbedError> {
        let limit = self.pending.limit.load(Ordering::Relaxed);
        let bytes_limit = self.pending.bytes_limit.load(Ordering::Relaxed);
        let before = self.pending.inputs.fetch_add(inputs, Ordering::Relaxed);
        let bytes_before = self.pending.bytes.fetch_add(bytes, Ordering::Relaxed);
        let reservation = Reservation {
            pending: Arc::clone(&self.pending),
            inputs,
            bytes,
        };
        // A request alone over a limit is let through when nothing waits: the batcher's own
        // bounds answer it.
        if before > 0 && before + inputs > limit {
            return Err(EmbedError::Overloaded(format!(
                "{before} inputs are waiting to be tokenized (QUEUE_CAP {limit})"
            )));
        }
        if before > 0 && bytes_before.saturating_add(bytes) > bytes_limit {
            return Err(EmbedError::Overloaded(format!(
                "{bytes_before} bytes of input are waiting to be tokenized \
                 (MAX_QUEUE_BYTES {bytes_limit})"
            )));
        }
        Ok(reservation)
    }

    /// Where the counts come from.
    pub fn source(&self) -> Source {
        match &*self.kind {
            Kind::Tokenizer { origin, .. } => Source::Tokenizer(origin.clone()),
            Kind::Tei(_) => Source::TeiTokenize,
            Kind::Inputs => Source::Inputs,
        }
    }

    /// Whether counting costs nothing (no tokenizer: [`Source::Inputs`]): then
    /// [`Counter::count_now`] gives the counts on the caller's thread.
    pub fn is_immediate(&self) -> bool {
        matches!(*self.kind, Kind::Inputs)
    }

    /// The counts when [`Counter::is_immediate`]: 1 per input. For a counter that tokenizes, the
    /// same 1 per input (use [`Counter::count`]).
    pub fn count_now(&self, inputs: Vec<Input>, options: EmbedOptions) -> Counted {
        let lengths = vec![1; inputs.len()];
        Counted {
            inputs,
            options,
            lengths,
            exact: false,
        }
    }

    /// Whether the counts are tokens (a tokenizer or TEI's `/tokenize`), not inputs.
    pub fn counts_tokens(&self) -> bool {
        !matches!(*self.kind, Kind::Inputs)
    }

    /// Counts the tokens of `inputs` under `options` (see [`Counted::lengths`]), off the
    /// caller's thread: on tokio's blocking pool for a tokenizer, by an HTTP call for TEI's
    /// `/tokenize`.
    ///
    /// # Errors
    /// - [`EmbedError::Validation`] (422, TEI 1.9.3's answer) for an input over the model's
    ///   limit with `truncate: false` ("`inputs` must have less than 256 tokens. Given: 830"),
    ///   or over TEI's character limit; an unknown `prompt_name` for the built-in model; a token
    ///   id outside the vocabulary.
    /// - [`EmbedError::Tokenizer`] (422) when the tokenizer fails on an input.
    /// - [`EmbedError::Unavailable`] (503) when the tokenizing task cannot run (the worker is
    ///   stopping). TEI's `/tokenize` failing is not an error: its texts count 1 each and
    ///   [`Counted::tokens`] is `None`.
    pub async fn count(
        &self,
        inputs: Vec<Input>,
        options: EmbedOptions,
    ) -> Result<Counted, EmbedError> {
        match &*self.kind {
            Kind::Inputs => Ok(self.count_now(inputs, options)),
            Kind::Tei(tei) => {
                let (lengths, exact) = tei.count(&inputs, &options).await?;
                Ok(Counted {
                    inputs,
                    options,
                    lengths,
                    exact,
                })
            }
            Kind::Tokenizer { .. } => {
                let text_bytes: usize = inputs.iter().map(Input::size_bytes).sum();
                let _large = if text_bytes > LARGE_REQUEST_BYTES {
                    Some(self.large.acquire().await.map_err(|_| stopping())?)
                } else {
                    None
                };
                let _slot = self.slots.acquire().await.map_err(|_| stopping())?;
                let kind = Arc::clone(&self.kind);
                tokio::task::spawn_blocking(move || {
                    let lengths = kind.count_blocking(&inputs, &options)?;
                    Ok(Counted {
                        inputs,
                        options,
                        lengths,
                        exact: true,
                    })
                })
                .await
                .map_err(|_| stopping())?
            }
        }
    }

    /// [`Counter::count`] on the caller's thread (blocking for a tokenizer); for benchmarks and
    /// tests. With TEI's `/tokenize` it counts inputs (that one needs the async path).
    ///
    /// # Errors
    /// As [`Counter::count`].
    pub fn count_blocking(
        &self,
        inputs: &[Input],
        options: &EmbedOptions,
    ) -> Result<Vec<u32>, EmbedError> {
        self.kind.count_blocking(inputs, options)
    }
}

impl Kind {
    fn count_blocking(
        &self,
        inputs: &[Input],
        options: &EmbedOptions,
    ) -> Result<Vec<u32>, EmbedError> {
        match self {
            Kind::Tokenizer {
                encoder,
                auto_truncate,
                strict_prompts,
                ..
            } => {
                let prompt = match options.prompt_name.as_deref() {
                    None => None,
                    Some(name) => match encoder.prompt(name) {
                        Ok(text) => Some(text),
                        Err(err) if *strict_prompts => return Err(err),
                        Err(_) => None,
                    },
                };
                encoder.count(inputs, prompt, truncate_for(options, *auto_truncate))
            }
            Kind::Tei(_) | Kind::Inputs => Ok(vec![1; inputs.len()]),
        }
    }
}

/// The truncation a request asks for: its `truncate`, or `auto_truncate` when absent.
fn truncate_for(options: &EmbedOptions, auto_truncate: bool) -> Option<TruncationDirection> {
    match options.truncate {
        Some(_) => truncation(options),
        None if auto_truncate => Some(options.truncation_direction.unwrap_or_default()),
        None => None,
    }
}

fn stopping() -> EmbedError {
    EmbedError::Unavailable("the worker is stopping".into())
}

/// TEI's `POST /tokenize`: `{"inputs": [...], "add_special_tokens": true, "prompt_name": ...}`,
/// answered with one array of tokens per input. TEI's `/tokenize` does not truncate: the limit is
/// applied here.
struct TeiTokenize {
    client: reqwest::Client,
    url: String,
    max_input_length: usize,
    auto_truncate: bool,
}

impl TeiTokenize {
    /// Counts per input, and whether they are tokens: when TEI's `/tokenize` fails (TEI then
    /// answers the inputs itself), each text counts 1 and the counts are not reported. TEI's
    /// `/tokenize` takes texts only: token ids count as given.
    async fn count(
        &self,
        inputs: &[Input],
        options: &EmbedOptions,
    ) -> Result<(Vec<u32>, bool), EmbedError> {
        #[derive(Deserialize)]
        struct Token {}
        if inputs.iter().any(|i| matches!(i, Input::Pair(..))) {
            // TEI's `/tokenize` has no pairs: rerank pairs count as inputs, and no count is
            // reported.
            return Ok((vec![1; inputs.len()], false));
        }
        let texts: Vec<&str> = inputs.iter().filter_map(Input::as_text).collect();
        let answered = if texts.is_empty() {
            Some(Vec::new())
        } else {
            let body = serde_json::json!({
                "inputs": texts,
                "add_special_tokens": true,
                "prompt_name": options.prompt_name,
            });
            let answer = async {
                let response = self.client.post(&self.url).json(&body).send().await.ok()?;
                if !response.status().is_success() {
                    return None;
                }
                response.json::<Vec<Vec<Token>>>().await.ok()
            };
            answer
                .await
                .filter(|tokens| tokens.len() == texts.len())
                .map(|tokens| tokens.iter().map(Vec::len).collect::<Vec<_>>())
        };
        let exact = answered.is_some();
        let mut counted = answered.unwrap_or_default().into_iter();
        let truncate = truncate_for(options, self.auto_truncate);
        let lengths = inputs
            .iter()
            .map(|input| {
                let given = match input {
                    Input::Text(_) => counted.next().unwrap_or(1),
                    Input::Ids(ids) => ids.len(),
                    Input::Pair(..) => 1,
                };
                limit(given, self.max_input_length, truncate)
            })
            .collect::<Result<_, _>>()?;
        Ok((lengths, exact))
    }
}

/// `given` tokens against the limit of `max` tokens: cut to `max` when truncating, else TEI's
/// 422.
fn limit(
    given: usize,
    max: usize,
    truncate: Option<TruncationDirection>,
) -> Result<u32, EmbedError> {
    if given > max && truncate.is_none() {
        return Err(EmbedError::Validation(format!(
            "`inputs` must have less than {max} tokens. Given: {given}"
        )));
    }
    Ok(u32::try_from(given.min(max)).unwrap_or(u32::MAX))
}

/// Where the TEI model's tokenizer is looked for, in order: `--tokenizer`, then the Hugging Face
/// cache (or hub) for `model_id`.
#[derive(Debug, Clone, Default)]
pub struct TokenizerLookup {
    /// `--tokenizer`: a `tokenizer.json` path.
    pub path: Option<PathBuf>,
}

impl TokenizerLookup {
    /// The tokenizer file for the TEI model `model_id` (from its `/info`), and where it came
    /// from; `None` when there is none (the reason is logged). Blocking (may fetch from the hub).
    pub fn find(&self, model_id: Option<&str>) -> Option<(PathBuf, String)> {
        if let Some(path) = &self.path {
            return Some((path.clone(), path.display().to_string()));
        }
        let model_id = model_id?;
        find_in_hub(model_id).map(|path| (path, format!("{model_id} (Hugging Face cache)")))
    }
}

#[cfg(feature = "hub")]
fn find_in_hub(model_id: &str) -> Option<PathBuf> {
    match embatch_local_model::tokenizer_path(model_id) {
        Ok(path) => Some(path),
        Err(err) => {
            tracing::info!(model_id, %err, "no tokenizer for the TEI model in the Hugging Face cache or hub");
            None
        }
    }
}

#[cfg(not(feature = "hub"))]
fn find_in_hub(model_id: &str) -> Option<PathBuf> {
    tracing::info!(
        model_id,
        "this build has no `hub` feature: set --tokenizer for the TEI model's tokenizer"
    );
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absent_truncate_follows_auto_truncate() {
        let options = EmbedOptions::default();
        assert_eq!(
            truncate_for(&options, true),
            Some(TruncationDirection::Right)
        );
        assert_eq!(truncate_for(&options, false), None);
        let refuse = EmbedOptions {
            truncate: Some(false),
            ..EmbedOptions::default()
        };
        assert_eq!(truncate_for(&refuse, true), None);
        let left = EmbedOptions {
            truncate: Some(true),
            truncation_direction: Some(TruncationDirection::Left),
            ..EmbedOptions::default()
        };
        assert_eq!(truncate_for(&left, false), Some(TruncationDirection::Left));
    }

    #[test]
    fn the_limit_cuts_or_refuses_with_teis_message() {
        assert_eq!(limit(300, 256, Some(TruncationDirection::Right)), Ok(256));
        assert_eq!(limit(12, 256, None), Ok(12));
        let err = limit(830, 256, None).expect_err("over the limit");
        assert_eq!(err.status(), 422);
        assert_eq!(
            err.to_string(),
            "Input validation error: `inputs` must have less than 256 tokens. Given: 830"
        );
    }

    #[test]
    fn the_pending_bound_sheds_and_frees_on_drop() {
        let counter = Counter::inputs().with_pending_limit(4);
        let first = counter.reserve(3, 30).expect("room");
        let err = counter.reserve(2, 20).err().expect("over the bound");
        assert_eq!(err.status(), 429);
        let second = counter.reserve(1, 10).expect("exactly the bound");
        drop((first, second));
        let alone = counter
            .reserve(10, 100)
            .expect("a request alone is let through");
        assert!(counter.reserve(1, 1).is_err(), "behind one over the bound");
        drop(alone);
        assert!(counter.reserve(4, 40).is_ok(), "all freed");
    }

    #[test]
    fn the_pending_bytes_bound_sheds_and_frees_on_drop() {
        let counter = Counter::inputs()
            .with_pending_limit(100)
            .with_pending_bytes(1000);
        let first = counter.reserve(1, 600).expect("room");
        let err = counter.reserve(1, 401).err().expect("over the bytes bound");
        assert_eq!(err.status(), 429);
        assert!(err.to_string().contains("MAX_QUEUE_BYTES 1000"), "{err}");
        let second = counter.reserve(1, 400).expect("exactly the bound");
        drop((first, second));
        let alone = counter
            .reserve(1, 5000)
            .expect("a request alone is let through");
        assert!(counter.reserve(1, 1).is_err(), "behind one over the bound");
        drop(alone);
        assert!(counter.reserve(2, 1000).is_ok(), "all freed");
    }

    /// TEI's `POST /tokenize` shape (`{"inputs": [...], "add_special_tokens": true}` → one array
    /// of `{id, text, special, start, stop}` per input), served by a minimal HTTP server whose
    /// "tokenizer" is one token per word plus 2 special tokens.
    #[tokio::test]
    async fn tei_tokenize_counts_texts_and_applies_the_limit_here() {
        use axum::Json;
        use axum::routing::post;
        async fn tokenize(Json(body): Json<serde_json::Value>) -> Json<serde_json::Value> {
            assert_eq!(body["add_special_tokens"], true);
            let tokens: Vec<Vec<serde_json::Value>> = body["inputs"]
                .as_array()
                .expect("a batch")
                .iter()
                .map(|text| {
                    let words = text.as_str().expect("a text").split_whitespace().count();
                    (0..words + 2)
                        .map(|i| serde_json::json!({"id": i, "text": "w", "special": false, "start": null, "stop": null}))
                        .collect()
                })
                .collect();
            Json(serde_json::json!(tokens))
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let server = tokio::spawn(async move {
            axum::serve(
                listener,
                axum::Router::new().route("/tokenize", post(tokenize)),
            )
            .await
        });
        let counter = Counter::tei_tokenize(reqwest::Client::new(), &url, 8, true);
        assert_eq!(counter.source(), Source::TeiTokenize);
        let inputs = vec![
            Input::from("one two three"),
            Input::Ids(vec![101, 7, 102]),
            Input::from("a b c d e f g h i j"),
        ];
        let counted = counter
            .count(inputs.clone(), EmbedOptions::default())
            .await
            .expect("counted");
        assert_eq!(
            counted.lengths,
            [5, 3, 8],
            "the long text is cut to the limit"
        );
        assert_eq!(counted.tokens(), Some(16));
        let refuse = EmbedOptions {
            truncate: Some(false),
            ..EmbedOptions::default()
        };
        let err = counter.count(inputs, refuse).await.expect_err("over 8");
        assert_eq!(
            err.to_string(),
            "Input validation error: `inputs` must have less than 8 tokens. Given: 12"
        );
        // TEI's `/tokenize` gone: texts count 1 each, and no token count is reported.
        server.abort();
        let _ = server.await;
        let counted = counter
            .count(vec![Input::from("a b")], EmbedOptions::default())
            .await
            .expect("counted as inputs");
        assert_eq!(counted.lengths, [1]);
        assert_eq!(counted.tokens(), None);
    }

    #[tokio::test]
    async fn without_a_tokenizer_each_input_counts_one() {
        let counter = Counter::inputs();
        let counted = counter
            .count(vec!["a".into(), "b c".into()], EmbedOptions::default())
            .await
            .expect("counted");
        assert_eq!(counted.lengths, [1, 1]);
        assert_eq!(counted.tokens(), None);
        assert_eq!(counter.source(), Source::Inputs);
    }
}
