//! Upstreams: what turns a batch of inputs into embeddings.
//!
//! - [`tei::TeiUpstream`]: a text-embeddings-inference server over HTTP (`--tei-url`).
//! - [`local::LocalUpstream`]: the built-in CPU model (the default when no TEI URL is given).
//!
//! The batcher is generic over [`Upstream`], so its tests can use an in-process double.

pub mod local;
pub mod tei;

use std::future::Future;

use embatch_protocol::{EmbedError, EmbedOptions};
use serde_json::value::RawValue;

/// One embedding, kept as the raw JSON array text the upstream produced (`[0.1,-0.2,...]`), so the
/// worker slices an upstream reply into per-request replies without re-encoding any float.
pub type Embedding = Box<RawValue>;

/// Why an upstream call failed, split by whose fault it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    /// The upstream rejected the inputs (a 4xx such as 413 "input too long" or 422): one input is
    /// at fault, so the batcher retries the batch's requests apart to isolate it.
    #[error("{0}")]
    Rejected(EmbedError),
    /// The upstream itself failed (refused, 5xx, timeout, malformed reply): every request of the
    /// call fails with this error (`Unavailable` 503 or `Backend` 424).
    #[error("{0}")]
    Failed(EmbedError),
}

impl From<UpstreamError> for EmbedError {
    fn from(err: UpstreamError) -> EmbedError {
        match err {
            UpstreamError::Rejected(e) | UpstreamError::Failed(e) => e,
        }
    }
}

/// An embedding backend the batcher sends whole batches to.
pub trait Upstream: Send + Sync + 'static {
    /// Embeds `inputs` (at most [`Upstream::max_batch_size`] of them) with `options`.
    /// Returns exactly one embedding per input, in order.
    fn embed(
        &self,
        inputs: &[String],
        options: &EmbedOptions,
    ) -> impl Future<Output = Result<Vec<Embedding>, UpstreamError>> + Send;

    /// The most inputs one call may carry (TEI's `max_client_batch_size`); larger requests are
    /// split across calls and reassembled.
    fn max_batch_size(&self) -> usize;
}

/// The upstream chosen by configuration.
pub enum AnyUpstream {
    /// See [`tei::TeiUpstream`].
    Tei(tei::TeiUpstream),
    /// See [`local::LocalUpstream`].
    Local(local::LocalUpstream),
}

impl Upstream for AnyUpstream {
    async fn embed(
        &self,
        inputs: &[String],
        options: &EmbedOptions,
    ) -> Result<Vec<Embedding>, UpstreamError> {
        match self {
            AnyUpstream::Tei(u) => u.embed(inputs, options).await,
            AnyUpstream::Local(u) => u.embed(inputs, options).await,
        }
    }

    fn max_batch_size(&self) -> usize {
        match self {
            AnyUpstream::Tei(u) => u.max_batch_size(),
            AnyUpstream::Local(u) => u.max_batch_size(),
        }
    }
}
