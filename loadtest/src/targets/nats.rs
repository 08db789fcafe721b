//! The NATS target: request-reply on the embatch subject, with the deadline header.

use std::time::Duration;

use async_nats::client::RequestErrorKind;
use async_nats::{HeaderMap, Request};
use embatch_protocol::headers;

use crate::LoadtestError;
use crate::corpus::Payload;
use crate::stats::{FailureKind, Outcome, classify_nats};

/// The embatch NATS subject, reached with one multiplexed NATS connection.
#[derive(Debug, Clone)]
pub struct NatsTarget {
    client: async_nats::Client,
    url: String,
    subject: String,
    timeout: Duration,
}

impl NatsTarget {
    /// Connects to `url`; requests go to `subject` with a reply timeout of `timeout`, which is
    /// also sent as the [`headers::DEADLINE_MS`] budget (whole ms).
    ///
    /// # Errors
    /// [`LoadtestError::NatsConnect`] when the initial connection fails.
    pub async fn connect(
        url: &str,
        subject: &str,
        timeout: Duration,
    ) -> Result<NatsTarget, LoadtestError> {
        let client = async_nats::ConnectOptions::new()
            .name("embatch-loadtest")
            .connection_timeout(timeout.max(Duration::from_secs(5)))
            .request_timeout(Some(timeout))
            .connect(url)
            .await
            .map_err(|e| LoadtestError::NatsConnect {
                url: url.to_string(),
                message: e.to_string(),
            })?;
        Ok(NatsTarget {
            client,
            url: url.to_string(),
            subject: subject.to_string(),
            timeout,
        })
    }

    /// Sends one request and classifies its reply.
    pub async fn send(&self, payload: Payload) -> Outcome {
        let mut hdrs = HeaderMap::new();
        hdrs.insert(
            headers::DEADLINE_MS,
            headers::encode_deadline(self.timeout).as_str(),
        );
        hdrs.insert(headers::VERSION, embatch_protocol::PROTOCOL_VERSION);
        let request = Request::new()
            .payload(payload.body)
            .headers(hdrs)
            .timeout(Some(self.timeout));
        match self
            .client
            .send_request(self.subject.clone(), request)
            .await
        {
            Ok(message) => classify_nats(
                message.status.map(|s| s.as_u16()),
                message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get(headers::SERVICE_ERROR_CODE))
                    .map(|v| v.as_str()),
                &message.payload,
                payload.inputs,
            ),
            Err(err) => Err(classify_request_error(err.kind())),
        }
    }

    /// `nats://… subject …`.
    pub fn describe(&self) -> String {
        format!("{} subject {}", self.url, self.subject)
    }
}

/// Classifies a failed NATS request.
pub fn classify_request_error(kind: RequestErrorKind) -> FailureKind {
    match kind {
        RequestErrorKind::TimedOut => FailureKind::Timeout,
        RequestErrorKind::NoResponders => FailureKind::NoResponders,
        // The client refuses a payload over the server's max_payload before sending it.
        RequestErrorKind::MaxPayloadExceeded => FailureKind::Status(413),
        RequestErrorKind::InvalidSubject | RequestErrorKind::Other => FailureKind::Transport,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_errors() {
        assert_eq!(
            classify_request_error(RequestErrorKind::TimedOut),
            FailureKind::Timeout
        );
        assert_eq!(
            classify_request_error(RequestErrorKind::NoResponders),
            FailureKind::NoResponders
        );
        assert_eq!(
            classify_request_error(RequestErrorKind::Other),
            FailureKind::Transport
        );
    }
}
