//! End to end on the real model: HTTP → gateway → NATS → worker → built-in CPU model, and a
//! direct NATS request, checked against embeddings a real TEI server produced for the same
//! inputs (`testdata/` in the repo).

mod common;

use bytes::Bytes;
use common::start_gateway;
use embatch_testkit::{NatsServer, RunningWorker, cosine, model_dir, testdata};
use serde::Deserialize;

/// The built-in model's name: its directory's (what `GET /v1/models` lists for it).
fn built_in() -> String {
    model_dir()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .expect("a model directory")
}

#[derive(Deserialize)]
struct Reference {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    request: serde_json::Value,
    embeddings: Vec<Vec<f32>>,
}

fn assert_matches(case: &Case, got: &[Vec<f32>], path: &str) {
    assert_eq!(
        got.len(),
        case.embeddings.len(),
        "{path}: one embedding per input"
    );
    for (i, (g, want)) in got.iter().zip(&case.embeddings).enumerate() {
        assert_eq!(g.len(), want.len(), "{path}: dimension of input {i}");
        let cos = cosine(g, want);
        assert!(
            cos >= 0.999,
            "{path}: input {i} cosine {cos} < 0.999 against TEI's reference"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_model_through_gateway_and_direct_nats_matches_tei() {
    let raw = std::fs::read(testdata().join("minilm-reference-embeddings.json"))
        .expect("reference embeddings in testdata/");
    let reference: Reference = serde_json::from_slice(&raw).expect("reference JSON");
    assert!(reference.cases.len() >= 3, "all reference cases present");

    let nats = NatsServer::start();
    let dir = model_dir();
    let dir = dir.to_str().expect("UTF-8 model path");
    let worker = RunningWorker::start(&nats, &["--model-dir", dir, "--max-wait-time", "2ms"]).await;
    let gateway = start_gateway(&nats, 2 << 20, 512).await;
    let http = reqwest::Client::new();
    let nats_client = async_nats::connect(nats.url())
        .await
        .expect("client connects");

    for case in &reference.cases {
        let body = case.request.to_string();
        let response = http
            .post(format!("{}/embed", gateway.url))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .expect("HTTP response");
        assert_eq!(response.status().as_u16(), 200);
        let got: Vec<Vec<f32>> = response.json().await.expect("vectors");
        assert_matches(case, &got, "gateway");

        let reply = nats_client
            .request(embatch_protocol::DEFAULT_SUBJECT, Bytes::from(body))
            .await
            .expect("NATS reply");
        let got: Vec<Vec<f32>> = serde_json::from_slice(&reply.payload).expect("vectors");
        assert_matches(case, &got, "direct NATS");
    }

    // Token ids, as TEI 1.9.3 takes them: the ids of "Hello, world!" (with [CLS] and [SEP]) embed
    // like the text, on `/embed` next to a text and on OpenAI's route as an array of ids.
    let first = &reference.cases[0];
    assert_eq!(first.request["inputs"][1], "Hello, world!");
    let hello = Case {
        request: serde_json::Value::Null,
        embeddings: vec![first.embeddings[1].clone(); 2],
    };
    let hello_ids = serde_json::json!([101, 7592, 1010, 2088, 999, 102]);
    let response = http
        .post(format!("{}/embed", gateway.url))
        .json(&serde_json::json!({ "inputs": [hello_ids, "Hello, world!"] }))
        .send()
        .await
        .expect("HTTP response");
    assert_eq!(response.status().as_u16(), 200);
    let got: Vec<Vec<f32>> = response.json().await.expect("vectors");
    assert_matches(&hello, &got, "token ids on /embed");
    let response = http
        .post(format!("{}/v1/embeddings", gateway.url))
        .json(&serde_json::json!({ "input": [hello_ids, hello_ids], "model": built_in() }))
        .send()
        .await
        .expect("HTTP response");
    assert_eq!(response.status().as_u16(), 200);
    let body: serde_json::Value = response.json().await.expect("OpenAI body");
    let got: Vec<Vec<f32>> = body["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|d| serde_json::from_value(d["embedding"].clone()).expect("floats"))
        .collect();
    assert_matches(&hello, &got, "token ids on /v1/embeddings");

    // The long input is over the model's 256 tokens. Without `truncate`, TEI 1.9.3 truncates it
    // (its `--auto-truncate` defaults to true) and answers TEI's truncated embedding; with
    // `truncate: false` it answers 422.
    let truncated = reference
        .cases
        .iter()
        .find(|case| case.request["truncate"] == true)
        .expect("the reference has the long input with `truncate: true`");
    let long = truncated.request["inputs"].clone();
    let response = http
        .post(format!("{}/embed", gateway.url))
        .json(&serde_json::json!({ "inputs": long }))
        .send()
        .await
        .expect("HTTP response");
    assert_eq!(response.status().as_u16(), 200);
    let got: Vec<Vec<f32>> = response.json().await.expect("vectors");
    assert_matches(truncated, &got, "a long input without `truncate`");
    let response = http
        .post(format!("{}/embed", gateway.url))
        .json(&serde_json::json!({ "inputs": long, "truncate": false }))
        .send()
        .await
        .expect("HTTP response");
    assert_eq!(response.status().as_u16(), 422);
    let error: serde_json::Value = response.json().await.expect("error body");
    assert_eq!(error["error_type"], "Validation");
    assert!(
        error["error"].as_str().expect("message").starts_with(
            "Input validation error: `inputs` must have less than 256 tokens. Given: "
        ),
        "{error}"
    );

    // OpenAI's `usage` counts the inputs' tokens as the model's own tokenizer does (special
    // tokens included, the long input truncated to 256). A few inputs: every input of a forward
    // pass is padded to the longest.
    let encoder = embatch_local_model::Encoder::load_file(&model_dir().join("tokenizer.json"), 256)
        .expect("the model's tokenizer");
    let mut inputs: Vec<serde_json::Value> =
        first.request["inputs"].as_array().expect("inputs")[..3].to_vec();
    match &long {
        serde_json::Value::Array(long) => inputs.extend(long.iter().cloned()),
        long => inputs.push(long.clone()),
    }
    let texts: Vec<embatch_protocol::Input> = inputs
        .iter()
        .map(|t| embatch_protocol::Input::from(t.as_str().expect("a text")))
        .collect();
    let want: u32 = encoder
        .count(
            &texts,
            None,
            Some(embatch_protocol::TruncationDirection::Right),
        )
        .expect("counts")
        .iter()
        .sum();
    let response = http
        .post(format!("{}/v1/embeddings", gateway.url))
        .json(&serde_json::json!({ "input": inputs, "model": built_in() }))
        .send()
        .await
        .expect("HTTP response");
    assert_eq!(response.status().as_u16(), 200);
    let body: serde_json::Value = response.json().await.expect("OpenAI body");
    assert_eq!(body["usage"]["prompt_tokens"], want, "{}", body["usage"]);
    assert_eq!(body["usage"]["total_tokens"], want);
    assert!(want > 256, "the sum covers every input");
    worker.stop().await;
}
