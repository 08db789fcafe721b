//! A request's work after admission, in its reply task: look up, count, submit, wait for the
//! batcher and for equal inputs in flight, assemble the reply body.

use embatch_protocol::{EmbedError, EmbedOptions, Input};
use tokio::time::Instant;

use crate::batcher::{BatcherHandle, Outcome, Reply, Share};
use crate::cache::{Answered, Cache, Plan};
use crate::tokens::{Counter, Reservation};

/// A request's misses: submitted by the intake, or to be submitted by the reply task.
pub(super) enum Submitted {
    /// Submitted (counting was immediate); `None` when there was nothing to submit.
    Now(Option<tokio::sync::oneshot::Receiver<Outcome>>),
    /// To be looked up in the shared bucket, counted and submitted by the reply task, holding
    /// the misses' room among the inputs waiting to be counted.
    Later(Option<Reservation>),
}

/// What a request's reply task does: look up, count, submit, wait, assemble.
pub(super) struct Work {
    pub(super) plan: Plan,
    pub(super) submitted: Submitted,
    /// The request's inputs, as received; emptied when moved to the batcher
    /// ([`take_misses`]).
    pub(super) inputs: Vec<Input>,
    pub(super) options: EmbedOptions,
    pub(super) deadline: Instant,
    /// Its tenant's share of the upstream.
    pub(super) share: Share,
    pub(super) counter: Counter,
    /// Present while the task may still submit: misses not yet submitted, or inputs in flight
    /// for other requests that it may have to send itself.
    pub(super) batcher: Option<BatcherHandle>,
}

/// The timing of the batcher's answer, when the request had one.
pub(super) type Timing = Option<(std::time::Duration, std::time::Duration)>;

impl Work {
    /// Serves the request: its shared reads, its misses upstream (through the batcher), its
    /// waits for inputs in flight elsewhere (sending those itself whose leader ended without a
    /// result), then its reply body.
    ///
    /// # Errors
    /// The count's error (422 over the limit with `truncate: false`, ...), the batcher's
    /// refusal or outcome, 504 when the deadline passes while it waits.
    /// Also returns whether the batcher answered (and so counted) the request's outcome in
    /// `embatch_worker_requests_total`.
    pub(super) async fn run(self, cache: &Cache) -> (Result<(Answered, Timing), EmbedError>, bool) {
        let mut batcher_answered = false;
        let outcome = self.serve(cache, &mut batcher_answered).await;
        (outcome, batcher_answered)
    }

    async fn serve(
        self,
        cache: &Cache,
        batcher_answered: &mut bool,
    ) -> Result<(Answered, Timing), EmbedError> {
        let Work {
            mut plan,
            submitted,
            mut inputs,
            options,
            deadline,
            share,
            counter,
            batcher,
        } = self;
        let (receiver, lengths) = match submitted {
            Submitted::Now(receiver) => (receiver, None),
            Submitted::Later(_reservation) => {
                if plan.reads_shared(cache) {
                    plan.read_shared(cache).await;
                }
                let misses = take_misses(&plan, &mut inputs);
                if misses.is_empty() {
                    (None, None)
                } else {
                    let (receiver, lengths) = submit(
                        &counter,
                        (batcher.as_ref(), &share),
                        misses,
                        &options,
                        deadline,
                    )
                    .await?;
                    (Some(receiver), lengths)
                }
            }
        };
        let mut timing = None;
        if let Some(receiver) = receiver {
            *batcher_answered = true;
            let reply = receive(receiver).await?;
            timing = Some((reply.queue_time, reply.inference_time));
            plan.complete_leads(reply.embeddings, lengths.as_deref())?;
        }
        let abandoned = plan.wait(deadline).await?;
        if !abandoned.is_empty() {
            let (positions, retried): (Vec<usize>, Vec<_>) = abandoned.into_iter().unzip();
            let (receiver, lengths) = submit(
                &counter,
                (batcher.as_ref(), &share),
                retried,
                &options,
                deadline,
            )
            .await?;
            *batcher_answered = true;
            let reply = receive(receiver).await?;
            timing = timing.or(Some((reply.queue_time, reply.inference_time)));
            plan.complete_retried(&positions, reply.embeddings, lengths.as_deref())?;
        }
        Ok((plan.answer()?, timing))
    }
}

/// Counts `inputs` and submits them to `batcher` for the tenant of `share`: the receiver of
/// their outcome, and their token counts when a tokenizer counted them.
///
/// # Errors
/// The count's error, the batcher's refusal; 503 without a batcher (cannot happen: a task
/// that may submit holds one).
async fn submit(
    counter: &Counter,
    (batcher, share): (Option<&BatcherHandle>, &Share),
    inputs: Vec<Input>,
    options: &EmbedOptions,
    deadline: Instant,
) -> Result<(tokio::sync::oneshot::Receiver<Outcome>, Option<Vec<u32>>), EmbedError> {
    let batcher =
        batcher.ok_or_else(|| EmbedError::Unavailable("the worker is shutting down".into()))?;
    let counted = counter.count(inputs, options.clone()).await?;
    let lengths = counted.tokens().is_some().then(|| counted.lengths.clone());
    // The seam to the token budget: `counted.lengths`, one count per input.
    let receiver = batcher.submit_as(
        share.clone(),
        (counted.inputs, counted.lengths),
        counted.options,
        deadline,
    )?;
    Ok((receiver, lengths))
}

/// The inputs of `plan`'s misses, in order, for the batcher: moved out of `inputs` when every
/// input is a miss (the common case, and the one that matters for a large input: a 2 MiB text
/// is not copied), else copied ([`Plan::miss_inputs`]). `inputs` is not read afterwards.
pub(super) fn take_misses(plan: &Plan, inputs: &mut Vec<Input>) -> Vec<Input> {
    // Every input a miss: the leads are the inputs, in order (see `Cache::plan`).
    if plan.misses() == inputs.len() {
        std::mem::take(inputs)
    } else {
        plan.miss_inputs(inputs)
    }
}

/// The batcher's outcome.
async fn receive(receiver: tokio::sync::oneshot::Receiver<Outcome>) -> Result<Reply, EmbedError> {
    receiver.await.unwrap_or_else(|_| {
        Err(EmbedError::Unavailable(
            "the worker stopped before answering".into(),
        ))
    })
}

/// A request that passed parsing and validation: what its reply task counts and submits.
pub(super) struct Parsed {
    pub(super) inputs: Vec<Input>,
    pub(super) options: EmbedOptions,
    /// When its deadline passes.
    pub(super) deadline: Instant,
    /// How to shape its reply, when not as assembled (rerank, predict, similarity, embed_all).
    pub(super) shape: Option<super::shape::Shape>,
}
