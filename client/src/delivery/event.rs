//! What the delivery of one request reacts to ([`Event`]), read off the reply inbox, the timer
//! and the inbox's announcements by the driver ([`super::deliver`]), and why a copy is sent
//! again ([`Resend`]).

use std::time::Duration;

use async_nats::Message;
use embatch_protocol::headers;

use crate::inbox::Generation;
use crate::{Reply, RequestError, decode, header};

/// Why a request is sent again: the label of [`RETRIES`](crate::RETRIES).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resend {
    /// No worker was subscribed yet (workers re-subscribe after a reconnect).
    NoResponders,
    /// A worker answered 503.
    Unavailable,
    /// No worker acknowledged the copy in time.
    NoAck,
    /// The connection came back while the copy was in flight.
    Reconnect,
    /// Every worker holding a copy stopped its heartbeat.
    WorkerLost,
    /// Every worker holding a copy stopped its heartbeat or reconnected to NATS since it
    /// acknowledged the copy, at least one of them reconnected.
    WorkerReconnected,
}

impl Resend {
    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Resend::NoResponders => "no_responders",
            Resend::Unavailable => "unavailable",
            Resend::NoAck => "no_ack",
            Resend::Reconnect => "reconnect",
            Resend::WorkerLost => "worker_lost",
            Resend::WorkerReconnected => "worker_reconnected",
        }
    }
}

/// One thing that happened to a request while a copy of it is out: the input of
/// [`State::on`](super::state::State::on). Plain data: the driver reads the clock, the inbox
/// and the connection, so the state machine needs none of them.
#[derive(Debug)]
pub(crate) enum Event {
    /// A worker acknowledged a copy ([`headers::ACCEPTED_BY`]): `worker` is its service id,
    /// `connects` the connect count its acknowledgement carried ([`headers::WORKER_CONNECTS`];
    /// `None` from a worker that predates the header).
    Acknowledged {
        worker: String,
        connects: Option<u64>,
    },
    /// The final reply, a success. `ack_delay_ms`: its [`headers::ACK_DELAY_MS`] (whole ms),
    /// which an acknowledging worker puts on every reply, acknowledged or not; `None` from a
    /// worker that predates acknowledgements.
    Success {
        reply: Reply,
        ack_delay_ms: Option<u64>,
    },
    /// The final reply, a 503 (the worker's upstream failed, or it is stopping, or it left the
    /// queue group while the copy was on its way). `jitter`: 0–9 ms the driver drew from the
    /// clock ([`retry_jitter`](crate::retry_jitter)), added to the pause before a resend.
    Unavailable {
        error: RequestError,
        ack_delay_ms: Option<u64>,
        jitter: Duration,
    },
    /// The final reply, any other error (4xx, 429, 504, other 5xx): never resent.
    Error {
        error: RequestError,
        ack_delay_ms: Option<u64>,
    },
    /// NATS answered "no responders": no worker is a member of the queue group.
    NoResponders,
    /// The acknowledgement timer ([`Timer::Ack`](super::state::Timer::Ack)) fired.
    AckTimeout,
    /// The deadline timer ([`Timer::Deadline`](super::state::Timer::Deadline)) fired.
    Deadline,
    /// The inbox announced a change ([`Inbox::events`](crate::inbox::Inbox::events)).
    Announced(Announcement),
    /// The reply inbox or its announcements closed (the client's inbox task ended).
    Closed,
}

/// An announcement of the inbox, with what the driver read at that moment of this client's
/// connection and of the workers holding a copy
/// ([`State::holders`](super::state::State::holders)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Announcement {
    /// The inbox's counters now.
    pub generation: Generation,
    /// How many times this client's connection was made so far (reconnects included).
    pub connects: u64,
    /// The holders whose heartbeats stopped ([`Inbox::is_lost`](crate::inbox::Inbox::is_lost)).
    pub lost: Vec<String>,
    /// The holders heard on a later NATS connection than their acknowledgement carried
    /// ([`Inbox::reconnected_since`](crate::inbox::Inbox::reconnected_since)).
    pub reconnected: Vec<String>,
}

impl Event {
    /// What a message on the request's reply subject says; `None` (the inbox closed) is
    /// [`Event::Closed`]. `jitter` is called for a 503 only ([`Event::Unavailable`]).
    pub(crate) fn of_message(message: Option<Message>, jitter: impl FnOnce() -> Duration) -> Event {
        let Some(message) = message else {
            return Event::Closed;
        };
        if message.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
            return Event::NoResponders;
        }
        if let Some(worker) = header(&message, headers::ACCEPTED_BY) {
            return Event::Acknowledged {
                worker: worker.to_owned(),
                connects: crate::inbox::connects_of(&message),
            };
        }
        let ack_delay_ms = headers::parse_millis(header(&message, headers::ACK_DELAY_MS));
        match decode(message) {
            Ok(reply) => Event::Success {
                reply,
                ack_delay_ms,
            },
            Err(error) if matches!(&error, RequestError::Reply(err) if err.status() == 503) => {
                Event::Unavailable {
                    error,
                    ack_delay_ms,
                    jitter: jitter(),
                }
            }
            Err(error) => Event::Error {
                error,
                ack_delay_ms,
            },
        }
    }
}
