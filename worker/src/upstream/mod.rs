//! Upstreams: what turns a batch of inputs into embeddings.
//!
//! - [`tei::TeiUpstream`]: a text-embeddings-inference server over HTTP (`--tei-url`).
//! - [`local::LocalUpstream`]: the built-in CPU model (the default when no TEI URL is given).
//!
//! The batcher is generic over [`Upstream`], so its tests can use an in-process double.

mod body;
mod classify;
mod embedding;
pub mod local;
mod local_route;
mod rerank;
pub mod route;
mod sparse;
pub mod tei;

use std::future::Future;

use embatch_protocol::{EmbedError, EmbedOptions, ErrorResponse, Input};

pub use embedding::{Embedding, ShapeError};

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
    /// (see `crate::membership`).
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
pub trait Upstream: Send + Sync + 'static {
    /// Embeds `inputs` (at most [`Upstream::max_batch_size`] of them) with `options`.
    /// Returns exactly one embedding per input, in order. With [`embatch_protocol::Task::Rerank`]
    /// options the inputs are (query, text) pairs and each "embedding" is the pair's score as a
    /// one-element array (`[0.93]`), so the batcher, the cache and the reply assembly treat
    /// scores as they treat vectors. With [`embatch_protocol::Task::Sparse`] each "embedding" is
    /// the input's sparse embedding as TEI's `/embed_sparse` writes it (`[{"index", "value"},
    /// ...]`); an upstream without sparse output answers TEI's 424
    /// ([`embatch_protocol::sparse::NOT_SPLADE`]).
    fn embed(
        &self,
        inputs: &[Input],
        options: &EmbedOptions,
    ) -> impl Future<Output = Result<Vec<Embedding>, UpstreamError>> + Send;

    /// The most inputs one call may carry (TEI's `max_client_batch_size`); larger requests are
    /// split across calls and reassembled.
    fn max_batch_size(&self) -> usize;

    /// The upstream's description in the shape of TEI's `GET /info` (`model_id`,
    /// `max_input_length`, `max_client_batch_size`, ...), answered on the worker's `info`
    /// endpoint (see `crate::info`).
    ///
    /// The default, for upstreams that know nothing of themselves (test doubles), is a document
    /// with `model_id` `"unknown"` and [`Upstream::max_batch_size`] as `max_client_batch_size`.
    ///
    /// # Errors
    /// When the upstream's own description cannot be read (TEI unreachable or answering an
    /// error).
    fn info(&self) -> impl Future<Output = Result<serde_json::Value, UpstreamError>> + Send {
        let max_client_batch_size = self.max_batch_size();
        async move {
            Ok(serde_json::json!({
                "model_id": "unknown",
                "max_client_batch_size": max_client_batch_size,
            }))
        }
    }

    /// Whether the upstream is healthy now: TEI's `GET /health` (200 when its model answers),
    /// probed by the worker to leave and rejoin its queue group (see `crate::membership`).
    ///
    /// The default, for upstreams in this process (the built-in model, test doubles), is always
    /// healthy.
    ///
    /// # Errors
    /// The failure, as for [`Upstream::embed`]: unreachable, a timeout, an error status.
    fn health(&self) -> impl Future<Output = Result<(), UpstreamError>> + Send {
        async { Ok(()) }
    }

    /// How the worker counts this upstream's tokens before batching (see [`crate::tokens`]),
    /// decided once at start: the built-in model's own tokenizer; for TEI, the tokenizer
    /// `lookup` finds for its model, else its `POST /tokenize`, else none.
    ///
    /// The default, for upstreams that know no tokenizer (test doubles), counts inputs.
    fn counter(
        &self,
        lookup: &crate::tokens::TokenizerLookup,
    ) -> impl Future<Output = crate::tokens::Counter> + Send {
        let _ = lookup;
        async { crate::tokens::Counter::inputs() }
    }

    /// What serves TEI's pass-through routes (`/tokenize`, `/decode`, see [`route`]) for this
    /// upstream. The default, for upstreams without them (test doubles), is `None`: the worker
    /// answers those routes 424 naming the route.
    fn route_caller(self: std::sync::Arc<Self>) -> Option<std::sync::Arc<dyn route::RouteCaller>> {
        None
    }
}

/// The upstream chosen by configuration.
pub enum AnyUpstream {
    /// See [`tei::TeiUpstream`].
    Tei(tei::TeiUpstream),
    /// See [`local::LocalUpstream`].
    Local(local::LocalUpstream),
}

impl AnyUpstream {
    /// One call to the chosen upstream ([`Upstream::embed`] without its span).
    async fn call(
        &self,
        inputs: &[Input],
        options: &EmbedOptions,
    ) -> Result<Vec<Embedding>, UpstreamError> {
        match self {
            AnyUpstream::Tei(u) => u.embed(inputs, options).await,
            AnyUpstream::Local(u) => u.embed(inputs, options).await,
        }
    }
}

/// TEI's routes on TEI; on the built-in model, its own tokenizer answers them.
impl route::RouteCaller for AnyUpstream {
    fn call(&self, route: &'static str, body: bytes::Bytes) -> route::RouteCall<'_> {
        match self {
            AnyUpstream::Tei(u) => u.call(route, body),
            AnyUpstream::Local(u) => local_route::call(u.encoder(), route, body),
        }
    }
}

impl Upstream for AnyUpstream {
    fn route_caller(self: std::sync::Arc<Self>) -> Option<std::sync::Arc<dyn route::RouteCaller>> {
        Some(self)
    }

    async fn embed(
        &self,
        inputs: &[Input],
        options: &EmbedOptions,
    ) -> Result<Vec<Embedding>, UpstreamError> {
        if !embatch_runtime::tracing_otel::enabled() {
            return self.call(inputs, options).await;
        }
        let kind = match self {
            AnyUpstream::Tei(_) => "tei",
            AnyUpstream::Local(_) => "local",
        };
        let span = crate::trace::upstream_call(kind, inputs.len());
        let result =
            tracing::Instrument::instrument(self.call(inputs, options), span.clone()).await;
        if let Err(err) = &result {
            crate::trace::upstream_failed(&span, err);
        }
        result
    }

    fn max_batch_size(&self) -> usize {
        match self {
            AnyUpstream::Tei(u) => u.max_batch_size(),
            AnyUpstream::Local(u) => u.max_batch_size(),
        }
    }

    async fn info(&self) -> Result<serde_json::Value, UpstreamError> {
        match self {
            AnyUpstream::Tei(u) => u.info().await,
            AnyUpstream::Local(u) => u.info().await,
        }
    }

    async fn health(&self) -> Result<(), UpstreamError> {
        match self {
            AnyUpstream::Tei(u) => u.health().await,
            AnyUpstream::Local(u) => u.health().await,
        }
    }

    async fn counter(&self, lookup: &crate::tokens::TokenizerLookup) -> crate::tokens::Counter {
        match self {
            AnyUpstream::Tei(u) => u.counter(lookup).await,
            AnyUpstream::Local(u) => u.counter(lookup).await,
        }
    }
}
