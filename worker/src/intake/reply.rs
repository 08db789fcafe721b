//! A request's reply: its reply task (work, acknowledgement, withdrawal, reply), the reply size
//! limit every reply is checked against, and the replies' bodies and headers.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_nats::HeaderMap;
use async_nats::header::{HeaderName, HeaderValue};
use embatch_protocol::{EmbedError, headers, reply};

use super::shape::{Shape, shaped};
use super::work::{Timing, Work};
use super::{Acks, Arrival, sleep_until};
use crate::cache::{Answered, Cache, Stash};
use crate::micro::EndpointStats;
use crate::respond::Answer;
use crate::telemetry::{Traffic, count_tenant};

/// Bytes a reply may need per input, learnt from the replies sent (the largest seen), so a
/// request whose reply cannot fit `max_payload` is refused before any upstream work.
pub(super) struct ReplyLimit {
    max_payload: usize,
    bytes_per_input: AtomicUsize,
}

/// Room kept in a reply for NATS headers and framing, in bytes.
const REPLY_OVERHEAD: usize = 1024;

impl ReplyLimit {
    pub(super) fn new(max_payload: usize) -> ReplyLimit {
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
    pub(super) fn check(&self, inputs: usize) -> Result<(), EmbedError> {
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
    pub(super) fn observe(&self, inputs: usize, bytes: usize) -> Result<(), EmbedError> {
        self.bytes_per_input
            .fetch_max(bytes.div_ceil(inputs.max(1)), Ordering::Relaxed);
        if bytes + REPLY_OVERHEAD > self.max_payload {
            return Err(self.too_large(inputs, bytes));
        }
        Ok(())
    }
}

/// A request's reply task: its work, then its reply.
pub(super) struct ReplyTask {
    pub(super) work: Work,
    /// The request's inputs.
    pub(super) inputs: usize,
    /// How to shape the reply, when not as assembled.
    pub(super) shape: Option<Shape>,
    /// The request (its payload dropped), its registration and its share of what is held,
    /// released when the task ends.
    pub(super) arrival: Arrival,
    /// The reply-size limit that checks the reply, if any ([`Shape::limit`]).
    pub(super) reply_limit: Option<Arc<ReplyLimit>>,
    pub(super) client: async_nats::Client,
    pub(super) stats: EndpointStats,
    pub(super) cache: Arc<Cache>,
    /// How to acknowledge, when the request asks for it.
    pub(super) ack: Option<Acks>,
}

impl ReplyTask {
    /// Looks up, counts, submits and waits (acknowledging the request when it is still held
    /// [`headers::ACK_DELAY`] after it arrived), then replies. Withdrawn by its caller: dropping
    /// the work drops its count, its receiver (the batcher drops its queued inputs) and its leads
    /// (requests waiting on them send their inputs themselves).
    pub(super) async fn run(self) {
        let ReplyTask {
            work,
            inputs,
            shape,
            arrival,
            reply_limit,
            client,
            stats,
            cache,
            ack,
        } = self;
        let Arrival {
            request,
            received,
            registered,
            cancelled,
            share: _share,
            hand_back,
            caller,
            ..
        } = arrival;
        let mut ack_at = ack.as_ref().map(|_| received + headers::ACK_DELAY);
        // Counted for the heartbeat from the acknowledgement until the reply is sent.
        let mut _acked = None;
        // Boxed: the work's state (about 2.4 KB) would otherwise make this task's future twice
        // as large, and a task's future is copied whole as it is spawned.
        let mut work = Box::pin(work.run(&cache));
        let (outcome, batcher_answered) = loop {
            tokio::select! {
                // An outcome ready with the acknowledgement due makes it unnecessary.
                biased;
                outcome = &mut work => break outcome,
                () = cancelled.cancelled() => return,
                () = sleep_until(ack_at) => {
                    ack_at = None;
                    if let Some(acks) = &ack {
                        _acked = Some(acks.send(&client, &request).await);
                    }
                }
            }
        };
        drop(registered);
        let limit = reply_limit.as_deref();
        let settled = settle(outcome, batcher_answered, hand_back, inputs, limit);
        let Settled {
            outcome,
            timing,
            stash,
            all_hits,
        } = settled;
        let outcome = shaped(outcome, shape);
        let (status, tokens) = outcome
            .as_ref()
            .map_or_else(|err| (err.status(), None), |a| (200, a.tokens));
        count_tenant(
            &caller.label,
            Traffic::Interactive,
            status,
            (inputs, tokens),
        );
        let mut reply = served(outcome, timing);
        if let Some(Acks { delay_ms, .. }) = &ack {
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
    }
}

/// A reply task's outcome, ready to send.
struct Settled {
    outcome: Result<Answered, EmbedError>,
    timing: Timing,
    /// The new results, stored once the reply is sent.
    stash: Stash,
    /// Whether every input was a cache hit.
    all_hits: bool,
}

/// Counts a request's outcome (unless the batcher did: `batcher_answered`), turns a 429 of a
/// request that asks to be handed back (`hand_back`) into a 503 to resend on, takes its new
/// results out for the cache, and checks (and teaches) `reply_limit`, when given, with the
/// reply for `inputs` inputs.
fn settle(
    outcome: Result<(Answered, Timing), EmbedError>,
    batcher_answered: bool,
    hand_back: bool,
    inputs: usize,
    reply_limit: Option<&ReplyLimit>,
) -> Settled {
    if !batcher_answered {
        let label = match &outcome {
            Ok(_) => "ok",
            Err(err) => err.kind(),
        };
        metrics::counter!(crate::telemetry::names::REQUESTS, "outcome" => label).increment(1);
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
        if let Some(reply_limit) = reply_limit {
            reply_limit.observe(inputs, answered.payload.len())?;
        }
        Ok((answered, timing))
    });
    let (outcome, timing) = match outcome {
        Ok((answered, timing)) => (Ok(answered), timing),
        Err(err) => (Err(err), None),
    };
    Settled {
        outcome,
        timing,
        stash,
        all_hits,
    }
}

/// The reply for a request served through the cache: TEI's response body with timing headers
/// (zero for a request the batcher never saw), the request's tokens when known
/// ([`headers::TOKENS`]) and its cache hits while the cache is on ([`headers::CACHE_HITS`]);
/// or the error reply.
pub(super) fn served(outcome: Result<Answered, EmbedError>, timing: Timing) -> Answer {
    match outcome {
        Ok(answered) => {
            let (queue_time, inference_time) = timing.unwrap_or_default();
            let name = HeaderName::from_static;
            let mut reply_headers = HeaderMap::new();
            for (header, value) in reply::success_headers(queue_time, inference_time) {
                reply_headers.insert(name(header), value);
            }
            if let Some(tokens) = answered.tokens {
                reply_headers.insert(name(headers::TOKENS), HeaderValue::from(tokens));
            }
            if let Some(hits) = answered.hits {
                reply_headers.insert(name(headers::CACHE_HITS), HeaderValue::from(hits));
            }
            Answer::ok(reply_headers, answered.payload)
        }
        Err(err) => Answer::error(&err),
    }
}
