//! The Rust client of the embatch NATS contract (see `embatch-protocol` and the README's "NATS
//! contract"): connect to NATS, send one embed request with its deadline, get back the embeddings
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

pub mod fleet;
mod servers;

use std::time::Duration;

use async_nats::client::RequestErrorKind;
use bytes::Bytes;
use embatch_protocol::reply::{self, Timings};
use embatch_protocol::{EmbedError, PROTOCOL_VERSION, headers};

pub use servers::{ServerList, with_url_credentials};

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

/// A successful reply: TEI's response body and the worker's timings.
#[derive(Debug, Clone)]
pub struct Reply {
    /// TEI's `POST /embed` response body, `[[f32, ...], ...]`, one array per input, as JSON bytes.
    pub payload: Bytes,
    /// Milliseconds waited in the worker before the upstream call, and spent in it.
    pub timings: Timings,
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
    /// Not connected to NATS when the request was to be sent (503, at once): a request would
    /// wait in the client's buffer and reach a worker with a stale deadline after its caller
    /// gave up.
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

/// Sends embed requests on one subject over a shared NATS connection (cheap to clone).
#[derive(Debug, Clone)]
pub struct EmbedClient {
    nats: async_nats::Client,
    subject: String,
    discovery: fleet::Discovery,
}

impl EmbedClient {
    /// A client for `subject` (the workers' `EMBATCH_SUBJECT`, by default
    /// [`embatch_protocol::DEFAULT_SUBJECT`]) on an open connection.
    pub fn new(nats: async_nats::Client, subject: impl Into<String>) -> EmbedClient {
        EmbedClient {
            nats,
            subject: subject.into(),
            discovery: fleet::Discovery::default(),
        }
    }

    /// The NATS connection.
    pub fn nats(&self) -> &async_nats::Client {
        &self.nats
    }

    /// The subject requests are sent on.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// [`RequestError::Disconnected`] unless the connection is up.
    fn connected(&self) -> Result<(), RequestError> {
        match self.nats.connection_state() {
            async_nats::connection::State::Connected => Ok(()),
            _ => Err(RequestError::Disconnected),
        }
    }

    /// Sends `body` (TEI's `POST /embed` JSON, passed through unparsed) with `budget` as its
    /// deadline ([`headers::DEADLINE_MS`], whole ms) and waits at most `budget` for the reply.
    ///
    /// Every request carries a fresh [`headers::REQUEST_ID`]; when this future is dropped before
    /// the reply came (the caller went away, e.g. an HTTP client disconnected), the id is
    /// published on [`headers::cancel_subject`] so the worker drops the request before it costs
    /// upstream work.
    ///
    /// "No responders" (no worker is a member of the queue group) is retried for up to
    /// [`NO_RESPONDERS_RETRY`] within the budget (10, 20, 40, 80 ms): workers re-subscribe a few
    /// ms after a NATS reconnect or a rolling restart, and a full worker rejoins as soon as it
    /// sees no other member with room. Then service discovery ([`fleet`]) says why: workers
    /// that are full make it [`RequestError::Saturated`] (429), workers whose upstream fails
    /// [`RequestError::Unhealthy`] (503), none [`RequestError::NoResponders`] (503).
    ///
    /// A worker's "unavailable" answer (503: its upstream is unreachable or it is stopping) is
    /// retried at most [`UNAVAILABLE_RETRIES`] times, after 10–20 ms and 20–30 ms (jittered), while
    /// the budget allows: an embedding request is idempotent, and the queue group is likely to
    /// route the retry to another worker. Nothing else is retried (never a 4xx, a 429 or a
    /// timeout).
    ///
    /// # Errors
    /// See [`RequestError`].
    pub async fn embed(&self, body: Bytes, budget: Duration) -> Result<Reply, RequestError> {
        let started = tokio::time::Instant::now();
        let mut retries = 0;
        loop {
            let remaining = budget.saturating_sub(started.elapsed());
            match self.embed_once(body.clone(), remaining).await {
                Err(RequestError::Reply(err))
                    if err.status() == 503
                        && retries < UNAVAILABLE_RETRIES
                        && remaining > Duration::from_millis(100) =>
                {
                    retries += 1;
                    metrics::counter!(RETRIES, "reason" => "unavailable").increment(1);
                    tracing::debug!(%err, retries, "a worker answered 503; retrying");
                    tokio::time::sleep(retry_pause(retries)).await;
                }
                other => return other,
            }
        }
    }

    /// One attempt of [`EmbedClient::embed`] (with its no-responders retries).
    async fn embed_once(&self, body: Bytes, budget: Duration) -> Result<Reply, RequestError> {
        self.connected()?;
        let started = tokio::time::Instant::now();
        let id = self.nats.new_inbox();
        let mut cancel = CancelOnDrop {
            nats: Some(self.nats.clone()),
            subject: &self.subject,
            id: &id,
        };
        let mut backoff = Duration::from_millis(10);
        let message = loop {
            let remaining = budget.saturating_sub(started.elapsed());
            let mut request_headers = async_nats::HeaderMap::new();
            request_headers.insert(
                headers::DEADLINE_MS,
                headers::encode_deadline(remaining).as_str(),
            );
            request_headers.insert(headers::VERSION, PROTOCOL_VERSION);
            request_headers.insert(headers::REQUEST_ID, id.as_str());
            let request = async_nats::Request::new()
                .payload(body.clone())
                .headers(request_headers)
                .timeout(Some(remaining));
            match self.nats.send_request(self.subject.clone(), request).await {
                Ok(message) => break message,
                Err(err) if err.kind() == RequestErrorKind::NoResponders => {
                    let waited = started.elapsed();
                    if waited + backoff < NO_RESPONDERS_RETRY.min(budget) {
                        metrics::counter!(RETRIES, "reason" => "no_responders").increment(1);
                        tokio::time::sleep(backoff).await;
                        backoff *= 2;
                        continue;
                    }
                    cancel.disarm();
                    // Still no member: discovery says whether the workers are full, sick or
                    // absent.
                    let subject = self.subject.clone();
                    return Err(
                        match self
                            .discovery
                            .ask(&self.nats, embatch_protocol::SERVICE_NAME, &self.subject)
                            .await
                        {
                            fleet::Fleet::Saturated => RequestError::Saturated { subject },
                            fleet::Fleet::Unhealthy => RequestError::Unhealthy { subject },
                            fleet::Fleet::Absent => RequestError::NoResponders { subject },
                        },
                    );
                }
                Err(err) => {
                    if err.kind() != RequestErrorKind::TimedOut {
                        cancel.disarm();
                    }
                    return Err(match err.kind() {
                        RequestErrorKind::TimedOut => RequestError::TimedOut {
                            budget_ms: budget.as_millis(),
                        },
                        RequestErrorKind::MaxPayloadExceeded => {
                            RequestError::MaxPayload(err.to_string())
                        }
                        _ => RequestError::Transport(err.to_string()),
                    });
                }
            }
        };
        cancel.disarm();
        decode(message)
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
    Ok(Reply {
        payload: message.payload,
        timings,
    })
}

/// How many times [`EmbedClient::embed`] retries a worker's 503 answer: 2.
pub const UNAVAILABLE_RETRIES: u32 = 2;

/// Counter of the retries [`EmbedClient::embed`] made, by `reason`: `no_responders` (no worker
/// subscribed yet) and `unavailable` (a worker answered 503). Recorded through the `metrics`
/// facade, so it appears in the `/metrics` of the process that installs a recorder (the
/// gateway's).
pub const RETRIES: &str = "embatch_client_retries_total";

/// The pause before retry `n` (1-based): `10·n` ms plus 0–9 ms of jitter from the clock, so
/// callers that failed together do not retry together.
fn retry_pause(n: u32) -> Duration {
    let jitter = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::from(d.subsec_nanos() % 10))
        .unwrap_or(0);
    Duration::from_millis(10 * u64::from(n) + jitter)
}

/// How long [`EmbedClient::embed`] keeps retrying a "no responders" answer (within the
/// request's budget) before it reports [`RequestError::NoResponders`]: 150 ms.
pub const NO_RESPONDERS_RETRY: Duration = Duration::from_millis(150);

/// Publishes a request's id on the cancel subject when dropped while armed (the caller stopped
/// waiting, or the request timed out): the worker that holds it drops it.
struct CancelOnDrop<'a> {
    nats: Option<async_nats::Client>,
    subject: &'a str,
    id: &'a str,
}

impl CancelOnDrop<'_> {
    fn disarm(&mut self) {
        self.nats = None;
    }
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        let Some(nats) = self.nats.take() else {
            return;
        };
        let subject = headers::cancel_subject(self.subject);
        let id = Bytes::copy_from_slice(self.id.as_bytes());
        // Drop cannot wait: publishing only queues the message on the connection, so a task
        // of its own finishes it. Without a runtime (the caller's runtime is shutting down)
        // nothing can be sent, and the worker's deadline check drops the request instead.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(err) = nats.publish(subject, id).await {
                    tracing::debug!(%err, "cannot publish a cancel");
                }
            });
        }
    }
}
