//! Discovery as the membership tests see it (each `mod discovery;`): a plain connection, and the
//! live `membership` metadata of the workers answering `$SRV.INFO.embatch`.

use std::time::Duration;

use bytes::Bytes;
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
