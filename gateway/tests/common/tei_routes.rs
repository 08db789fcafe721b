//! The steps the TEI route tests share (`rerank.rs`, `sparse.rs`, `tokenize.rs`, `predict.rs`,
//! `embed_all.rs`): the double as one kind of model, a JSON `POST` read back as JSON, TEI's
//! errors before any upstream call, a route's deadline, the capabilities `GET /v1/models`
//! shows, and the route's NATS subject called directly, as a caller that skips the gateway
//! does.
#![allow(dead_code)] // not every test binary uses every helper

use std::time::Duration;

use embatch_client::{EmbedClient, Operation, Reply, RequestError, SendOptions};
use embatch_tei_double::RecordedCall;
use embatch_testkit::{POISON, Stack, TeiConfig};

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
    let response = post(url, path, body).await;
    let status = response.status().as_u16();
    let body = response.json().await.expect("JSON body");
    (status, body)
}

/// Worker arguments under which a request waits (no dispatch while the upstream is idle) up to
/// 400 ms for others to join its batch, so that requests sent together share one upstream call.
pub const WAIT_FOR_BATCH_MATES: [&str; 4] =
    ["--max-wait-time", "400ms", "--dispatch-when-idle", "false"];

/// The upstream calls on `route` (`"/predict"`, `"/embed_sparse"`, ...): each one's number of
/// inputs and the status it answered.
pub fn route_calls(calls: &[RecordedCall], route: &str) -> Vec<(usize, u16)> {
    calls
        .iter()
        .filter(|c| c.options["route"] == route)
        .map(|c| (c.inputs.len(), c.status))
        .collect()
}

/// `POST {url}{path}` of `body` again: asserts that the reply says `hits` inputs came from the
/// cache and that `stack`'s upstream saw no new call; the reply body.
pub async fn repeat_from_cache(
    stack: &Stack,
    url: &str,
    path: &str,
    body: &serde_json::Value,
    hits: &str,
) -> serde_json::Value {
    let calls = stack.tei.calls().len();
    let response = post(url, path, body).await;
    assert_eq!(response.headers()["x-embatch-cache-hits"], hits, "{path}");
    let reply = response.json().await.expect("JSON body");
    assert_eq!(stack.tei.calls().len(), calls, "answered from the cache");
    reply
}

/// Sends `bad` (holding an input the double refuses, [`POISON`]) and `good` to `{url}{path}` at
/// once: asserts that `bad` alone is TEI's 422 `Validation` naming that input and that `good`
/// is answered; `good`'s reply body.
pub async fn bad_beside_good(
    url: &str,
    path: &str,
    bad: serde_json::Value,
    good: serde_json::Value,
) -> serde_json::Value {
    let ((status_bad, err), (status_good, fine)) =
        tokio::join!(post_json(url, path, bad), post_json(url, path, good));
    assert_eq!(status_bad, 422, "{err}");
    assert_tei_error(&err, "Validation", POISON);
    assert_eq!(status_good, 200, "{fine}");
    fine
}

/// Asserts that the upstream calls (`(inputs, status)` each, in order) began with one shared
/// call of `shared` inputs that the upstream refused, and that the good input went alone after.
pub fn assert_isolated(sizes: &[(usize, u16)], shared: usize) {
    assert_eq!(
        sizes.first(),
        Some(&(shared, 422)),
        "one shared call first: {sizes:?}"
    );
    assert!(sizes.contains(&(1, 200)), "the good input alone: {sizes:?}");
}

/// Asserts that `POST {url}/models/nobody{route}` of `body` is a 404: no worker serves it.
pub async fn assert_unknown_model_404(url: &str, route: &str, body: serde_json::Value) {
    let (status, err) = post_json(url, &format!("/models/nobody{route}"), body).await;
    assert_eq!(status, 404, "{err}");
}

/// `POST {url}{path}` of `body` as JSON: the response.
async fn post(url: &str, path: &str, body: impl std::fmt::Display) -> reqwest::Response {
    json_post(
        &reqwest::Client::new(),
        &format!("{url}{path}"),
        body.to_string(),
    )
    .send()
    .await
    .expect("HTTP response")
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
