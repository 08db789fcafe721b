//! `GET /info`: TEI's `/info` document, asked of the workers over NATS.
//!
//! Each worker answers on `<subject>.info` (its `info` NATS micro endpoint, in the workers' queue
//! group, so one worker answers): the upstream's TEI-shaped `/info` JSON, with
//! `max_client_batch_size` set to the worker's own limit. The gateway lowers
//! `max_client_batch_size` to its own `--max-client-batch-size` when that is smaller, so a client
//! that sizes its batches by `/info` is never refused with 413.

use std::time::Duration;

use bytes::Bytes;
use embatch_client::{EmbedClient, RequestError};
use embatch_protocol::EmbedError;

/// Asks one worker for its `/info` document (see [`EmbedClient::info`]), waiting at most
/// `timeout`, and lowers its `max_client_batch_size` to `max_client_batch_size`. Returns the
/// document, serialized.
///
/// # Errors
/// - [`EmbedError::Unavailable`] (503) when not connected to NATS, or no worker answers within
///   `timeout` (no responders, or a timeout);
/// - the worker's error, verbatim, when it answered one (e.g. 503 when its TEI is unreachable);
/// - [`EmbedError::Backend`] (424) when the answer is not a JSON object.
pub async fn fetch(
    client: &EmbedClient,
    timeout: Duration,
    max_client_batch_size: usize,
) -> Result<Bytes, EmbedError> {
    let reply = client.info(timeout).await.map_err(|err| match err {
        RequestError::Reply(err) => err,
        other => EmbedError::Unavailable(format!("no embatch worker answered /info: {other}")),
    })?;
    lower_batch_size(&reply.payload, max_client_batch_size)
}

/// `document` (a JSON object) with `max_client_batch_size` at most `limit` (set to `limit` when
/// absent or not a number).
///
/// # Errors
/// [`EmbedError::Backend`] (424) when `document` is not a JSON object.
fn lower_batch_size(document: &[u8], limit: usize) -> Result<Bytes, EmbedError> {
    let mut info: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(document)
        .map_err(|e| EmbedError::Backend(format!("malformed /info from the worker: {e}")))?;
    let reported = info
        .get("max_client_batch_size")
        .and_then(serde_json::Value::as_u64)
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(usize::MAX);
    info.insert(
        "max_client_batch_size".into(),
        serde_json::Value::from(reported.min(limit)),
    );
    serde_json::to_vec(&info)
        .map(Bytes::from)
        .map_err(|e| EmbedError::Backend(format!("cannot encode /info: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lowered(document: &str, limit: usize) -> serde_json::Value {
        let body = lower_batch_size(document.as_bytes(), limit).expect("an object");
        serde_json::from_slice(&body).expect("JSON")
    }

    #[test]
    fn the_smaller_limit_wins() {
        let doc = r#"{"model_id":"m","max_client_batch_size":512}"#;
        assert_eq!(lowered(doc, 64)["max_client_batch_size"], 64);
        assert_eq!(lowered(doc, 1024)["max_client_batch_size"], 512);
        assert_eq!(lowered(doc, 1024)["model_id"], "m");
        let null = r#"{"model_id":"m","max_client_batch_size":null}"#;
        assert_eq!(lowered(null, 32)["max_client_batch_size"], 32);
    }

    #[test]
    fn a_non_object_is_a_backend_error() {
        let err = lower_batch_size(b"[1]", 8).expect_err("not an object");
        assert_eq!(err.status(), 424);
    }
}
