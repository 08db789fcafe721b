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

mod lookup;
mod pending;
mod tei;

use std::sync::Arc;

use embatch_local_model::Encoder;
use embatch_local_model::model::truncation;
use embatch_protocol::{EmbedError, EmbedOptions, Input, TruncationDirection};
use tokio::sync::Semaphore;

pub use lookup::TokenizerLookup;
use pending::Pending;
pub use pending::Reservation;
use tei::TeiTokenize;

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
        Counter::new(Kind::Tei(TeiTokenize::new(
            client,
            base_url,
            max_input_length,
            auto_truncate,
        )))
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
            pending: Arc::new(Pending::unbounded()),
            large: Arc::new(Semaphore::new(LARGE_TOKENIZATIONS.min(cpus))),
        }
    }

    /// Where the counts come from.
    pub fn source(&self) -> Source {
        match &*self.kind {
            Kind::Tokenizer { origin, .. } => Source::Tokenizer(origin.clone()),
            Kind::Tei(_) => Source::TeiTokenize,
            Kind::Inputs => Source::Inputs,
        }
    }

    /// Whether the model defines a prompt named `name`: `Some` when this counter has the
    /// model's tokenizer and prompts (its sentence-transformers config, which TEI reads too),
    /// `None` when it cannot tell (it counts with TEI's `/tokenize`, or by inputs).
    pub fn defines_prompt(&self, name: &str) -> Option<bool> {
        match &*self.kind {
            Kind::Tokenizer { encoder, .. } => Some(encoder.prompt(name).is_ok()),
            Kind::Tei(_) | Kind::Inputs => None,
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
