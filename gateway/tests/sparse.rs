//! Sparse embeddings end to end over HTTP, a real nats-server and an in-process worker on the
//! TEI double (a SPLADE model): TEI's `POST /embed_sparse`, the sparse subject over NATS
//! directly, TEI's errors, a bad input among good ones, the deadline, a dense model's 424, and
//! inputs of concurrent callers batched into one upstream call.

mod common;

use std::time::Duration;

use common::stack_with_gateway;
use common::tei_routes::{
    WAIT_FOR_BATCH_MATES, assert_isolated, assert_plain_model_424, assert_refused_before_any_call,
    assert_the_deadline, assert_unknown_model_404, bad_beside_good, direct_client, instant_double,
    post_json, repeat_from_cache, route_calls, send_direct,
};
use embatch_client::Operation;
use embatch_protocol::Input;
use embatch_protocol::sparse::SparseValue;
use embatch_tei_double::{POISON, sparse_embedding};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inputs_of_concurrent_callers_share_one_upstream_call() {
    let (stack, gateway) = stack_with_gateway(splade(), &WAIT_FOR_BATCH_MATES, 1 << 20, 64).await;
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
    assert_eq!(
        route_calls(&calls, "/embed_sparse"),
        [(3, 200)],
        "one call: {calls:?}"
    );
    assert!(
        calls.iter().all(|c| c.options["route"] == "/embed_sparse"),
        "no dense call: {calls:?}"
    );

    // Deterministic, so cached: a repeat costs no upstream call, in its own key namespace.
    let repeat = repeat_from_cache(&stack, &gateway.url, "/embed_sparse", &a, "2").await;
    assert_eq!(lists(&repeat), expected(&["a1", "a2"]));

    // A bad input fails its own request only: the shared call is refused, then the batch is
    // bisected and the good input embedded alone.
    stack.tei.calls.clear();
    let bad = serde_json::json!({"inputs": ["fine too", format!("x {POISON}")]});
    let good = serde_json::json!({"inputs": ["fine"]});
    let fine = bad_beside_good(&gateway.url, "/embed_sparse", bad, good).await;
    assert_eq!(lists(&fine), expected(&["fine"]));
    assert_isolated(&route_calls(&stack.tei.calls(), "/embed_sparse"), 3);
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
    let refused = [
        (
            serde_json::json!({"inputs": []}),
            400,
            "Empty",
            "`inputs` cannot be empty",
        ),
        (
            serde_json::json!({"inputs": ["a", "b", "c", "d", "e"]}),
            422,
            "Validation",
            "batch size 5 > maximum allowed batch size 4",
        ),
        (
            serde_json::json!({"input": "a"}),
            422,
            "Validation",
            "missing field `inputs`",
        ),
    ];
    let cases = refused
        .into_iter()
        .map(|(body, status, kind, needle)| ("/embed_sparse", body, status, kind, needle))
        .collect();
    assert_refused_before_any_call(&stack, &gateway.url, cases).await;

    // The model's own path, and a model no worker serves.
    let name = first_model(&gateway.url).await;
    let path = format!("/models/{}/embed_sparse", name.replace('/', "%2F"));
    let (status, body) = post_json(&gateway.url, &path, serde_json::json!({"inputs": "m"})).await;
    assert_eq!(status, 200, "{path}: {body}");
    assert_eq!(lists(&body), expected(&["m"]));
    assert_unknown_model_404(
        &gateway.url,
        "/embed_sparse",
        serde_json::json!({"inputs": "m"}),
    )
    .await;
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
