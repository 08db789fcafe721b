//! The NATS target: request-reply on the embatch subject, with the deadline header.

use std::time::Duration;

use embatch_client::{EmbedClient, RequestError, SendOptions};
use embatch_runtime::{NatsAuth, ServerList};

use crate::LoadtestError;
use crate::corpus::Payload;
use crate::stats::{FailureKind, Outcome, check_embeddings};

/// The embatch NATS subject, reached with one multiplexed NATS connection.
#[derive(Debug, Clone)]
pub struct NatsTarget {
    client: EmbedClient,
    url: String,
    timeout: Duration,
    /// Sent with every request (the tenant).
    options: SendOptions,
}

impl NatsTarget {
    /// Connects to `url` (one or several servers) with `auth`; requests go to `subject` with a
    /// reply timeout of `timeout`, which is also sent as the
    /// [`embatch_protocol::headers::DEADLINE_MS`] budget (whole ms).
    ///
    /// # Errors
    /// [`LoadtestError::NatsUrl`] when `url` is not a server list, [`LoadtestError::NatsConnect`]
    /// when the initial connection fails (the messages never show credentials).
    pub async fn connect(
        url: &str,
        subject: &str,
        timeout: Duration,
        auth: &NatsAuth,
    ) -> Result<NatsTarget, LoadtestError> {
        let servers: ServerList = url.parse().map_err(LoadtestError::NatsUrl)?;
        let options = async_nats::ConnectOptions::new()
            .connection_timeout(timeout.max(Duration::from_secs(5)))
            .request_timeout(Some(timeout));
        let nats = auth.connect(&servers, "embatch-loadtest", options).await?;
        Ok(NatsTarget {
            client: EmbedClient::new(nats, subject),
            url: servers.to_string(),
            timeout,
            options: SendOptions::default(),
        })
    }

    /// The same target sending `tenant` as the `Embatch-Tenant` header (`--tenant`); `None`
    /// sends none.
    pub fn for_tenant(mut self, tenant: Option<&str>) -> NatsTarget {
        self.options.tenant = tenant.map(std::sync::Arc::from);
        self
    }

    /// Sends one request and classifies its reply.
    pub async fn send(&self, payload: Payload) -> Outcome {
        let sent = self
            .client
            .embed_with(payload.body, self.timeout, &self.options);
        match sent.await {
            Ok(reply) => check_embeddings(&reply.payload, payload.inputs),
            Err(err) => Err(classify_request_error(&err)),
        }
    }

    /// `nats://… subject …`.
    pub fn describe(&self) -> String {
        format!("{} subject {}", self.url, self.client.subject())
    }
}

/// Classifies a failed NATS request: an error the worker answered by its status, the client's
/// own failures by kind.
pub fn classify_request_error(err: &RequestError) -> FailureKind {
    match err {
        RequestError::TimedOut { .. } => FailureKind::Timeout,
        RequestError::NoResponders { .. } => FailureKind::NoResponders,
        // The client refuses a payload over the server's max_payload before sending it.
        RequestError::MaxPayload(_) => FailureKind::Status(413),
        RequestError::Transport(_) | RequestError::Disconnected => FailureKind::Transport,
        RequestError::Reply(err) => FailureKind::Status(err.status()),
        // Discovery's verdict on "no responders": every worker full (429) or sick (503).
        RequestError::Saturated { .. } => FailureKind::Status(429),
        RequestError::Unhealthy { .. } => FailureKind::Status(503),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_errors() {
        assert_eq!(
            classify_request_error(&RequestError::TimedOut { budget_ms: 5 }),
            FailureKind::Timeout
        );
        assert_eq!(
            classify_request_error(&RequestError::NoResponders {
                subject: "embed".into()
            }),
            FailureKind::NoResponders
        );
        assert_eq!(
            classify_request_error(&RequestError::Transport("closed".into())),
            FailureKind::Transport
        );
        assert_eq!(
            classify_request_error(&RequestError::Reply(
                embatch_protocol::EmbedError::Overloaded("full".into())
            )),
            FailureKind::Status(429)
        );
    }
}
