//! Sparse embeddings end to end over HTTP, a real nats-server and an in-process worker on the
//! TEI double (a SPLADE model): TEI's `POST /embed_sparse`, the sparse subject over NATS
//! directly, TEI's errors, a bad input among good ones, the deadline, a dense model's 424, and
//! inputs of concurrent callers batched into one upstream call.

mod common;

use std::time::Duration;

use common::tei_routes::{
    assert_plain_model_424, assert_the_deadline, direct_client, instant_double, post_json,
    send_direct,
};
use common::{assert_tei_error, json_post, stack_with_gateway};
use embatch_client::Operation;
use embatch_protocol::Input;
use embatch_protocol::sparse::SparseValue;
use embatch_tei_double::{POISON, RecordedCall, sparse_embedding};
use embatch_testkit::TeiConfig;

/// The double as a SPLADE model that answers at once.
fn splade() -> TeiConfig {
    instant_double(|tei| tei.splade = true)
}

/// A reply body as TEI's sparse lists.
fn lists(body: &serde_json::Value) -> Vec<Vec<SparseValue>> {
    serde_json::from_value(body.clone()).expect("TEI's /embed_sparse reply")
}

/// The double's sparse embeddings of `texts`.
fn expected(texts: &[&str]) -> Vec<Vec<SparseValue>> {
    texts
        .iter()
        .map(|t| sparse_embedding(&Input::Text((*t).to_owned())))
        .collect()
}

/// The upstream calls on `/embed_sparse`: their inputs and statuses.
fn sparse_calls(calls: &[RecordedCall]) -> Vec<(usize, u16)> {
    calls
        .iter()
        .filter(|c| c.options["route"] == "/embed_sparse")
        .map(|c| (c.inputs.len(), c.status))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inputs_of_concurrent_callers_share_one_upstream_call() {
    // The first request waits (no dispatch while idle) for the other to join its batch.
    let args = ["--max-wait-time", "400ms", "--dispatch-when-idle", "false"];
    let (stack, gateway) = stack_with_gateway(splade(), &args, 1 << 20, 64).await;
    let a = serde_json::json!({"inputs": ["a1", "a2"]});
    let b = serde_json::json!({"inputs": "b1"});
    let ((status_a, body_a), (status_b, body_b)) = tokio::join!(
        post_json(&gateway.url, "/embed_sparse", a.clone()),
        post_json(&gateway.url, "/embed_sparse", b),
    );
    assert_eq!((status_a, status_b), (200, 200), "{body_a} {body_b}");
    assert_eq!(lists(&body_a), expected(&["a1", "a2"]));
    assert_eq!(lists(&body_b), expected(&["b1"]));
    let calls = stack.tei.calls();
    assert_eq!(sparse_calls(&calls), [(3, 200)], "one call: {calls:?}");
    assert!(
        calls.iter().all(|c| c.options["route"] == "/embed_sparse"),
        "no dense call: {calls:?}"
    );

    // Deterministic, so cached: a repeat costs no upstream call, in its own key namespace.
    let response = json_post(
        &reqwest::Client::new(),
        &format!("{}/embed_sparse", gateway.url),
        a.to_string(),
    )
    .send()
    .await
    .expect("HTTP response");
    assert_eq!(response.headers()["x-embatch-cache-hits"], "2");
    let repeat: serde_json::Value = response.json().await.expect("JSON body");
    assert_eq!(lists(&repeat), expected(&["a1", "a2"]));
    assert_eq!(stack.tei.calls().len(), 1, "answered from the cache");

    // A bad input fails its own request only: the shared call is refused, then the batch is
    // bisected and the good input embedded alone.
    stack.tei.calls.clear();
    let bad = serde_json::json!({"inputs": ["fine too", format!("x {POISON}")]});
    let good = serde_json::json!({"inputs": ["fine"]});
    let ((status_bad, err), (status_good, fine)) = tokio::join!(
        post_json(&gateway.url, "/embed_sparse", bad),
        post_json(&gateway.url, "/embed_sparse", good),
    );
    assert_eq!(status_bad, 422, "{err}");
    assert_tei_error(&err, "Validation", POISON);
    assert_eq!(status_good, 200, "{fine}");
    assert_eq!(lists(&fine), expected(&["fine"]));
    let sizes = sparse_calls(&stack.tei.calls());
    assert_eq!(sizes.first(), Some(&(3, 422)), "one shared call: {sizes:?}");
    assert!(sizes.contains(&(1, 200)), "the good input alone: {sizes:?}");
    stack.worker.stop().await;
}

/// The first model `GET /v1/models` lists, once discovery has found one (at most 10 s).
async fn first_model(gateway: &str) -> String {
    for _ in 0..200 {
        let models: serde_json::Value = reqwest::get(format!("{gateway}/v1/models"))
            .await
            .expect("GET /v1/models")
            .json()
            .await
            .expect("JSON");
        if let Some(id) = models["data"][0]["id"].as_str() {
            return id.to_owned();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no model listed within 10 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teis_errors_and_the_model_routes() {
    let (stack, gateway) = stack_with_gateway(splade(), &[], 1 << 20, 4).await;
    let (status, err) = post_json(
        &gateway.url,
        "/embed_sparse",
        serde_json::json!({"inputs": []}),
    )
    .await;
    assert_eq!(status, 400);
    assert_tei_error(&err, "Empty", "`inputs` cannot be empty");
    let five = serde_json::json!({"inputs": ["a", "b", "c", "d", "e"]});
    let (status, err) = post_json(&gateway.url, "/embed_sparse", five).await;
    assert_eq!(status, 422);
    assert_tei_error(
        &err,
        "Validation",
        "batch size 5 > maximum allowed batch size 4",
    );
    let (status, err) = post_json(
        &gateway.url,
        "/embed_sparse",
        serde_json::json!({"input": "a"}),
    )
    .await;
    assert_eq!(status, 422);
    assert_tei_error(&err, "Validation", "missing field `inputs`");
    assert!(stack.tei.calls().is_empty(), "refused before any call");

    // The model's own path, and a model no worker serves.
    let name = first_model(&gateway.url).await;
    let path = format!("/models/{}/embed_sparse", name.replace('/', "%2F"));
    let (status, body) = post_json(&gateway.url, &path, serde_json::json!({"inputs": "m"})).await;
    assert_eq!(status, 200, "{path}: {body}");
    assert_eq!(lists(&body), expected(&["m"]));
    let (status, err) = post_json(
        &gateway.url,
        "/models/nobody/embed_sparse",
        serde_json::json!({"inputs": "m"}),
    )
    .await;
    assert_eq!(status, 404, "{err}");
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sparse_subject_serves_direct_nats_callers() {
    let (stack, _gateway) =
        stack_with_gateway(splade(), &["--max-client-batch-size", "2"], 1 << 20, 64).await;
    let client = direct_client(&stack).await;
    let body = br#"{"inputs":["x",[101,102]]}"#;
    let reply = send_direct(&client, Operation::Sparse, body)
        .await
        .expect("sparse embeddings");
    let got: Vec<Vec<SparseValue>> = serde_json::from_slice(&reply.payload).expect("TEI's shape");
    let ids = sparse_embedding(&Input::Ids(vec![101, 102]));
    assert_eq!(got, [expected(&["x"]).remove(0), ids]);
    // The worker's own limit, for a caller that skips the gateway.
    let three = br#"{"inputs":["a","b","c"]}"#;
    let err = send_direct(&client, Operation::Sparse, three)
        .await
        .expect_err("over the worker's limit");
    assert_eq!(embatch_protocol::EmbedError::from(err).status(), 422);
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dense_model_is_teis_424_before_any_upstream_call() {
    let body = serde_json::json!({"inputs": "a"});
    let needle = "Model is not an embedding model with SPLADE pooling";
    let calls = assert_plain_model_424("/embed_sparse", body, needle).await;
    assert!(calls.is_empty(), "refused by the worker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sparse_request_has_its_deadline() {
    assert_the_deadline(splade(), "/embed_sparse", r#"{"inputs":"slow"}"#).await;
}
