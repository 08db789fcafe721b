//! `GET /health` tells the truth about the configured subject: a worker serving another subject
//! does not make the gateway healthy.

mod common;

use common::start_gateway_at;
use embatch_testkit::{Stack, TeiConfig};

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
