//! Tokenize and decode end to end over HTTP, a real nats-server and an in-process worker on the
//! TEI double: TEI's `POST /tokenize` and `POST /decode` passed to the upstream one call per
//! request, the subjects over NATS directly, TEI's errors, the deadline, and an upstream without
//! the route.

mod common;

use common::tei_routes::{
    assert_plain_model_424, assert_the_deadline, assert_unknown_model_404, direct_client,
    instant_double, post_json, send_direct,
};
use common::{assert_tei_error, stack_with_gateway};
use embatch_client::Operation;
use embatch_protocol::tokenize::SimpleToken;
use embatch_tei_double::{decoded, tokenized};
use embatch_testkit::TeiConfig;

/// The double with TEI's `/tokenize` and `/decode`, answering at once.
fn tokenizer() -> TeiConfig {
    instant_double(|tei| tei.tokenizer = true)
}

/// The upstream calls on `route`, by their number of inputs.
fn calls_on(stack: &embatch_testkit::Stack, route: &str) -> Vec<usize> {
    stack
        .tei
        .calls()
        .iter()
        .filter(|c| c.options["route"] == route)
        .map(|c| c.inputs.len())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_and_decode_pass_through_one_call_per_request() {
    let (stack, gateway) = stack_with_gateway(tokenizer(), &[], 1 << 20, 4).await;
    let body = serde_json::json!({"inputs": ["hello world", "x"]});
    let (status, lists) = post_json(&gateway.url, "/tokenize", body).await;
    assert_eq!(status, 200, "{lists}");
    let lists: Vec<Vec<SimpleToken>> = serde_json::from_value(lists).expect("TEI's shape");
    assert_eq!(
        lists,
        [tokenized("hello world", true), tokenized("x", true)]
    );
    let one = serde_json::json!({"inputs": "hi there", "add_special_tokens": false});
    let (status, single) = post_json(&gateway.url, "/tokenize", one).await;
    assert_eq!(status, 200, "{single}");
    assert_eq!(single, serde_json::json!([tokenized("hi there", false)]));

    let ids: Vec<u32> = lists[0].iter().map(|t| t.id).collect();
    let (status, texts) = post_json(&gateway.url, "/decode", serde_json::json!({"ids": ids})).await;
    assert_eq!(status, 200, "{texts}");
    assert_eq!(texts, serde_json::json!([decoded(&ids, true)]));
    let batch = serde_json::json!({"ids": [[101, 5], [7]], "skip_special_tokens": false});
    let (status, texts) = post_json(&gateway.url, "/decode", batch).await;
    assert_eq!(status, 200, "{texts}");
    assert_eq!(
        texts,
        serde_json::json!([decoded(&[101, 5], false), decoded(&[7], false)])
    );

    // Two concurrent callers: a call each (nothing to batch: no model runs).
    stack.tei.calls.clear();
    let ((a, _), (b, _)) = tokio::join!(
        post_json(
            &gateway.url,
            "/tokenize",
            serde_json::json!({"inputs": "a"})
        ),
        post_json(
            &gateway.url,
            "/tokenize",
            serde_json::json!({"inputs": ["b", "c"]})
        ),
    );
    assert_eq!((a, b), (200, 200));
    let mut sizes = calls_on(&stack, "/tokenize");
    sizes.sort_unstable();
    assert_eq!(sizes, [1, 2]);
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teis_errors_the_model_path_and_direct_nats_callers() {
    let (stack, gateway) = stack_with_gateway(tokenizer(), &[], 1 << 20, 2).await;
    for (path, body, status, error_type, needle) in [
        (
            "/tokenize",
            serde_json::json!({"inputs": []}),
            400,
            "Empty",
            "`inputs` cannot be empty",
        ),
        (
            "/tokenize",
            serde_json::json!({"inputs": ["a", "b", "c"]}),
            422,
            "Validation",
            "batch size 3",
        ),
        (
            "/tokenize",
            serde_json::json!({"inputs": 7}),
            422,
            "Validation",
            "`inputs`",
        ),
        (
            "/decode",
            serde_json::json!({"ids": [[1], [2], [3]]}),
            422,
            "Validation",
            "batch size 3",
        ),
        (
            "/decode",
            serde_json::json!({"ids": "a"}),
            422,
            "Validation",
            "`ids`",
        ),
        (
            "/decode",
            serde_json::json!({}),
            422,
            "Validation",
            "missing field `ids`",
        ),
    ] {
        let (got, err) = post_json(&gateway.url, path, body.clone()).await;
        assert_eq!(got, status, "{path} {body}: {err}");
        assert_tei_error(&err, error_type, needle);
    }
    // Refused before any call (the worker's token counter may have called /tokenize at start).
    assert!(calls_on(&stack, "/decode").is_empty());
    assert!(!calls_on(&stack, "/tokenize").contains(&3));
    assert_unknown_model_404(&gateway.url, "/decode", serde_json::json!({"ids": [1]})).await;

    // The subjects over NATS, for a caller that skips the gateway.
    let client = direct_client(&stack).await;
    let body = br#"{"inputs":"over nats"}"#;
    let reply = send_direct(&client, Operation::Tokenize, body)
        .await
        .expect("tokens");
    let got: Vec<Vec<SimpleToken>> = serde_json::from_slice(&reply.payload).expect("shape");
    assert_eq!(got, [tokenized("over nats", true)]);
    let empty = br#"{"ids":[[]],"skip_special_tokens":true}"#;
    let reply = send_direct(&client, Operation::Decode, empty)
        .await
        .expect("texts");
    assert_eq!(&reply.payload[..], br#"[""]"#);
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tokenize_request_has_its_deadline() {
    assert_the_deadline(tokenizer(), "/tokenize", r#"{"inputs":"slow"}"#).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_without_the_route_is_424_naming_it() {
    // Without its tokenizer routes the double answers 404 for them, as an OpenAI-compatible or
    // older server without the route does.
    let body = serde_json::json!({"ids": [101, 102]});
    let needle = "the upstream does not serve POST /decode";
    assert_plain_model_424("/decode", body, needle).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_built_in_model_answers_with_its_own_tokenizer() {
    let nats = embatch_testkit::NatsServer::start();
    let dir = embatch_testkit::model_dir();
    let dir = dir.to_str().expect("UTF-8 model path");
    let worker = embatch_testkit::RunningWorker::start(&nats, &["--model-dir", dir]).await;
    let gateway = common::start_gateway(&nats, 1 << 20, 64).await;
    // all-MiniLM-L6-v2's BERT vocabulary, as TEI 1.9.3 answers for the same model.
    let (status, tokens) = post_json(
        &gateway.url,
        "/tokenize",
        serde_json::json!({"inputs": "Hello world"}),
    )
    .await;
    assert_eq!(status, 200, "{tokens}");
    assert_eq!(
        tokens,
        serde_json::json!([[
            {"id": 101, "text": "[CLS]", "special": true, "start": null, "stop": null},
            {"id": 7592, "text": "Hello", "special": false, "start": 0, "stop": 5},
            {"id": 2088, "text": "world", "special": false, "start": 6, "stop": 11},
            {"id": 102, "text": "[SEP]", "special": true, "start": null, "stop": null},
        ]])
    );
    let (status, texts) = post_json(
        &gateway.url,
        "/decode",
        serde_json::json!({"ids": [[101, 7592, 2088, 102]], "skip_special_tokens": false}),
    )
    .await;
    assert_eq!(status, 200, "{texts}");
    assert_eq!(texts, serde_json::json!(["[CLS] hello world [SEP]"]));
    worker.stop().await;
}
