//! Replies on the worker's micro-service endpoints (`embed`, `info`): TEI's bodies with the
//! contract's headers, and error replies counted in the service's `$SRV.STATS`.
//!
//! The contract promises TEI's error JSON as the body of an error reply, next to the NATS micro
//! error headers (`Nats-Service-Error-Code`, `Nats-Service-Error`). async-nats 0.51 counts an
//! error in `$SRV.STATS` (`num_errors`, `last_error`) only for `Request::respond(Err(..))`, and
//! that call always sends an *empty* body (nats.go's `micro` lets an error carry data; async-nats
//! does not). So an error reply is sent in two steps:
//! 1. the reply itself (TEI's error body and the error headers) is published to the caller's
//!    inbox on the worker's connection;
//! 2. the request's reply subject is then pointed at a fresh inbox of the worker's own that
//!    nobody subscribes to, and `respond(Err(..))` is called, which counts the error (and the
//!    request, with its processing time) and publishes an empty message the server drops.
//!
//! Step 2 costs one more publish per error reply: no body, only the subject and the two error
//! headers (the code and the one-line message). At 2x overload (~5,000 429s per second) runs
//! with and without it differed by less than the benchmark machine's noise. It needs permission
//! to publish to `_INBOX.>`; under `allow_responses`-only permissions the server refuses it (the
//! reply itself has gone out by then).

use async_nats::service::{Request, error::Error as ServiceError};
use async_nats::{Client, HeaderMap, Subject};
use bytes::Bytes;
use embatch_protocol::{EmbedError, reply};

/// A reply ready to send: its headers and body, and for an error the entry for `$SRV.STATS`.
pub(crate) struct Answer {
    headers: HeaderMap,
    payload: Bytes,
    error: Option<ServiceError>,
}

impl Answer {
    /// A success: `payload` (TEI's response body) with `headers` (e.g. timing headers).
    pub(crate) fn ok(headers: HeaderMap, payload: Bytes) -> Answer {
        Answer {
            headers,
            payload,
            error: None,
        }
    }

    /// An error: TEI's error body `{"error": .., "error_type": ..}` with the micro error headers
    /// carrying its status code and message.
    pub(crate) fn error(err: &EmbedError) -> Answer {
        let [code, message] = reply::error_headers(err);
        let mut headers = HeaderMap::new();
        headers.insert(code.0, code.1.as_str());
        headers.insert(message.0, message.1.as_str());
        Answer {
            headers,
            payload: err.to_json().into(),
            // The one-line message of the header: async-nats puts `status` in a header too.
            error: Some(ServiceError {
                code: usize::from(err.status()),
                status: message.1,
            }),
        }
    }

    /// Publishes the reply on `client` without touching the service's statistics (used once the
    /// service's own connection is drained at shutdown).
    pub(crate) async fn publish(self, client: &Client, request: &Request) {
        if let Some(inbox) = request.message.reply.clone() {
            publish(client, inbox, self.headers, self.payload).await;
        }
    }

    /// Answers `request` and records it in the endpoint's `$SRV.STATS`: a success through
    /// `respond`, an error as the module documentation describes (its body published on
    /// `client`, the service's connection, then counted).
    pub(crate) async fn send(self, client: &Client, mut request: Request) {
        let Some(error) = self.error else {
            if let Err(err) = request
                .respond_with_headers(Ok(self.payload), self.headers)
                .await
            {
                tracing::warn!(%err, "cannot publish reply");
            }
            return;
        };
        let Some(inbox) = request.message.reply.take() else {
            return;
        };
        if !publish(client, inbox, self.headers, self.payload).await {
            return;
        }
        request.message.reply = Some(client.new_inbox().into());
        if let Err(err) = request.respond(Err(error)).await {
            tracing::debug!(%err, "cannot count the error reply in $SRV.STATS");
        }
    }
}

/// Publishes a reply to `inbox`; `false` (logged) when the connection refused it.
async fn publish(client: &Client, inbox: Subject, headers: HeaderMap, payload: Bytes) -> bool {
    match client.publish_with_headers(inbox, headers, payload).await {
        Ok(()) => true,
        Err(err) => {
            tracing::warn!(%err, "cannot publish reply");
            false
        }
    }
}
