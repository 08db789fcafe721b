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
    /// `UPSTREAM_TIMEOUT`, reported in [`UpstreamError::Timeout`].
    timeout: Duration,
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
            timeout,
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
            .map_err(|e| transport_error(e, self.timeout))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|e| transport_error(e, self.timeout))?;
        if !status.is_success() {
            let status = status.as_u16();
            return Err(match serde_json::from_slice::<ErrorResponse>(&body) {
                Ok(response) => UpstreamError::Status { status, response },
                Err(_) => UpstreamError::Http {
                    status,
                    body: String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
                },
            });
        }
        let embeddings: Vec<Embedding> =
            serde_json::from_slice(&body).map_err(|e| UpstreamError::Malformed(e.to_string()))?;
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

/// Connection refused / DNS → unreachable (503); timeouts → 424; a broken body → malformed (424).
fn transport_error(err: reqwest::Error, timeout: Duration) -> UpstreamError {
    if err.is_connect() {
        UpstreamError::Unreachable(err.to_string())
    } else if err.is_timeout() {
        UpstreamError::Timeout(timeout)
    } else {
        UpstreamError::Malformed(format!("upstream call failed: {err}"))
    }
}
