//! Discovery as the membership tests see it (each `mod discovery;`): a plain connection, the
//! live `membership` metadata of the workers answering `$SRV.INFO.embatch`, and a request's
//! status through the queue group.

use std::time::Duration;

use bytes::Bytes;
use embatch_client::{EmbedClient, RequestError};
use embatch_testkit::NatsServer;
use futures::StreamExt;

/// A plain async-nats connection to `nats`.
pub async fn connect(nats: &NatsServer) -> async_nats::Client {
    async_nats::connect(nats.url())
        .await
        .expect("client connects")
}

/// The `membership` of the first `most` workers answering `$SRV.INFO.embatch`, each within
/// `wait` of the previous answer, in the order they answered.
pub async fn states(client: &async_nats::Client, most: usize, wait: Duration) -> Vec<String> {
    let inbox = client.new_inbox();
    let mut answers = client.subscribe(inbox.clone()).await.expect("subscribe");
    client
        .publish_with_reply("$SRV.INFO.embatch", inbox, Bytes::new())
        .await
        .expect("publish");
    let mut states = Vec::new();
    while states.len() < most
        && let Ok(Some(answer)) = tokio::time::timeout(wait, answers.next()).await
    {
        let info: serde_json::Value = serde_json::from_slice(&answer.payload).expect("JSON");
        let state = info["metadata"]["membership"].as_str().unwrap_or_default();
        states.push(state.to_owned());
    }
    states
}

/// Sends `{"inputs": text}` through `client` with a 10 s budget; 200 or the worker's error
/// status, or the client's error when no worker answered.
pub async fn embed(client: &EmbedClient, text: &str) -> Result<u16, RequestError> {
    let body = serde_json::json!({ "inputs": text }).to_string();
    match client
        .embed(Bytes::from(body), Duration::from_secs(10))
        .await
    {
        Ok(_) => Ok(200),
        Err(RequestError::Reply(err)) => Ok(err.status()),
        Err(err) => Err(err),
    }
}
