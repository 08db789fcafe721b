//! Tokenize and decode requests at the intake: TEI 1.9.3's `/tokenize` and `/decode` bodies on
//! `<subject>.tokenize` and `<subject>.decode` (contract v1.3), checked with TEI's limits and
//! passed to the upstream's route, one upstream call per request: they run no model, so a batch
//! would only add its wait. Each keeps the request's deadline (504 when it passes first), its
//! acknowledgement, its withdrawal and its tenant's counts; the upstream's reply, or TEI's
//! error, is answered as it came (the built-in model answers from its own tokenizer). An
//! upstream without the route (a server answering 404 or 405) is 424 `Backend` naming it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use embatch_protocol::tokenize::{self, DecodeRequest, TokenizeRequest};
use embatch_protocol::{EmbedError, headers};
use tokio::time::Instant;

use super::reply::served;
use super::{Acks, Arrival, sleep_until};
use crate::cache::{Answered, Stash};
use crate::micro::EndpointStats;
use crate::telemetry::{self, Traffic};
use crate::upstream::UpstreamError;
use crate::upstream::route::RouteCaller;

/// Where this worker passes TEI's token routes through, and to what.
#[derive(Clone, Default)]
pub struct TokenRoutes {
    /// Each served subject's tokenize and decode subjects, with their route.
    subjects: Vec<(String, &'static str)>,
    /// The upstream's routes; `None`: an upstream without them.
    caller: Option<Arc<dyn RouteCaller>>,
}

impl std::fmt::Debug for TokenRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenRoutes")
            .field("subjects", &self.subjects)
            .field("caller", &self.caller.is_some())
            .finish()
    }
}

impl TokenRoutes {
    /// The token routes of a worker serving `subjects`, passed to `caller` (the upstream's
    /// [`crate::upstream::Upstream::route_caller`]).
    pub fn new(subjects: &[String], caller: Option<Arc<dyn RouteCaller>>) -> TokenRoutes {
        let subjects = subjects
            .iter()
            .flat_map(|s| {
                [
                    (tokenize::tokenize_subject(s), tokenize::TOKENIZE),
                    (tokenize::decode_subject(s), tokenize::DECODE),
                ]
            })
            .collect();
        TokenRoutes { subjects, caller }
    }

    /// The subjects, which join and leave the queue group with the request subjects.
    pub fn subjects(&self) -> Vec<String> {
        self.subjects.iter().map(|(s, _)| s.clone()).collect()
    }

    /// The upstream's routes, if it has them.
    pub(super) fn caller(&self) -> Option<Arc<dyn RouteCaller>> {
        self.caller.clone()
    }

    /// The route `subject` is the subject of, if any.
    pub(super) fn route_of(&self, subject: &str) -> Option<&'static str> {
        self.subjects
            .iter()
            .find(|(s, _)| s == subject)
            .map(|(_, route)| *route)
    }
}

/// One tokenize or decode request, from its arrival to its reply.
pub(super) struct PassTask {
    /// `tokenize` or `decode`.
    pub(super) route: &'static str,
    /// The request.
    pub(super) arrival: Arrival,
    /// Its time budget from its headers, or why they are invalid.
    pub(super) budget: Result<Duration, EmbedError>,
    /// Most inputs in one request (`MAX_CLIENT_BATCH_SIZE`).
    pub(super) max_inputs: usize,
    /// The upstream's routes.
    pub(super) caller: Option<Arc<dyn RouteCaller>>,
    /// Where the reply goes, and the endpoint's counters.
    pub(super) client: async_nats::Client,
    pub(super) stats: EndpointStats,
    /// How to acknowledge, when the request asks for it.
    pub(super) ack: Option<Acks>,
}

impl PassTask {
    /// Checks, calls the upstream (acknowledging the request when it is still held
    /// [`headers::ACK_DELAY`] after it arrived) and replies; withdrawn by its caller, it ends
    /// without a reply.
    pub(super) async fn run(mut self) {
        let payload = std::mem::take(&mut self.arrival.request.payload);
        let received = self.arrival.received;
        let started = Instant::now();
        let mut ack_at = self.ack.as_ref().map(|_| received + headers::ACK_DELAY);
        // Counted for the heartbeat from the acknowledgement until the reply is sent.
        let mut _acked = None;
        let outcome = self.outcome(payload);
        tokio::pin!(outcome);
        let outcome = loop {
            tokio::select! {
                biased;
                outcome = &mut outcome => break outcome,
                () = self.arrival.cancelled.cancelled() => return,
                () = sleep_until(ack_at) => {
                    ack_at = None;
                    if let Some(acks) = &self.ack {
                        _acked = Some(acks.send(&self.client, &self.arrival.request).await);
                    }
                }
            }
        };
        let (status, inputs) = match &outcome {
            Ok((_, inputs)) => (200, *inputs),
            Err(err) => (err.status(), 0),
        };
        let label = outcome.as_ref().map_or_else(EmbedError::kind, |_| "ok");
        metrics::counter!(crate::telemetry::names::REQUESTS, "outcome" => label).increment(1);
        let caller = &self.arrival.caller.label;
        telemetry::count_tenant(caller, Traffic::Interactive, status, (inputs, None));
        let answered = outcome.map(|(payload, _)| Answered {
            payload,
            tokens: None,
            hits: None,
            stash: Stash::default(),
        });
        let mut reply = served(answered, Some((Duration::ZERO, started.elapsed())));
        if let Some(Acks { delay_ms, .. }) = &self.ack {
            reply = reply.header(headers::ACK_DELAY_MS, delay_ms);
        }
        let request = &self.arrival.request;
        reply
            .send(&self.client, request, &self.stats, received)
            .await;
    }

    /// The upstream's reply and the request's number of inputs, or the error to answer.
    async fn outcome(&self, payload: Bytes) -> Result<(Bytes, usize), EmbedError> {
        let budget = self.budget.clone()?;
        let inputs = check(self.route, &payload, self.max_inputs)?;
        let Some(caller) = &self.caller else {
            return Err(not_served(
                self.route,
                "this worker's upstream has no such route",
            ));
        };
        let deadline = self.arrival.received + budget;
        let call = caller.call(self.route, payload);
        let reply = tokio::time::timeout_at(deadline, call)
            .await
            .map_err(|_| {
                EmbedError::DeadlineExceeded(format!(
                    "the request's deadline of {} ms passed during the upstream's /{}",
                    budget.as_millis(),
                    self.route
                ))
            })?
            .map_err(|err| upstream_error(self.route, err))?;
        Ok((reply, inputs))
    }
}

/// TEI 1.9.3's checks of a `route` body: its number of inputs.
fn check(route: &str, payload: &[u8], max_inputs: usize) -> Result<usize, EmbedError> {
    if route == tokenize::DECODE {
        let request = DecodeRequest::from_slice(payload)?;
        request.validate(max_inputs)?;
        Ok(request.len())
    } else {
        let request = TokenizeRequest::from_slice(payload)?;
        request.validate(max_inputs)?;
        Ok(request.len())
    }
}

/// 424 `Backend` naming `route`, for an upstream that does not serve it.
fn not_served(route: &str, why: &str) -> EmbedError {
    EmbedError::Backend(format!("the upstream does not serve POST /{route}: {why}"))
}

/// What a failed pass-through call is answered: a 404 or 405 (a server without the route) as
/// [`not_served`], any other error as the embedding path answers it (TEI's error passed through).
fn upstream_error(route: &str, err: UpstreamError) -> EmbedError {
    match &err {
        UpstreamError::Status { status, .. } | UpstreamError::Http { status, .. }
            if matches!(status, 404 | 405) =>
        {
            not_served(route, &err.to_string())
        }
        _ => err.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_by_subject_and_checks_bodies() {
        let routes = TokenRoutes::new(&["embed.m".to_owned(), "embed".to_owned()], None);
        assert_eq!(routes.route_of("embed.m.tokenize"), Some("tokenize"));
        assert_eq!(routes.route_of("embed.decode"), Some("decode"));
        assert_eq!(routes.route_of("embed"), None);
        assert_eq!(routes.subjects().len(), 4);
        assert_eq!(check("tokenize", br#"{"inputs":["a","b"]}"#, 4), Ok(2));
        assert_eq!(check("decode", br#"{"ids":[[1],[2],[3]]}"#, 4), Ok(3));
        let err = check("decode", br#"{"ids":[[1],[2],[3]]}"#, 2).expect_err("too many");
        assert_eq!(err.status(), 422);
        assert_eq!(check("tokenize", b"{}", 2).expect_err("").status(), 422);
    }

    #[test]
    fn a_missing_route_is_424_naming_it() {
        let missing = UpstreamError::Http {
            status: 404,
            body: String::new(),
        };
        let err = upstream_error("tokenize", missing);
        assert_eq!(err.status(), 424);
        assert!(err.to_string().contains("POST /tokenize"), "{err}");
        let teis = UpstreamError::Status {
            status: 422,
            response: embatch_protocol::ErrorResponse {
                error: "too long".into(),
                error_type: embatch_protocol::ErrorType::Validation,
            },
        };
        assert_eq!(upstream_error("tokenize", teis).status(), 422);
    }
}
