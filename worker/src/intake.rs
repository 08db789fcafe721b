//! NATS intake: the worker's `embed` endpoint, from message to batcher and back.
//!
//! Requests arrive on the request subject in the shared queue group while the worker is a
//! member ([`crate::group`]); they are counted under the `embed` endpoint of the worker's NATS
//! micro service ([`crate::micro`]: `$SRV.PING`, `$SRV.INFO`, `$SRV.STATS`).
//!
//! The intake loop never waits on the batcher: it parses, validates, admits (or answers an error
//! at once) and moves on, so the client's subscription buffer, which would drop messages silently
//! when full, never fills; our own bound (`QUEUE_CAP`) bites first. Counting a request's tokens
//! ([`crate::tokens`]) is CPU work, so it runs in the request's own reply task, which then
//! submits the request to the batcher: the loop never waits on a tokenizer.
//!
//! Two things are answered here rather than left to time out:
//! - withdrawal: a message on `<subject>.cancel` carrying a request's [`headers::REQUEST_ID`]
//!   drops it (no reply, no upstream work);
//! - replies over the NATS server's `max_payload`: the server would refuse them and the caller
//!   would wait its whole deadline. Once the worker has seen one embedding, it knows the reply
//!   size per input and refuses a request whose reply cannot fit at once with 413 naming the
//!   limit; a reply that still turns out too large is replaced by that 413.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::{HeaderMap, Message};
use embatch_protocol::{EmbedError, EmbedRequest, PROTOCOL_VERSION, headers, reply};
use futures::StreamExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::batcher::{BatcherHandle, Outcome, Reply};
use crate::cache::{Answered, Cache, Plan, Stash, Usage};
use crate::group::{Event, Group};
use crate::micro::EndpointStats;
use crate::respond::Answer;
use crate::tokens::Counter;

/// Settings of the intake loop.
#[derive(Debug, Clone)]
pub struct IntakeConfig {
    /// Deadline applied when a request carries no [`headers::DEADLINE_MS`].
    pub default_deadline: Duration,
    /// Most inputs in one request (413 beyond).
    pub max_client_batch_size: usize,
    /// The NATS server's `max_payload` in bytes (from its INFO): the largest reply it relays.
    pub max_payload: usize,
    /// This worker's service id: the [`headers::ACCEPTED_BY`] of its acknowledgements.
    pub worker_id: String,
}

/// Bytes a reply may need per input, learnt from the replies sent (the largest seen), so a
/// request whose reply cannot fit `max_payload` is refused before any upstream work.
struct ReplyLimit {
    max_payload: usize,
    bytes_per_input: AtomicUsize,
}

/// Room kept in a reply for NATS headers and framing, in bytes.
const REPLY_OVERHEAD: usize = 1024;

impl ReplyLimit {
    fn new(max_payload: usize) -> ReplyLimit {
        ReplyLimit {
            max_payload,
            bytes_per_input: AtomicUsize::new(0),
        }
    }

    fn too_large(&self, inputs: usize, bytes: usize) -> EmbedError {
        let per_input = self.bytes_per_input.load(Ordering::Relaxed).max(1);
        let fits = self.max_payload.saturating_sub(REPLY_OVERHEAD) / per_input;
        EmbedError::TooLarge(format!(
            "the reply for {inputs} inputs needs ~{bytes} bytes, over the NATS server's \
             max_payload of {} bytes; send at most {fits} inputs per request",
            self.max_payload
        ))
    }

    /// Refuses a request of `inputs` inputs whose reply cannot fit, once the size is known.
    fn check(&self, inputs: usize) -> Result<(), EmbedError> {
        let per_input = self.bytes_per_input.load(Ordering::Relaxed);
        let needed = per_input
            .saturating_mul(inputs)
            .saturating_add(REPLY_OVERHEAD);
        if per_input > 0 && needed > self.max_payload {
            return Err(self.too_large(inputs, needed));
        }
        Ok(())
    }

    /// Learns from a reply of `bytes` for `inputs` inputs; the replacement error when it does
    /// not fit.
    fn observe(&self, inputs: usize, bytes: usize) -> Result<(), EmbedError> {
        self.bytes_per_input
            .fetch_max(bytes.div_ceil(inputs.max(1)), Ordering::Relaxed);
        if bytes + REPLY_OVERHEAD > self.max_payload {
            return Err(self.too_large(inputs, bytes));
        }
        Ok(())
    }
}

/// Requests in the batcher that carry a [`headers::REQUEST_ID`], by id: cancelling one ends the
/// task waiting for its outcome without a reply, which drops its receiver, and the batcher then
/// drops the request before it costs upstream work (see `batcher`).
#[derive(Default)]
pub(crate) struct Withdrawable {
    by_id: Mutex<HashMap<String, CancellationToken>>,
}

impl Withdrawable {
    fn insert(&self, id: String, handle: CancellationToken) {
        self.by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, handle);
    }

    /// Whether the request with this id is held here.
    fn holds(&self, id: &str) -> bool {
        self.by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(id)
    }

    fn remove(&self, id: &str) -> Option<CancellationToken> {
        self.by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id)
    }

    /// Withdraws the request with the id in `payload`, if this worker holds it.
    fn cancel(&self, payload: &[u8]) {
        let Ok(id) = std::str::from_utf8(payload) else {
            return;
        };
        if let Some(handle) = self.remove(id.trim()) {
            handle.cancel();
            metrics::counter!(crate::telemetry::names::REQUESTS, "outcome" => "cancelled")
                .increment(1);
        }
    }
}

/// What the intake runs on ([`run`]): where requests come from, where they go and where their
/// answers are sent.
pub(crate) struct Intake {
    /// The request subject's queue subscription and the membership deciding it.
    pub group: Group,
    /// Where accepted requests are submitted; the intake holds the last handle (a reply task
    /// holds a clone only until it has submitted), so the batcher ends after the intake does.
    pub batcher: BatcherHandle,
    /// Counts each request's tokens before it is submitted.
    pub counter: Counter,
    /// Limits and defaults.
    pub config: IntakeConfig,
    /// The reply tasks, one per accepted request: close and wait on it (after the batcher ends)
    /// to know every accepted request was answered.
    pub replies: TaskTracker,
    /// The requests that may be withdrawn, shared with [`withdraw`].
    pub withdrawable: Arc<Withdrawable>,
    /// The connection replies are sent on.
    pub client: async_nats::Client,
    /// The `embed` endpoint's `$SRV.STATS` counters.
    pub stats: EndpointStats,
    /// The cache and in-flight de-duplication every request goes through first.
    pub cache: Arc<Cache>,
}

/// How long shutdown waits for the server to confirm the drain (its PONG) while still admitting
/// the requests it delivered before the unsubscribe.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Reads requests from `intake.group` until `stop` is cancelled, then leaves the queue group for
/// good: the subscription drains (NATS drain: UNSUB, then PING; the server routes nothing here
/// after its PONG), and every request delivered until then is admitted. Requests and membership
/// events alternate in one loop, so admitting a request and re-deciding membership never race.
/// Also ends, at once, when the connection closes.
pub(crate) async fn run(mut intake: Intake, stop: CancellationToken) {
    let reply_limit = Arc::new(ReplyLimit::new(intake.config.max_payload));
    let mut reconnects = crate::reconnect::Reconnects::new(&intake.client);
    let acks = Acks {
        worker_id: Arc::from(intake.config.worker_id.as_str()),
        delay_ms: headers::ACK_DELAY.as_millis().to_string().into(),
    };
    loop {
        let event = tokio::select! {
            event = intake.group.next() => event,
            () = stop.cancelled() => break,
        };
        match event {
            Event::Request(request) => {
                reconnects.check(&intake.batcher);
                intake.admit(request, &reply_limit, &acks).await;
                intake.group.admitted().await;
            }
            Event::Control(control) => intake.group.control(control).await,
            Event::Ended => return,
        }
    }
    tracing::info!("shutdown: draining the request subscription");
    intake.group.stop().await;
    // Ends when the drained subscription ends; what is lost around the UNSUB was never
    // acknowledged, and acknowledging clients resend it (see `crate::group`).
    while let Ok(event) = tokio::time::timeout(DRAIN_TIMEOUT, intake.group.next()).await {
        match event {
            Event::Request(request) => intake.admit(request, &reply_limit, &acks).await,
            Event::Ended => break,
            Event::Control(_) => {}
        }
    }
}

/// Withdraws the requests named on `cancels` (the [`headers::cancel_subject`]) until `stop` is
/// cancelled or the subscription ends.
pub(crate) async fn withdraw(
    mut cancels: impl futures::Stream<Item = async_nats::Message> + Unpin,
    withdrawable: Arc<Withdrawable>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            cancel = cancels.next() => match cancel {
                Some(cancel) => withdrawable.cancel(&cancel.payload),
                None => return,
            },
            () = stop.cancelled() => return,
        }
    }
}

/// What this worker puts in acknowledgements: its id ([`headers::ACCEPTED_BY`]) and its delay
/// ([`headers::ACK_DELAY_MS`]), shared by the reply tasks.
struct Acks {
    worker_id: Arc<str>,
    delay_ms: Arc<str>,
}

/// Whether `request` asks for an acknowledgement ([`headers::ACK`]).
fn wants_ack(request: &Message) -> bool {
    request
        .headers
        .as_ref()
        .and_then(|h| h.get(headers::ACK))
        .is_some_and(|v| v.as_str() == "1")
}

/// Sleeps until `at`, or forever when `None`.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Tells the client of `request` that worker `worker_id` holds it: an empty message with
/// [`headers::ACCEPTED_BY`] on its reply subject, so the client can resend what it never saw
/// acknowledged or answered, or what a worker that went silent held.
async fn acknowledge(client: &async_nats::Client, request: &Message, worker_id: &str) {
    let Some(inbox) = request.reply.clone() else {
        return;
    };
    let mut ack = HeaderMap::new();
    ack.insert(headers::ACCEPTED_BY, worker_id);
    if let Err(err) = client
        .publish_with_headers(inbox, ack, bytes::Bytes::new())
        .await
    {
        tracing::debug!(%err, "cannot acknowledge a request");
    }
}

impl Intake {
    /// Admits one request into the batcher, or answers its error at once; its reply will be
    /// checked against (and teach) `reply_limit`. A request that asks for an acknowledgement
    /// ([`headers::ACK`]) gets one when it is still held [`headers::ACK_DELAY`] after
    /// `received` (at once for a copy of a request held already); its reply carries
    /// [`headers::ACK_DELAY_MS`].
    async fn admit(&self, request: Message, reply_limit: &Arc<ReplyLimit>, acks: &Acks) {
        let received = Instant::now();
        if request.reply.is_none() {
            metrics::counter!(crate::telemetry::names::REQUESTS, "outcome" => "no_reply_subject")
                .increment(1);
            tracing::debug!(
                "ignoring a message without a reply subject: it was published, not requested"
            );
            return;
        }
        let wants_ack = wants_ack(&request);
        let id = request
            .headers
            .as_ref()
            .and_then(|h| h.get(headers::REQUEST_ID))
            .map(|v| v.as_str().to_owned());
        if id.as_deref().is_some_and(|id| self.withdrawable.holds(id)) {
            // A copy its client resent (see `embatch_client::EmbedClient::embed`) of a request
            // this worker already holds: that one answers on the same reply subject. The
            // client resent it for want of an acknowledgement, so it gets one now.
            if wants_ack {
                acknowledge(&self.client, &request, &acks.worker_id).await;
            }
            metrics::counter!(crate::telemetry::names::REQUESTS, "outcome" => "duplicate")
                .increment(1);
            return;
        }
        // A copy resent after a loss is admitted by deadline (see `headers::ATTEMPT`).
        let resent = request
            .headers
            .as_ref()
            .is_some_and(|h| h.get(headers::ATTEMPT).is_some());
        let parsed = match self.parse(&request, received, reply_limit) {
            Ok(parsed) => parsed,
            Err(err) => return self.refuse(err, &request, wants_ack, acks, received).await,
        };
        let usage = Usage::from_header(
            request
                .headers
                .as_ref()
                .and_then(|h| h.get(headers::CACHE_CONTROL))
                .map(|v| v.as_str()),
        );
        let plan = self.cache.plan(&parsed.inputs, &parsed.options, usage);
        let inputs = parsed.inputs.len();
        if plan.is_answered() {
            // Every input a hit of the in-process LRU: answered at once, without the batch
            // queue or admission.
            let outcome = plan.answer().and_then(|answered| {
                reply_limit.observe(inputs, answered.payload.len())?;
                Ok(answered)
            });
            let label = match &outcome {
                Ok(_) => "ok",
                Err(err) => err.kind(),
            };
            metrics::counter!(crate::telemetry::names::REQUESTS, "outcome" => label).increment(1);
            let mut reply = served(outcome, None);
            if wants_ack {
                reply = reply.header(headers::ACK_DELAY_MS, &acks.delay_ms);
            }
            reply
                .send(&self.client, &request, &self.stats, received)
                .await;
            metrics::histogram!(crate::telemetry::names::CACHE_HIT_TIME)
                .record(received.elapsed().as_secs_f64());
            return;
        }
        if resent {
            self.batcher.absorb_resent(inputs);
        }
        let work = match self.hand_over(parsed, plan) {
            Ok(work) => work,
            Err(err) => return self.refuse(err, &request, wants_ack, acks, received).await,
        };
        let cancelled = CancellationToken::new();
        let registered = id.map(|id| {
            self.withdrawable.insert(id.clone(), cancelled.clone());
            (Arc::clone(&self.withdrawable), id)
        });
        let reply_limit = Arc::clone(reply_limit);
        let client = self.client.clone();
        let stats = self.stats.clone();
        let cache = Arc::clone(&self.cache);
        let ack_id = wants_ack.then(|| (Arc::clone(&acks.worker_id), Arc::clone(&acks.delay_ms)));
        // Out of the queue group (full, which it leaves only for a peer with room; its
        // upstream failing or stalled; stopping), and this request was on its way: a 429 would
        // fail it only because of where it was routed, so a client that resends gets a 503 to
        // resend on instead.
        let hand_back = wants_ack && !self.group.state().is_member();
        self.replies.spawn(async move {
            let mut ack_at = ack_id.as_ref().map(|_| received + headers::ACK_DELAY);
            // Looked up, counted, submitted and waited for; withdrawn by its caller: dropping
            // the work drops its count, its receiver (the batcher drops its queued inputs) and
            // its leads (requests waiting on them send their inputs themselves).
            let work = work.run(&cache);
            tokio::pin!(work);
            let (outcome, batcher_answered) = loop {
                tokio::select! {
                    // An outcome ready with the acknowledgement due makes it unnecessary.
                    biased;
                    outcome = &mut work => break outcome,
                    () = cancelled.cancelled() => return,
                    () = sleep_until(ack_at) => {
                        ack_at = None;
                        if let Some((worker_id, _)) = &ack_id {
                            acknowledge(&client, &request, worker_id).await;
                        }
                    }
                }
            };
            if let Some((registry, id)) = registered {
                registry.remove(&id);
            }
            if !batcher_answered {
                let label = match &outcome {
                    Ok(_) => "ok",
                    Err(err) => err.kind(),
                };
                metrics::counter!(crate::telemetry::names::REQUESTS, "outcome" => label)
                    .increment(1);
            }
            let mut outcome = match outcome {
                Err(EmbedError::Overloaded(why)) if hand_back => {
                    metrics::counter!(crate::telemetry::names::REQUESTS, "outcome" => "handed_back")
                        .increment(1);
                    Err(EmbedError::Unavailable(format!(
                        "this worker left the queue group for a peer with room ({why}); resend"
                    )))
                }
                outcome => outcome,
            };
            let all_hits = outcome
                .as_ref()
                .is_ok_and(|(answered, _)| answered.hits == Some(inputs));
            // The new results are stored even when the reply turns out too large to send.
            let stash = match &mut outcome {
                Ok((answered, _)) => std::mem::take(&mut answered.stash),
                Err(_) => Stash::default(),
            };
            let outcome = outcome.and_then(|(answered, timing)| {
                reply_limit.observe(inputs, answered.payload.len())?;
                Ok((answered, timing))
            });
            let (outcome, timing) = match outcome {
                Ok((answered, timing)) => (Ok(answered), timing),
                Err(err) => (Err(err), None),
            };
            let mut reply = served(outcome, timing);
            if let Some((_, delay_ms)) = &ack_id {
                // Whether acknowledged or not (an acknowledgement can be lost, e.g. while the
                // client was disconnected): this worker acknowledges.
                reply = reply.header(headers::ACK_DELAY_MS, delay_ms);
            }
            reply.send(&client, &request, &stats, received).await;
            // Only now: storing never delays the reply (see `Cache::store`).
            cache.store(stash);
            if all_hits {
                metrics::histogram!(crate::telemetry::names::CACHE_HIT_TIME)
                    .record(received.elapsed().as_secs_f64());
            }
        });
    }

    /// Answers `err` to `request` at once (refused before any work), counted.
    async fn refuse(
        &self,
        err: EmbedError,
        request: &Message,
        wants_ack: bool,
        acks: &Acks,
        received: Instant,
    ) {
        metrics::counter!(crate::telemetry::names::REQUESTS, "outcome" => err.kind()).increment(1);
        let mut reply = answer(Err(err), None);
        if wants_ack {
            reply = reply.header(headers::ACK_DELAY_MS, &acks.delay_ms);
        }
        reply
            .send(&self.client, request, &self.stats, received)
            .await;
    }

    /// Submits the misses of `plan` to the batcher now when counting their tokens is
    /// immediate (no tokenizer) and no shared read comes first; else reserves their room among
    /// the inputs waiting to be counted, for the reply task to look up, count and submit.
    ///
    /// # Errors
    /// The batcher's refusal (413, 429, 504), or 429 when too many inputs wait to be counted.
    fn hand_over(&self, parsed: Parsed, plan: Plan) -> Result<Work, EmbedError> {
        let Parsed {
            inputs,
            options,
            deadline,
        } = parsed;
        let submitted = if !plan.reads_shared(&self.cache) && self.counter.is_immediate() {
            let misses = plan.miss_inputs(&inputs);
            let receiver = if misses.is_empty() {
                None
            } else {
                let counted = self.counter.count_now(misses, options.clone());
                Some(self.batcher.submit(
                    counted.inputs,
                    counted.lengths,
                    counted.options,
                    deadline,
                )?)
            };
            Submitted::Now(receiver)
        } else {
            let reservation = match plan.misses() {
                0 => None,
                misses => Some(self.counter.reserve(misses)?),
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
            counter: self.counter.clone(),
            // Held only while the task may still submit (see `Intake::batcher`).
            batcher: submits_later.then(|| self.batcher.clone()),
        })
    }

    /// Parses and validates a request received at `received` whose reply must fit
    /// `reply_limit`: what its reply task counts and submits.
    fn parse(
        &self,
        request: &Message,
        received: Instant,
        reply_limit: &ReplyLimit,
    ) -> Result<Parsed, EmbedError> {
        let message_headers = request.headers.as_ref();
        if let Some(version) = message_headers.and_then(|h| h.get(headers::VERSION)) {
            let major = version.as_str().split('.').next().unwrap_or_default();
            if major != PROTOCOL_VERSION {
                return Err(EmbedError::Validation(format!(
                    "header `{}`: version {} is not supported; this worker speaks {PROTOCOL_VERSION}",
                    headers::VERSION,
                    version.as_str()
                )));
            }
        }
        let budget = match message_headers.and_then(|h| h.get(headers::DEADLINE_MS)) {
            Some(value) => headers::parse_deadline(value.as_str()).ok_or_else(|| {
                EmbedError::Validation(format!(
                    "header `{}` must be a whole number of milliseconds. Given: {:?}",
                    headers::DEADLINE_MS,
                    value.as_str()
                ))
            })?,
            None => self.config.default_deadline,
        };
        let body = EmbedRequest::from_slice(&request.payload)?;
        body.validate(self.config.max_client_batch_size)?;
        let (inputs, options) = body.into_parts();
        reply_limit.check(inputs.len())?;
        Ok(Parsed {
            inputs,
            options,
            deadline: received + budget,
        })
    }
}

/// A request's misses: submitted by the intake, or to be submitted by the reply task.
enum Submitted {
    /// Submitted (counting was immediate); `None` when there was nothing to submit.
    Now(Option<tokio::sync::oneshot::Receiver<Outcome>>),
    /// To be looked up in the shared bucket, counted and submitted by the reply task, holding
    /// the misses' room among the inputs waiting to be counted.
    Later(Option<crate::tokens::Reservation>),
}

/// What a request's reply task does: look up, count, submit, wait, assemble.
struct Work {
    plan: Plan,
    submitted: Submitted,
    /// The request's inputs, as received.
    inputs: Vec<embatch_protocol::Input>,
    options: embatch_protocol::EmbedOptions,
    deadline: Instant,
    counter: Counter,
    /// Present while the task may still submit: misses not yet submitted, or inputs in flight
    /// for other requests that it may have to send itself.
    batcher: Option<BatcherHandle>,
}

/// The timing of the batcher's answer, when the request had one.
type Timing = Option<(std::time::Duration, std::time::Duration)>;

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
    async fn run(self, cache: &Cache) -> (Result<(Answered, Timing), EmbedError>, bool) {
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
            inputs,
            options,
            deadline,
            counter,
            batcher,
        } = self;
        let (receiver, lengths) = match submitted {
            Submitted::Now(receiver) => (receiver, None),
            Submitted::Later(_reservation) => {
                if plan.reads_shared(cache) {
                    plan.read_shared(cache).await;
                }
                let misses = plan.miss_inputs(&inputs);
                if misses.is_empty() {
                    (None, None)
                } else {
                    let (receiver, lengths) =
                        submit(&counter, batcher.as_ref(), misses, &options, deadline).await?;
                    (Some(receiver), lengths)
                }
            }
        };
        let mut timing = None;
        if let Some(receiver) = receiver {
            *batcher_answered = true;
            let reply = receive(receiver).await?;
            timing = Some((reply.queue_time, reply.inference_time));
            plan.complete_leads(&reply.payload, lengths.as_deref())?;
        }
        let abandoned = plan.wait(deadline).await?;
        if !abandoned.is_empty() {
            let (positions, retried): (Vec<usize>, Vec<_>) = abandoned.into_iter().unzip();
            let (receiver, lengths) =
                submit(&counter, batcher.as_ref(), retried, &options, deadline).await?;
            *batcher_answered = true;
            let reply = receive(receiver).await?;
            timing = timing.or(Some((reply.queue_time, reply.inference_time)));
            plan.complete_retried(&positions, &reply.payload, lengths.as_deref())?;
        }
        Ok((plan.answer()?, timing))
    }
}

/// Counts `inputs` and submits them to `batcher`: the receiver of their outcome, and their
/// token counts when a tokenizer counted them.
///
/// # Errors
/// The count's error, the batcher's refusal; 503 without a batcher (cannot happen: a task
/// that may submit holds one).
async fn submit(
    counter: &Counter,
    batcher: Option<&BatcherHandle>,
    inputs: Vec<embatch_protocol::Input>,
    options: &embatch_protocol::EmbedOptions,
    deadline: Instant,
) -> Result<(tokio::sync::oneshot::Receiver<Outcome>, Option<Vec<u32>>), EmbedError> {
    let batcher =
        batcher.ok_or_else(|| EmbedError::Unavailable("the worker is shutting down".into()))?;
    let counted = counter.count(inputs, options.clone()).await?;
    let lengths = counted.tokens().is_some().then(|| counted.lengths.clone());
    // The seam to the token budget: `counted.lengths`, one count per input.
    let receiver = batcher.submit(counted.inputs, counted.lengths, counted.options, deadline)?;
    Ok((receiver, lengths))
}

/// The batcher's outcome.
async fn receive(receiver: tokio::sync::oneshot::Receiver<Outcome>) -> Result<Reply, EmbedError> {
    receiver.await.unwrap_or_else(|_| {
        Err(EmbedError::Unavailable(
            "the worker stopped before answering".into(),
        ))
    })
}

/// A request that passed [`Intake::parse`]: what its reply task counts and submits.
struct Parsed {
    inputs: Vec<embatch_protocol::Input>,
    options: embatch_protocol::EmbedOptions,
    /// When its deadline passes.
    deadline: Instant,
}

/// The reply for `outcome`: TEI's response body with timing headers and, when counted, the
/// request's `tokens` ([`headers::TOKENS`]), or TEI's error body with NATS micro error headers
/// (`Nats-Service-Error-Code`, `Nats-Service-Error`), see [`crate::respond`].
fn answer(outcome: Outcome, tokens: Option<u64>) -> Answer {
    match outcome {
        Ok(reply) => {
            let mut reply_headers = HeaderMap::new();
            for (name, value) in reply::success_headers(reply.queue_time, reply.inference_time) {
                reply_headers.insert(name, value.as_str());
            }
            if let Some(tokens) = tokens {
                reply_headers.insert(headers::TOKENS, tokens.to_string().as_str());
            }
            Answer::ok(reply_headers, reply.payload)
        }
        Err(err) => Answer::error(&err),
    }
}

/// The reply for a request served through the cache: TEI's response body with timing headers
/// (zero for a request the batcher never saw), the request's tokens when known
/// ([`headers::TOKENS`]) and its cache hits while the cache is on ([`headers::CACHE_HITS`]);
/// or the error reply.
fn served(outcome: Result<Answered, EmbedError>, timing: Timing) -> Answer {
    match outcome {
        Ok(answered) => {
            let (queue_time, inference_time) = timing.unwrap_or_default();
            let mut reply_headers = HeaderMap::new();
            for (name, value) in reply::success_headers(queue_time, inference_time) {
                reply_headers.insert(name, value.as_str());
            }
            if let Some(tokens) = answered.tokens {
                reply_headers.insert(headers::TOKENS, tokens.to_string().as_str());
            }
            if let Some(hits) = answered.hits {
                reply_headers.insert(headers::CACHE_HITS, hits.to_string().as_str());
            }
            Answer::ok(reply_headers, answered.payload)
        }
        Err(err) => Answer::error(&err),
    }
}
