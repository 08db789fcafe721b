//! Helpers shared by the worker's test binaries (each `mod common;`).

pub mod bulk_contract;
pub mod plain;

use std::time::Duration;

use bytes::Bytes;
use embatch_client::{EmbedClient, RequestError};
use embatch_testkit::TeiConfig;

/// Sends `body` through `client` with a 10 s budget; the status (200, the worker's error code, or
/// discovery's 429/503 when no worker is a member of the queue group) and the payload (TEI's
/// response or error body).
///
/// # Panics
/// When no reply comes for another reason (time-out, transport, no responders), or a payload is
/// not JSON.
#[allow(dead_code)] // not every test binary uses every helper
pub async fn embed_status(client: &EmbedClient, body: Bytes) -> (u16, serde_json::Value) {
    match client.embed(body, Duration::from_secs(10)).await {
        Ok(reply) => (
            200,
            serde_json::from_slice(&reply.payload).expect("JSON payload"),
        ),
        Err(RequestError::Reply(err)) => (
            err.status(),
            serde_json::to_value(err.to_response()).expect("serializes"),
        ),
        // Discovery's verdict when no worker is a member of the queue group (429 or 503).
        Err(err @ (RequestError::Saturated { .. } | RequestError::Unhealthy { .. })) => {
            let err = embatch_protocol::EmbedError::from(err);
            (
                err.status(),
                serde_json::to_value(err.to_response()).expect("serializes"),
            )
        }
        Err(err) => panic!("no reply: {err}"),
    }
}

/// The text of the worker's `/metrics` at `addr` (`host:port`).
///
/// # Panics
/// When `/metrics` does not answer with a text body.
#[allow(dead_code)] // not every test binary uses every helper
pub async fn metrics_text(addr: impl std::fmt::Display) -> String {
    reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("/metrics answers")
        .text()
        .await
        .expect("a text body")
}

/// The TEI double taking `base_ms` ms a call, `concurrency` calls at a time (otherwise
/// [`TeiConfig::instant`]).
#[allow(dead_code)] // not every test binary uses every helper
pub fn tei_taking(base_ms: u64, concurrency: usize) -> TeiConfig {
    TeiConfig {
        base: Duration::from_millis(base_ms),
        concurrency,
        ..TeiConfig::instant()
    }
}
