//! What the batcher needs of an upstream: [`Backend`], the trait it sends whole batches to, and
//! [`UpstreamError`], why a call failed. The worker's `Upstream` (TEI over HTTP, the built-in
//! model) extends [`Backend`] with what only the worker asks (`/info`, `/health`, the
//! tokenizer, TEI's pass-through routes).

use std::future::Future;

use embatch_protocol::{EmbedError, EmbedOptions, ErrorResponse, Input};

use crate::Embedding;

/// Why an upstream call failed, by cause. [`UpstreamError::blames_input`] decides whether the
/// batcher bisects the batch to isolate an input; `From<UpstreamError> for EmbedError` is the
/// one mapping to what the requests of the call are answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    /// The upstream cannot be reached (connection refused, DNS), or the connection broke during
    /// the call: 503 `Unhealthy`.
    #[error("upstream unreachable: {0}")]
    Unreachable(String),
    /// TLS to the upstream failed (an untrusted or expired certificate, a name mismatch): 503
    /// `Unhealthy`; at start-up the worker stops with this reason.
    #[error("TLS to the upstream failed: {0}")]
    Tls(String),
    /// The call took longer than `UPSTREAM_TIMEOUT`: 424 `Backend`.
    #[error("upstream timed out after {} ms", .0.as_millis())]
    Timeout(std::time::Duration),
    /// The upstream answered an error status with TEI's error body, passed through verbatim
    /// (TEI's 413/422/400 blame an input; its 429, 503 and 424 do not).
    #[error("upstream answered {status}: {}", .response.error)]
    Status {
        /// The HTTP status.
        status: u16,
        /// TEI's error body as received.
        response: ErrorResponse,
    },
    /// The upstream answered an error status without TEI's error body (a proxy's 502, say):
    /// 424 `Backend` (503 stays 503).
    #[error("upstream answered {status}: {body}")]
    Http {
        /// The HTTP status.
        status: u16,
        /// The body, as text (truncated to 512 bytes).
        body: String,
    },
    /// The call failed in transit, or the reply is not TEI's response shape: 424 `Backend`.
    #[error("malformed upstream reply: {0}")]
    Malformed(String),
    /// The reply holds another number of embeddings than inputs were sent: 424 `Backend`.
    #[error("upstream returned {got} embeddings for {sent} inputs")]
    CountMismatch {
        /// Inputs sent.
        sent: usize,
        /// Embeddings received.
        got: usize,
    },
    /// The built-in model refused or failed (its own typed error; validation and tokenizer
    /// errors blame an input).
    #[error("{0}")]
    Model(EmbedError),
    /// The task running the call panicked or was cancelled: 500-class `Backend` for exactly the
    /// requests of that call.
    #[error("upstream call crashed: {0}")]
    Crashed(String),
}

impl UpstreamError {
    /// `true` when an input of the batch is at fault (TEI's 400/413/422, the model's validation
    /// or tokenizer errors): the batcher then retries the batch's requests apart to isolate it.
    pub fn blames_input(&self) -> bool {
        match self {
            UpstreamError::Status { status, .. } | UpstreamError::Http { status, .. } => {
                matches!(status, 400 | 413 | 422)
            }
            UpstreamError::Model(err) => matches!(err.status(), 400 | 413 | 422),
            _ => false,
        }
    }

    /// `true` when the failure says the upstream itself is unwell: unreachable, TLS failing,
    /// timed out, a 5xx, or a reply that is not TEI's shape. An upstream's 429 (busy), an input
    /// it rejects, or a crash of our own call task are not. Counted for queue-group membership
    /// (the worker's `membership`, through [`crate::BatcherHandle::failures`]).
    pub fn is_unhealthy(&self) -> bool {
        match self {
            UpstreamError::Unreachable(_)
            | UpstreamError::Tls(_)
            | UpstreamError::Timeout(_)
            | UpstreamError::Malformed(_)
            | UpstreamError::CountMismatch { .. } => true,
            UpstreamError::Status { status, .. } | UpstreamError::Http { status, .. } => {
                *status >= 500
            }
            UpstreamError::Model(_) | UpstreamError::Crashed(_) => false,
        }
    }
}

impl From<UpstreamError> for EmbedError {
    fn from(err: UpstreamError) -> EmbedError {
        match err {
            UpstreamError::Unreachable(_) | UpstreamError::Tls(_) => {
                EmbedError::Unavailable(err.to_string())
            }
            UpstreamError::Status { status, response } => {
                // TEI's own statuses pass through; another 5xx is the backend failing (424).
                let status = if (400..500).contains(&status) || matches!(status, 503 | 424) {
                    status
                } else {
                    424
                };
                EmbedError::Remote { status, response }
            }
            UpstreamError::Http { status: 503, .. } => EmbedError::Unavailable(err.to_string()),
            UpstreamError::Http { status, .. } if (400..500).contains(&status) => {
                EmbedError::Remote {
                    status,
                    response: ErrorResponse {
                        error: err.to_string(),
                        error_type: embatch_protocol::ErrorType::for_status(status),
                    },
                }
            }
            UpstreamError::Model(err) => err,
            UpstreamError::Timeout(_)
            | UpstreamError::Http { .. }
            | UpstreamError::Malformed(_)
            | UpstreamError::CountMismatch { .. }
            | UpstreamError::Crashed(_) => EmbedError::Backend(err.to_string()),
        }
    }
}

/// An embedding backend the batcher sends whole batches to.
pub trait Backend: Send + Sync + 'static {
    /// Embeds `inputs` (at most [`Backend::max_batch_size`] of them) with `options`.
    /// Returns exactly one embedding per input, in order. With [`embatch_protocol::Task::Rerank`]
    /// options the inputs are (query, text) pairs and each "embedding" is the pair's score as a
    /// one-element array (`[0.93]`), so the batcher, the cache and the reply assembly treat
    /// scores as they treat vectors. With [`embatch_protocol::Task::Sparse`] each "embedding" is
    /// the input's sparse embedding as TEI's `/embed_sparse` writes it (`[{"index", "value"},
    /// ...]`); an upstream without sparse output answers TEI's 424
    /// ([`embatch_protocol::sparse::NOT_SPLADE`]).
    ///
    /// # Errors
    /// Why the call failed ([`UpstreamError`]); [`UpstreamError::blames_input`] says whether the
    /// batcher bisects the batch.
    fn embed(
        &self,
        inputs: &[Input],
        options: &EmbedOptions,
    ) -> impl Future<Output = Result<Vec<Embedding>, UpstreamError>> + Send;

    /// The most inputs one call may carry (TEI's `max_client_batch_size`); larger requests are
    /// split across calls and reassembled.
    fn max_batch_size(&self) -> usize;
}
