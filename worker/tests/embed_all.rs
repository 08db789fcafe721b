//! `/embed_all` replies against the NATS server's `max_payload`: token vectors are far larger
//! per input than an embedding, so they are checked with a reply size per input learnt from
//! `/embed_all` replies only, and `/embed` requests keep their own limit.

mod common;

use std::time::Duration;

use bytes::Bytes;
use embatch_client::{EmbedClient, Operation, RequestError, SendOptions};
use embatch_testkit::{NatsServer, RunningWorker, TeiConfig, start_tei};

/// The status of `body` sent on `operation`'s subject (200, or the worker's error code).
async fn status(client: &EmbedClient, operation: Operation, body: String) -> u16 {
    let options = SendOptions {
        operation,
        ..SendOptions::default()
    };
    match client
        .embed_with(Bytes::from(body), Duration::from_secs(10), &options)
        .await
    {
        Ok(_) => 200,
        Err(RequestError::Reply(err)) => err.status(),
        Err(err) => panic!("no reply: {err}"),
    }
}

/// An `inputs` body of `n` texts of about 40 bytes (12 tokens for the double).
fn many(n: usize) -> String {
    let inputs: Vec<String> = (0..n)
        .map(|i| format!("input {i} with enough words to be long"))
        .collect();
    serde_json::json!({ "inputs": inputs }).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_vectors_have_a_reply_limit_of_their_own() {
    let nats = NatsServer::start_with_max_payload("4096");
    let tei = start_tei(TeiConfig::instant()).await;
    let worker = RunningWorker::start(&nats, &["--tei-url", &tei.url]).await;
    let nats_client = async_nats::connect(nats.url()).await.expect("connects");
    let client = EmbedClient::new(nats_client, "embed");

    // 10 inputs of 12 token vectors (8 floats each): ~11 KB, over 4 KB. The first is computed,
    // then replaced by the 413; the next is refused before any upstream call.
    assert_eq!(status(&client, Operation::EmbedAll, many(10)).await, 413);
    let calls = tei.calls().len();
    assert_eq!(calls, 1);
    assert_eq!(status(&client, Operation::EmbedAll, many(10)).await, 413);
    assert_eq!(tei.calls().len(), calls, "refused before any upstream call");
    // The same inputs' embeddings (~1 KB) fit: `/embed` did not learn from token vectors.
    assert_eq!(status(&client, Operation::Embed, many(10)).await, 200);
    // And a small /embed_all still fits.
    assert_eq!(status(&client, Operation::EmbedAll, many(1)).await, 200);
    worker.stop().await;
}
