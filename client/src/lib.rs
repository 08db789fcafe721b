//! The Rust client of the embatch NATS contract (see `embatch-protocol` and
//! docs/nats-contract.md): connect to NATS, send one embed request with its deadline, get back the embeddings
//! or a typed error.
//!
//! The gateway, the load generator and the tests all send requests through [`EmbedClient`], so
//! the request headers, the reply decoding and the mapping of NATS request failures to
//! [`EmbedError`]s are written once. Likewise [`ServerList`] is the one parser of NATS server
//! lists and URL credentials: [`connect`] uses it, and so does every embatch binary's
//! `--nats-url`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! let nats = embatch_client::connect("nats://127.0.0.1:4222", "my-service").await?;
//! let client = embatch_client::EmbedClient::new(nats, embatch_protocol::DEFAULT_SUBJECT);
//! let reply = client
//!     .embed(r#"{"inputs":["hello"]}"#.into(), Duration::from_secs(2))
//!     .await?;
//! println!("{}", String::from_utf8_lossy(&reply.payload)); // [[0.01, ...]]
//! # Ok(()) }
//! ```
//!
//! A fleet that serves several models (contract v1.1) is reached per model with
//! [`EmbedClient::for_model`]; [`models::discover`] lists the models served.

mod delivery;
pub mod fleet;
mod inbox;
pub mod models;
mod servers;
pub mod trace;

use std::sync::Arc;
use std::time::Duration;

use async_nats::client::RequestErrorKind;
use bytes::Bytes;
use embatch_protocol::reply::{self, Timings};
use embatch_protocol::{EmbedError, PROTOCOL_VERSION, headers};
use tokio::time::Instant;

pub use inbox::{ACK_TIMEOUT_MAX, ACK_TIMEOUT_MIN};

pub use servers::{ServerList, with_url_credentials};
pub use trace::TraceContext;

/// Connects to NATS as `name` (shown by `nats server report connections` and in the monitoring
/// endpoints).
///
/// `urls` may list several servers, comma-separated (see [`ServerList`]). They are tried in the
/// order given, first to connect and again on every reconnect: list the nearest node first.
/// Credentials in a URL are sent ([`with_url_credentials`]).
///
/// # Errors
/// When no server in `urls` answers, or one is not a NATS URL.
pub async fn connect(
    urls: &str,
    name: &str,
) -> Result<async_nats::Client, async_nats::ConnectError> {
    connect_with(urls, async_nats::ConnectOptions::new().name(name)).await
}

/// [`connect`] with the caller's own options (e.g. a subscription capacity).
///
/// # Errors
/// When no server in `urls` answers, or one is not a NATS URL
/// (`ConnectErrorKind::ServerParse`, the URL shown redacted).
pub async fn connect_with(
    urls: &str,
    options: async_nats::ConnectOptions,
) -> Result<async_nats::Client, async_nats::ConnectError> {
    let servers = urls.parse::<ServerList>().map_err(|e| {
        async_nats::ConnectError::with_source(async_nats::ConnectErrorKind::ServerParse, e)
    })?;
    servers
        .connect(with_url_credentials(options, servers.addrs()))
        .await
}

/// The pause before reconnect attempt `attempts` (1-based): none for the first, then 10, 20,
/// 40, 80 ms, then 100 ms for every later one. async-nats's default doubles up to 4 s, so a
/// client could come back seconds after a restarted server did, while requests wait for it
/// within their deadline; an attempt on a local network costs a TCP connect, so ten per second
/// per client is cheap. [`connect`] and the gateway and worker (`embatch-runtime`) use it.
pub fn reconnect_delay(attempts: usize) -> Duration {
    match attempts {
        0 | 1 => Duration::ZERO,
        n => {
            let exp = u32::try_from(n - 2).unwrap_or(u32::MAX).min(4);
            Duration::from_millis(10u64 << exp).min(RECONNECT_DELAY_MAX)
        }
    }
}

/// The longest pause between reconnect attempts ([`reconnect_delay`]): 100 ms.
pub const RECONNECT_DELAY_MAX: Duration = Duration::from_millis(100);

/// A successful reply: TEI's response body and the worker's timings.
#[derive(Debug, Clone)]
pub struct Reply {
    /// TEI's `POST /embed` response body, `[[f32, ...], ...]`, one array per input, as JSON bytes.
    pub payload: Bytes,
    /// Milliseconds waited in the worker before the upstream call, and spent in it.
    pub timings: Timings,
    /// The request's tokens as the worker's tokenizer counts them (the reply's
    /// [`headers::TOKENS`]); `None` when the worker counts inputs, not tokens.
    pub tokens: Option<u64>,
    /// Inputs the worker answered from its cache (the reply's [`headers::CACHE_HITS`]); `None`
    /// when its cache is off (or it predates the cache).
    pub cache_hits: Option<u64>,
}

/// Per-request options of [`EmbedClient::embed_with`], sent as headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SendOptions {
    /// [`headers::CACHE_CONTROL`]: `no-cache` or `no-store` bypass the workers' cache
    /// (HTTP's `Cache-Control` request directives); `None` uses it.
    pub cache_control: Option<String>,
    /// [`headers::TENANT`]: the tenant the request is served for (the gateway sets the one
    /// that authenticated); `None` sends no header, and the worker takes the caller's account's
    /// tenant or `default`.
    pub tenant: Option<std::sync::Arc<str>>,
    /// The W3C trace context to send ([`headers::TRACEPARENT`], [`headers::TRACESTATE`]): the
    /// worker's spans for the request become children of it. `None` sends none.
    pub trace: Option<TraceContext>,
    /// What the request asks for, which decides the subject it is sent on.
    pub operation: Operation,
}

/// What a request asks the workers for: the subject it is sent on, derived from the client's
/// subject. Cancels, heartbeats and discovery are the client's subject's either way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Operation {
    /// Embeddings: TEI's `/embed` body on the client's subject.
    #[default]
    Embed,
    /// Rerank scores: TEI's `/rerank` body on
    /// [`embatch_protocol::rerank::rerank_subject`] of the client's subject (contract v1.2).
    Rerank,
    /// Sparse embeddings: TEI's `/embed_sparse` body on
    /// [`embatch_protocol::sparse::sparse_subject`] of the client's subject (contract v1.3).
    Sparse,
    /// Tokens: TEI's `/tokenize` body on [`embatch_protocol::tokenize::tokenize_subject`] of the
    /// client's subject (contract v1.3).
    Tokenize,
    /// Texts of token ids: TEI's `/decode` body on
    /// [`embatch_protocol::tokenize::decode_subject`] of the client's subject (contract v1.3).
    Decode,
    /// Predictions: TEI's `/predict` body on [`embatch_protocol::predict::predict_subject`] of
    /// the client's subject (contract v1.4).
    Predict,
    /// Token embeddings: TEI's `/embed_all` body on
    /// [`embatch_protocol::embed_all::embed_all_subject`] of the client's subject (v1.4).
    EmbedAll,
    /// Sentence similarities: TEI's `/similarity` body on
    /// [`embatch_protocol::similarity::similarity_subject`] of the client's subject (v1.4).
    Similarity,
}

/// Why a request failed, as the NATS client saw it. [`RequestError::Reply`] is an error the
/// worker answered; the others mean no worker answered. `From<RequestError> for EmbedError` is
/// the one mapping to statuses (503, 504, 413, ...).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The NATS server has no subscriber on the subject: no worker runs (503).
    #[error("no embatch worker is listening on subject `{subject}`")]
    NoResponders {
        /// The subject sent to.
        subject: String,
    },
    /// No worker is a member of the queue group, and discovery says workers exist and at least
    /// one has left it because it is full (429: retry later; see [`fleet`]).
    #[error(
        "every embatch worker on subject `{subject}` is at capacity (full workers leave the \
         queue group until their backlog drains); retry in ~1 s"
    )]
    Saturated {
        /// The subject sent to.
        subject: String,
    },
    /// No worker is a member of the queue group, and discovery says the workers that exist
    /// left it because their upstream fails (503; see [`fleet`]).
    #[error(
        "no embatch worker on subject `{subject}` has a healthy upstream (workers leave the \
         queue group while their upstream fails and rejoin when it recovers)"
    )]
    Unhealthy {
        /// The subject sent to.
        subject: String,
    },
    /// No reply within the budget (504).
    #[error("no reply within {budget_ms} ms")]
    TimedOut {
        /// The budget in whole ms.
        budget_ms: u128,
    },
    /// The body is larger than the NATS server's `max_payload` (413).
    #[error("the request body is larger than the NATS server's max_payload: {0}")]
    MaxPayload(String),
    /// The connection failed or the subject is invalid (503).
    #[error("NATS request failed: {0}")]
    Transport(String),
    /// Not connected to NATS (503): for [`EmbedClient::embed`], not before the deadline (a
    /// request waits for the reconnect rather than wait in the client's buffer and reach a
    /// worker with a stale deadline); for [`EmbedClient::info`], at the call.
    #[error("not connected to NATS")]
    Disconnected,
    /// The worker answered with an error.
    #[error("{0}")]
    Reply(EmbedError),
}

impl From<RequestError> for EmbedError {
    fn from(err: RequestError) -> EmbedError {
        match err {
            RequestError::Reply(err) => err,
            RequestError::TimedOut { .. } => EmbedError::DeadlineExceeded(err.to_string()),
            RequestError::MaxPayload(_) => EmbedError::TooLarge(err.to_string()),
            RequestError::Saturated { .. } => EmbedError::Overloaded(err.to_string()),
            RequestError::NoResponders { .. }
            | RequestError::Unhealthy { .. }
            | RequestError::Transport(_)
            | RequestError::Disconnected => EmbedError::Unavailable(err.to_string()),
        }
    }
}

/// Sends embed requests on one subject over a shared NATS connection (cheap to clone; clones
/// share one reply inbox).
#[derive(Debug, Clone)]
pub struct EmbedClient {
    nats: async_nats::Client,
    subject: String,
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
    fn connects(&self) -> u64 {
        self.nats
            .statistics()
            .connects
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// [`RequestError::Disconnected`] unless the connection is up.
    fn connected(&self) -> Result<(), RequestError> {
        match self.nats.connection_state() {
            async_nats::connection::State::Connected => Ok(()),
            _ => Err(RequestError::Disconnected),
        }
    }

    /// Waits until the connection is up, polling every [`RECONNECT_POLL`]: a request is never
    /// handed to async-nats while it is disconnected (it would be buffered and reach a worker
    /// with a stale deadline). Whether it had to wait; [`RequestError::Disconnected`] when
    /// `deadline` comes first.
    async fn wait_connected(&self, deadline: Instant) -> Result<bool, RequestError> {
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
    async fn inbox(&self) -> Result<&inbox::Inbox, RequestError> {
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
    ///   [`RECONNECT_GRACE`] of a reconnect, when the backlog of the outage reaches the workers
    ///   at once) it is resent: nats-server
    ///   delivers at most once, and drops messages around a queue member's unsubscribe, a
    ///   worker killed before reading it, or a server restart;
    /// - when every worker that acknowledged it stops its heartbeat
    ///   ([`headers::HEARTBEAT_EXPIRY`]), it is resent: the worker was killed or cut off;
    /// - after a reconnect of this client, every request in flight is resent: replies
    ///   published while it was away were dropped;
    /// - while disconnected, nothing is sent: a request waits for the reconnect (polling every
    ///   [`RECONNECT_POLL`]) until its deadline, then fails with [`RequestError::Disconnected`];
    /// - a worker's "unavailable" answer (503: its upstream failed, or it is stopping) is
    ///   resent at most [`UNAVAILABLE_RETRIES`] times after a short jittered pause (10, 20, 40,
    ///   80, 160, 200 ms), as the queue group likely routes it to another worker.
    ///
    /// The first final reply wins; when more than one copy was sent, the id is then published
    /// on [`headers::cancel_subject`] so a worker still holding a copy drops it before upstream
    /// work. The same happens when this future is dropped before the reply (the caller went
    /// away, e.g. an HTTP client disconnected) or the budget runs out.
    ///
    /// "No responders" (no worker is a member of the queue group) is retried for up to
    /// [`NO_RESPONDERS_RETRY`] within the budget (10, 20, 40, 80 ms; [`RECONNECT_GRACE`] after
    /// a reconnect, with pauses of at most 100 ms): workers re-subscribe a few ms after a NATS
    /// reconnect or a rolling restart, and a full worker rejoins as soon as it
    /// sees no other member with room. Then service discovery ([`fleet`]) says why: workers
    /// that are full make it [`RequestError::Saturated`] (429), workers whose upstream fails
    /// [`RequestError::Unhealthy`] (503), none [`RequestError::NoResponders`] (503). Nothing
    /// else is retried (never a 4xx, a 429 or a 504).
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
    async fn publish(
        &self,
        reply: &str,
        body: &Bytes,
        remaining: Duration,
        attempt: u32,
        options: &SendOptions,
    ) -> Result<(), RequestError> {
        let mut request_headers = async_nats::HeaderMap::new();
        if let Some(cache_control) = &options.cache_control {
            request_headers.insert(headers::CACHE_CONTROL, cache_control.as_str());
        }
        if let Some(tenant) = &options.tenant {
            request_headers.insert(headers::TENANT, &**tenant);
        }
        if let Some(trace) = &options.trace {
            trace.inject(&mut request_headers);
        }
        request_headers.insert(
            headers::DEADLINE_MS,
            headers::encode_deadline(remaining).as_str(),
        );
        request_headers.insert(headers::VERSION, PROTOCOL_VERSION);
        request_headers.insert(headers::REQUEST_ID, reply);
        request_headers.insert(headers::ACK, "1");
        if attempt > 1 {
            request_headers.insert(headers::ATTEMPT, attempt.to_string().as_str());
        }
        let subject = match options.operation {
            Operation::Embed => self.subject.clone(),
            Operation::Rerank => embatch_protocol::rerank::rerank_subject(&self.subject),
            Operation::Sparse => embatch_protocol::sparse::sparse_subject(&self.subject),
            Operation::Tokenize => embatch_protocol::tokenize::tokenize_subject(&self.subject),
            Operation::Decode => embatch_protocol::tokenize::decode_subject(&self.subject),
            Operation::Predict => embatch_protocol::predict::predict_subject(&self.subject),
            Operation::EmbedAll => embatch_protocol::embed_all::embed_all_subject(&self.subject),
            Operation::Similarity => {
                embatch_protocol::similarity::similarity_subject(&self.subject)
            }
        };
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
    fn withdraw(&self, id: &str) {
        publish_cancel(self.nats.clone(), &self.subject, id);
    }

    /// Why no worker is a member of the queue group, as discovery tells.
    async fn why_no_responders(&self) -> RequestError {
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

/// The value of header `name` of `message`, if any.
fn header<'a>(message: &'a async_nats::Message, name: &str) -> Option<&'a str> {
    message
        .headers
        .as_ref()
        .and_then(|h| h.get(name))
        .map(|v| v.as_str())
}

/// A reply message as the contract defines it: the payload, or the error its headers carry.
fn decode(message: async_nats::Message) -> Result<Reply, RequestError> {
    let header = |name: &str| {
        message
            .headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str())
    };
    reply::decode(
        header(headers::SERVICE_ERROR_CODE),
        header(headers::SERVICE_ERROR),
        &message.payload,
    )
    .map_err(RequestError::Reply)?;
    let timings = Timings::read(header);
    let tokens = header(headers::TOKENS).and_then(|v| v.trim().parse().ok());
    let cache_hits = header(headers::CACHE_HITS).and_then(|v| v.trim().parse().ok());
    Ok(Reply {
        payload: message.payload,
        timings,
        tokens,
        cache_hits,
    })
}

/// How many times [`EmbedClient::embed`] resends after a worker's 503 answer: 6.
pub const UNAVAILABLE_RETRIES: u32 = 6;

/// How often a request waiting for the NATS connection checks it: 5 ms.
pub const RECONNECT_POLL: Duration = Duration::from_millis(5);

/// A copy is resent only while at least this much of the budget is left: 5 ms.
const MIN_RESEND_BUDGET: Duration = Duration::from_millis(5);

/// Counter of the resends [`EmbedClient::embed`] made, by `reason`: `no_responders` (no worker
/// subscribed yet), `unavailable` (a worker answered 503), `no_ack` (no worker acknowledged the
/// copy in time), `worker_lost` (the worker holding it stopped its heartbeat), `reconnect` (the
/// connection came back while it was in flight), and `disconnected` (a request that waited for
/// the connection before its first send). Recorded through the `metrics`
/// facade, so it appears in the `/metrics` of the process that installs a recorder (the
/// gateway's).
pub const RETRIES: &str = "embatch_client_retries_total";

/// The pause before resend `n` (1-based) after a 503: `10·2^(n-1)` ms, at most 200 ms, plus
/// 0–9 ms of jitter from the clock, so callers that failed together do not retry together.
fn retry_pause(n: u32) -> Duration {
    let jitter = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::from(d.subsec_nanos() % 10))
        .unwrap_or(0);
    let base = 10u64
        .saturating_mul(1 << n.saturating_sub(1).min(5))
        .min(200);
    Duration::from_millis(base + jitter)
}

/// How long [`EmbedClient::embed`] keeps retrying a "no responders" answer (within the
/// request's budget) before it reports [`RequestError::NoResponders`]: 150 ms.
pub const NO_RESPONDERS_RETRY: Duration = Duration::from_millis(150);

/// After a reconnect that a request waited through, or for a request sent within this long of
/// a reconnect, "no responders" is retried until this long after the reconnect instead of for
/// [`NO_RESPONDERS_RETRY`] (within the budget): workers re-subscribe when they have
/// reconnected too, up to a reconnect pause ([`RECONNECT_DELAY_MAX`]) after the server is
/// back: 1 s.
pub const RECONNECT_GRACE: Duration = Duration::from_secs(1);

/// Publishes `id` on the cancel subject of `subject` from a task of its own (a `Drop` cannot
/// wait; publishing only queues the message on the connection). Without a runtime (the caller's
/// runtime is shutting down) nothing can be sent, and the worker's deadline check drops the
/// request instead.
fn publish_cancel(nats: async_nats::Client, subject: &str, id: &str) {
    let subject = headers::cancel_subject(subject);
    let id = Bytes::copy_from_slice(id.as_bytes());
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            if let Err(err) = nats.publish(subject, id).await {
                tracing::debug!(%err, "cannot publish a cancel");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnects_come_fast_and_then_every_100_ms() {
        let delays: Vec<u64> = (1..=8)
            .map(|n| u64::try_from(reconnect_delay(n).as_millis()).unwrap_or(u64::MAX))
            .collect();
        assert_eq!(delays, [0, 10, 20, 40, 80, 100, 100, 100]);
        assert_eq!(reconnect_delay(usize::MAX), RECONNECT_DELAY_MAX);
    }

    #[test]
    fn resend_pauses_grow_to_200_ms_with_under_10_ms_of_jitter() {
        for (n, base) in [
            (1, 10),
            (2, 20),
            (3, 40),
            (4, 80),
            (5, 160),
            (6, 200),
            (9, 200),
        ] {
            let pause = retry_pause(n).as_millis();
            assert!((base..base + 10).contains(&pause), "resend {n}: {pause} ms");
        }
    }
}
