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

/// Worker arguments under which batches form only when full (64 inputs) or after 250 ms, so
/// that requests sent together share one batch.
#[allow(dead_code)] // not every test binary uses every helper
pub const SHARED_BATCHES: [&str; 6] = [
    "--max-batch-size",
    "64",
    "--max-wait-time",
    "250ms",
    "--dispatch-when-idle",
    "false",
];

/// Sends each of `bodies` at once as its own request on the default subject of the nats-server
/// at `nats_url`; each reply's status and body as [`embed_status`] reads them, in order.
#[allow(dead_code)] // not every test binary uses every helper
pub async fn send_all(
    nats_url: &str,
    bodies: Vec<serde_json::Value>,
) -> Vec<(u16, serde_json::Value)> {
    let raw = async_nats::connect(nats_url)
        .await
        .expect("client connects");
    let client = EmbedClient::new(raw, embatch_protocol::DEFAULT_SUBJECT);
    let tasks: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            let client = client.clone();
            tokio::spawn(async move { embed_status(&client, Bytes::from(body.to_string())).await })
        })
        .collect();
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(task.await.expect("client task"));
    }
    replies
}

/// [`send_all`] of one single-input request (`{"inputs": text}`) per text.
#[allow(dead_code)] // not every test binary uses every helper
pub async fn send_texts(nats_url: &str, texts: &[String]) -> Vec<(u16, serde_json::Value)> {
    let bodies = texts
        .iter()
        .map(|text| serde_json::json!({ "inputs": text }))
        .collect();
    send_all(nats_url, bodies).await
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
