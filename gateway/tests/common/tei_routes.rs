//! The steps the TEI route tests share (`rerank.rs`, `sparse.rs`, `tokenize.rs`, `predict.rs`,
//! `embed_all.rs`): the double as one kind of model, a JSON `POST` read back as JSON, TEI's
//! errors before any upstream call, a route's deadline, the capabilities `GET /v1/models`
//! shows, and the route's NATS subject called directly, as a caller that skips the gateway
//! does.
#![allow(dead_code)] // not every test binary uses every helper

use std::time::Duration;

use embatch_client::{EmbedClient, Operation, Reply, RequestError, SendOptions};
use embatch_tei_double::RecordedCall;
use embatch_testkit::{Stack, TeiConfig};

use super::{assert_tei_error, json_post, stack_with_gateway};

/// The TEI double answering at once ([`TeiConfig::instant`]), as `kind` sets it
/// (`|tei| tei.reranker = true`).
pub fn instant_double(kind: impl FnOnce(&mut TeiConfig)) -> TeiConfig {
    let mut tei = TeiConfig::instant();
    kind(&mut tei);
    tei
}

/// `POST {url}{path}` of `body` (a `serde_json::Value`, or JSON text as it is sent) as JSON: the
/// status and the JSON reply.
pub async fn post_json(
    url: &str,
    path: &str,
    body: impl std::fmt::Display,
) -> (u16, serde_json::Value) {
    let response = json_post(
        &reqwest::Client::new(),
        &format!("{url}{path}"),
        body.to_string(),
    )
    .send()
    .await
    .expect("HTTP response");
    let status = response.status().as_u16();
    let body = response.json().await.expect("JSON body");
    (status, body)
}

/// One request TEI refuses: `(path, body, status, error_type, a part of the message)`.
pub type Refused<'a> = (&'a str, serde_json::Value, u16, &'a str, &'a str);

/// Asserts that each of `cases` is answered with its status and TEI's error body by the gateway
/// at `url`, and that `stack`'s upstream saw no call.
pub async fn assert_refused_before_any_call(stack: &Stack, url: &str, cases: Vec<Refused<'_>>) {
    for (path, body, status, error_type, needle) in cases {
        let (got, err) = post_json(url, path, body.clone()).await;
        assert_eq!(got, status, "{path} {body}: {err}");
        assert_tei_error(&err, error_type, needle);
    }
    assert!(stack.tei.calls().is_empty(), "refused before any call");
}

/// Asserts that `GET /v1/models` of the gateway at `url` lists `capabilities` for its first
/// model.
pub async fn assert_capabilities(url: &str, capabilities: &[&str]) {
    let models: serde_json::Value = reqwest::get(format!("{url}/v1/models"))
        .await
        .expect("GET /v1/models")
        .json()
        .await
        .expect("JSON");
    let want = serde_json::json!(capabilities);
    assert_eq!(models["data"][0]["capabilities"], want, "{models}");
}

/// Asserts that `POST {path}` of `body`, on a stack whose `tei` takes 800 ms a call, with an
/// `x-embatch-timeout-ms` of 100, is TEI's 504 `Timeout`.
pub async fn assert_the_deadline(tei: TeiConfig, path: &str, body: &'static str) {
    let slow = TeiConfig {
        base: Duration::from_millis(800),
        ..tei
    };
    let (stack, gateway) = stack_with_gateway(slow, &[], 1 << 20, 64).await;
    let response = json_post(
        &reqwest::Client::new(),
        &format!("{}{path}", gateway.url),
        body,
    )
    .header("x-embatch-timeout-ms", "100")
    .send()
    .await
    .expect("HTTP response");
    assert_eq!(response.status().as_u16(), 504);
    let body: serde_json::Value = response.json().await.expect("JSON body");
    assert_tei_error(&body, "Timeout", "");
    stack.worker.stop().await;
}

/// Asserts that `POST {path}` of `body` to a plain embedding model (the TEI double with no other
/// route) is TEI's 424 `Backend` with `needle` in its message; the upstream calls it made.
pub async fn assert_plain_model_424(
    path: &str,
    body: serde_json::Value,
    needle: &str,
) -> Vec<RecordedCall> {
    let (stack, gateway) = stack_with_gateway(TeiConfig::instant(), &[], 1 << 20, 64).await;
    let (status, err) = post_json(&gateway.url, path, body).await;
    assert_eq!(status, 424, "{err}");
    assert_tei_error(&err, "Backend", needle);
    let calls = stack.tei.calls();
    stack.worker.stop().await;
    calls
}

/// A client of `stack`'s NATS server on the default model's subject, as a caller that skips
/// the gateway.
pub async fn direct_client(stack: &Stack) -> EmbedClient {
    let nats = async_nats::connect(stack.nats.url())
        .await
        .expect("connects");
    EmbedClient::new(nats, embatch_protocol::DEFAULT_SUBJECT)
}

/// `body` sent by `client` on `operation`'s subject with a 10 s deadline.
pub async fn send_direct(
    client: &EmbedClient,
    operation: Operation,
    body: &'static [u8],
) -> Result<Reply, RequestError> {
    let options = SendOptions {
        operation,
        ..SendOptions::default()
    };
    let body = bytes::Bytes::from_static(body);
    client
        .embed_with(body, Duration::from_secs(10), &options)
        .await
}
