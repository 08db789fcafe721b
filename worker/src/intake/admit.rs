//! The admission half of the [`Admitter`]: parsing a request, planning it against the cache,
//! and handing it to the batcher, or answering it at once (a hit, or its error).

use std::sync::Arc;

use async_nats::Message;
use embatch_protocol::{EmbedError, EmbedRequest, headers};
use tokio::time::Instant;
use tracing::Instrument;

use super::reply::ReplyLimit;
use super::reply::{ReplyTask, served};
use super::shape::{self, Limit, Shape};
use super::work::{Parsed, Submitted, Work, take_misses};
use super::{Admitter, Arrival, budget};
use crate::batcher::Share;
use crate::cache::{Plan, Usage};
use crate::respond::Answer;
use crate::telemetry::{self, Traffic};
use crate::tenant::Caller;

impl Admitter {
    /// Admits one request into the batcher, or answers its error at once; its reply will be
    /// checked against (and teach) the reply limit.
    pub(super) async fn admit(&self, mut arrival: Arrival) {
        let payload = std::mem::take(&mut arrival.request.payload);
        let scope = &arrival.caller.tenant.cache_scope;
        let prepared = self.prepare(&arrival.request, &payload, arrival.received, scope);
        // The inputs are parsed (copied out): the body is not kept while the request waits,
        // only its reply subject and headers (a 2 MiB input is held once, not twice).
        drop(payload);
        self.admit_prepared(arrival, prepared).await;
    }

    /// [`Admitter::admit`] for a large body, in a task of its own: parsed and planned on the
    /// blocking pool, at most one per CPU at a time, so that the intake loop and the NATS
    /// connection keep their threads while it is.
    pub(super) async fn admit_large(self: Arc<Self>, mut arrival: Arrival) {
        let payload = std::mem::take(&mut arrival.request.payload);
        let mut request = arrival.request.clone();
        let received = arrival.received;
        let scope = arrival.caller.tenant.cache_scope.clone();
        let prepared = match self.parsing.acquire().await {
            Ok(_permit) => {
                let admitter = Arc::clone(&self);
                tokio::task::spawn_blocking(move || {
                    request.payload = payload;
                    admitter.prepare(&request, &request.payload, received, &scope)
                })
                .await
                .unwrap_or_else(|_| Err(EmbedError::Unavailable("the worker is stopping".into())))
            }
            Err(_) => Err(EmbedError::Unavailable("the worker is stopping".into())),
        };
        self.admit_prepared(arrival, prepared).await;
    }

    /// Parses and validates `request` (whose body is `payload`), and plans its inputs against
    /// the cache in its tenant's cache `scope`. CPU work: for a 2 MiB text, a copy and a
    /// SHA-256, a few milliseconds.
    ///
    /// # Errors
    /// As [`Admitter::parse`].
    fn prepare(
        &self,
        request: &Message,
        payload: &[u8],
        received: Instant,
        scope: &str,
    ) -> Result<(Parsed, Plan), EmbedError> {
        let parsed = self.parse(request, payload, received)?;
        let usage = Usage::from_header(embatch_client::header(request, headers::CACHE_CONTROL));
        let plan = self
            .serving
            .cache
            .plan(&parsed.inputs, &parsed.options, usage, scope);
        Ok((parsed, plan))
    }

    /// Admits a request [`Admitter::prepare`]d: answers it at once (its error, or every input
    /// a hit of the in-process LRU), or hands it over to the batcher and to its reply task.
    async fn admit_prepared(&self, arrival: Arrival, prepared: Result<(Parsed, Plan), EmbedError>) {
        let (request, received, wants_ack) =
            (&arrival.request, arrival.received, arrival.wants_ack);
        let caller = Some(&arrival.caller);
        let (parsed, plan) = match prepared {
            Ok(prepared) => prepared,
            Err(err) => return self.refuse(err, request, wants_ack, received, caller).await,
        };
        let inputs = parsed.inputs.len();
        let shape = parsed.shape.clone();
        if plan.is_answered() {
            return self
                .answer_at_once(
                    (plan, shape),
                    (inputs, &arrival.caller),
                    request,
                    wants_ack,
                    received,
                )
                .await;
        }
        // A copy resent after a loss is admitted by deadline (see `headers::ATTEMPT`).
        if embatch_client::header(request, headers::ATTEMPT).is_some() {
            self.serving.batcher.absorb_resent(inputs);
        }
        let share = crate::batcher::share_of(&arrival.caller.tenant);
        let work = match self.hand_over(parsed, plan, share) {
            Ok(work) => work,
            Err(err) => return self.refuse(err, request, wants_ack, received, caller).await,
        };
        let task = ReplyTask {
            work,
            inputs,
            reply_limit: self.limit_for(shape.as_ref()).cloned(),
            shape,
            arrival,
            client: self.serving.client.clone(),
            stats: self.serving.stats.clone(),
            cache: Arc::clone(&self.serving.cache),
            ack: wants_ack.then(|| self.acks.clone()),
        };
        crate::trace::admitted(received, None);
        self.serving
            .replies
            .spawn(task.run().instrument(crate::trace::current()));
    }

    /// Answers a request whose every input is a hit of the in-process LRU (or a repeat of one)
    /// at once, without the batch queue or admission.
    async fn answer_at_once(
        &self,
        (plan, shape): (Plan, Option<Shape>),
        (inputs, caller): (usize, &Caller),
        request: &Message,
        wants_ack: bool,
        received: Instant,
    ) {
        let limit = self.limit_for(shape.as_ref());
        let outcome = plan.answer().and_then(|answered| {
            if let Some(limit) = limit {
                limit.observe(inputs, answered.payload.len())?;
            }
            Ok(answered)
        });
        let outcome = shape::shaped(outcome, shape);
        let label = match &outcome {
            Ok(_) => "ok",
            Err(err) => err.kind(),
        };
        metrics::counter!(crate::telemetry::names::REQUESTS, "outcome" => label).increment(1);
        let (status, tokens) = outcome
            .as_ref()
            .map_or_else(|err| (err.status(), None), |a| (200, a.tokens));
        telemetry::count_tenant(
            &caller.label,
            Traffic::Interactive,
            status,
            (inputs, tokens),
        );
        let mut reply = served(outcome, None);
        if wants_ack {
            reply = reply.header(headers::ACK_DELAY_MS, &self.acks.delay_ms);
        }
        reply
            .send(&self.serving.client, request, &self.serving.stats, received)
            .await;
        metrics::histogram!(crate::telemetry::names::CACHE_HIT_TIME)
            .record(received.elapsed().as_secs_f64());
    }

    /// Answers `err` to `request` at once (refused before any work), counted.
    /// Counted per tenant when its tenant is known (`caller`).
    pub(super) async fn refuse(
        &self,
        err: EmbedError,
        request: &Message,
        wants_ack: bool,
        received: Instant,
        caller: Option<&Caller>,
    ) {
        crate::trace::admitted(received, Some(err.status()));
        if let Some(caller) = caller {
            telemetry::count_tenant(&caller.label, Traffic::Interactive, err.status(), (0, None));
        }
        metrics::counter!(crate::telemetry::names::REQUESTS, "outcome" => err.kind()).increment(1);
        let mut reply = Answer::error(&err);
        if wants_ack {
            reply = reply.header(headers::ACK_DELAY_MS, &self.acks.delay_ms);
        }
        reply
            .send(&self.serving.client, request, &self.serving.stats, received)
            .await;
    }

    /// Submits the misses of `plan` to the batcher now when counting their tokens is
    /// immediate (no tokenizer) and no shared read comes first; else reserves their room among
    /// the inputs waiting to be counted, for the reply task to look up, count and submit.
    ///
    /// # Errors
    /// The batcher's refusal (413, 429, 504), or 429 when too many inputs wait to be counted.
    fn hand_over(&self, parsed: Parsed, plan: Plan, share: Share) -> Result<Work, EmbedError> {
        let Parsed {
            mut inputs,
            options,
            deadline,
            shape: _,
        } = parsed;
        let submitted =
            if !plan.reads_shared(&self.serving.cache) && self.serving.counter.is_immediate() {
                let misses = take_misses(&plan, &mut inputs);
                let receiver = if misses.is_empty() {
                    None
                } else {
                    let counted = self.serving.counter.count_now(misses, options.clone());
                    Some(self.serving.batcher.submit_as(
                        share.clone(),
                        (counted.inputs, counted.lengths),
                        counted.options,
                        deadline,
                    )?)
                };
                Submitted::Now(receiver)
            } else {
                let reservation = match plan.misses() {
                    0 => None,
                    misses => {
                        let bytes = inputs.iter().map(embatch_protocol::Input::size_bytes).sum();
                        Some(self.serving.counter.reserve(misses, bytes)?)
                    }
                };
                Submitted::Later(reservation)
            };
        let submits_later = matches!(submitted, Submitted::Later(_)) || plan.has_waits();
        Ok(Work {
            plan,
            submitted,
            inputs,
            options,
            deadline,
            share,
            counter: self.serving.counter.clone(),
            // Held only while the task may still submit (see `Admitter`).
            batcher: submits_later.then(|| self.serving.batcher.clone()),
        })
    }

    /// Parses and validates a request received at `received`, whose body is `payload` and whose
    /// reply must fit the reply limit: what its reply task counts and submits.
    fn parse(
        &self,
        request: &Message,
        payload: &[u8],
        received: Instant,
    ) -> Result<Parsed, EmbedError> {
        let message_headers = request.headers.as_ref();
        let budget = budget(message_headers, self.serving.config.default_deadline)?;
        let deadline = received + budget;
        if self.serving.config.rerank.serves(&request.subject) {
            let max = self.serving.config.max_client_batch_size;
            let (inputs, options, shape) = self.serving.config.rerank.parse(payload, max)?;
            return Ok(Parsed {
                inputs,
                options,
                deadline,
                shape: Some(Shape::Rerank(shape)),
            });
        }
        let max = self.serving.config.max_client_batch_size;
        let subject = &request.subject;
        if let Some(parsed) = self.serving.config.classify.parse(subject, payload, max) {
            let (inputs, options, shape) = parsed?;
            if let Some(limit) = self.limit_for(Some(&shape)) {
                limit.check(inputs.len())?;
            }
            let shape = Some(shape);
            return Ok(Parsed {
                inputs,
                options,
                deadline,
                shape,
            });
        }
        // A sparse reply teaches and checks the reply limit as a dense one: both grow with the
        // inputs, and a worker's model answers one of them in practice (SPLADE or dense).
        let (inputs, options, shape) = if self.serving.config.sparse.serves(&request.subject) {
            let (inputs, options) = self.serving.config.sparse.parse(payload, max)?;
            (inputs, options, None)
        } else {
            self.serving.config.classify.check_embed()?;
            let mut body = EmbedRequest::from_slice(payload)?;
            body.validate(max)?;
            // A prompt only if the model has it (Cohere's `input_type`): dropped where the
            // model is known to lack it, and where the upstream takes no prompts (an
            // OpenAI-compatible server); passed on where that cannot be told.
            if let Some(hint) = body.prompt_hint.take()
                && body.prompt_name.is_none()
                && self.serving.config.upstream_prompts
                && self.serving.counter.defines_prompt(&hint) != Some(false)
            {
                body.prompt_name = Some(hint);
            }
            // Quantized after the batch (contract v1.5); `"float"` is the reply as assembled.
            let shape = body
                .output_dtype
                .take()
                .filter(|output| !output.is_plain())
                .map(Shape::Compact);
            let (inputs, options) = body.into_parts();
            (inputs, options, shape)
        };
        self.reply_limit.check(inputs.len())?;
        Ok(Parsed {
            inputs,
            options,
            deadline,
            shape,
        })
    }

    /// The reply-size limit of a reply of `shape` ([`Shape::limit`]), if any.
    fn limit_for(&self, shape: Option<&Shape>) -> Option<&Arc<ReplyLimit>> {
        match Shape::limit(shape) {
            Limit::Embeddings => Some(&self.reply_limit),
            Limit::TokenVectors => Some(&self.token_vectors_limit),
            Limit::Unchecked => None,
        }
    }
}
