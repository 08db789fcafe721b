//! TEI over HTTP or HTTPS: `POST {tei_url}/embed` with a batch, `GET {tei_url}/info` for its
//! limits. TLS uses the system's roots plus an optional CA file, with the workspace's one crypto
//! provider (aws-lc-rs, through reqwest's `rustls` feature).

use std::time::Duration;

use embatch_protocol::{EmbedError, EmbedOptions, ErrorResponse, Input};
use serde::Deserialize;

use super::body::{self, TeiRequest};
use super::http;
use super::{Backend, Embedding, Upstream, UpstreamError};

/// A pooled HTTP client for one TEI server.
pub struct TeiUpstream {
    pub(super) client: reqwest::Client,
    /// `{tei_url}`, without a trailing `/`.
    pub(super) base_url: String,
    embed_url: String,
    /// `{tei_url}/info`.
    info_url: String,
    /// `{tei_url}/health`.
    health_url: String,
    /// TEI's `GET /info` document as read at start-up, or on the first [`Upstream::info`] call
    /// after a start-up read failed.
    info: tokio::sync::OnceCell<serde_json::Value>,
    max_batch_size: usize,
    /// `UPSTREAM_TIMEOUT`, reported in [`UpstreamError::Timeout`].
    pub(super) timeout: Duration,
}

/// How to reach one TEI server.
#[derive(Debug, Clone)]
pub struct TeiConfig {
    /// Base URL, `http://` or `https://` (e.g. `http://tei:80`).
    pub base_url: String,
    /// PEM file of a private CA to trust for `https://` (besides the system's roots).
    pub tls_ca: Option<std::path::PathBuf>,
    /// Bearer token for `Authorization`, when TEI runs with `--api-key` or behind a hosted endpoint.
    pub api_key: Option<embatch_runtime::Secret>,
    /// Timeout of one call.
    pub timeout: Duration,
    /// Batch limit used when `/info` cannot be read.
    pub fallback_max_batch_size: usize,
}

/// Longest the worker looks for the TEI model's tokenizer at start (the hub may be slow or
/// unreachable): 20 s; past it, it goes on with TEI's `/tokenize` or counts inputs.
pub const TOKENIZER_LOOKUP_TIMEOUT: Duration = Duration::from_secs(20);

/// The part of TEI's `GET /info` the worker uses for batching.
#[derive(Debug, Deserialize)]
struct TeiInfo {
    max_client_batch_size: usize,
}

impl TeiUpstream {
    /// Builds a pooled client for the TEI server of `config` (the bearer token on every request)
    /// and reads `max_client_batch_size` from its `/info`. When `/info` cannot be read (TEI still
    /// starting, or a proxy without it), `fallback_max_batch_size` is used and a warning logged.
    ///
    /// # Errors
    /// [`EmbedError::Unavailable`] when the HTTP client cannot be built (an API key that is not
    /// a valid header value, an unreadable `tls_ca`), or when TLS to TEI fails (an untrusted
    /// certificate, say): the worker then stops at start-up with the reason instead of starting
    /// "ready" and failing every request.
    pub async fn connect(config: &TeiConfig) -> Result<TeiUpstream, EmbedError> {
        let base = config.base_url.trim_end_matches('/');
        let timeout = config.timeout;
        let fallback_max_batch_size = config.fallback_max_batch_size;
        let mut builder = reqwest::Client::builder();
        if let Some(path) = &config.tls_ca {
            let pem = std::fs::read(path).map_err(|e| {
                EmbedError::Unavailable(format!("cannot read TEI_TLS_CA {}: {e}", path.display()))
            })?;
            let certificates = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                EmbedError::Unavailable(format!("TEI_TLS_CA {} is not PEM: {e}", path.display()))
            })?;
            for certificate in certificates {
                builder = builder.add_root_certificate(certificate);
            }
        }
        let client = http::client(builder, config.api_key.as_ref(), "TEI_API_KEY", timeout)?;
        let info_url = format!("{base}/info");
        let health_url = format!("{base}/health");
        let info = tokio::sync::OnceCell::new();
        let read = read_info(&client, &info_url, timeout).await;
        if let Err(UpstreamError::Tls(reason)) = &read {
            return Err(EmbedError::Unavailable(format!(
                "TLS to TEI at {base} failed: {reason} (a private CA goes in TEI_TLS_CA)"
            )));
        }
        let limit = match read {
            Ok(document) => {
                let limit = serde_json::from_value::<TeiInfo>(document.clone())
                    .map(|i| i.max_client_batch_size)
                    .map_err(|e| UpstreamError::Malformed(format!("TEI /info: {e}")));
                // Kept for the worker's `info` endpoint even when the batch limit is missing.
                let _ = info.set(document);
                limit
            }
            Err(err) => Err(err),
        };
        let max_batch_size = match limit {
            Ok(max_client_batch_size) => {
                tracing::info!(max_client_batch_size, "read TEI /info");
                max_client_batch_size.max(1)
            }
            Err(err) => {
                tracing::warn!(%err, fallback_max_batch_size, "cannot read TEI /info; using fallback batch limit");
                fallback_max_batch_size.max(1)
            }
        };
        Ok(TeiUpstream {
            client,
            base_url: base.to_owned(),
            embed_url: format!("{base}/embed"),
            info_url,
            health_url,
            info,
            max_batch_size,
            timeout,
        })
    }
}

/// `GET {tei_url}/info` as JSON; errors by cause, as for `/embed`.
async fn read_info(
    client: &reqwest::Client,
    url: &str,
    timeout: Duration,
) -> Result<serde_json::Value, UpstreamError> {
    let (status, body) = http::answer(client.get(url).send().await, timeout).await?;
    if !status.is_success() {
        return Err(UpstreamError::Http {
            status: status.as_u16(),
            body: String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
        });
    }
    serde_json::from_slice(&body).map_err(|e| UpstreamError::Malformed(format!("TEI /info: {e}")))
}

impl Backend for TeiUpstream {
    async fn embed(
        &self,
        inputs: &[Input],
        options: &EmbedOptions,
    ) -> Result<Vec<Embedding>, UpstreamError> {
        match options.task {
            embatch_protocol::Task::Embed => {}
            embatch_protocol::Task::Rerank { raw_scores } => {
                return self.rerank(inputs, options, raw_scores).await;
            }
            embatch_protocol::Task::Sparse => return self.embed_sparse(inputs, options).await,
            embatch_protocol::Task::Predict { raw_scores } => {
                return self.predict(inputs, options, raw_scores).await;
            }
            embatch_protocol::Task::EmbedAll => return self.embed_all(inputs, options).await,
        }
        let n = inputs.len();
        // The body is written while it is sent (see `body`): a batch of long inputs is not
        // copied whole into a buffer that lives as long as the call.
        let request = TeiRequest { inputs, options };
        let (body, writer) = body::body(&request);
        let post = http::post_json(&self.client, &self.embed_url);
        let send = post.body(reqwest::Body::wrap(body)).send();
        let write = writer.write(&request);
        tokio::pin!(send, write);
        let mut writing = true;
        // The answer ends the call, whether the body was written whole or not (an early error
        // answer, or a broken connection, drops the body and so ends the writer).
        let response = loop {
            tokio::select! {
                response = &mut send => break response,
                () = &mut write, if writing => writing = false,
            }
        };
        let (status, body) = http::answer(response, self.timeout).await?;
        if !status.is_success() {
            return Err(status_error(status.as_u16(), &body));
        }
        let embeddings = Embedding::split_reply(&body)?;
        if embeddings.len() != n {
            return Err(UpstreamError::CountMismatch {
                sent: n,
                got: embeddings.len(),
            });
        }
        Ok(embeddings)
    }

    fn max_batch_size(&self) -> usize {
        self.max_batch_size
    }
}

impl Upstream for TeiUpstream {
    /// TEI's own `GET /info` document, verbatim: the one read at start-up, or (when that read
    /// failed) read now and kept once it succeeds.
    async fn info(&self) -> Result<serde_json::Value, UpstreamError> {
        self.info
            .get_or_try_init(|| read_info(&self.client, &self.info_url, self.timeout))
            .await
            .cloned()
    }

    /// The tokenizer of the model TEI's `/info` names (`model_id`, with its `max_input_length`
    /// and `auto_truncate`, `true` when absent as in TEI 1.9.3), found by `lookup` (a path, or
    /// the Hugging Face cache or hub, for at most [`TOKENIZER_LOOKUP_TIMEOUT`]); else TEI's
    /// `POST /tokenize` when it answers; else none.
    async fn counter(&self, lookup: &crate::tokens::TokenizerLookup) -> crate::tokens::Counter {
        use crate::tokens::Counter;
        let info = self.info().await.unwrap_or(serde_json::Value::Null);
        let model_id = info["model_id"].as_str().map(str::to_owned);
        let auto_truncate = info["auto_truncate"].as_bool().unwrap_or(true);
        let Some(max_input_length) = info["max_input_length"]
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
        else {
            tracing::warn!("TEI /info names no max_input_length: counting inputs, not tokens");
            return Counter::inputs();
        };
        let lookup = lookup.clone();
        let find = tokio::task::spawn_blocking(move || {
            let (path, origin) = lookup.find(model_id.as_deref())?;
            match embatch_local_model::Encoder::load_file(&path, max_input_length) {
                Ok(encoder) => Some((encoder, origin)),
                Err(err) => {
                    tracing::warn!(%err, "cannot load the TEI model's tokenizer");
                    None
                }
            }
        });
        match tokio::time::timeout(TOKENIZER_LOOKUP_TIMEOUT, find).await {
            Ok(Ok(Some((encoder, origin)))) => {
                return Counter::tokenizer(
                    std::sync::Arc::new(encoder),
                    origin,
                    auto_truncate,
                    false,
                );
            }
            Ok(_) => {}
            Err(_) => tracing::warn!(
                timeout_ms = TOKENIZER_LOOKUP_TIMEOUT.as_millis() as u64,
                "looking up the TEI model's tokenizer timed out"
            ),
        }
        let probe = self
            .client
            .post(format!("{}/tokenize", self.base_url))
            .json(&serde_json::json!({"inputs": "probe"}))
            .timeout(crate::membership::PROBE_TIMEOUT.min(self.timeout))
            .send()
            .await;
        match probe {
            Ok(response) if response.status().is_success() => Counter::tei_tokenize(
                self.client.clone(),
                &self.base_url,
                max_input_length,
                auto_truncate,
            ),
            _ => Counter::inputs(),
        }
    }

    /// `GET {tei_url}/health`: 200 is healthy (TEI answers 503 while its model cannot run).
    /// Bounded by `crate::membership::PROBE_TIMEOUT` (less than `UPSTREAM_TIMEOUT` when that is
    /// shorter).
    async fn health(&self) -> Result<(), UpstreamError> {
        let timeout = crate::membership::PROBE_TIMEOUT.min(self.timeout);
        let text = |body: &[u8]| String::from_utf8_lossy(body).chars().take(512).collect();
        http::probe(&self.client, &self.health_url, timeout, text).await
    }
}

/// An error status's body: TEI's error body passed through ([`UpstreamError::Status`]), or the
/// text of another ([`UpstreamError::Http`]).
pub(super) fn status_error(status: u16, body: &[u8]) -> UpstreamError {
    match serde_json::from_slice::<ErrorResponse>(body) {
        Ok(response) => UpstreamError::Status { status, response },
        Err(_) => UpstreamError::Http {
            status,
            body: String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
        },
    }
}
