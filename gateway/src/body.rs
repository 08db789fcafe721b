//! The request body of the embedding routes, read within `BODY_READ_TIMEOUT`.
//!
//! hyper's `HEADER_READ_TIMEOUT` ends once a request's headers are in; nothing bounds the body
//! after them, so a client that declares `Content-Length: 100` and sends 14 bytes would hold its
//! connection (and a `MAX_CONNECTIONS` slot) for as long as it likes. [`TimedBody`] reads the
//! whole body through axum's own `Bytes` extractor (so `DefaultBodyLimit`, the 413, still
//! applies) under one deadline for the whole body: a client that stalls *or* trickles a byte
//! now and then is answered 408 Request Timeout ([`EmbedError::BodyTimeout`], RFC 9110 §15.5.9)
//! with `Connection: close`. tower-http's `TimeoutBody` was not used: its timer restarts at
//! every frame received, so a trickling client never trips it. TEI 1.9.3 (`axum::serve`, no
//! timeouts) has no body timeout to mirror.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use embatch_protocol::EmbedError;

use crate::state::AppState;

/// Why a request body could not be read.
#[derive(Debug)]
pub enum BodyError {
    /// axum's rejection: over `MAX_BODY_BYTES` (413), or the connection failed mid-body.
    Rejected(BytesRejection),
    /// The whole body did not arrive within `BODY_READ_TIMEOUT` (408).
    TimedOut,
}

/// The request body, or why it could not be read (an extractor that never rejects: the routes
/// answer the error in their own shape, TEI's or OpenAI's). Must be a handler's last argument.
pub struct TimedBody(pub Result<Bytes, BodyError>);

impl FromRequest<Arc<AppState>> for TimedBody {
    type Rejection = std::convert::Infallible;

    async fn from_request(
        request: Request,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        let read = Bytes::from_request(request, state);
        Ok(TimedBody(
            match tokio::time::timeout(state.body_read_timeout, read).await {
                Ok(read) => read.map_err(BodyError::Rejected),
                Err(_) => Err(BodyError::TimedOut),
            },
        ))
    }
}

impl BodyError {
    /// The typed error the routes answer: [`EmbedError::TooLarge`] (413) over `max_body_bytes`,
    /// [`EmbedError::BodyTimeout`] (408) after `BODY_READ_TIMEOUT`, [`EmbedError::Validation`]
    /// (422) for a body that could not be read.
    pub fn into_embed_error(self, state: &AppState) -> EmbedError {
        match self {
            BodyError::Rejected(rejection)
                if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE =>
            {
                EmbedError::TooLarge(format!(
                    "the request body must be at most {} bytes (MAX_BODY_BYTES)",
                    state.max_body_bytes
                ))
            }
            BodyError::Rejected(rejection) => {
                EmbedError::Validation(format!("cannot read the request body: {rejection}"))
            }
            BodyError::TimedOut => EmbedError::BodyTimeout(format!(
                "the request body did not arrive within {} ms (BODY_READ_TIMEOUT)",
                state.body_read_timeout.as_millis()
            )),
        }
    }
}
