//! The gateway over HTTP, a real nats-server and an in-process worker on a TEI test double:
//! TEI-compatible bodies and status codes for every outcome.

mod common;

use std::time::Duration;

use common::start_gateway;
use embatch_testkit::{NatsServer, Stack, TeiConfig, double_vector};

async fn post(
    url: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> (u16, reqwest::header::HeaderMap, serde_json::Value) {
    let mut request = reqwest::Client::new()
        .post(format!("{url}/embed"))
        .header("content-type", "application/json")
        .body(body.to_owned());
    for (name, value) in headers {
        request = request.header(*name, *value);
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
    let (status, headers, body) = post(&gateway.url, r#"{"inputs":"hello"}"#, &[]).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error_type"], "Unhealthy");
    assert!(
        body["error"]
            .as_str()
            .expect("message")
            .contains("no embatch worker"),
        "{body}"
    );
    assert_eq!(headers["content-type"], "application/json");
    let health = reqwest::get(format!("{}/health", gateway.url))
        .await
        .expect("health");
    assert_eq!(health.status().as_u16(), 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeds_through_nats_and_reports_health_and_timings() {
    let Stack { nats, tei, worker } =
        Stack::start(TeiConfig::instant(), &["--max-wait-time", "2ms"]).await;
    let gateway = start_gateway(&nats, 1 << 20, 64).await;

    let health = reqwest::get(format!("{}/health", gateway.url))
        .await
        .expect("health");
    assert_eq!(health.status().as_u16(), 200);

    let (status, headers, body) = post(&gateway.url, r#"{"inputs":["alpha","beta"]}"#, &[]).await;
    assert_eq!(status, 200, "{body}");
    let vectors: Vec<Vec<f32>> = serde_json::from_value(body).expect("vectors");
    assert_eq!(vectors, vec![double_vector("alpha"), double_vector("beta")]);
    for name in ["x-queue-time", "x-inference-time", "x-total-time"] {
        assert!(headers.contains_key(name), "missing {name}");
    }
    // A single string gets a one-element array, as in TEI.
    let (status, _, body) = post(&gateway.url, r#"{"inputs":"gamma"}"#, &[]).await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_value::<Vec<Vec<f32>>>(body).expect("vectors"),
        vec![double_vector("gamma")]
    );
    // Options reach the upstream unchanged.
    let (status, _, _) = post(
        &gateway.url,
        r#"{"inputs":"delta","normalize":false,"truncate":true}"#,
        &[],
    )
    .await;
    assert_eq!(status, 200);
    let last = tei.calls().pop().expect("a call");
    assert_eq!(last.options["normalize"], false);
    assert_eq!(last.options["truncate"], true);
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_teis_error_bodies_and_nothing_reaches_the_workers() {
    let Stack { nats, tei, worker } = Stack::start(TeiConfig::instant(), &[]).await;
    let gateway = start_gateway(&nats, 256, 3).await;
    let big = format!(r#"{{"inputs":"{}"}}"#, "x".repeat(300));
    let too_big = (big.as_str(), 413, "Validation", "at most 256 bytes");
    let cases = embatch_testkit::BAD_REQUESTS
        .iter()
        .copied()
        .chain(std::iter::once(too_big));
    for (body, status, kind, needle) in cases {
        let (got, _, reply) = post(&gateway.url, body, &[]).await;
        assert_eq!(got, status, "{body} → {reply}");
        assert_eq!(reply["error_type"], kind, "{body}");
        assert!(
            reply["error"].as_str().expect("message").contains(needle),
            "{body}: {reply}"
        );
    }
    let (status, _, reply) = post(
        &gateway.url,
        r#"{"inputs":"a"}"#,
        &[("x-embatch-timeout-ms", "soon")],
    )
    .await;
    assert_eq!(status, 422, "{reply}");
    assert!(tei.calls().is_empty());
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_timeout_shorter_than_the_upstream_gets_504() {
    let Stack {
        nats,
        tei: _tei,
        worker,
    } = Stack::start(
        TeiConfig {
            base: Duration::from_secs(2),
            ..TeiConfig::instant()
        },
        &["--max-wait-time", "1ms"],
    )
    .await;
    let gateway = start_gateway(&nats, 1 << 20, 64).await;
    let started = std::time::Instant::now();
    let (status, _, body) = post(
        &gateway.url,
        r#"{"inputs":"slow"}"#,
        &[("x-embatch-timeout-ms", "300")],
    )
    .await;
    assert_eq!(status, 504, "{body}");
    assert_eq!(body["error_type"], "Timeout");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "took {:?}",
        started.elapsed()
    );
    worker.stop().await;
}
