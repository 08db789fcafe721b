//! The drop-in routes over HTTP, a real nats-server and an in-process worker on the TEI double:
//! `POST /` (TEI's compat route), `POST /v1/embeddings` and `POST /embeddings` (OpenAI's shape),
//! `GET /info` (answered by a worker over NATS).

mod common;

use base64::Engine as _;
use common::tei_routes::post_json;
use common::{assert_tei_error, stack_with_gateway, start_gateway};
use embatch_testkit::{NatsServer, RunningWorker, TeiConfig, double_vector, model_dir};

async fn get_json(url: &str, path: &str) -> (u16, serde_json::Value) {
    let response = reqwest::get(format!("{url}{path}"))
        .await
        .expect("HTTP response");
    let status = response.status().as_u16();
    let body = response.json().await.expect("JSON body");
    (status, body)
}

/// `GET /info`, which must answer 200: TEI's info document.
async fn get_info(url: &str) -> serde_json::Value {
    let (status, info) = get_json(url, "/info").await;
    assert_eq!(status, 200, "{info}");
    info
}

/// The vectors of an OpenAI response's `data`, decoding base64 ones as little-endian f32.
fn openai_vectors(body: &serde_json::Value) -> Vec<Vec<f32>> {
    let data = body["data"].as_array().expect("data");
    data.iter()
        .enumerate()
        .map(|(i, item)| {
            assert_eq!(item["object"], "embedding");
            assert_eq!(item["index"], i);
            match &item["embedding"] {
                serde_json::Value::String(text) => base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .expect("base64")
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                other => serde_json::from_value(other.clone()).expect("floats"),
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_root_is_embed() {
    let (stack, gateway) = stack_with_gateway(TeiConfig::instant(), &[], 1 << 20, 64).await;

    let body = r#"{"inputs":["alpha","beta"]}"#;
    let (status, root) = post_json(&gateway.url, "/", body).await;
    assert_eq!(status, 200, "{root}");
    let (_, embed) = post_json(&gateway.url, "/embed", body).await;
    assert_eq!(root, embed);
    assert_eq!(
        serde_json::from_value::<Vec<Vec<f32>>>(root).expect("vectors"),
        vec![double_vector("alpha"), double_vector("beta")]
    );
    // Errors too are TEI's.
    let (status, err) = post_json(&gateway.url, "/", r#"{"inputs":[]}"#).await;
    assert_eq!(status, 400);
    assert_eq!(err["error_type"], "Empty");
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_embeddings_float_and_base64_match_embed() {
    let (stack, gateway) = stack_with_gateway(TeiConfig::instant(), &[], 1 << 20, 64).await;

    let (_, embed) = post_json(&gateway.url, "/embed", r#"{"inputs":["alpha","beta"]}"#).await;
    let expected: Vec<Vec<f32>> = serde_json::from_value(embed).expect("vectors");

    for path in ["/v1/embeddings", "/embeddings"] {
        for format in ["float", "base64"] {
            let request = format!(
                r#"{{"input":["alpha","beta"],"model":"embatch/tei-double","encoding_format":"{format}","user":"u1"}}"#
            );
            let (status, body) = post_json(&gateway.url, path, &request).await;
            assert_eq!(status, 200, "{path} {format}: {body}");
            assert_eq!(body["object"], "list");
            assert_eq!(body["model"], "embatch/tei-double");
            assert_eq!(body["usage"]["prompt_tokens"], 0);
            assert_eq!(body["usage"]["total_tokens"], 0);
            assert_eq!(openai_vectors(&body), expected, "{path} {format}");
        }
    }
    // A single string, no model and no encoding_format: floats, model "".
    let (status, body) = post_json(&gateway.url, "/v1/embeddings", r#"{"input":"gamma"}"#).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], "");
    assert!(body["data"][0]["embedding"].is_array(), "{body}");
    assert_eq!(openai_vectors(&body), vec![double_vector("gamma")]);

    // `dimensions` and `normalize: true` reach the upstream like /embed's options.
    let (status, body) = post_json(
        &gateway.url,
        "/v1/embeddings",
        r#"{"input":"delta","dimensions":4}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(openai_vectors(&body)[0].len(), 4);
    let last = stack.tei.calls().pop().expect("a call");
    assert_eq!(last.options["dimensions"], 4);
    assert_eq!(last.options["normalize"], true);
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_errors_have_openais_shape_and_the_tei_routes_status() {
    let (stack, gateway) = stack_with_gateway(TeiConfig::instant(), &[], 1 << 20, 3).await;

    // (OpenAI body, the equivalent /embed body, param)
    let cases: [(&str, &str, Option<&str>); 4] = [
        (r#"{"input":[]}"#, r#"{"inputs":[]}"#, Some("input")),
        (
            r#"{"input":["a","b","c","d"]}"#,
            r#"{"inputs":["a","b","c","d"]}"#,
            Some("input"),
        ),
        (
            r#"{"input":"a","dimensions":0}"#,
            r#"{"inputs":"a","dimensions":0}"#,
            Some("dimensions"),
        ),
        ("{oops", "{oops", None),
    ];
    for (openai, tei_body, param) in cases {
        let (tei_status, _) = post_json(&gateway.url, "/embed", tei_body).await;
        let (status, body) = post_json(&gateway.url, "/v1/embeddings", openai).await;
        assert_eq!(status, tei_status, "{openai}: {body}");
        let error = &body["error"];
        assert_eq!(error["type"], "invalid_request_error", "{body}");
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
        assert_eq!(error["param"].as_str(), param, "{openai}: {body}");
        assert!(error["code"].is_null());
    }
    // Fields only OpenAI has are checked too.
    let (status, body) = post_json(
        &gateway.url,
        "/v1/embeddings",
        r#"{"input":"a","encoding_format":"hex"}"#,
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["param"], "encoding_format");
    let (status, body) = post_json(&gateway.url, "/v1/embeddings", r#"{"input":[1,"a"]}"#).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["param"], "input");
    assert!(stack.tei.calls().is_empty());
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_without_workers_is_503() {
    let nats = NatsServer::start();
    let gateway = start_gateway(&nats, 1 << 20, 64).await;
    let (status, body) = post_json(&gateway.url, "/v1/embeddings", r#"{"input":"a"}"#).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["type"], "server_error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_comes_from_a_worker() {
    let tei = TeiConfig {
        model_id: "acme/embedder".into(),
        ..TeiConfig::instant()
    };
    // The double's, the worker's and this gateway's limit are all 512 (the defaults).
    let (stack, gateway) = stack_with_gateway(tei, &[], 1 << 20, 512).await;
    let info = get_info(&gateway.url).await;
    assert_eq!(info["model_id"], "acme/embedder");
    assert_eq!(
        info["max_client_batch_size"],
        TeiConfig::instant().max_client_batch_size
    );
    // The rest of TEI's document passes through.
    assert_eq!(info["model_type"]["embedding"]["pooling"], "mean");
    assert_eq!(info["max_input_length"], 512);

    // A gateway with a smaller limit announces its own, so clients that size batches by /info
    // are not refused.
    let small = start_gateway(&stack.nats, 1 << 20, 8).await;
    let info = get_info(&small.url).await;
    assert_eq!(info["max_client_batch_size"], 8);
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_reports_the_workers_limit() {
    let worker_args = ["--max-client-batch-size", "100"];
    let (stack, gateway) =
        stack_with_gateway(TeiConfig::instant(), &worker_args, 1 << 20, 512).await;
    let info = get_info(&gateway.url).await;
    assert_eq!(info["max_client_batch_size"], 100);
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_from_the_built_in_model() {
    let nats = NatsServer::start();
    let dir = model_dir();
    let dir = dir.to_str().expect("UTF-8 model path");
    let worker = RunningWorker::start(&nats, &["--model-dir", dir]).await;
    let gateway = start_gateway(&nats, 1 << 20, 512).await;
    let info = get_info(&gateway.url).await;
    assert_eq!(info["model_id"], "all-MiniLM-L6-v2");
    assert_eq!(info["max_input_length"], 256);
    assert_eq!(info["max_client_batch_size"], 512);
    assert_eq!(info["model_dtype"], "float32");
    assert_eq!(info["auto_truncate"], true, "as TEI 1.9.3 by default");
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_without_workers_is_503() {
    let nats = NatsServer::start();
    let gateway = start_gateway(&nats, 1 << 20, 64).await;
    let (status, body) = get_json(&gateway.url, "/info").await;
    assert_eq!(status, 503, "{body}");
    assert_tei_error(&body, "Unhealthy", "embed.info");
}
