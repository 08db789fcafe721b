//! The gateway under clients that go away, hold connections, or arrive while NATS is down:
//! cancellation of a disconnected client's request, the connection cap and header-read timeout,
//! the in-flight cap (429 with `Retry-After`), and 503 at once while NATS is unreachable.

mod common;

use std::time::Duration;

use common::{
    assert_tei_error, json_post, read_to_close, start_gateway_at, tei_taking, wait_until,
};
use embatch_protocol::Input;
use embatch_testkit::{NatsServer, ONE_CALL_AT_A_TIME, Stack, TeiConfig};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

fn embed_body(text: &str) -> String {
    serde_json::json!({ "inputs": text }).to_string()
}

async fn post(
    url: &str,
    text: &str,
    timeout: Duration,
) -> Result<reqwest::Response, reqwest::Error> {
    json_post(
        &reqwest::Client::new(),
        &format!("{url}/embed"),
        embed_body(text),
    )
    .timeout(timeout)
    .send()
    .await
}

/// Posts `text` and asserts that it is shed: 429 with `Retry-After: 1` and TEI's `Overloaded`
/// error body with `needle` in its message.
async fn assert_shed(url: &str, text: &str, needle: &str) {
    let shed = post(url, text, Duration::from_secs(10))
        .await
        .expect("HTTP response");
    assert_eq!(shed.status().as_u16(), 429);
    assert_eq!(shed.headers()["retry-after"], "1");
    let body: serde_json::Value = shed.json().await.expect("TEI error body");
    assert_tei_error(&body, "Overloaded", needle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_costs_no_upstream_call() {
    // One call at a time, one input per call, 600 ms each: a second request waits in the queue.
    let Stack { nats, tei, worker } =
        Stack::start(tei_taking(Duration::from_millis(600)), &ONE_CALL_AT_A_TIME).await;
    let gateway = start_gateway_at(&nats.url(), &[], None).await;

    let url = gateway.url.clone();
    let first =
        tokio::spawn(
            async move { post(&url, "occupies the upstream", Duration::from_secs(10)).await },
        );
    // Wait until the first request is upstream, then send one that gives up while queued.
    wait_until("the first request reached the upstream", || {
        !tei.calls().is_empty()
    })
    .await;
    let gave_up = post(
        &gateway.url,
        "the caller hangs up",
        Duration::from_millis(150),
    )
    .await;
    assert!(gave_up.is_err_and(|e| e.is_timeout()), "the client gave up");

    let first = first.await.expect("joins").expect("HTTP response");
    assert_eq!(first.status().as_u16(), 200);
    // A third request after the queue drained proves the worker moved past the withdrawn one.
    let third = post(&gateway.url, "after", Duration::from_secs(10))
        .await
        .expect("HTTP response");
    assert_eq!(third.status().as_u16(), 200);
    let inputs: Vec<Input> = tei.calls().into_iter().flat_map(|c| c.inputs).collect();
    assert_eq!(
        inputs,
        ["occupies the upstream", "after"],
        "the withdrawn request never reached the upstream"
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_connections_are_bounded() {
    let stack = Stack::start(TeiConfig::instant(), &[]).await;
    let gateway = start_gateway_at(
        &stack.nats.url(),
        &["--max-connections", "2", "--header-read-timeout", "500ms"],
        None,
    )
    .await;
    let addr = gateway.url.trim_start_matches("http://").to_owned();

    // Two slowloris connections: half a request line, then nothing.
    let mut slow = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(&addr).await.expect("connects");
        stream
            .write_all(b"POST /embed HTTP/1.1\r\nHost: x\r\n")
            .await
            .expect("writes");
        slow.push(stream);
    }
    // A third connection is over the cap: closed at once, nothing answered.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut third = TcpStream::connect(&addr).await.expect("the kernel accepts");
    let _ = third
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let answered = read_to_close(&mut third, Duration::from_secs(5)).await;
    assert_eq!(answered, Some(Vec::new()), "closed without an answer");

    // The header-read timeout closes the slow ones (hyper answers 408 or just closes).
    for mut stream in slow {
        let closed = read_to_close(&mut stream, Duration::from_secs(5)).await;
        assert!(
            closed.is_some(),
            "a slowloris connection is closed by the header-read timeout"
        );
    }
    // With the slots free again, a normal request is served.
    let response = post(&gateway.url, "hello", Duration::from_secs(10))
        .await
        .expect("HTTP response");
    assert_eq!(response.status().as_u16(), 200);
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_max_in_flight_the_gateway_sheds_with_429_and_retry_after() {
    let Stack { nats, tei, worker } =
        Stack::start(tei_taking(Duration::from_millis(500)), &[]).await;
    let gateway = start_gateway_at(&nats.url(), &["--max-in-flight", "1"], None).await;

    let url = gateway.url.clone();
    let first = tokio::spawn(async move { post(&url, "first", Duration::from_secs(10)).await });
    wait_until("the first request reached the upstream", || {
        !tei.calls().is_empty()
    })
    .await;
    assert_shed(&gateway.url, "second", "MAX_IN_FLIGHT").await;
    let first = first.await.expect("joins").expect("HTTP response");
    assert_eq!(first.status().as_u16(), 200);
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_nats_is_down_requests_get_503_not_a_timeout() {
    let mut nats = NatsServer::start();
    let gateway = start_gateway_at(&nats.url(), &["--request-timeout", "20s"], None).await;
    nats.kill();
    // Wait for the client to notice the connection is gone.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let response = post(&gateway.url, "hello", Duration::from_secs(30))
        .await
        .expect("HTTP response");
    assert_eq!(response.status().as_u16(), 503);
    let body: serde_json::Value = response.json().await.expect("TEI error body");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|m| m.contains("not connected to NATS")),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_worker_full_is_429_with_retry_after_and_no_worker_is_503() {
    // One input per call, one call at a time, 600 ms each: a few queued requests put the worker
    // over its admission bound. Alone, it stays a member (it would leave only while another
    // worker serves) and sheds with 429 itself; several full workers answer the same, whichever
    // of them is a member, and when none is, the gateway answers 429 from discovery. A queue
    // delay bound well under one call makes "over the bound" hold however late (on a loaded
    // machine) the last request arrives during the running call.
    let Stack { nats, tei, worker } = Stack::start(
        tei_taking(Duration::from_millis(600)),
        &[
            "--max-batch-size",
            "1",
            "--max-concurrent-batches",
            "1",
            "--max-queue-delay",
            "100ms",
        ],
    )
    .await;
    let gateway = start_gateway_at(&nats.url(), &[], None).await;
    let first = post(&gateway.url, "measure the call", Duration::from_secs(10))
        .await
        .expect("HTTP response");
    assert_eq!(first.status().as_u16(), 200);
    let queued: Vec<_> = (0..3)
        .map(|i| {
            let url = gateway.url.clone();
            tokio::spawn(async move {
                post(&url, &format!("queued {i}"), Duration::from_secs(10)).await
            })
        })
        .collect();
    wait_until("a queued request reached the upstream", || {
        tei.calls().len() >= 2
    })
    .await;
    assert_shed(&gateway.url, "one too many", "retry in").await;
    for task in queued {
        let status = task.await.expect("joins").expect("HTTP response").status();
        assert!(matches!(status.as_u16(), 200 | 429), "{status}");
    }
    worker.stop().await;

    let absent = post(&gateway.url, "nobody home", Duration::from_secs(10))
        .await
        .expect("HTTP response");
    assert_eq!(absent.status().as_u16(), 503);
    let body: serde_json::Value = absent.json().await.expect("TEI error body");
    assert_tei_error(&body, "Unhealthy", "no embatch worker is listening");
}
