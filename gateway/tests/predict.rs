//! Classification end to end over HTTP, a real nats-server and an in-process worker on the TEI
//! double (a classifier, or a reranker): TEI's `POST /predict` in its single and batch shapes,
//! sequences of concurrent callers in one upstream call, the cache, a bad sequence among good
//! ones, TEI's errors, an embedding model's 424, the deadline, and the subject over NATS.

mod common;

use common::stack_with_gateway;
use common::tei_routes::{
    WAIT_FOR_BATCH_MATES, assert_capabilities, assert_isolated, assert_plain_model_424,
    assert_refused_before_any_call, assert_the_deadline, assert_unknown_model_404, bad_beside_good,
    direct_client, instant_double, post_json, repeat_from_cache, route_calls, send_direct,
};
use embatch_client::Operation;
use embatch_protocol::Input;
use embatch_protocol::predict::Prediction;
use embatch_tei_double::{POISON, predictions};
use embatch_testkit::TeiConfig;

/// The double as a classifier that answers at once.
fn classifier() -> TeiConfig {
    instant_double(|tei| tei.classifier = true)
}

fn text(s: &str) -> Input {
    Input::Text(s.to_owned())
}

fn pair(a: &str, b: &str) -> Input {
    Input::Pair(a.to_owned(), b.to_owned())
}

/// The double's predictions of `input`.
fn expected(input: &Input, raw_scores: bool) -> Vec<Prediction> {
    predictions(&classifier(), input, raw_scores)
}

/// A reply body as TEI's batch shape.
fn lists(body: &serde_json::Value) -> Vec<Vec<Prediction>> {
    serde_json::from_value(body.clone()).expect("TEI's /predict batch reply")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequences_of_concurrent_callers_share_one_upstream_call() {
    let (stack, gateway) =
        stack_with_gateway(classifier(), &WAIT_FOR_BATCH_MATES, 1 << 20, 64).await;
    let single = serde_json::json!({"inputs": "I like it"});
    let batch = serde_json::json!({"inputs": [["so so"], ["is it good?", "it is great"]]});
    let ((status_a, body_a), (status_b, body_b)) = tokio::join!(
        post_json(&gateway.url, "/predict", single.clone()),
        post_json(&gateway.url, "/predict", batch),
    );
    assert_eq!((status_a, status_b), (200, 200), "{body_a} {body_b}");
    // A single sequence: one list, TEI's `PredictResponse::Single`.
    let one: Vec<Prediction> = serde_json::from_value(body_a).expect("one list");
    assert_eq!(one, expected(&text("I like it"), false));
    assert_eq!(one.len(), 3, "every label");
    assert_eq!(
        lists(&body_b),
        [
            expected(&text("so so"), false),
            expected(&pair("is it good?", "it is great"), false)
        ]
    );
    let calls = stack.tei.calls();
    assert_eq!(
        route_calls(&calls, "/predict"),
        [(3, 200)],
        "one call: {calls:?}"
    );
    let sent: Vec<&Input> = calls[0].inputs.iter().collect();
    assert!(
        sent.contains(&&pair("is it good?", "it is great")),
        "{sent:?}"
    );

    // Deterministic, so cached: a repeat costs no upstream call.
    let repeat = repeat_from_cache(&stack, &gateway.url, "/predict", &single, "1").await;
    let repeat: Vec<Prediction> = serde_json::from_value(repeat).expect("one list");
    assert_eq!(repeat, expected(&text("I like it"), false));

    // `raw_scores` is another result (the logits), not the cached one.
    let raw = serde_json::json!({"inputs": "I like it", "raw_scores": true});
    let (status, body) = post_json(&gateway.url, "/predict", raw).await;
    assert_eq!(status, 200, "{body}");
    let logits: Vec<Prediction> = serde_json::from_value(body).expect("one list");
    assert_eq!(logits, expected(&text("I like it"), true));
    assert_ne!(logits, repeat);
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_sequence_fails_its_own_request_only() {
    let (stack, gateway) =
        stack_with_gateway(classifier(), &WAIT_FOR_BATCH_MATES, 1 << 20, 64).await;
    let bad = serde_json::json!({"inputs": [["fine too"], ["q", format!("x {POISON}")]]});
    let good = serde_json::json!({"inputs": ["q", "fine"]});
    let fine = bad_beside_good(&gateway.url, "/predict", bad, good).await;
    let fine: Vec<Prediction> = serde_json::from_value(fine).expect("one list");
    assert_eq!(fine, expected(&pair("q", "fine"), false));
    assert_isolated(&route_calls(&stack.tei.calls(), "/predict"), 3);
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teis_errors_before_any_call_and_the_model_route() {
    let (stack, gateway) = stack_with_gateway(classifier(), &[], 1 << 20, 2).await;
    let p = "/predict";
    let cases = vec![
        (
            p,
            serde_json::json!({"inputs": ""}),
            400,
            "Empty",
            "`inputs` cannot be empty",
        ),
        (
            p,
            serde_json::json!({"inputs": [["a"], ["b"], ["c"]]}),
            422,
            "Validation",
            "batch size 3 > maximum allowed batch size 2",
        ),
        (
            p,
            serde_json::json!({"inputs": ["a", "b", "c"]}),
            422,
            "Validation",
            "a string, a pair of strings",
        ),
        (
            p,
            serde_json::json!({"inputs": []}),
            422,
            "Validation",
            "inputs",
        ),
        (
            p,
            serde_json::json!({"input": "a"}),
            422,
            "Validation",
            "missing field `inputs`",
        ),
    ];
    assert_refused_before_any_call(&stack, &gateway.url, cases).await;
    // `GET /v1/models` says what the model does.
    assert_capabilities(&gateway.url, &["classify"]).await;
    let (status, body) = post_json(
        &gateway.url,
        "/models/embatch%2Ftei-double/predict",
        serde_json::json!({"inputs": ["q", "t"]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let one: Vec<Prediction> = serde_json::from_value(body).expect("one list");
    assert_eq!(one, expected(&pair("q", "t"), false));
    assert_unknown_model_404(&gateway.url, "/predict", serde_json::json!({"inputs": "a"})).await;
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerankers_predict_scores_equal_its_rerank_scores() {
    let reranker = instant_double(|tei| tei.reranker = true);
    let (stack, gateway) = stack_with_gateway(reranker, &[], 1 << 20, 64).await;
    for raw_scores in [false, true] {
        let rerank =
            serde_json::json!({"query": "q", "texts": ["a", "b"], "raw_scores": raw_scores});
        let (status, ranks) = post_json(&gateway.url, "/rerank", rerank).await;
        assert_eq!(status, 200, "{ranks}");
        let predict =
            serde_json::json!({"inputs": [["q", "a"], ["q", "b"]], "raw_scores": raw_scores});
        let (status, body) = post_json(&gateway.url, "/predict", predict).await;
        assert_eq!(status, 200, "{body}");
        let predicted = lists(&body);
        for rank in ranks.as_array().expect("ranks") {
            let index = rank["index"].as_u64().expect("index") as usize;
            let score = rank["score"].as_f64().expect("score") as f32;
            assert_eq!(predicted[index][0].score, score, "{ranks} {body}");
            assert_eq!(predicted[index][0].label, "LABEL_0");
        }
    }
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedding_model_is_teis_424_before_any_upstream_call() {
    let body = serde_json::json!({"inputs": "a"});
    let calls = assert_plain_model_424("/predict", body, "Model is not a classifier model").await;
    assert!(calls.is_empty(), "refused by the worker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_predict_request_has_its_deadline() {
    assert_the_deadline(classifier(), "/predict", r#"{"inputs":"slow"}"#).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_predict_subject_serves_direct_nats_callers() {
    let args = ["--max-client-batch-size", "2"];
    let (stack, _gateway) = stack_with_gateway(classifier(), &args, 1 << 20, 64).await;
    let client = direct_client(&stack).await;
    let reply = send_direct(
        &client,
        Operation::Predict,
        br#"{"inputs":[["x"],["q","t"]]}"#,
    )
    .await
    .expect("predictions");
    let got: Vec<Vec<Prediction>> = serde_json::from_slice(&reply.payload).expect("TEI's shape");
    assert_eq!(
        got,
        [
            expected(&text("x"), false),
            expected(&pair("q", "t"), false)
        ]
    );
    let three = br#"{"inputs":[["a"],["b"],["c"]]}"#;
    let err = send_direct(&client, Operation::Predict, three)
        .await
        .expect_err("over the worker's limit");
    assert_eq!(embatch_protocol::EmbedError::from(err).status(), 422);
    stack.worker.stop().await;
}
