//! Replies on the worker's endpoints (`embed`, `info`): TEI's bodies with the contract's
//! headers, counted in the endpoint's `$SRV.STATS` entry (see [`crate::micro`]).
//!
//! An error reply carries TEI's error JSON as its body next to the NATS micro error headers
//! (`Nats-Service-Error-Code`, `Nats-Service-Error`), as nats.go's `micro` lets an error carry
//! data, and is counted in `num_errors` with `last_error` = `code:message`.

use async_nats::service::error::Error as ServiceError;
use async_nats::{Client, HeaderMap, Message};
use bytes::Bytes;
use embatch_protocol::{EmbedError, reply};
use tokio::time::Instant;

use crate::micro::EndpointStats;

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
            error: Some(ServiceError {
                code: usize::from(err.status()),
                status: message.1,
            }),
        }
    }

    /// The same reply with header `name: value` added (e.g. [`embatch_protocol::headers::ACK_DELAY_MS`]).
    pub(crate) fn header(mut self, name: &'static str, value: &str) -> Answer {
        self.headers
            .insert(async_nats::header::HeaderName::from_static(name), value);
        self
    }

    /// Counts the reply in `stats`, with the time since `received`, then publishes it to
    /// `request`'s inbox on `client`: counted first, so a caller that asks `$SRV.STATS` right
    /// after its reply sees it counted. A request without a reply subject (published, not
    /// requested) is only counted.
    pub(crate) async fn send(
        self,
        client: &Client,
        request: &Message,
        stats: &EndpointStats,
        received: Instant,
    ) {
        crate::trace::answered(self.error.as_ref().and_then(|e| u16::try_from(e.code).ok()));
        stats.record(received.elapsed(), self.error);
        if let Some(inbox) = request.reply.clone()
            && let Err(err) = client
                .publish_with_headers(inbox, self.headers, self.payload)
                .await
        {
            tracing::warn!(%err, "cannot publish reply");
        }
    }
}
