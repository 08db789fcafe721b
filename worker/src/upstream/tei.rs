//! TEI over HTTP: `POST {tei_url}/embed` with a batch, `GET {tei_url}/info` for its limits.

use std::time::Duration;

use embatch_protocol::{EmbedError, EmbedOptions, ErrorResponse};
use serde::{Deserialize, Serialize};

use super::{Embedding, Upstream, UpstreamError};

/// A pooled HTTP client for one TEI server.
pub struct TeiUpstream {
    client: reqwest::Client,
    embed_url: String,
    max_batch_size: usize,
}

/// How to reach one TEI server.
#[derive(Debug, Clone)]
pub struct TeiConfig {
    /// Base URL, `http://` (e.g. `http://tei:80`); this build has no TLS.
    pub base_url: String,
    /// Bearer token for `Authorization`, when TEI runs with `--api-key` or behind a hosted endpoint.
    pub api_key: Option<crate::config::Secret>,
    /// Timeout of one call.
    pub timeout: Duration,
    /// Batch limit used when `/info` cannot be read.
    pub fallback_max_batch_size: usize,
}

/// The part of TEI's `GET /info` the worker uses.
#[derive(Debug, Deserialize)]
struct TeiInfo {
    max_client_batch_size: usize,
}

/// The body sent to TEI: the batch's inputs and their shared options, in TEI's shape.
#[derive(Serialize)]
struct TeiRequest<'a> {
    inputs: &'a [String],
    #[serde(flatten)]
    options: &'a EmbedOptions,
}

impl TeiUpstream {
    /// Builds a pooled client for the TEI server of `config` (plain HTTP; the bearer token on
    /// every request) and reads `max_client_batch_size` from
    /// its `/info`. When `/info` cannot be read (TEI still starting, or a proxy without it),
    /// `fallback_max_batch_size` is used and a warning logged.
    ///
    /// # Errors
    /// [`EmbedError::Unavailable`] when the HTTP client cannot be built (e.g. an API key that is
    /// not a valid header value).
    pub async fn connect(config: &TeiConfig) -> Result<TeiUpstream, EmbedError> {
        let base = config.base_url.trim_end_matches('/');
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(key) = &config.api_key {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {}", key.0))
                .map_err(|_| {
                    EmbedError::Unavailable("TEI_API_KEY is not a valid header value".into())
                })?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let timeout = config.timeout;
        let fallback_max_batch_size = config.fallback_max_batch_size;
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(2).min(timeout))
            .pool_max_idle_per_host(64)
            .tcp_nodelay(true)
            .build()
            .map_err(|e| EmbedError::Unavailable(format!("cannot build HTTP client: {e}")))?;
        let max_batch_size = match read_info(&client, base).await {
            Ok(info) => {
                tracing::info!(
                    max_client_batch_size = info.max_client_batch_size,
                    "read TEI /info"
                );
                info.max_client_batch_size.max(1)
            }
            Err(err) => {
                tracing::warn!(%err, fallback_max_batch_size, "cannot read TEI /info; using fallback batch limit");
                fallback_max_batch_size.max(1)
            }
        };
        Ok(TeiUpstream {
            client,
            embed_url: format!("{base}/embed"),
            max_batch_size,
        })
    }
}

async fn read_info(client: &reqwest::Client, base: &str) -> Result<TeiInfo, reqwest::Error> {
    client
        .get(format!("{base}/info"))
        .send()
        .await?
        .error_for_status()?
        .json::<TeiInfo>()
        .await
}

impl Upstream for TeiUpstream {
    async fn embed(
        &self,
        inputs: &[String],
        options: &EmbedOptions,
    ) -> Result<Vec<Embedding>, UpstreamError> {
        let n = inputs.len();
        let response = self
            .client
            .post(&self.embed_url)
            .json(&TeiRequest { inputs, options })
            .send()
            .await
            .map_err(transport_error)?;
        let status = response.status();
        let body = response.bytes().await.map_err(transport_error)?;
        if !status.is_success() {
            let message = serde_json::from_slice::<ErrorResponse>(&body)
                .map(|e| e.error)
                .unwrap_or_else(|_| String::from_utf8_lossy(&body).into_owned());
            let code = status.as_u16();
            return Err(match code {
                // The upstream is overloaded or unhealthy: pass its 429 / 503 through.
                429 | 503 => UpstreamError::Failed(EmbedError::from_reply(code, &message)),
                // Any other 4xx: the inputs are at fault (413 too long, 422 invalid, ...).
                _ if status.is_client_error() => {
                    UpstreamError::Rejected(EmbedError::from_reply(code, &message))
                }
                _ => UpstreamError::Failed(EmbedError::Backend(format!(
                    "upstream {status}: {message}"
                ))),
            });
        }
        let embeddings: Vec<Embedding> = serde_json::from_slice(&body).map_err(|e| {
            UpstreamError::Failed(EmbedError::Backend(format!(
                "malformed upstream reply: {e}"
            )))
        })?;
        if embeddings.len() != n {
            return Err(UpstreamError::Failed(EmbedError::Backend(format!(
                "upstream returned {} embeddings for {n} inputs",
                embeddings.len()
            ))));
        }
        Ok(embeddings)
    }

    fn max_batch_size(&self) -> usize {
        self.max_batch_size
    }
}

/// Connection refused / DNS → 503 (the upstream is not there); timeouts and broken bodies → 424.
fn transport_error(err: reqwest::Error) -> UpstreamError {
    if err.is_connect() {
        UpstreamError::Failed(EmbedError::Unavailable(format!(
            "upstream unreachable: {err}"
        )))
    } else if err.is_timeout() {
        UpstreamError::Failed(EmbedError::Backend(format!("upstream timed out: {err}")))
    } else {
        UpstreamError::Failed(EmbedError::Backend(format!("upstream call failed: {err}")))
    }
}
