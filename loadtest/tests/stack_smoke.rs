//! Smoke test of the loadtest against a running stack: a real `nats-server`, an embatch worker
//! (in process) batching for the crate's own GPU-like fake upstream, and the loadtest's library
//! entry point driving a closed loop through the NATS target.

use std::time::Duration;

use embatch_loadtest::cli::{LoadModel, RunConfig, TargetSpec};
use embatch_loadtest::load::{Plan, Stop};
use embatch_loadtest::run;
use embatch_tei_double::{Config, TeiDouble};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_through_nats_and_a_worker_is_batched() {
    let nats = embatch_testkit::NatsServer::start();
    // One simulated GPU: 2 ms per call, one call at a time.
    let upstream = TeiDouble::spawn(Config {
        base: Duration::from_millis(2),
        per_input: Duration::from_micros(10),
        concurrency: 1,
        dim: 16,
        ..Config::default()
    })
    .await
    .expect("spawn the TEI double");
    let tei_url = upstream.url.clone();
    let worker = embatch_testkit::RunningWorker::start(
        &nats,
        &["--tei-url", &tei_url, "--max-wait-time", "2ms"],
    )
    .await;

    let requests = 300;
    let config = RunConfig {
        target: TargetSpec::Nats {
            url: nats.url(),
            subject: embatch_protocol::DEFAULT_SUBJECT.into(),
            auth: Default::default(),
            tenant: None,
        },
        load: LoadModel::Closed { concurrency: 16 },
        plan: Plan {
            warmup: Duration::ZERO,
            stop: Stop::Requests(requests),
        },
        timeout: Duration::from_secs(10),
        corpus: None,
        words: 8,
        zipf: None,
        inputs_per_request: 1,
        route: embatch_loadtest::route::Route::Embed,
        seed: 7,
        truncate: false,
        json: None,
        quiet: true,
    };
    let report = run::run(&config).await.expect("run completes");
    worker.stop().await;

    assert_eq!(report.requests.sent, requests, "{report}");
    assert_eq!(report.requests.succeeded, requests, "{report}");
    assert!(report.failures.is_empty(), "{report}");
    assert_eq!(
        report.latency.as_ref().map(|l| l.count),
        Some(requests),
        "{report}"
    );
    let calls = upstream.calls();
    let inputs: usize = calls.iter().map(|c| c.inputs.len()).sum();
    assert_eq!(
        inputs as u64, requests,
        "every input reached the upstream once"
    );
    assert!(
        (calls.len() as u64) < requests,
        "the worker batched: {} upstream calls for {requests} requests",
        calls.len()
    );
    assert!(calls.iter().all(|c| c.status == 200));
}
