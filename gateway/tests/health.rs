//! `GET /health` tells the truth about the configured subject: a worker serving another subject
//! does not make the gateway healthy, and a worker whose TEI hangs is still a worker.

mod common;

use common::start_gateway_at;
use embatch_testkit::{NatsServer, RunningWorker, Stack, TeiConfig};

async fn health(gateway_url: &str) -> u16 {
    reqwest::get(format!("{gateway_url}/health"))
        .await
        .expect("health")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_503_when_no_worker_serves_the_gateways_subject() {
    let Stack {
        nats,
        tei: _tei,
        worker,
    } = Stack::start(TeiConfig::instant(), &[]).await;
    let elsewhere = start_gateway_at(&nats.url(), &["--subject", "other"], None).await;
    assert_eq!(health(&elsewhere.url).await, 503);
    let here = start_gateway_at(&nats.url(), &[], None).await;
    assert_eq!(health(&here.url).await, 200);
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_tei_hangs_still_counts() {
    // A "TEI" that accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let tei_url = format!("http://{}", silent.local_addr().expect("addr"));
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            open.push(stream);
        }
    });
    let nats = NatsServer::start();
    let worker =
        // MODEL_ALIAS: the worker needs no /info to name its model, so it starts while TEI hangs.
        RunningWorker::start(
            &nats,
            &["--tei-url", &tei_url, "--upstream-timeout", "5s", "--model-alias", "m"],
        )
        .await;
    let gateway = start_gateway_at(&nats.url(), &[], None).await;
    // Each probe waits for the worker's bounded /info attempt (500 ms), not TEI's 5 s timeout.
    for _ in 0..3 {
        assert_eq!(health(&gateway.url).await, 200);
    }
    worker.stop().await;
    held.abort();
}
