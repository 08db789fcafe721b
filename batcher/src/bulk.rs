//! The bulk lane's way into the batcher ([`BulkGate`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use embatch_protocol::{EmbedError, EmbedOptions, Input};
use tokio::sync::{mpsc, oneshot};

use crate::{BatcherHandle, BulkJob, Embedding, Sent, Share, Shared, estimate_lengths, stopped};

/// The outcome of a bulk request: an embedding per input, in order, or the error of the call
/// that carried it (the batcher's own isolation already split a rejected call by request).
pub type BulkOutcome = Result<Vec<Embedding>, EmbedError>;

/// The bulk lane's way into the batcher (the worker's bulk jobs): bulk requests share the
/// interactive batches' upstream calls without competing with interactive requests.
///
/// A bulk request is queued apart from interactive ones and holds no share of the admission
/// bounds (`QUEUE_CAP`, `MAX_QUEUE_BYTES`, `MAX_QUEUE_DELAY`), so it never causes a 429. Its
/// inputs leave in two ways:
/// - they fill the room an interactive batch of the same options leaves (up to the batch limit
///   and the token budget), so interactive traffic below capacity carries bulk inputs at the
///   cost of the call's per-input time only;
/// - as a batch of their own, only while nothing interactive is queued or on its way to the
///   actor: on an idle upstream while interactive requests arrive (one arriving then waits
///   behind at most that one call), and under up to [`BulkGate::limit_calls`] calls in flight
///   once none arrived for 10 call times (so a bulk job alone keeps the upstream busy back to
///   back; the first interactive request after such a spell may wait behind that many calls).
///
/// It holds a weak sender, so it never keeps the actor alive.
#[derive(Clone)]
pub struct BulkGate {
    tx: mpsc::WeakUnboundedSender<Sent>,
    shared: Arc<Shared>,
}

impl BulkGate {
    /// Sets the most calls in flight (interactive and bulk alike) under which a batch of bulk
    /// inputs alone may start (`BULK_CALLS`, at least 1, at most `MAX_CONCURRENT_BATCHES`).
    pub fn limit_calls(&self, calls: usize) {
        self.shared
            .bulk_calls
            .store(calls.max(1), Ordering::Relaxed);
    }

    /// Embeds `inputs` (token counts `lengths`, or [`estimate_lengths`] when they do not hold
    /// one per input) with `options` as a bulk request: waits until the batcher has sent them
    /// (see [`BulkGate`]) and returns an embedding per input, in order. Dropping the future
    /// cancels the inputs not yet sent.
    ///
    /// # Errors
    /// The [`EmbedError`] of the upstream call that carried the request (a rejected input's
    /// request alone gets the rejection, as for interactive requests), or
    /// [`EmbedError::Unavailable`] when the batcher has stopped.
    pub async fn embed(
        &self,
        inputs: Vec<Input>,
        lengths: Vec<u32>,
        options: EmbedOptions,
    ) -> BulkOutcome {
        self.embed_as(Share::default(), inputs, lengths, options)
            .await
    }

    /// [`BulkGate::embed`] for the tenant of `share`: bulk inputs of several tenants are shared
    /// by weight too, behind every tenant's interactive traffic.
    ///
    /// # Errors
    /// As [`BulkGate::embed`].
    pub async fn embed_as(
        &self,
        share: Share,
        inputs: Vec<Input>,
        lengths: Vec<u32>,
        options: EmbedOptions,
    ) -> BulkOutcome {
        if inputs.is_empty() {
            return Ok(Vec::new());
        }
        let lengths = if lengths.len() == inputs.len() {
            lengths
        } else {
            estimate_lengths(&inputs)
        };
        let tx = self.tx.upgrade().ok_or_else(stopped)?;
        let (reply, rx) = oneshot::channel();
        tx.send(Sent::Bulk(BulkJob {
            inputs,
            lengths,
            options,
            share,
            reply,
        }))
        .map_err(|_| stopped())?;
        drop(tx);
        rx.await.unwrap_or_else(|_| Err(stopped()))
    }
}

impl BatcherHandle {
    /// The bulk lane's way into this batcher (see [`BulkGate`]).
    pub fn bulk_gate(&self) -> BulkGate {
        BulkGate {
            tx: self.tx.downgrade(),
            shared: Arc::clone(&self.shared),
        }
    }
}
