//! NATS intake: the worker's NATS micro service endpoint, from message to batcher and back.
//!
//! The worker registers as NATS micro service [`embatch_protocol::SERVICE_NAME`] with one
//! endpoint on the request subject in the shared queue group, so `$SRV.PING`, `$SRV.INFO` and
//! `$SRV.STATS` discovery comes from async-nats for free (the gateway's `/health` pings it).
//!
//! The intake loop never waits on the batcher: it parses, validates, admits (or answers an error
//! at once) and moves on, so the client's subscription buffer, which would drop messages silently
//! when full, never fills; our own bound (`QUEUE_CAP`) bites first.
//!
//! Two things are answered here rather than left to time out:
//! - withdrawal: a message on `<subject>.cancel` carrying a request's [`headers::REQUEST_ID`]
//!   drops it (no reply, no upstream work);
//! - replies over the NATS server's `max_payload`: the server would refuse them and the caller
//!   would wait its whole deadline. Once the worker has seen one embedding, it knows the reply
//!   size per input and refuses a request whose reply cannot fit at once with 413 naming the
//!   limit; a reply that still turns out too large is replaced by that 413.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::service::{Request, endpoint::Endpoint};
use embatch_protocol::{EmbedError, EmbedRequest, PROTOCOL_VERSION, headers, reply};
use futures::StreamExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::batcher::{BatcherHandle, Outcome};
use crate::respond::Answer;

/// Settings of the intake loop.
#[derive(Debug, Clone)]
pub struct IntakeConfig {
    /// Deadline applied when a request carries no [`headers::DEADLINE_MS`].
    pub default_deadline: Duration,
    /// Most inputs in one request (413 beyond).
    pub max_client_batch_size: usize,
    /// The NATS server's `max_payload` in bytes (from its INFO): the largest reply it relays.
    pub max_payload: usize,
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
struct Withdrawable {
    by_id: Mutex<HashMap<String, CancellationToken>>,
}

impl Withdrawable {
    fn insert(&self, id: String, handle: CancellationToken) {
        self.by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, handle);
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

/// What every admitted request shares.
struct Intake {
    batcher: BatcherHandle,
    config: IntakeConfig,
    replies: TaskTracker,
    withdrawable: Arc<Withdrawable>,
    reply_limit: Arc<ReplyLimit>,
    replier: Arc<Replier>,
}

/// Where replies go: through the request, on the service's connection (which counts them in
/// `$SRV.STATS`), while serving; through a second connection once the service's connection is
/// draining at shutdown (a drained connection closes when its subscriptions are done, while the
/// batcher still has requests to answer).
struct Replier {
    /// The service's connection.
    client: async_nats::Client,
    draining: OnceLock<async_nats::Client>,
}

/// How long shutdown waits for the server to confirm the drain (its PONG) while still admitting
/// the requests it delivered before the unsubscribe.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Reads requests from `endpoint` until `shutdown` resolves, then drains: the connection
/// `client` unsubscribes everything (NATS drain: UNSUB, then PING; the server delivers nothing
/// after its PONG), every request delivered until then is admitted, and replies move to the
/// connection `reply_connection` yields, which `run` returns for the caller to flush. Without it
/// (the second connection failed), the endpoint is unsubscribed at once and requests the server
/// had already routed here may be lost.
///
/// Replies are sent by tasks on `replies`; wait on it (after dropping the batcher) to know every
/// accepted request was answered. Messages on `cancels` (the [`headers::cancel_subject`])
/// withdraw requests by id.
#[allow(clippy::too_many_arguments)] // one call site; each argument is a distinct part
pub async fn run(
    mut endpoint: Endpoint,
    mut cancels: async_nats::Subscriber,
    batcher: BatcherHandle,
    config: IntakeConfig,
    replies: TaskTracker,
    shutdown: impl Future<Output = ()>,
    client: async_nats::Client,
    reply_connection: impl Future<Output = Option<async_nats::Client>>,
) -> Option<async_nats::Client> {
    let intake = Intake {
        batcher,
        reply_limit: Arc::new(ReplyLimit::new(config.max_payload)),
        config,
        replies,
        withdrawable: Arc::new(Withdrawable::default()),
        replier: Arc::new(Replier {
            client: client.clone(),
            draining: OnceLock::new(),
        }),
    };
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            request = endpoint.next() => match request {
                Some(request) => intake.admit(request).await,
                None => return None,
            },
            Some(cancel) = cancels.next() => intake.withdrawable.cancel(&cancel.payload),
            () = &mut shutdown => break,
        }
    }
    let Some(spare) = reply_connection.await else {
        tracing::warn!("shutdown: no second connection for replies; unsubscribing without a drain");
        if let Err(err) = endpoint.stop().await {
            tracing::warn!(%err, "unsubscribe failed");
        }
        while let Ok(Some(request)) =
            tokio::time::timeout(Duration::from_millis(200), endpoint.next()).await
        {
            intake.admit(request).await;
        }
        return None;
    };
    tracing::info!("shutdown: draining the request subscription");
    let _ = intake.replier.draining.set(spare.clone());
    if let Err(err) = client.drain().await {
        tracing::warn!(%err, "drain failed");
    }
    // Ends when the server has confirmed the unsubscribe: nothing is routed here after that.
    while let Ok(Some(request)) = tokio::time::timeout(DRAIN_TIMEOUT, endpoint.next()).await {
        intake.admit(request).await;
    }
    Some(spare)
}

impl Intake {
    /// Admits one request into the batcher, or answers its error at once.
    async fn admit(&self, request: Request) {
        if request.message.reply.is_none() {
            metrics::counter!(crate::telemetry::names::REQUESTS, "outcome" => "no_reply_subject")
                .increment(1);
            tracing::debug!(
                "ignoring a message without a reply subject: it was published, not requested"
            );
            return;
        }
        let (receiver, inputs) = match self.submit(&request) {
            Ok(accepted) => accepted,
            Err(err) => {
                metrics::counter!(crate::telemetry::names::REQUESTS, "outcome" => err.kind())
                    .increment(1);
                self.replier.respond(request, Err(err)).await;
                return;
            }
        };
        let id = request
            .message
            .headers
            .as_ref()
            .and_then(|h| h.get(headers::REQUEST_ID))
            .map(|v| v.as_str().to_owned());
        let cancelled = CancellationToken::new();
        let registered = id.map(|id| {
            self.withdrawable.insert(id.clone(), cancelled.clone());
            (Arc::clone(&self.withdrawable), id)
        });
        let reply_limit = Arc::clone(&self.reply_limit);
        let replier = Arc::clone(&self.replier);
        self.replies.spawn(async move {
            let outcome = tokio::select! {
                outcome = receiver => outcome.unwrap_or_else(|_| {
                    Err(EmbedError::Unavailable(
                        "the worker stopped before answering".into(),
                    ))
                }),
                // Withdrawn by its caller: dropping the receiver tells the batcher.
                () = cancelled.cancelled() => return,
            };
            if let Some((registry, id)) = registered {
                registry.remove(&id);
            }
            let outcome = outcome.and_then(|reply| {
                reply_limit.observe(inputs, reply.payload.len())?;
                Ok(reply)
            });
            replier.respond(request, outcome).await;
        });
    }

    /// Parses, validates and submits a request; its receiver and input count.
    fn submit(
        &self,
        request: &Request,
    ) -> Result<(tokio::sync::oneshot::Receiver<Outcome>, usize), EmbedError> {
        let received = Instant::now();
        let message_headers = request.message.headers.as_ref();
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
        let body = EmbedRequest::from_slice(&request.message.payload)?;
        body.validate(self.config.max_client_batch_size)?;
        let (inputs, options) = body.into_parts();
        let n = inputs.len();
        self.reply_limit.check(n)?;
        let receiver = self.batcher.submit(inputs, options, received + budget)?;
        Ok((receiver, n))
    }
}

impl Replier {
    /// Sends the reply: TEI's response body with timing headers, or TEI's error body with NATS
    /// micro error headers (`Nats-Service-Error-Code`, `Nats-Service-Error`), counted in
    /// `$SRV.STATS` (see [`crate::respond`]). Once draining, it goes out on the spare connection.
    async fn respond(&self, request: Request, outcome: Outcome) {
        let answer = match outcome {
            Ok(reply) => {
                let mut reply_headers = HeaderMap::new();
                for (name, value) in reply::success_headers(reply.queue_time, reply.inference_time)
                {
                    reply_headers.insert(name, value.as_str());
                }
                Answer::ok(reply_headers, reply.payload)
            }
            Err(err) => Answer::error(&err),
        };
        match self.draining.get() {
            Some(spare) => answer.publish(spare, &request).await,
            None => answer.send(&self.client, request).await,
        }
    }
}
