//! TEI over HTTP or HTTPS: `POST {tei_url}/embed` with a batch, `GET {tei_url}/info` for its
//! limits. TLS uses the system's roots plus an optional CA file, with the workspace's one crypto
//! provider (aws-lc-rs, through reqwest's `rustls` feature). Several TEI URLs are replicas of
//! one model: every call goes to one of them through [`Replicas`].

use std::future::Future;
use std::time::Duration;

use embatch_protocol::{EmbedError, EmbedOptions, ErrorResponse, Input};
use serde::Deserialize;

use super::body::{self, TeiRequest};
use super::http;
use super::replicas::Replicas;
use super::{Backend, Embedding, Upstream, UpstreamError};

/// A pooled HTTP client for one TEI server, or for several replicas of one model.
pub struct TeiUpstream {
    pub(super) client: reqwest::Client,
    /// The TEI base URLs (`TEI_URL`'s list), with their calls in flight.
    pub(super) replicas: Replicas,
    /// TEI's `GET /info` document as read at start-up (from the first replica that answered),
    /// or on the first [`Upstream::info`] call after a start-up read failed.
    info: tokio::sync::OnceCell<serde_json::Value>,
    max_batch_size: usize,
    /// `UPSTREAM_TIMEOUT`, reported in [`UpstreamError::Timeout`].
    pub(super) timeout: Duration,
}

/// How to reach TEI.
#[derive(Debug, Clone)]
pub struct TeiConfig {
    /// Base URLs, `http://` or `https://` (e.g. `http://tei:80`): one TEI server, or several
    /// replicas of one model, at least one.
    pub base_urls: Vec<String>,
    /// PEM file of a private CA to trust for `https://` (besides the system's roots).
    pub tls_ca: Option<std::path::PathBuf>,
    /// Bearer token for `Authorization`, when TEI runs with `--api-key` or behind a hosted endpoint.
    pub api_key: Option<embatch_runtime::Secret>,
    /// Timeout of one call.
    pub timeout: Duration,
    /// Batch limit used when `/info` cannot be read.
    pub fallback_max_batch_size: usize,
}

/// Why the worker cannot use the configured TEI.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The HTTP client cannot be built, or TLS to a replica failed (see
    /// [`TeiUpstream::connect`]).
    #[error(transparent)]
    Client(#[from] EmbedError),
    /// No URL was given.
    #[error("TEI_URL names no URL")]
    NoUrl,
    /// Two replicas' `/info` name different models: batches would get one model's vectors or
    /// the other's by chance.
    #[error(
        "TEI replicas serve different models: {first_url} serves {first_model}, {url} serves \
         {model} (every URL in TEI_URL must serve the same model)"
    )]
    ModelMismatch {
        /// The first replica (in `TEI_URL` order) whose `/info` answered.
        first_url: String,
        /// Its `model_id`.
        first_model: String,
        /// The replica that disagrees.
        url: String,
        /// Its `model_id`.
        model: String,
    },
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
    /// Builds a pooled client for the TEI servers of `config` (the bearer token on every
    /// request) and reads `/info` from every one: `max_client_batch_size` comes from the first
    /// (in `base_urls` order) that answered. When no `/info` can be read (TEI still starting,
    /// or a proxy without it), `fallback_max_batch_size` is used and a warning logged.
    ///
    /// # Errors
    /// [`ConnectError::Client`] ([`EmbedError::Unavailable`]) when the HTTP client cannot be
    /// built (an API key that is not a valid header value, an unreadable `tls_ca`), or when TLS
    /// to a replica fails (an untrusted certificate, say): the worker then stops at start-up
    /// with the reason instead of starting "ready" and failing every request.
    /// [`ConnectError::ModelMismatch`] when two replicas' `/info` name different `model_id`s.
    pub async fn connect(config: &TeiConfig) -> Result<TeiUpstream, ConnectError> {
        let replicas =
            Replicas::new(config.base_urls.iter().cloned()).ok_or(ConnectError::NoUrl)?;
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
        let info = tokio::sync::OnceCell::new();
        let limit = match read_infos(&client, &replicas, timeout).await? {
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
                tracing::info!(
                    max_client_batch_size,
                    replicas = replicas.len(),
                    "read TEI /info"
                );
                max_client_batch_size.max(1)
            }
            Err(err) => {
                tracing::warn!(%err, fallback_max_batch_size, "cannot read TEI /info; using fallback batch limit");
                fallback_max_batch_size.max(1)
            }
        };
        Ok(TeiUpstream {
            client,
            replicas,
            info,
            max_batch_size,
            timeout,
        })
    }

    /// [`Replicas::on_replica`] of this server's replicas.
    ///
    /// # Errors
    /// As [`Replicas::on_replica`].
    pub(super) async fn on_replica<T, F, Fut>(&self, call: F) -> Result<T, UpstreamError>
    where
        F: Fn(String) -> Fut,
        Fut: Future<Output = Result<T, UpstreamError>>,
    {
        self.replicas.on_replica(call).await
    }

    /// `POST {replica}/embed` with a batch of `inputs`: the embeddings, one per input.
    async fn embed_on(
        &self,
        base: &str,
        inputs: &[Input],
        options: &EmbedOptions,
    ) -> Result<Vec<Embedding>, UpstreamError> {
        let n = inputs.len();
        // The body is written while it is sent (see `body`): a batch of long inputs is not
        // copied whole into a buffer that lives as long as the call.
        let request = TeiRequest { inputs, options };
        let (body, writer) = body::body(&request);
        let post = http::post_json(&self.client, &format!("{base}/embed"));
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
}

/// `/info` of every replica, read at once: the first document that answered (in `TEI_URL`
/// order), or the first replica's failure when none did. A replica that cannot be read is
/// logged and left to its health probe.
///
/// # Errors
/// [`ConnectError::Client`] when TLS to a replica fails, [`ConnectError::ModelMismatch`] when
/// two documents name different `model_id`s (a document without one is not compared).
async fn read_infos(
    client: &reqwest::Client,
    replicas: &Replicas,
    timeout: Duration,
) -> Result<Result<serde_json::Value, UpstreamError>, ConnectError> {
    let reads = replicas.bases().map(|base| async move {
        (
            base,
            read_info(client, &format!("{base}/info"), timeout).await,
        )
    });
    let mut first: Option<(&str, serde_json::Value)> = None;
    let mut failure = None;
    for (base, read) in futures::future::join_all(reads).await {
        let document = match read {
            Ok(document) => document,
            Err(UpstreamError::Tls(reason)) => {
                return Err(EmbedError::Unavailable(format!(
                    "TLS to TEI at {base} failed: {reason} (a private CA goes in TEI_TLS_CA)"
                ))
                .into());
            }
            Err(err) => {
                if replicas.len() > 1 {
                    tracing::warn!(replica = base, %err, "cannot read this TEI replica's /info");
                }
                failure.get_or_insert(err);
                continue;
            }
        };
        let Some((first_url, first_document)) = &first else {
            first = Some((base, document));
            continue;
        };
        if let (Some(first_model), Some(model)) = (
            first_document["model_id"].as_str(),
            document["model_id"].as_str(),
        ) && first_model != model
        {
            return Err(ConnectError::ModelMismatch {
                first_url: (*first_url).to_owned(),
                first_model: first_model.to_owned(),
                url: base.to_owned(),
                model: model.to_owned(),
            });
        }
    }
    Ok(match (first, failure) {
        (Some((_, document)), _) => Ok(document),
        (None, Some(err)) => Err(err),
        (None, None) => Err(UpstreamError::Unreachable("no TEI replica".into())),
    })
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
        self.on_replica(|base| async move { self.embed_on(&base, inputs, options).await })
            .await
    }

    fn max_batch_size(&self) -> usize {
        self.max_batch_size
    }
}

impl Upstream for TeiUpstream {
    /// TEI's own `GET /info` document, verbatim: the one read at start-up, or (when that read
    /// failed) read now from a replica and kept once it succeeds.
    async fn info(&self) -> Result<serde_json::Value, UpstreamError> {
        let read = || {
            self.on_replica(|base| async move {
                read_info(&self.client, &format!("{base}/info"), self.timeout).await
            })
        };
        self.info.get_or_try_init(read).await.cloned()
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
        // The counter keeps the replica that answered the probe (see `tokens::tei`).
        let replica = self.replicas.pick();
        let probe = self
            .client
            .post(replica.url("tokenize"))
            .json(&serde_json::json!({"inputs": "probe"}))
            .timeout(crate::membership::PROBE_TIMEOUT.min(self.timeout))
            .send()
            .await;
        match probe {
            Ok(response) if response.status().is_success() => Counter::tei_tokenize(
                self.client.clone(),
                replica.base(),
                max_input_length,
                auto_truncate,
            ),
            _ => Counter::inputs(),
        }
    }

    /// `GET {tei_url}/health` on every replica at once: healthy when one answers 200 (TEI
    /// answers 503 while its model cannot run) or failed its probe while it answered calls
    /// since the last ([`super::replicas::Pick::probed`]: busy, not sick); a replica that is
    /// neither is skipped by calls for [`super::replicas::COOL_DOWN`], one that is is used
    /// again. Each probe is bounded by `crate::membership::PROBE_TIMEOUT` (less than
    /// `UPSTREAM_TIMEOUT` when that is shorter).
    ///
    /// # Errors
    /// The first replica's failure, when none is healthy.
    async fn health(&self) -> Result<(), UpstreamError> {
        let timeout = crate::membership::PROBE_TIMEOUT.min(self.timeout);
        let text = |body: &[u8]| String::from_utf8_lossy(body).chars().take(512).collect();
        self.replicas
            .probe_all(|base| async move {
                let url = format!("{base}/health");
                http::probe(&self.client, &url, timeout, text).await
            })
            .await
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
