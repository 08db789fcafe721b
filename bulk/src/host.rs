//! What the bulk lane takes from the worker that runs it, besides the batcher's [`BulkGate`]:
//! who owns a batch ([`Owners`]) and how a line's tokens are counted ([`TokenCounter`]). The
//! worker implements both on its own types (its tenant policy, its token counter), so this
//! crate never depends on the worker.

use std::sync::Arc;

use embatch_batcher::{BulkGate, Share};
use embatch_protocol::{EmbedError, EmbedOptions, Input};
use futures::future::BoxFuture;

/// The owner of a batch as the worker serves it.
#[derive(Debug, Clone)]
pub struct Owner {
    /// Its share of the upstream: the batch's inputs are shared with other tenants' by its
    /// weight, and its usage is recorded under its tenant's name ([`Share::tenant`]).
    pub share: Share,
    /// Its `tenant` label on the worker's metrics (bounded by the worker's configuration).
    pub label: Arc<str>,
}

/// The tenants a batch can belong to: the worker's tenant policy.
pub trait Owners: Send + Sync {
    /// The owner of a batch whose record names the tenant `owner`
    /// (`embatch_protocol::bulk::BatchRecord::owner`).
    fn batch_owner(&self, owner: &str) -> Owner;

    /// Counts one line of `owner`'s batch on the worker's per-tenant metrics: answered with
    /// HTTP-style `status` (200, or the status of the error that ended it); `counts` are its
    /// inputs and, when they were counted, its tokens.
    fn count_line(&self, owner: &Owner, status: u16, counts: (usize, Option<u64>));
}

/// A line's inputs once their tokens are counted: what the batcher takes.
#[derive(Debug)]
pub struct Counted {
    /// The inputs, as received.
    pub inputs: Vec<Input>,
    /// The line's options (its batching key).
    pub options: EmbedOptions,
    /// Tokens per input, in input order (1 per input when the worker counts inputs only).
    pub lengths: Vec<u32>,
    /// The line's tokens, or `None` when inputs were counted, not tokens (never an estimate):
    /// an OpenAI line's `usage` and the owner's usage.
    pub tokens: Option<u64>,
}

/// Counts a line's tokens as the worker counts an interactive request's.
pub trait TokenCounter: Send + Sync {
    /// Counts the tokens of `inputs` under `options`.
    ///
    /// # Errors
    /// The [`EmbedError`] the worker would answer an interactive request with (an input over
    /// the model's limit, a tokenizer failure: 422; the worker stopping: 503): the line's
    /// outcome, as the batcher's would be.
    fn count_tokens(
        &self,
        inputs: Vec<Input>,
        options: EmbedOptions,
    ) -> BoxFuture<'_, Result<Counted, EmbedError>>;
}

/// What [`crate::run`] takes from the worker: the batcher's bulk entry and the two hooks above.
#[derive(Clone)]
pub struct Host {
    /// Lines go to the batcher through it.
    pub gate: BulkGate,
    /// Counts each line's tokens, for batching and for the line's `usage`.
    pub tokens: Arc<dyn TokenCounter>,
    /// Decides each batch's owner and counts its lines under it.
    pub owners: Arc<dyn Owners>,
}
