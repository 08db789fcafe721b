//! [`EmbedClient`]: a subject on a shared NATS connection, and what a request sends on it.

use std::sync::Arc;
use std::time::Duration;

use async_nats::client::RequestErrorKind;
use bytes::Bytes;
use embatch_protocol::{PROTOCOL_VERSION, headers};
use tokio::time::Instant;

use crate::message::decode;
use crate::resend::{RECONNECT_POLL, RETRIES, publish_cancel};
use crate::{Operation, Reply, RequestError, SendOptions, delivery, fleet, inbox};

/// Sends embed requests on one subject over a shared NATS connection (cheap to clone; clones
/// share one reply inbox).
#[derive(Debug, Clone)]
pub struct EmbedClient {
    pub(crate) nats: async_nats::Client,
    pub(crate) subject: String,
    discovery: fleet::Discovery,
    inbox: Arc<tokio::sync::OnceCell<inbox::Inbox>>,
}

impl EmbedClient {
    /// A client for `subject` (the workers' `EMBATCH_SUBJECT`, by default
    /// [`embatch_protocol::DEFAULT_SUBJECT`]) on an open connection.
    pub fn new(nats: async_nats::Client, subject: impl Into<String>) -> EmbedClient {
        EmbedClient {
            nats,
            subject: subject.into(),
            discovery: fleet::Discovery::default(),
            inbox: Arc::new(tokio::sync::OnceCell::new()),
        }
    }

    /// A client for model `model` of the fleet under `subject` (contract v1.1): requests go to
    /// the model subject [`embatch_protocol::model::model_subject`] (`<subject>.<token>`, e.g.
    /// `embed.BAAI/bge-small-en-v1%2E5`), answered only by the workers of that model; cancels,
    /// heartbeats and `info` use that subject's derived subjects. [`EmbedClient::new`] on the
    /// plain subject reaches the default model.
    pub fn for_model(nats: async_nats::Client, subject: &str, model: &str) -> EmbedClient {
        EmbedClient::new(nats, embatch_protocol::model::model_subject(subject, model))
    }

    /// The NATS connection.
    pub fn nats(&self) -> &async_nats::Client {
        &self.nats
    }

    /// The subject requests are sent on.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// How many times the connection was made so far (reconnects included).
    pub(crate) fn connects(&self) -> u64 {
        self.nats
            .statistics()
            .connects
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// [`RequestError::Disconnected`] unless the connection is up.
    pub(crate) fn connected(&self) -> Result<(), RequestError> {
        match self.nats.connection_state() {
            async_nats::connection::State::Connected => Ok(()),
            _ => Err(RequestError::Disconnected),
        }
    }

    /// Waits until the connection is up, polling every [`RECONNECT_POLL`]: a request is never
    /// handed to async-nats while it is disconnected (it would be buffered and reach a worker
    /// with a stale deadline). Whether it had to wait; [`RequestError::Disconnected`] when
    /// `deadline` comes first.
    pub(crate) async fn wait_connected(&self, deadline: Instant) -> Result<bool, RequestError> {
        let mut waited = false;
        while self.connected().is_err() {
            if Instant::now() + RECONNECT_POLL >= deadline {
                return Err(RequestError::Disconnected);
            }
            if !waited {
                waited = true;
                metrics::counter!(RETRIES, "reason" => "disconnected").increment(1);
            }
            tokio::time::sleep(RECONNECT_POLL).await;
        }
        Ok(waited)
    }

    /// The shared reply inbox, started by the first request.
    pub(crate) async fn inbox(&self) -> Result<&inbox::Inbox, RequestError> {
        self.inbox
            .get_or_try_init(|| inbox::Inbox::start(&self.nats, &self.subject))
            .await
            .map_err(|err| {
                RequestError::Transport(format!("cannot subscribe the reply inbox: {err}"))
            })
    }

    /// Sends `body` (TEI's `POST /embed` JSON, passed through unparsed) with what is left of
    /// `budget` as its deadline ([`headers::DEADLINE_MS`], whole ms), and waits at most `budget`
    /// for the reply. Whatever happens to NATS or to a worker, the request is resent (with the
    /// same [`headers::REQUEST_ID`] and the deadline left) as long as the budget allows:
    ///
    /// - every request asks for an acknowledgement ([`headers::ACK`]), which a worker sends
    ///   only for a request it still holds after [`headers::ACK_DELAY`] (20 ms; a faster reply
    ///   is its own proof of receipt); with neither within the acknowledgement wait (the
    ///   workers' delay + 10 × the smoothed acknowledgement round trip, that part at least
    ///   100 ms, 120 ms to 1 s in all, doubled at each resend; 1 s for a copy sent within
    ///   [`RECONNECT_GRACE`](crate::RECONNECT_GRACE) of a reconnect, when the backlog of the
    ///   outage reaches the workers at once) it is resent: nats-server delivers at most once,
    ///   and drops messages around a queue member's unsubscribe, a worker killed before reading
    ///   it, or a server restart;
    /// - when every worker that acknowledged it stops its heartbeat
    ///   ([`headers::HEARTBEAT_EXPIRY`]), it is resent: the worker was killed or cut off;
    /// - after a reconnect of this client, every request in flight is resent: replies
    ///   published while it was away were dropped;
    /// - while disconnected, nothing is sent: a request waits for the reconnect (polling every
    ///   [`RECONNECT_POLL`]) until its deadline, then fails with [`RequestError::Disconnected`];
    /// - a worker's "unavailable" answer (503: its upstream failed, or it is stopping) is
    ///   resent at most [`UNAVAILABLE_RETRIES`](crate::UNAVAILABLE_RETRIES) times after a short
    ///   jittered pause (10, 20, 40, 80, 160, 200 ms), as the queue group likely routes it to
    ///   another worker.
    ///
    /// The first final reply wins; when more than one copy was sent, the id is then published
    /// on [`headers::cancel_subject`] so a worker still holding a copy drops it before upstream
    /// work. The same happens when this future is dropped before the reply (the caller went
    /// away, e.g. an HTTP client disconnected) or the budget runs out.
    ///
    /// "No responders" (no worker is a member of the queue group) is retried for up to
    /// [`NO_RESPONDERS_RETRY`](crate::NO_RESPONDERS_RETRY) within the budget (10, 20, 40, 80 ms;
    /// [`RECONNECT_GRACE`](crate::RECONNECT_GRACE) after a reconnect, with pauses of at most
    /// 100 ms): workers re-subscribe a few ms after a NATS reconnect or a rolling restart, and a
    /// full worker rejoins as soon as it sees no other member with room. Then service discovery
    /// ([`fleet`]) says why: workers that are full make it [`RequestError::Saturated`] (429),
    /// workers whose upstream fails [`RequestError::Unhealthy`] (503), none
    /// [`RequestError::NoResponders`] (503). Nothing else is retried (never a 4xx, a 429 or a 504).
    ///
    /// # Errors
    /// See [`RequestError`].
    pub async fn embed(&self, body: Bytes, budget: Duration) -> Result<Reply, RequestError> {
        self.embed_with(body, budget, &SendOptions::default()).await
    }

    /// [`EmbedClient::embed`] with per-request `options` (e.g. the cache bypass the gateway
    /// maps from HTTP's `Cache-Control`), sent as headers on every copy.
    ///
    /// # Errors
    /// See [`RequestError`].
    pub async fn embed_with(
        &self,
        body: Bytes,
        budget: Duration,
        options: &SendOptions,
    ) -> Result<Reply, RequestError> {
        delivery::deliver(self, body, budget, options).await
    }

    /// Sends `body` (TEI's `POST /rerank` JSON, passed through unparsed) on the rerank subject,
    /// as [`EmbedClient::embed`] sends an embed request (the same deadline, acknowledgements,
    /// resends and cancels); the reply's payload is TEI's `/rerank` reply, `[{"index",
    /// "score", "text"?}, ...]` sorted by score.
    ///
    /// # Errors
    /// See [`RequestError`].
    pub async fn rerank(&self, body: Bytes, budget: Duration) -> Result<Reply, RequestError> {
        let options = SendOptions {
            operation: Operation::Rerank,
            ..SendOptions::default()
        };
        self.embed_with(body, budget, &options).await
    }

    /// Publishes copy `attempt` (1-based) of a request: `body` with its headers, replies to
    /// `reply`; a resent copy says which it is ([`headers::ATTEMPT`]).
    pub(crate) async fn publish(
        &self,
        reply: &str,
        body: &Bytes,
        remaining: Duration,
        attempt: u32,
        options: &SendOptions,
    ) -> Result<(), RequestError> {
        // Names from `from_static`: no copy and no check of a name known to be valid, on the
        // path every request takes.
        let name = async_nats::header::HeaderName::from_static;
        let mut request_headers = async_nats::HeaderMap::new();
        if let Some(cache_control) = &options.cache_control {
            request_headers.insert(name(headers::CACHE_CONTROL), cache_control.as_str());
        }
        if let Some(tenant) = &options.tenant {
            request_headers.insert(name(headers::TENANT), &**tenant);
        }
        if let Some(trace) = &options.trace {
            trace.inject(&mut request_headers);
        }
        request_headers.insert(
            name(headers::DEADLINE_MS),
            headers::encode_deadline(remaining),
        );
        request_headers.insert(name(headers::VERSION), PROTOCOL_VERSION);
        request_headers.insert(name(headers::REQUEST_ID), reply);
        request_headers.insert(name(headers::ACK), "1");
        if let Some(inbox) = self.inbox.get() {
            request_headers.insert(name(headers::HEARTBEAT_TO), inbox.alive());
        }
        if attempt > 1 {
            request_headers.insert(name(headers::ATTEMPT), attempt.to_string());
        }
        let subject = options.operation.subject(&self.subject);
        self.nats
            .publish_with_reply_and_headers(
                subject,
                reply.to_owned(),
                request_headers,
                body.clone(),
            )
            .await
            .map_err(|err| match err.kind() {
                async_nats::client::PublishErrorKind::MaxPayloadExceeded => {
                    RequestError::MaxPayload(err.to_string())
                }
                _ => RequestError::Transport(err.to_string()),
            })
    }

    /// Withdraws the copies of request `id` that workers may still hold.
    pub(crate) fn withdraw(&self, id: &str) {
        publish_cancel(self.nats.clone(), &self.subject, id);
    }

    /// Why no worker is a member of the queue group, as discovery tells.
    pub(crate) async fn why_no_responders(&self) -> RequestError {
        let subject = self.subject.clone();
        match self
            .discovery
            .ask(&self.nats, embatch_protocol::SERVICE_NAME, &self.subject)
            .await
        {
            fleet::Fleet::Saturated => RequestError::Saturated { subject },
            fleet::Fleet::Unhealthy => RequestError::Unhealthy { subject },
            fleet::Fleet::Absent => RequestError::NoResponders { subject },
        }
    }

    /// Asks one worker for the upstream's `/info` document (TEI's shape) on
    /// [`headers::info_subject`], waiting at most `timeout`.
    ///
    /// # Errors
    /// [`RequestError::NoResponders`] when no worker serves the subject,
    /// [`RequestError::TimedOut`] after `timeout`, [`RequestError::Reply`] with the worker's error
    /// (e.g. its TEI is unreachable).
    pub async fn info(&self, timeout: Duration) -> Result<Reply, RequestError> {
        self.connected()?;
        let subject = headers::info_subject(&self.subject);
        let request = async_nats::Request::new()
            .payload(Bytes::new())
            .timeout(Some(timeout));
        let message = self
            .nats
            .send_request(subject.clone(), request)
            .await
            .map_err(|err| match err.kind() {
                RequestErrorKind::NoResponders => RequestError::NoResponders { subject },
                RequestErrorKind::TimedOut => RequestError::TimedOut {
                    budget_ms: timeout.as_millis(),
                },
                _ => RequestError::Transport(err.to_string()),
            })?;
        decode(message)
    }
}
