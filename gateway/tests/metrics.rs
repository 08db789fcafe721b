//! Prometheus `/metrics` of the gateway and of the worker after a short load through
//! gateway → NATS → worker → TEI test double, with good requests, bad ones and an overload.
//!
//! Its own test binary: the Prometheus recorder is process-global. Both crates record through
//! the `metrics` facade, so one recorder (the worker's, which also sets the batch-size buckets)
//! sees both; the gateway's router and the worker's HTTP app each render it.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{json_post, start_gateway_at, tei_taking};
use embatch_testkit::{POISON, Stack};
use embatch_worker::http::{HttpState, app as worker_app};

/// Serves `router` (the worker's HTTP app) on a free loopback port; returns its base URL.
async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        axum::serve(listener, router).await.expect("serves");
    });
    url
}

/// The samples of a Prometheus text exposition: `series` (name and labels as rendered) → value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The value of `series`, which must be present.
fn value(samples: &BTreeMap<String, f64>, series: &str) -> f64 {
    *samples
        .get(series)
        .unwrap_or_else(|| panic!("no sample `{series}` in:\n{samples:#?}"))
}

/// Sum of every sample of metric `name` (all label sets); `None` when there is none.
fn total(samples: &BTreeMap<String, f64>, name: &str) -> Option<f64> {
    let matching: Vec<f64> = samples
        .iter()
        .filter(|(series, _)| series.as_str() == name || series.starts_with(&format!("{name}{{")))
        .map(|(_, v)| *v)
        .collect();
    (!matching.is_empty()).then(|| matching.iter().sum())
}

/// `GET {url}`, which must answer 200.
async fn get_ok(http: &reqwest::Client, url: &str) -> reqwest::Response {
    let response = http.get(url).send().await.expect(url);
    assert_eq!(response.status().as_u16(), 200, "{url}");
    response
}

async fn get_metrics(http: &reqwest::Client, base: &str) -> (String, BTreeMap<String, f64>) {
    let response = get_ok(http, &format!("{base}/metrics")).await;
    let text = response.text().await.expect("metrics text");
    let parsed = samples(&text);
    (text, parsed)
}

async fn post(
    http: &reqwest::Client,
    gateway: &str,
    body: String,
    headers: &[(&str, &str)],
) -> u16 {
    let mut request = json_post(http, &format!("{gateway}/embed"), body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("HTTP response");
    let status = response.status().as_u16();
    let _ = response.bytes().await;
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_and_worker_metrics_after_a_short_load() {
    let handle = embatch_worker::telemetry::init_metrics().expect("the process's one recorder");

    // Slow enough upstream and a tiny queue so that a burst overflows it: 429s, shed requests.
    let Stack { nats, tei, worker } = Stack::start(
        tei_taking(Duration::from_millis(100)),
        &[
            "--max-wait-time",
            "2ms",
            "--max-batch-size",
            "4",
            "--max-concurrent-batches",
            "1",
            "--queue-cap",
            "8",
            // The worker's own shedding is counted here: with adaptive membership a full worker
            // leaves the group and the gateway answers 429 itself (gateway/tests/edge.rs).
            "--membership",
            "static",
        ],
    )
    .await;

    // Every gateway of this test is on its server and records into the process's recorder.
    let gateway_on = async |args: &[&str]| {
        start_gateway_at(&nats.url(), args, Some(handle.clone()))
            .await
            .url
    };
    let gateway = gateway_on(&["--max-client-batch-size", "16"]).await;
    let worker_http = serve(worker_app(HttpState {
        metrics: handle.clone(),
        client: async_nats::connect(nats.url())
            .await
            .expect("client connects"),
    }))
    .await;

    let http = reqwest::Client::new();
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    // Good requests, one after the other: 2 inputs each.
    for i in 0..6 {
        let status = post(
            &http,
            &gateway,
            format!(r#"{{"inputs":["good {i} a","good {i} b"]}}"#),
            &[],
        )
        .await;
        assert_eq!(status, 200);
        *statuses.entry(status).or_default() += 1;
    }
    // Bad requests: three the gateway rejects itself, one the upstream rejects.
    let bad = [
        (r#"{"inputs": "#.to_owned(), vec![]),
        (
            r#"{"inputs":"x"}"#.to_owned(),
            vec![(embatch_gateway::routes::TIMEOUT_HEADER, "soon")],
        ),
        (
            serde_json::json!({ "inputs": vec!["x"; 17] }).to_string(),
            vec![],
        ),
        (format!(r#"{{"inputs":"bad {POISON}"}}"#), vec![]),
    ];
    for (body, headers) in bad {
        let status = post(&http, &gateway, body, &headers).await;
        assert!(
            (400..500).contains(&status),
            "bad request answered {status}"
        );
        *statuses.entry(status).or_default() += 1;
    }
    // A burst of 30 concurrent one-input requests: at most 8 inputs fit in the worker's queue
    // while a batch takes 100 ms upstream, so most of the burst is shed with 429.
    let burst: Vec<_> = (0..30)
        .map(|i| {
            let (http, gateway) = (http.clone(), gateway.clone());
            tokio::spawn(async move {
                post(&http, &gateway, format!(r#"{{"inputs":"burst {i}"}}"#), &[]).await
            })
        })
        .collect();
    for task in burst {
        let status = task.await.expect("burst request");
        assert!(
            matches!(status, 200 | 429),
            "burst request answered {status}"
        );
        *statuses.entry(status).or_default() += 1;
    }
    let count = |status: u16| statuses.get(&status).copied().unwrap_or(0);
    let requests: usize = statuses.values().sum();
    println!("statuses: {statuses:?}");
    assert!(
        count(429) >= 1,
        "the burst overflowed nothing: {statuses:?}"
    );

    // ---- the gateway's /metrics ----
    let (text, g) = get_metrics(&http, &gateway).await;
    for (status, n) in &statuses {
        assert_eq!(
            value(
                &g,
                &format!(r#"embatch_gateway_requests_total{{status="{status}"}}"#)
            ),
            *n as f64,
            "gateway requests with status {status}"
        );
    }
    assert_eq!(
        value(&g, "embatch_gateway_request_seconds_count"),
        requests as f64
    );
    assert!(value(&g, "embatch_gateway_request_seconds_sum") > 0.0);
    assert!(text.contains(r#"embatch_gateway_request_seconds_bucket{le="0.1"}"#));
    assert!(text.contains("# TYPE embatch_gateway_request_seconds histogram"));
    assert_eq!(value(&g, "embatch_gateway_requests_in_flight"), 0.0);

    // ---- the worker's /metrics (through its own HTTP app) ----
    let (text, w) = get_metrics(&http, &worker_http).await;
    let calls = tei.calls();
    let upstream_inputs: usize = calls.iter().map(|c| c.inputs.len()).sum();
    println!(
        "upstream: {} calls, {upstream_inputs} inputs; worker metrics:\n{}",
        calls.len(),
        text.lines()
            .filter(|l| l.starts_with("embatch_worker") && !l.contains("_bucket"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Requests by outcome: every 200 was an `ok` answer, every 429 an `overloaded` one, the
    // poisoned input a `validation` one; the gateway's own rejections never reached it.
    assert_eq!(
        value(&w, r#"embatch_worker_requests_total{outcome="ok"}"#),
        count(200) as f64
    );
    assert_eq!(
        value(&w, r#"embatch_worker_requests_total{outcome="overloaded"}"#),
        count(429) as f64
    );
    assert_eq!(
        value(&w, r#"embatch_worker_requests_total{outcome="validation"}"#),
        1.0
    );
    // Shed at admission: the 429s, because the queue was full (or, once the worker has measured
    // its upstream, because the queue ahead could not finish before the deadline).
    assert!(
        total(&w, "embatch_worker_requests_shed_total").unwrap_or(0.0) >= 1.0,
        "the burst was shed at admission"
    );
    assert_eq!(
        total(&w, "embatch_worker_requests_shed_total"),
        Some(count(429) as f64)
    );
    // Latency histograms: queue wait and total per accepted request, upstream time per call.
    let accepted = (count(200) + 1) as f64; // the poisoned request was accepted too
    assert_eq!(value(&w, "embatch_worker_request_seconds_count"), accepted);
    assert_eq!(
        value(&w, "embatch_worker_queue_wait_seconds_count"),
        accepted
    );
    assert_eq!(
        value(&w, "embatch_worker_upstream_seconds_count"),
        calls.len() as f64
    );
    // Each served upstream call takes the double's 100 ms at least, so none of them can fall in
    // the 50 ms bucket; a rejected one (the poisoned input) is answered without the delay, as TEI
    // validates before queueing, but how fast depends on the machine, so only the served calls'
    // lower bound is asserted.
    let served = calls.iter().filter(|c| c.status == 200).count() as f64;
    let rejected = calls.len() as f64 - served;
    assert!(rejected >= 1.0, "the poisoned input reached the upstream");
    assert!(value(&w, "embatch_worker_upstream_seconds_sum") >= 0.1 * served);
    assert!(value(&w, "embatch_worker_request_seconds_sum") >= 0.1 * accepted);
    assert!(
        value(&w, r#"embatch_worker_upstream_seconds_bucket{le="0.05"}"#) <= rejected,
        "a served call (100 ms at least) was counted under 50 ms"
    );
    // Batch size in inputs and in requests, one observation per batch: at most 4 inputs
    // (`--max-batch-size`); the isolated poisoned request's retry is a call, not a batch.
    let batches = value(&w, "embatch_worker_batch_inputs_count");
    assert!(batches >= 1.0 && batches <= calls.len() as f64);
    assert_eq!(value(&w, "embatch_worker_batch_requests_count"), batches);
    assert_eq!(
        value(&w, r#"embatch_worker_batch_inputs_bucket{le="4"}"#),
        batches
    );
    // Inputs batched: 6 good requests × 2, one per accepted burst request, the poisoned one.
    let burst_ok = count(200) - 6;
    assert_eq!(
        value(&w, "embatch_worker_batch_inputs_sum"),
        (6 * 2 + burst_ok + 1) as f64
    );
    assert!(value(&w, "embatch_worker_batch_requests_sum") >= batches);
    for name in [
        "embatch_worker_queue_wait_seconds",
        "embatch_worker_upstream_seconds",
        "embatch_worker_request_seconds",
        "embatch_worker_batch_inputs",
        "embatch_worker_batch_requests",
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} histogram")),
            "{name} is not a histogram"
        );
    }
    // Gauges back at rest after the load: no batch in flight, nothing queued.
    assert_eq!(value(&w, "embatch_worker_batches_in_flight"), 0.0);
    assert_eq!(value(&w, "embatch_worker_queue_inputs"), 0.0);
    assert!(value(&w, r#"embatch_worker_upstream_calls_total{outcome="ok"}"#) >= 1.0);

    // The worker's HTTP app also answers /health while its NATS connection is up.
    get_ok(&http, &format!("{worker_http}/health")).await;

    // A gateway on a subject no worker serves: "no responders" is retried (~150 ms) before its
    // 503, and the retries are counted.
    let lonely = gateway_on(&["--subject", "unserved"]).await;
    let retried = |g: &BTreeMap<String, f64>| {
        let series = r#"embatch_client_retries_total{reason="no_responders"}"#;
        g.get(series).copied().unwrap_or(0.0)
    };
    let (_, before) = get_metrics(&http, &lonely).await;
    let status = post(&http, &lonely, r#"{"inputs":"a"}"#.into(), &[]).await;
    assert_eq!(status, 503);
    let (_, after) = get_metrics(&http, &lonely).await;
    assert!(
        retried(&after) >= retried(&before) + 2.0,
        "no-responders retries: {} → {}",
        retried(&before),
        retried(&after)
    );

    worker.stop().await;
}
