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

use crate::batcher::{BatcherHandle, Outcome};
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
    mut cancels: async_nats::Subscriber,
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
        let submission = match self
            .parse(&request, received, reply_limit)
            .and_then(|parsed| {
                if resent {
                    self.batcher.absorb_resent(parsed.inputs.len());
                }
                self.hand_over(parsed)
            }) {
            Ok(submission) => submission,
            Err(err) => {
                metrics::counter!(crate::telemetry::names::REQUESTS, "outcome" => err.kind())
                    .increment(1);
                let mut reply = answer(Err(err), None);
                if wants_ack {
                    reply = reply.header(headers::ACK_DELAY_MS, &acks.delay_ms);
                }
                reply
                    .send(&self.client, &request, &self.stats, received)
                    .await;
                return;
            }
        };
        let cancelled = CancellationToken::new();
        let registered = id.map(|id| {
            self.withdrawable.insert(id.clone(), cancelled.clone());
            (Arc::clone(&self.withdrawable), id)
        });
        let reply_limit = Arc::clone(reply_limit);
        let client = self.client.clone();
        let stats = self.stats.clone();
        let ack_id = wants_ack.then(|| (Arc::clone(&acks.worker_id), Arc::clone(&acks.delay_ms)));
        // Out of the queue group (full, which it leaves only for a peer with room; its
        // upstream failing or stalled; stopping), and this request was on its way: a 429 would
        // fail it only because of where it was routed, so a client that resends gets a 503 to
        // resend on instead.
        let hand_back = wants_ack && !self.group.state().is_member();
        self.replies.spawn(async move {
            let inputs = submission.inputs();
            let mut ack_at = ack_id.as_ref().map(|_| received + headers::ACK_DELAY);
            // Counted (when a tokenizer counts off the intake) and submitted; withdrawn by its
            // caller: dropping the count or the receiver tells the batcher.
            let submit = submission.submit();
            tokio::pin!(submit);
            let submitted = loop {
                tokio::select! {
                    biased;
                    submitted = &mut submit => break submitted,
                    () = cancelled.cancelled() => return,
                    () = sleep_until(ack_at) => {
                        ack_at = None;
                        if let Some((worker_id, _)) = &ack_id {
                            acknowledge(&client, &request, worker_id).await;
                        }
                    }
                }
            };
            let (outcome, tokens) = match submitted {
                Ok((mut receiver, tokens)) => {
                    let outcome = loop {
                        tokio::select! {
                            // An outcome ready with the acknowledgement due makes it unnecessary.
                            biased;
                            outcome = &mut receiver => break outcome.unwrap_or_else(|_| {
                                Err(EmbedError::Unavailable(
                                    "the worker stopped before answering".into(),
                                ))
                            }),
                            () = cancelled.cancelled() => return,
                            () = sleep_until(ack_at) => {
                                ack_at = None;
                                if let Some((worker_id, _)) = &ack_id {
                                    acknowledge(&client, &request, worker_id).await;
                                }
                            }
                        }
                    };
                    (outcome, tokens)
                }
                Err(err) => {
                    metrics::counter!(crate::telemetry::names::REQUESTS, "outcome" => err.kind())
                        .increment(1);
                    (Err(err), None)
                }
            };
            if let Some((registry, id)) = registered {
                registry.remove(&id);
            }
            let outcome = match outcome {
                Err(EmbedError::Overloaded(why)) if hand_back => {
                    metrics::counter!(crate::telemetry::names::REQUESTS, "outcome" => "handed_back")
                        .increment(1);
                    Err(EmbedError::Unavailable(format!(
                        "this worker left the queue group for a peer with room ({why}); resend"
                    )))
                }
                outcome => outcome,
            };
            let outcome = outcome.and_then(|reply| {
                reply_limit.observe(inputs, reply.payload.len())?;
                Ok(reply)
            });
            let mut reply = answer(outcome, tokens);
            if let Some((_, delay_ms)) = &ack_id {
                // Whether acknowledged or not (an acknowledgement can be lost, e.g. while the
                // client was disconnected): this worker acknowledges.
                reply = reply.header(headers::ACK_DELAY_MS, delay_ms);
            }
            reply.send(&client, &request, &stats, received).await;
        });
    }

    /// Submits `parsed` to the batcher now when counting its tokens is immediate (no
    /// tokenizer); else reserves its room among the inputs waiting to be counted, for its reply
    /// task to count and submit.
    ///
    /// # Errors
    /// The batcher's refusal (413, 429, 504), or 429 when too many inputs wait to be counted.
    fn hand_over(&self, parsed: Parsed) -> Result<Submission, EmbedError> {
        if self.counter.is_immediate() {
            let counted = self.counter.count_now(parsed.inputs, parsed.options);
            let tokens = counted.tokens();
            let inputs = counted.inputs.len();
            let receiver = self.batcher.submit(
                counted.inputs,
                counted.lengths,
                counted.options,
                parsed.deadline,
            )?;
            return Ok(Submission::Ready(receiver, tokens, inputs));
        }
        let reservation = self.counter.reserve(parsed.inputs.len())?;
        Ok(Submission::Count(
            parsed,
            self.counter.clone(),
            self.batcher.clone(),
            reservation,
        ))
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

/// A request on its way to the batcher.
enum Submission {
    /// Submitted by the intake (counting was immediate): its receiver, tokens and inputs.
    Ready(tokio::sync::oneshot::Receiver<Outcome>, Option<u64>, usize),
    /// To be counted, then submitted, by its reply task, holding its room among the inputs
    /// waiting to be counted.
    Count(Parsed, Counter, BatcherHandle, crate::tokens::Reservation),
}

impl Submission {
    fn inputs(&self) -> usize {
        match self {
            Submission::Ready(_, _, inputs) => *inputs,
            Submission::Count(parsed, ..) => parsed.inputs.len(),
        }
    }

    /// The request in the batcher: its receiver and token count. Counts it first when it is
    /// not yet submitted; the batcher handle and the reservation are dropped once it is.
    ///
    /// # Errors
    /// The count's error (422 over the limit with `truncate: false`, ...) or the batcher's
    /// refusal.
    async fn submit(
        self,
    ) -> Result<(tokio::sync::oneshot::Receiver<Outcome>, Option<u64>), EmbedError> {
        match self {
            Submission::Ready(receiver, tokens, _) => Ok((receiver, tokens)),
            Submission::Count(parsed, counter, batcher, _reservation) => {
                let counted = counter.count(parsed.inputs, parsed.options).await?;
                let tokens = counted.tokens();
                // The seam to the token budget: `counted.lengths`, one count per input.
                let receiver = batcher.submit(
                    counted.inputs,
                    counted.lengths,
                    counted.options,
                    parsed.deadline,
                )?;
                Ok((receiver, tokens))
            }
        }
    }
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
