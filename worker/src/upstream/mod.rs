//! Upstreams: what turns a batch of inputs into embeddings.
//!
//! - [`tei::TeiUpstream`]: a text-embeddings-inference server over HTTP (`--tei-url`).
//! - [`local::LocalUpstream`]: the built-in CPU model (the default when no TEI URL is given).
//! - [`openai::OpenAiUpstream`]: an OpenAI-compatible `/v1/embeddings` server (`--openai-url`).
//!
//! The batcher is generic over [`Upstream`], so its tests can use an in-process double.

mod body;
mod classify;
mod http;
pub mod local;
mod local_route;
pub mod openai;
mod openai_reply;
pub mod replicas;
mod rerank;
pub mod route;
mod sparse;
pub mod tei;

use std::future::Future;

use embatch_protocol::{EmbedOptions, Input};

pub use embatch_batcher::{Backend, Embedding, ShapeError, UpstreamError};

/// An embedding backend as the worker uses it: the batcher's [`Backend`] (`embed`,
/// `max_batch_size`) and what only the worker asks of it.
pub trait Upstream: Backend {
    /// The upstream's description in the shape of TEI's `GET /info` (`model_id`,
    /// `max_input_length`, `max_client_batch_size`, ...), answered on the worker's `info`
    /// endpoint (see `crate::info`).
    ///
    /// The default, for upstreams that know nothing of themselves (test doubles), is a document
    /// with `model_id` `"unknown"` and [`Backend::max_batch_size`] as `max_client_batch_size`.
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
    /// The failure, as for [`Backend::embed`]: unreachable, a timeout, an error status.
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

    /// Whether the upstream can answer unnormalized vectors (`normalize: false`). TEI and the
    /// built-in model can; an OpenAI-compatible server cannot (the API has no such field), so
    /// `/similarity`, whose cosines are the same for unit vectors, asks it for normalized ones
    /// (see `crate::intake::ClassifyRoutes::normalizing_similarity`).
    ///
    /// The default, for upstreams in this process (test doubles), is `true`.
    fn unnormalized(&self) -> bool {
        true
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
    /// See [`openai::OpenAiUpstream`].
    OpenAi(openai::OpenAiUpstream),
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
            AnyUpstream::OpenAi(u) => u.embed(inputs, options).await,
        }
    }
}

/// TEI's routes on TEI; on the built-in model, its own tokenizer answers them (an OpenAI
/// upstream has none: see [`Upstream::route_caller`] below).
impl route::RouteCaller for AnyUpstream {
    fn call(&self, route: &'static str, body: bytes::Bytes) -> route::RouteCall<'_> {
        match self {
            AnyUpstream::Tei(u) => u.call(route, body),
            AnyUpstream::Local(u) => local_route::call(u.encoder(), route, body),
            AnyUpstream::OpenAi(_) => Box::pin(async move {
                let _ = body;
                Err(UpstreamError::Http {
                    status: 404,
                    body: format!("an OpenAI-compatible upstream has no /{route}"),
                })
            }),
        }
    }
}

impl Backend for AnyUpstream {
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
            AnyUpstream::OpenAi(_) => "openai",
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
            AnyUpstream::OpenAi(u) => u.max_batch_size(),
        }
    }
}

impl Upstream for AnyUpstream {
    /// TEI's `/tokenize` and `/decode` on TEI and the built-in model; none on an OpenAI upstream
    /// (the worker answers them 424 naming the route).
    fn route_caller(self: std::sync::Arc<Self>) -> Option<std::sync::Arc<dyn route::RouteCaller>> {
        match *self {
            AnyUpstream::OpenAi(_) => None,
            _ => Some(self),
        }
    }

    fn unnormalized(&self) -> bool {
        match self {
            AnyUpstream::Tei(u) => u.unnormalized(),
            AnyUpstream::Local(u) => u.unnormalized(),
            AnyUpstream::OpenAi(u) => u.unnormalized(),
        }
    }

    async fn info(&self) -> Result<serde_json::Value, UpstreamError> {
        match self {
            AnyUpstream::Tei(u) => u.info().await,
            AnyUpstream::Local(u) => u.info().await,
            AnyUpstream::OpenAi(u) => u.info().await,
        }
    }

    async fn health(&self) -> Result<(), UpstreamError> {
        match self {
            AnyUpstream::Tei(u) => u.health().await,
            AnyUpstream::Local(u) => u.health().await,
            AnyUpstream::OpenAi(u) => u.health().await,
        }
    }

    async fn counter(&self, lookup: &crate::tokens::TokenizerLookup) -> crate::tokens::Counter {
        match self {
            AnyUpstream::Tei(u) => u.counter(lookup).await,
            AnyUpstream::Local(u) => u.counter(lookup).await,
            AnyUpstream::OpenAi(u) => u.counter(lookup).await,
        }
    }
}
