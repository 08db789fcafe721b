//! The worker's `info` endpoint: a second endpoint of its NATS micro service, on
//! `<subject>.info` in the same queue group (a member while the worker runs, whatever its
//! membership on the request subject), that answers the upstream's description in the shape of TEI's `GET /info`, so
//! the gateway's `GET /info` (and any NATS client, in any language) can ask a worker what model
//! it serves and what it accepts.
//!
//! - Request: any payload (ignored) on `<subject>.info`, e.g. `nats req embed.info ''`, or on
//!   a model subject's, `<subject>.<model token>.info` (see [`embatch_protocol::model`]).
//! - Reply: TEI's `/info` JSON object. For a TEI upstream it is TEI's own document (read at
//!   start-up); for the built-in model a TEI-shaped document built from the model (see
//!   `LocalUpstream::info`). `max_client_batch_size` is replaced by the worker's own
//!   `MAX_CLIENT_BATCH_SIZE`: the worker splits a request across upstream calls, so the most
//!   inputs a client may send is the worker's limit, not the upstream's.
//! - Error: as on the embed endpoint, TEI's error body with the `Nats-Service-Error-Code` and
//!   `Nats-Service-Error` headers (503 when TEI cannot be reached, 424 for a malformed answer).

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use embatch_protocol::EmbedError;
use futures::StreamExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::micro::EndpointStats;
use crate::respond::Answer;
use crate::upstream::{Upstream, UpstreamError};

/// The endpoint's name in the NATS micro service (shown by `$SRV.INFO.embatch`).
pub(crate) const ENDPOINT: &str = "info";

/// Longest an answer waits for the upstream's `/info` when it has not been read yet (TEI was
/// down at start-up). The gateway's `/health` asks this endpoint, so an upstream that hangs must
/// not make a present worker look absent: past this, the answer is a 503 error reply.
pub(crate) const UPSTREAM_INFO_WAIT: Duration = Duration::from_millis(500);

/// The `info` endpoint: its queue subscription and what it answers from.
pub(crate) struct Endpoint<U> {
    requests: futures::stream::SelectAll<async_nats::Subscriber>,
    client: async_nats::Client,
    upstream: Arc<U>,
    max_client_batch_size: usize,
    stats: EndpointStats,
}

impl<U: Upstream + 'static> Endpoint<U> {
    /// Subscribes to each of `subjects` (`<subject>.info` of every subject the worker serves) in
    /// `queue_group`; answers will describe
    /// `upstream` with the worker's `max_client_batch_size` and be counted in `stats`.
    ///
    /// # Errors
    /// When the subscription cannot be made (the connection is closed).
    pub(crate) async fn subscribe(
        client: async_nats::Client,
        subjects: Vec<String>,
        queue_group: String,
        upstream: Arc<U>,
        max_client_batch_size: usize,
        stats: EndpointStats,
    ) -> Result<Endpoint<U>, async_nats::SubscribeError> {
        let mut requests = futures::stream::SelectAll::new();
        for subject in subjects {
            requests.push(client.queue_subscribe(subject, queue_group.clone()).await?);
        }
        Ok(Endpoint {
            requests,
            client,
            upstream,
            max_client_batch_size,
            stats,
        })
    }

    /// Answers every request with [`document`] of the upstream's info, each in its own task on
    /// `tasks` (one that waits for the upstream holds up no other), until `stop` is cancelled
    /// (the subscription is dropped: the worker leaves this endpoint's queue group) or the
    /// connection closes.
    pub(crate) async fn run(mut self, stop: CancellationToken, tasks: TaskTracker) {
        loop {
            let request = tokio::select! {
                request = self.requests.next() => match request {
                    Some(request) => request,
                    None => return,
                },
                () = stop.cancelled() => return,
            };
            let received = Instant::now();
            let upstream = Arc::clone(&self.upstream);
            let client = self.client.clone();
            let stats = self.stats.clone();
            let max_client_batch_size = self.max_client_batch_size;
            tasks.spawn(async move {
                let info = tokio::time::timeout(UPSTREAM_INFO_WAIT, upstream.info())
                    .await
                    .unwrap_or_else(|_| {
                        Err(UpstreamError::Unreachable(format!(
                            "the upstream's /info did not answer within {} ms",
                            UPSTREAM_INFO_WAIT.as_millis()
                        )))
                    });
                let answer = info
                    .map_err(EmbedError::from)
                    .and_then(|info| document(info, max_client_batch_size));
                let answer = match answer {
                    Ok(payload) => Answer::ok(HeaderMap::new(), payload.into()),
                    Err(err) => Answer::error(&err),
                };
                answer.send(&client, &request, &stats, received).await;
            });
        }
    }
}

/// The document answered: `upstream_info` (a JSON object) with `max_client_batch_size` set to
/// the worker's limit.
///
/// # Errors
/// [`EmbedError::Backend`] (424) when the upstream's info is not a JSON object.
pub(crate) fn document(
    upstream_info: serde_json::Value,
    max_client_batch_size: usize,
) -> Result<Vec<u8>, EmbedError> {
    let serde_json::Value::Object(mut info) = upstream_info else {
        return Err(EmbedError::Backend(
            "the upstream's /info is not a JSON object".into(),
        ));
    };
    info.insert(
        "max_client_batch_size".into(),
        serde_json::Value::from(max_client_batch_size),
    );
    serde_json::to_vec(&info)
        .map_err(|e| EmbedError::Backend(format!("cannot encode the info document: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worker_limit_replaces_the_upstreams() {
        let upstream = serde_json::json!({"model_id": "m", "max_client_batch_size": 4});
        let body = document(upstream, 512).expect("an object");
        let value: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(
            value,
            serde_json::json!({"model_id": "m", "max_client_batch_size": 512})
        );
    }

    #[test]
    fn a_non_object_is_a_backend_error() {
        let err = document(serde_json::json!([1]), 8).expect_err("not an object");
        assert_eq!(err.status(), 424);
    }
}
