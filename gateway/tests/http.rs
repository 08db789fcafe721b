//! The gateway over HTTP, a real nats-server and an in-process worker on a TEI test double:
//! TEI-compatible bodies and status codes for every outcome.

mod common;

use std::time::Duration;

use common::{assert_tei_error, json_post, stack_with_gateway, start_gateway, tei_taking};
use embatch_testkit::{NatsServer, TeiConfig, double_vector};

/// `POST /embed` with `body` and, if given, an `x-embatch-timeout-ms` header.
async fn post(
    url: &str,
    body: &str,
    timeout_ms: Option<&str>,
) -> (u16, reqwest::header::HeaderMap, serde_json::Value) {
    let url = format!("{url}/embed");
    let mut request = json_post(&reqwest::Client::new(), &url, body.to_owned());
    if let Some(timeout_ms) = timeout_ms {
        request = request.header("x-embatch-timeout-ms", timeout_ms);
    }
    let response = request.send().await.expect("HTTP response");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.json().await.expect("JSON body");
    (status, headers, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_workers_embed_is_503_and_health_is_503() {
    let nats = NatsServer::start();
    let gateway = start_gateway(&nats, 1 << 20, 64).await;
    let (status, headers, body) = post(&gateway.url, r#"{"inputs":"hello"}"#, None).await;
    assert_eq!(status, 503, "{body}");
    assert_tei_error(&body, "Unhealthy", "no embatch worker");
    assert_eq!(headers["content-type"], "application/json");
    let health = reqwest::get(format!("{}/health", gateway.url))
        .await
        .expect("health");
    assert_eq!(health.status().as_u16(), 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeds_through_nats_and_reports_health_and_timings() {
    let (stack, gateway) = stack_with_gateway(
        TeiConfig::instant(),
        &["--max-wait-time", "2ms"],
        1 << 20,
        64,
    )
    .await;

    let health = reqwest::get(format!("{}/health", gateway.url))
        .await
        .expect("health");
    assert_eq!(health.status().as_u16(), 200);

    let (status, headers, body) = post(&gateway.url, r#"{"inputs":["alpha","beta"]}"#, None).await;
    assert_eq!(status, 200, "{body}");
    let vectors: Vec<Vec<f32>> = serde_json::from_value(body).expect("vectors");
    assert_eq!(vectors, vec![double_vector("alpha"), double_vector("beta")]);
    for name in ["x-queue-time", "x-inference-time", "x-total-time"] {
        assert!(headers.contains_key(name), "missing {name}");
    }
    // A single string gets a one-element array, as in TEI.
    let (status, _, body) = post(&gateway.url, r#"{"inputs":"gamma"}"#, None).await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_value::<Vec<Vec<f32>>>(body).expect("vectors"),
        vec![double_vector("gamma")]
    );
    // Options reach the upstream unchanged.
    let (status, _, _) = post(
        &gateway.url,
        r#"{"inputs":"delta","normalize":false,"truncate":true}"#,
        None,
    )
    .await;
    assert_eq!(status, 200);
    let last = stack.tei.calls().pop().expect("a call");
    assert_eq!(last.options["normalize"], false);
    assert_eq!(last.options["truncate"], true);
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_teis_error_bodies_and_nothing_reaches_the_workers() {
    let (stack, gateway) = stack_with_gateway(TeiConfig::instant(), &[], 256, 3).await;
    let big = format!(r#"{{"inputs":"{}"}}"#, "x".repeat(300));
    let too_big = (big.as_str(), 413, "Validation", "at most 256 bytes");
    let cases = embatch_testkit::BAD_REQUESTS
        .iter()
        .copied()
        .chain(std::iter::once(too_big));
    for (body, status, kind, needle) in cases {
        let (got, _, reply) = post(&gateway.url, body, None).await;
        assert_eq!(got, status, "{body} → {reply}");
        assert_tei_error(&reply, kind, needle);
    }
    let (status, _, reply) = post(&gateway.url, r#"{"inputs":"a"}"#, Some("soon")).await;
    assert_eq!(status, 422, "{reply}");
    assert!(stack.tei.calls().is_empty());
    stack.worker.stop().await;
}

/// `body` with every `inputs` renamed `input` (bytes, so invalid UTF-8 stays as it is).
fn rename_inputs(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    let mut rest = body;
    while !rest.is_empty() {
        if rest.starts_with(b"inputs") {
            out.extend_from_slice(b"input");
            rest = &rest[6..];
        } else {
            out.push(rest[0]);
            rest = &rest[1..];
        }
    }
    out
}

/// A body that is not JSON: 400 `Validation`, as TEI 1.9.3 answers (its JSON extractor's 400),
/// on `POST /embed` and on the OpenAI route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_json_is_400_on_every_route() {
    let (stack, gateway) = stack_with_gateway(TeiConfig::instant(), &[], 1 << 20, 64).await;
    let http = reqwest::Client::new();
    let (status, kind, needle) = embatch_testkit::MALFORMED_JSON_ANSWER;
    for route in ["embed", "v1/embeddings"] {
        let url = format!("{}/{route}", gateway.url);
        for body in embatch_testkit::MALFORMED_JSON {
            // OpenAI's field is `input`: the same defects, in the field that route reads.
            let body = match route {
                "embed" => body.to_vec(),
                _ => rename_inputs(body),
            };
            let response = json_post(&http, &url, body.clone())
                .send()
                .await
                .expect("HTTP response");
            assert_eq!(response.status().as_u16(), status, "{route} {body:?}");
            let reply: serde_json::Value = response.json().await.expect("JSON body");
            if route == "embed" {
                assert_tei_error(&reply, kind, needle);
            } else {
                let message = reply["error"]["message"].as_str().unwrap_or_default();
                assert!(message.contains(needle), "{route} {body:?}: {reply}");
                assert_eq!(reply["error"]["type"], "invalid_request_error", "{reply}");
            }
        }
    }
    assert!(stack.tei.calls().is_empty());
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_timeout_shorter_than_the_upstream_gets_504() {
    let (stack, gateway) = stack_with_gateway(
        tei_taking(Duration::from_secs(2)),
        &["--max-wait-time", "1ms"],
        1 << 20,
        64,
    )
    .await;
    let started = std::time::Instant::now();
    let (status, _, body) = post(&gateway.url, r#"{"inputs":"slow"}"#, Some("300")).await;
    assert_eq!(status, 504, "{body}");
    assert_eq!(body["error_type"], "Timeout");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "took {:?}",
        started.elapsed()
    );
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_shorter_than_every_recent_call_gets_no_upstream_work() {
    // An idle worker in front of a 40 ms upstream, which it measured on three requests.
    let (stack, gateway) =
        stack_with_gateway(tei_taking(Duration::from_millis(40)), &[], 1 << 20, 64).await;
    for text in ["warm a", "warm b", "warm c"] {
        let body = serde_json::json!({ "inputs": text }).to_string();
        let (status, _, reply) = post(&gateway.url, &body, None).await;
        assert_eq!(status, 200, "{reply}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let calls = stack.tei.calls().len();
    for timeout_ms in ["5", "20"] {
        let (status, _, body) =
            post(&gateway.url, r#"{"inputs":"too soon"}"#, Some(timeout_ms)).await;
        assert!(
            status == 429 || status == 504,
            "{timeout_ms} ms on a 40 ms upstream: {status} {body}"
        );
    }
    assert_eq!(stack.tei.calls().len(), calls, "no upstream work for them");
    let (status, _, body) = post(&gateway.url, r#"{"inputs":"warm a"}"#, Some("20")).await;
    assert_eq!(status, 200, "a cache hit within the timeout: {body}");
    stack.worker.stop().await;
}
