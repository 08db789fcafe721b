//! A request from acceptance to answer: what the actor keeps of it, the relay to its caller,
//! and the delivery of its outcome.

use std::sync::Arc;

use embatch_protocol::EmbedError;
use futures::future::BoxFuture;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::meters::Meters;
use crate::Embedding;
use crate::names;
use crate::{BulkOutcome, Outcome, Reply};

/// An accepted request until it is answered.
pub(super) struct Pending {
    pub(super) results: Vec<Option<Embedding>>,
    pub(super) received: usize,
    pub(super) accepted: Instant,
    pub(super) first_call: Option<Instant>,
    /// To the request's relay (see [`relay`]).
    pub(super) reply: ReplyTo,
    pub(super) span: tracing::Span,
    /// Bytes of input text: with `results.len()` inputs, its share of the bounds (0 for bulk).
    pub(super) bytes: usize,
    /// Its tenant.
    pub(super) tenant: Arc<str>,
}

/// Where a request's outcome goes: an interactive caller (its [`Reply`]), or the bulk
/// lane (the embeddings themselves; a bulk request holds no share of the bounds).
pub(super) enum ReplyTo {
    Interactive(oneshot::Sender<Outcome>),
    Bulk(oneshot::Sender<BulkOutcome>),
}

impl Pending {
    /// A request of `inputs` inputs accepted at `accepted`, none answered yet.
    pub(super) fn new(
        inputs: usize,
        accepted: Instant,
        reply: ReplyTo,
        span: tracing::Span,
    ) -> Pending {
        Pending {
            results: (0..inputs).map(|_| None).collect(),
            received: 0,
            accepted,
            first_call: None,
            reply,
            span,
            bytes: 0,
            tenant: Arc::from(""),
        }
    }

    /// Of `bytes` bytes of input text, for `tenant`.
    pub(super) fn of(self, bytes: usize, tenant: Arc<str>) -> Pending {
        Pending {
            bytes,
            tenant,
            ..self
        }
    }

    pub(super) fn is_bulk(&self) -> bool {
        matches!(self.reply, ReplyTo::Bulk(_))
    }
}

/// Forwards the actor's answer to the caller's receiver; resolves to `Some(id)` when the caller
/// dropped its receiver first (the request is cancelled).
pub(super) fn relay<T: Send + 'static>(
    id: u64,
    answer: oneshot::Receiver<T>,
    mut caller: oneshot::Sender<T>,
) -> BoxFuture<'static, Option<u64>> {
    Box::pin(async move {
        tokio::select! {
            biased;
            outcome = answer => {
                if let Ok(outcome) = outcome {
                    let _ = caller.send(outcome);
                }
                None
            }
            () = caller.closed() => Some(id),
        }
    })
}

/// A request's embeddings in order, each input's own; an error names the first input without
/// one (a bug: a request is answered once every input has a result).
fn collect(results: Vec<Option<Embedding>>) -> Result<Vec<Embedding>, EmbedError> {
    results
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            v.ok_or_else(|| EmbedError::Backend(format!("missing embedding for input {i}")))
        })
        .collect()
}

/// Delivers a request's outcome (the caller may have gone away: nothing to do then): its
/// embeddings once every input has one (`Ok(now)`), or the error that ends it. An interactive
/// outcome is recorded in the request metrics; a bulk one is the bulk lane's to count.
pub(super) fn answer(meters: &Meters, request: Pending, result: Result<Instant, EmbedError>) {
    let Pending {
        results,
        accepted,
        first_call,
        reply,
        span,
        ..
    } = request;
    match reply {
        ReplyTo::Bulk(reply) => {
            let _ = reply.send(result.and_then(|_| collect(results)));
        }
        ReplyTo::Interactive(reply) => {
            let outcome = result.and_then(|now| {
                let first_call = first_call.unwrap_or(now);
                Ok(Reply {
                    embeddings: collect(results)?,
                    queue_time: first_call - accepted,
                    inference_time: now - first_call,
                })
            });
            let label = match &outcome {
                Ok(_) => "ok",
                Err(e) => e.kind(),
            };
            span.record("outcome", label);
            match &outcome {
                Ok(_) => meters.requests_ok.increment(1),
                Err(_) => metrics::counter!(names::REQUESTS, "outcome" => label).increment(1),
            }
            meters.request_time.record(accepted.elapsed().as_secs_f64());
            let _ = reply.send(outcome);
        }
    }
}
