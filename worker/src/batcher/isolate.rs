//! One batch's upstream work: the call, and the bisection of a batch the upstream rejected
//! because of an input ([`UpstreamError::blames_input`]).
//!
//! No metrics here: every call is reported in [`Done::calls`] and the actor records them.

use std::ops::Range;
use std::time::Duration;

use embatch_protocol::{EmbedError, EmbedOptions, Input};
use tokio::time::Instant;

use super::queue::Segment;
use crate::upstream::{Embedding, Upstream, UpstreamError};

/// How one upstream call ended (the `outcome` label of `embatch_worker_upstream_calls_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CallOutcome {
    /// Embeddings for every input.
    Ok,
    /// An input is at fault (400/413/422).
    Rejected,
    /// The upstream failed (unreachable, 5xx, timeout, malformed reply).
    Failed,
}

impl CallOutcome {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            CallOutcome::Ok => "ok",
            CallOutcome::Rejected => "rejected",
            CallOutcome::Failed => "failed",
        }
    }
}

/// One upstream call of a batch.
#[derive(Debug, Clone, Copy)]
pub(super) struct Call {
    /// Duration of the call.
    pub elapsed: Duration,
    /// How it ended.
    pub outcome: CallOutcome,
    /// Whether it failed in a way that says the upstream is unhealthy (refused, 5xx, timeout,
    /// malformed reply; see [`UpstreamError::is_unhealthy`]), for queue-group membership.
    pub unhealthy: bool,
}

/// What a batch task hands back to the actor.
pub(super) struct Done {
    /// Each segment's embeddings, or the error that ends its request.
    pub results: Vec<(Segment, Result<Vec<Embedding>, EmbedError>)>,
    /// Every call made, in order; the first carried the whole batch.
    pub calls: Vec<Call>,
}

impl Done {
    /// Duration of the first (whole-batch) call when it succeeded: the estimate's sample.
    pub fn clean_call(&self) -> Option<Duration> {
        self.calls
            .first()
            .filter(|c| c.outcome == CallOutcome::Ok)
            .map(|c| c.elapsed)
    }
}

/// Sends `inputs` upstream once; when the upstream blames an input of a batch of several
/// requests, bisects by request and retries each half until the offending requests are
/// isolated (at most about 2 × log2(requests) extra calls per offending request).
pub(super) async fn run_batch<U: Upstream>(
    upstream: &U,
    inputs: &[Input],
    options: &EmbedOptions,
    segments: Vec<Segment>,
) -> Done {
    let mut results: Vec<Option<Result<Vec<Embedding>, EmbedError>>> =
        segments.iter().map(|_| None).collect();
    let mut calls = Vec::with_capacity(1);
    // Segment ranges still to send, as a stack: the whole batch first, then halves.
    let mut work: Vec<Range<usize>> = Vec::with_capacity(8);
    work.push(0..segments.len());
    while let Some(range) = work.pop() {
        let (Some(head), Some(tail)) = (
            segments.get(range.start),
            segments.get(range.end.saturating_sub(1)),
        ) else {
            continue;
        };
        let span = head.at..tail.at + tail.len;
        let Some(batch) = inputs.get(span.clone()) else {
            continue;
        };
        let started = Instant::now();
        let outcome = upstream.embed(batch, options).await;
        let mut call = Call {
            elapsed: started.elapsed(),
            outcome: CallOutcome::Ok,
            unhealthy: false,
        };
        match outcome {
            Ok(mut vectors) if vectors.len() == batch.len() => {
                // Split from the back so each segment takes its own tail of the reply.
                for index in range.rev() {
                    let own = vectors.split_off(segments[index].at - span.start);
                    results[index] = Some(Ok(own));
                }
            }
            Ok(vectors) => {
                call.outcome = CallOutcome::Failed;
                call.unhealthy = true;
                let err = EmbedError::from(UpstreamError::CountMismatch {
                    sent: batch.len(),
                    got: vectors.len(),
                });
                fill(&mut results[range], &err);
            }
            Err(err) if err.blames_input() && range.len() > 1 => {
                call.outcome = CallOutcome::Rejected;
                tracing::debug!(%err, requests = range.len(), "upstream rejected a mixed batch; isolating");
                let mid = range.start + range.len() / 2;
                work.push(mid..range.end);
                work.push(range.start..mid);
            }
            Err(err) => {
                call.outcome = if err.blames_input() {
                    CallOutcome::Rejected
                } else {
                    CallOutcome::Failed
                };
                call.unhealthy = err.is_unhealthy();
                tracing::debug!(%err, requests = range.len(), "upstream call failed");
                fill(&mut results[range], &EmbedError::from(err));
            }
        }
        calls.push(call);
    }
    let results = segments
        .into_iter()
        .zip(results)
        .map(|(segment, result)| {
            let result = result.unwrap_or_else(|| {
                Err(EmbedError::Backend(
                    "no upstream result for this request".into(),
                ))
            });
            (segment, result)
        })
        .collect();
    Done { results, calls }
}

fn fill(slots: &mut [Option<Result<Vec<Embedding>, EmbedError>>], err: &EmbedError) {
    for slot in slots {
        *slot = Some(Err(err.clone()));
    }
}
