//! Small steps several gateway test binaries take: a response header, the ids `GET /v1/models`
//! lists, and a stand-in worker that answers every embedding request.
#![allow(dead_code)] // not every test binary uses every helper

use std::time::Duration;

use embatch_testkit::NatsServer;
use futures::StreamExt;

/// The header `name` of `response`, when present and text.
pub fn header(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// The ids `GET /v1/models` of the gateway at `gateway` lists.
pub async fn model_ids(gateway: &str) -> Vec<String> {
    let response = reqwest::get(format!("{gateway}/v1/models"))
        .await
        .expect("HTTP response");
    let status = response.status().as_u16();
    let body: serde_json::Value = response.json().await.expect("JSON body");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "list");
    body["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|m| m["id"].as_str().expect("id").to_owned())
        .collect()
}

/// Polls `GET /v1/models` every 50 ms until it lists exactly `expected`, for at most 10 s.
pub async fn wait_for_models(gateway: &str, expected: &[&str]) {
    let mut listed = Vec::new();
    for _ in 0..200 {
        listed = model_ids(gateway).await;
        if listed == expected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("/v1/models lists {listed:?}, not {expected:?}");
}

/// A stand-in worker on `nats`: answers every embedding request on the default subject with
/// `[[0.5]]` and `headers`. Each request's headers arrive on the returned channel, in order.
pub async fn stand_in_worker(
    nats: &NatsServer,
    headers: &[(&'static str, &'static str)],
) -> tokio::sync::mpsc::UnboundedReceiver<Option<async_nats::HeaderMap>> {
    let nc = async_nats::connect(nats.url()).await.expect("connect");
    let mut requests = nc
        .subscribe(embatch_protocol::DEFAULT_SUBJECT)
        .await
        .expect("subscribe");
    nc.flush().await.expect("flush");
    let mut reply_headers = async_nats::HeaderMap::new();
    for (name, value) in headers {
        reply_headers.insert(*name, *value);
    }
    let (seen_tx, seen) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(message) = requests.next().await {
            let _ = seen_tx.send(message.headers);
            if let Some(reply) = message.reply {
                let _ = nc
                    .publish_with_headers(reply, reply_headers.clone(), "[[0.5]]".into())
                    .await;
            }
        }
    });
    seen
}
