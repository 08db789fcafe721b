//! Why a request failed, and the one mapping of it to the contract's errors.

use embatch_protocol::EmbedError;

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
    /// one has left it because it is full (429: retry later; see [`fleet`](crate::fleet)).
    #[error(
        "every embatch worker on subject `{subject}` is at capacity (full workers leave the \
         queue group until their backlog drains); retry in ~1 s"
    )]
    Saturated {
        /// The subject sent to.
        subject: String,
    },
    /// No worker is a member of the queue group, and discovery says the workers that exist
    /// left it because their upstream fails (503; see [`fleet`](crate::fleet)).
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
    /// Not connected to NATS (503): for [`EmbedClient::embed`](crate::EmbedClient::embed), not
    /// before the deadline (a request waits for the reconnect rather than wait in the client's
    /// buffer and reach a worker with a stale deadline); for
    /// [`EmbedClient::info`](crate::EmbedClient::info), at the call.
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
