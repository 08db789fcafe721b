//! An OpenAI-compatible embeddings server as the upstream (vLLM, Infinity, SGLang, Ollama,
//! LiteLLM, a hosted API): `POST {openai_url}/embeddings` with a batch, `GET {openai_url}/models`
//! as its health check. Such a server has no TEI `/info`, so what the worker would learn from
//! it (the model's name, the most inputs per call, the input limit in tokens) comes from the
//! configuration (`OPENAI_MODEL`, `OPENAI_MAX_INPUTS`, `OPENAI_MAX_INPUT_TOKENS`), and the
//! worker's `info` is a TEI-shaped document made of them ([`OpenAiUpstream::info`]).
//!
//! One batch is one call, `{"model", "input": [...], "encoding_format": "float"}` plus
//! `dimensions` when the requests ask for it; each `data[i].embedding` of the reply is kept as
//! the JSON text the server wrote (its floats are not decoded, the reply is cut byte-wise:
//! [`super::openai_reply`]) and put in `index` order. TEI's
//! options the API has no field for are refused with 422 naming the option unless they ask for
//! what the server does anyway ([`refusal`]). See docs/design/upstreams.md.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use embatch_protocol::{EmbedError, EmbedOptions, Input, Task, TruncationDirection};
use serde::Serialize;

use super::http;
use super::openai_reply::split_reply;
use super::replicas::Replicas;
use super::tei::TOKENIZER_LOOKUP_TIMEOUT;
use super::{Backend, Embedding, Upstream, UpstreamError};

/// Default of `OPENAI_MAX_INPUTS`: 2,048 inputs per call, OpenAI's own limit on
/// `/v1/embeddings`. The batch size is `MAX_BATCH_SIZE` (32 by default) below it; this only
/// caps a `MAX_BATCH_SIZE` raised past what the server takes.
pub const DEFAULT_MAX_INPUTS: usize = 2048;

/// How to reach one OpenAI-compatible server, and what it cannot tell about itself.
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// Base URLs up to the API version, `http://` or `https://` (e.g. `http://vllm:8000/v1`),
    /// at least one: replicas of one model, each call posted to `{base}/embeddings` of the one
    /// with the fewest calls in flight ([`Replicas`]).
    pub base_urls: Vec<String>,
    /// The `model` field sent with every call; also the served model's name (unless
    /// `MODEL_ALIAS`).
    pub model: String,
    /// Bearer token for `Authorization` (a hosted API's key, vLLM's `--api-key`).
    pub api_key: Option<embatch_runtime::Secret>,
    /// Timeout of one call.
    pub timeout: Duration,
    /// Most inputs one call may carry (inputs).
    pub max_inputs: usize,
    /// The model's input limit (tokens), when known: announced as `max_input_length`, and with
    /// the model's tokenizer the worker counts tokens and refuses an input over it that says
    /// `truncate: false`.
    pub max_input_tokens: Option<usize>,
}

/// A pooled HTTP client for one OpenAI-compatible server, or for several replicas of one model.
pub struct OpenAiUpstream {
    client: reqwest::Client,
    /// The servers' base URLs and what the picker counts for each.
    replicas: Replicas,
    model: String,
    max_inputs: usize,
    max_input_tokens: Option<usize>,
    timeout: Duration,
    /// Set once [`Upstream::counter`] loaded the model's tokenizer with its input limit: an
    /// input over it with `truncate: false` is then refused by the token count, before any
    /// call, so `truncate: false` is honoured.
    counts_tokens: AtomicBool,
}

impl OpenAiUpstream {
    /// A pooled client for the server of `config` (the bearer key on every request). It does
    /// not call the server: the health checks find whether it answers.
    ///
    /// # Errors
    /// [`EmbedError::Unavailable`] when the API key is not a valid header value, the HTTP
    /// client cannot be built, or `base_urls` is empty.
    pub fn new(config: &OpenAiConfig) -> Result<OpenAiUpstream, EmbedError> {
        let replicas = Replicas::new(config.base_urls.iter().cloned())
            .ok_or_else(|| EmbedError::Unavailable("OPENAI_URL names no server".into()))?;
        let client = http::client(
            reqwest::Client::builder(),
            config.api_key.as_ref(),
            "OPENAI_API_KEY",
            config.timeout,
        )?;
        Ok(OpenAiUpstream {
            client,
            replicas,
            model: config.model.clone(),
            max_inputs: config.max_inputs.max(1),
            max_input_tokens: config.max_input_tokens,
            timeout: config.timeout,
            counts_tokens: AtomicBool::new(false),
        })
    }
}

/// The body of one call, OpenAI's `POST /v1/embeddings` request.
#[derive(Serialize)]
struct Request<'a> {
    model: &'a str,
    /// Texts (`"a"`) or token-id arrays (`[101, 102]`), never both in one call.
    input: &'a [&'a Input],
    /// Always `float`: the vectors as JSON numbers, passed on as written.
    encoding_format: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    dimensions: Option<usize>,
}

/// Why the API cannot honour `options`, naming the option; `None` when it can. The API has a
/// `dimensions` field and nothing else of TEI's: the server normalizes (every server above does
/// for a sentence-transformers model) and applies its own prompts and truncation, so only the
/// values that ask for what it does anyway pass. `truncate: false` passes when the worker
/// checks inputs' lengths itself (`counts_tokens`).
fn refusal(options: &EmbedOptions, counts_tokens: bool) -> Option<String> {
    let unsupported = |option: &str| {
        Some(format!(
            "`{option}` cannot be honoured by this worker's upstream (an OpenAI-compatible \
             /v1/embeddings server)"
        ))
    };
    if !options.normalize {
        return unsupported("normalize: false");
    }
    if options.prompt_name.is_some() {
        return unsupported("prompt_name");
    }
    if options.truncation_direction == Some(TruncationDirection::Left) {
        return unsupported("truncation_direction: left");
    }
    if options.truncate == Some(false) && !counts_tokens {
        return Some(format!(
            "{} unless the worker knows the model's tokenizer and input limit \
             (OPENAI_MAX_INPUT_TOKENS)",
            unsupported("truncate: false").unwrap_or_default()
        ));
    }
    None
}

/// TEI's routes other than `/embed` on this upstream: 424 `Backend` naming the route, as a TEI
/// model without the head answers.
fn not_served(task: Task) -> Option<&'static str> {
    match task {
        Task::Embed => None,
        Task::Rerank { .. } => Some("/rerank"),
        Task::Sparse => Some("/embed_sparse"),
        Task::Predict { .. } => Some("/predict"),
        Task::EmbedAll => Some("/embed_all"),
    }
}

impl Backend for OpenAiUpstream {
    async fn embed(
        &self,
        inputs: &[Input],
        options: &EmbedOptions,
    ) -> Result<Vec<Embedding>, UpstreamError> {
        if let Some(route) = not_served(options.task) {
            return Err(UpstreamError::Model(EmbedError::Backend(format!(
                "{route} is not served by this upstream (an OpenAI-compatible /v1/embeddings \
                 server computes embeddings only)"
            ))));
        }
        if let Some(refusal) = refusal(options, self.counts_tokens.load(Ordering::Relaxed)) {
            return Err(UpstreamError::Model(EmbedError::Validation(refusal)));
        }
        // The API takes texts or token arrays, not both in one `input`: a mixed batch is two
        // calls, run together.
        let (ids, texts): (Vec<usize>, Vec<usize>) =
            (0..inputs.len()).partition(|&i| matches!(inputs[i], Input::Ids(_)));
        if ids.is_empty() || texts.is_empty() {
            let all: Vec<&Input> = inputs.iter().collect();
            return self.call(&all, options.dimensions).await;
        }
        let pick = |indices: &[usize]| indices.iter().map(|&i| &inputs[i]).collect::<Vec<_>>();
        let (id_inputs, text_inputs) = (pick(&ids), pick(&texts));
        let (of_ids, of_texts) = tokio::try_join!(
            self.call(&id_inputs, options.dimensions),
            self.call(&text_inputs, options.dimensions)
        )?;
        let mut merged: Vec<Option<Embedding>> = vec![None; inputs.len()];
        for (indices, embeddings) in [(ids, of_ids), (texts, of_texts)] {
            for (i, embedding) in indices.into_iter().zip(embeddings) {
                merged[i] = Some(embedding);
            }
        }
        // Each call's count was checked, so every slot is filled.
        Ok(merged.into_iter().flatten().collect())
    }

    fn max_batch_size(&self) -> usize {
        self.max_inputs
    }
}

impl OpenAiUpstream {
    /// One `POST {base}/embeddings` of `inputs` (all texts or all token arrays): one embedding
    /// per input, in order.
    async fn call(
        &self,
        inputs: &[&Input],
        dimensions: Option<usize>,
    ) -> Result<Vec<Embedding>, UpstreamError> {
        let request = Request {
            model: &self.model,
            input: inputs,
            encoding_format: "float",
            dimensions,
        };
        let body = serde_json::to_vec(&request)
            .map_err(|e| UpstreamError::Malformed(format!("cannot encode the request: {e}")))?;
        let body = bytes::Bytes::from(body);
        self.replicas
            .on_replica(|base| {
                let post = http::post_json(&self.client, &format!("{base}/embeddings"));
                let body = body.clone();
                async move {
                    let sent = post.body(body).send().await;
                    let (status, body) = http::answer(sent, self.timeout).await?;
                    if !status.is_success() {
                        return Err(status_error(status.as_u16(), &body));
                    }
                    split_reply(&body, inputs.len())
                }
            })
            .await
    }
}

/// An error answer of the server by cause. 400, 413 and 422 blame an input (the batcher then
/// isolates it), 429 is the server's overload, 5xx the server failing, as for TEI; a 401, 403
/// or 404 means this worker's key, model or URL is wrong, which no caller can fix: unreachable
/// (503, so callers go to another worker, and it counts against the worker's health).
fn status_error(status: u16, body: &[u8]) -> UpstreamError {
    let message = error_message(body);
    match status {
        401 | 403 | 404 => UpstreamError::Unreachable(format!(
            "the OpenAI-compatible upstream answered {status}: {message} (check OPENAI_URL, \
             OPENAI_MODEL and OPENAI_API_KEY)"
        )),
        _ => UpstreamError::Http {
            status,
            body: message,
        },
    }
}

/// The message of an error body, as the servers write it: OpenAI's `{"error": {"message"}}`,
/// vLLM's `{"message"}`, TEI-like `{"error": "..."}`, FastAPI's `{"detail": ...}`; else the
/// text. At most 512 bytes.
fn error_message(body: &[u8]) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let found = parsed.as_ref().and_then(|v| {
        [
            v.pointer("/error/message"),
            v.get("message"),
            v.get("error"),
            v.get("detail"),
        ]
        .into_iter()
        .flatten()
        .next()
        .map(|m| m.as_str().map_or_else(|| m.to_string(), str::to_owned))
    });
    let mut message = found.unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    if message.len() > 512 {
        let mut end = 512;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    message
}

impl Upstream for OpenAiUpstream {
    /// `false`: the API has no `normalize` field, and the servers normalize (see [`refusal`]).
    fn unnormalized(&self) -> bool {
        false
    }

    /// A TEI-shaped `/info` made of the configuration: `model_id` `OPENAI_MODEL`, an embedding
    /// model (`model_type` `{"embedding": {"pooling": null}}`: the pooling is the server's),
    /// `max_input_length` `OPENAI_MAX_INPUT_TOKENS` (`null` when unset),
    /// `max_client_batch_size` `OPENAI_MAX_INPUTS` (the worker's `info` endpoint answers its
    /// own), `auto_truncate` `null` (the server decides); the rest `null`.
    async fn info(&self) -> Result<serde_json::Value, UpstreamError> {
        Ok(serde_json::json!({
            "model_id": self.model,
            "model_sha": null,
            "model_dtype": null,
            "model_type": {"embedding": {"pooling": null}},
            "max_concurrent_requests": null,
            "max_input_length": self.max_input_tokens,
            "max_batch_tokens": null,
            "max_batch_requests": null,
            "max_client_batch_size": self.max_inputs,
            "auto_truncate": null,
            "tokenization_workers": null,
            "version": env!("CARGO_PKG_VERSION"),
            "sha": null,
            "docker_label": null,
        }))
    }

    /// `GET {base}/models` of every replica at once: 200 is healthy (the API has no
    /// `/health`; every server above answers this route, and a hosted API checks the key on
    /// it), as is a failed probe of a replica that answered calls since the last
    /// ([`super::replicas::Pick::probed`]); healthy when one replica is, the others cooled as
    /// for TEI. Bounded by `crate::membership::PROBE_TIMEOUT` (less when `UPSTREAM_TIMEOUT` is
    /// shorter).
    ///
    /// # Errors
    /// The first replica's failure, when none is healthy.
    async fn health(&self) -> Result<(), UpstreamError> {
        let timeout = crate::membership::PROBE_TIMEOUT.min(self.timeout);
        self.replicas
            .probe_all(|base| async move {
                let url = format!("{base}/models");
                http::probe(&self.client, &url, timeout, error_message).await
            })
            .await
    }

    /// With `OPENAI_MAX_INPUT_TOKENS`, the tokenizer `lookup` finds for `OPENAI_MODEL` (a
    /// `TOKENIZER` path, or the Hugging Face cache or hub, for at most
    /// [`TOKENIZER_LOOKUP_TIMEOUT`]), an absent `truncate` counted as truncating (the server
    /// decides); else input counts (the API has no tokenize route).
    async fn counter(&self, lookup: &crate::tokens::TokenizerLookup) -> crate::tokens::Counter {
        use crate::tokens::Counter;
        let Some(max_input_tokens) = self.max_input_tokens else {
            return Counter::inputs();
        };
        let (lookup, model) = (lookup.clone(), self.model.clone());
        let find = tokio::task::spawn_blocking(move || {
            let (path, origin) = lookup.find(Some(&model))?;
            embatch_local_model::Encoder::load_file(&path, max_input_tokens)
                .map_err(|err| tracing::warn!(%err, "cannot load the upstream model's tokenizer"))
                .ok()
                .map(|encoder| (encoder, origin))
        });
        match tokio::time::timeout(TOKENIZER_LOOKUP_TIMEOUT, find).await {
            Ok(Ok(Some((encoder, origin)))) => {
                self.counts_tokens.store(true, Ordering::Relaxed);
                Counter::tokenizer(std::sync::Arc::new(encoder), origin, true, false)
            }
            _ => {
                tracing::warn!("no tokenizer for OPENAI_MODEL: counting inputs, not tokens");
                Counter::inputs()
            }
        }
    }
}

#[cfg(test)]
#[path = "openai_tests.rs"]
mod tests;
