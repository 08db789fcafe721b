//! The double against its own HTTP API.

use super::*;

fn config() -> Config {
    Config {
        base: Duration::from_millis(1),
        per_input: Duration::ZERO,
        dim: 16,
        max_client_batch_size: 4,
        ..Config::default()
    }
}

/// The double with [`config`] but `base` of compute time per call, on a free port.
async fn spawn_taking(base: Duration) -> TeiDouble {
    TeiDouble::spawn(Config { base, ..config() })
        .await
        .expect("spawn")
}

/// `POST /embed` of `body` to `tei` (on a client of its own); the status and the JSON body.
async fn post(tei: &TeiDouble, body: serde_json::Value) -> (u16, serde_json::Value) {
    post_to(tei, "embed", body).await
}

/// `POST /{route}` of `body` to `tei` (on a client of its own); the status and the JSON body.
/// Shared by the tests of every route.
pub(crate) async fn post_to(
    tei: &TeiDouble,
    route: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let resp = reqwest::Client::new()
        .post(format!("{}/{route}", tei.url))
        .json(&body)
        .send()
        .await
        .expect("send");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("json body"))
}

#[test]
fn vectors_are_deterministic_distinct_and_normalized() {
    let a = embedding("hello", 384, None, true);
    assert_eq!(a.len(), 384);
    assert_eq!(a, embedding("hello", 384, None, true));
    assert_ne!(a, embedding("hello!", 384, None, true));
    let norm: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-4, "{norm}");
    let raw = embedding("hello", 384, None, false);
    assert!(raw.iter().all(|x| (-1.0..1.0).contains(x)));
    assert!((raw.iter().map(|x| x * x).sum::<f32>().sqrt() - 1.0).abs() > 0.1);
    assert_eq!(embedding("hello", 384, Some(8), false), raw[..8]);
}

#[tokio::test]
async fn simulated_cost_is_accurate_below_a_millisecond() {
    for ms in [1u64, 5, 7] {
        let d = Duration::from_millis(ms) + Duration::from_micros(20);
        let mut best = Duration::MAX;
        // Best of 5, so a busy test machine's scheduling hiccups do not fail the test.
        for _ in 0..5 {
            let start = Instant::now();
            precise_sleep(d).await;
            let took = start.elapsed();
            assert!(took >= d, "{took:?} < {d:?}");
            best = best.min(took);
        }
        // Tokio's timer alone overshoots by up to 1 ms plus wake-up latency.
        assert!(best < d + Duration::from_micros(500), "{best:?} for {d:?}");
    }
}

#[test]
fn a_padded_call_costs_its_groups_of_four_in_arrival_order() {
    let c = Config::padded_cpu(Duration::from_micros(10));
    // 4-byte texts count 3 tokens, 40-byte texts 12.
    let short = Input::from("abcd");
    let long = Input::from("x".repeat(40));
    let mixed = [short.clone(), long.clone(), short.clone(), short.clone()];
    assert_eq!(
        c.tokens(&mixed),
        4 * 12,
        "one long input pads its group of 4"
    );
    let sorted = [
        short.clone(),
        short.clone(),
        short.clone(),
        short.clone(),
        long.clone(),
    ];
    assert_eq!(
        c.tokens(&sorted),
        4 * 3 + 12,
        "by length: the long one alone"
    );
    assert_eq!(
        c.cost_of(&sorted),
        Duration::from_millis(1) + Duration::from_micros(10 * 24)
    );
    let unpadded = Config {
        pad_group: None,
        ..c.clone()
    };
    assert_eq!(unpadded.tokens(&mixed), 3 * 3 + 12, "unpadded: the sum");
    assert_eq!(
        tokens_of(&Input::from("y".repeat(10_000))),
        MAX_INPUT_LENGTH
    );
    assert_eq!(tokens_of(&Input::Ids(vec![1, 2])), 2);
}

#[test]
fn cost_is_base_plus_per_input() {
    let c = Config::default();
    assert_eq!(c.cost(0), Duration::from_millis(5));
    assert_eq!(c.cost(100), Duration::from_millis(7));
}

#[tokio::test]
async fn embeds_in_order_and_records_calls() {
    let tei = TeiDouble::spawn(config()).await.expect("spawn");

    let (status, body) = post(
        &tei,
        serde_json::json!({"inputs": ["a", "b", "a"], "normalize": false}),
    )
    .await;
    assert_eq!(status, 200);
    let vectors: Vec<Vec<f32>> = serde_json::from_value(body).expect("vectors");
    assert_eq!(vectors.len(), 3);
    assert_eq!(vectors[0], embedding("a", 16, None, false));
    assert_eq!(vectors[1], embedding("b", 16, None, false));
    assert_eq!(vectors[0], vectors[2]);

    let (status, body) = post(&tei, serde_json::json!({"inputs": "a"})).await;
    assert_eq!(status, 200);
    let vectors: Vec<Vec<f32>> = serde_json::from_value(body).expect("vectors");
    assert_eq!(vectors, [embedding("a", 16, None, true)]);

    let calls = tei.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].inputs, ["a", "b", "a"]);
    assert_eq!(calls[0].options, serde_json::json!({"normalize": false}));
    assert_eq!(calls[1].inputs, ["a"]);
    assert_eq!(calls[1].status, 200);
    assert_eq!(tei.calls.batch_sizes(), [3, 1]);
}

#[tokio::test]
async fn errors_have_teis_shape() {
    let tei = TeiDouble::spawn(config()).await.expect("spawn");

    let (status, body) = post(
        &tei,
        serde_json::json!({"inputs": ["1", "2", "3", "4", "5"]}),
    )
    .await;
    assert_eq!(status, 422);
    assert_eq!(body["error_type"], "Validation");
    assert!(
        body["error"]
            .as_str()
            .expect("message")
            .contains("at most 4")
    );

    let (status, body) = post(
        &tei,
        serde_json::json!({"inputs": ["ok", "x __poison__ y"]}),
    )
    .await;
    assert_eq!(status, 422);
    assert_eq!(body["error_type"], "Validation");

    let (status, body) = post(&tei, serde_json::json!({"inputs": []})).await;
    assert_eq!(status, 400);
    assert_eq!(body["error_type"], "Empty");

    let (status, _) = post(&tei, serde_json::json!({"nope": 1})).await;
    assert_eq!(status, 422);

    let statuses: Vec<u16> = tei.calls().iter().map(|c| c.status).collect();
    assert_eq!(
        statuses,
        [422, 422, 400],
        "malformed bodies are not recorded"
    );
}

#[tokio::test]
async fn injected_faults_apply_to_later_calls_and_are_recorded() {
    let tei = TeiDouble::spawn(config()).await.expect("spawn");
    tei.set_faults(Faults::failing_with(503));
    let (status, body) = post(&tei, serde_json::json!({"inputs": "a"})).await;
    assert_eq!(status, 503);
    assert_eq!(body["error_type"], "Unhealthy");
    tei.set_faults(Faults::default());
    let (status, _) = post(&tei, serde_json::json!({"inputs": "a"})).await;
    assert_eq!(status, 200);
    let statuses: Vec<u16> = tei.calls().iter().map(|c| c.status).collect();
    assert_eq!(statuses, [503, 200]);
}

#[tokio::test]
async fn a_poisoned_input_fails_with_the_injected_status_after_its_compute_time() {
    // A compute time far beyond what a loaded host stalls a request (CI runs many suites at
    // once): "at once" and "after it" cannot be mistaken for each other.
    let compute = Duration::from_millis(1500);
    let tei = spawn_taking(compute).await;
    let poisoned = serde_json::json!({"inputs": ["a", format!("b {POISON}")]});
    let started = Instant::now();
    let (status, body) = post(&tei, poisoned.clone()).await;
    assert_eq!(status, 422, "TEI's validation by default: {body}");
    assert!(started.elapsed() < compute, "rejected at once");
    tei.set_faults(Faults::poisoned_with(424));
    let started = Instant::now();
    let (status, body) = post(&tei, poisoned).await;
    assert_eq!(status, 424, "{body}");
    assert_eq!(body["error_type"], "Backend");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("input 1")),
        "{body}"
    );
    assert!(started.elapsed() >= compute, "after the compute time");
    let (status, _) = post(&tei, serde_json::json!({"inputs": ["a"]})).await;
    assert_eq!(status, 200, "other calls are served");
    let statuses: Vec<u16> = tei.calls().iter().map(|c| c.status).collect();
    assert_eq!(statuses, [422, 424, 200]);
}

#[tokio::test]
async fn served_with_shared_faults_that_the_caller_changes() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/embed", listener.local_addr().expect("addr"));
    let faults = SharedFaults::default();
    faults.lock().expect("lock").fail_with = Some(503);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_until_with(
        listener,
        config(),
        faults.clone(),
        async move {
            let _ = stopped.await;
        },
    ));
    let client = reqwest::Client::new();
    let status = |client: &reqwest::Client| {
        let request = client.post(&url).json(&serde_json::json!({"inputs": "a"}));
        async move { request.send().await.expect("send").status().as_u16() }
    };
    assert_eq!(status(&client).await, 503);
    *faults.lock().expect("lock") = Faults::default();
    assert_eq!(status(&client).await, 200);
    let _ = stop.send(());
    server.await.expect("join").expect("served");
}

#[tokio::test]
async fn info_and_health() {
    let tei = TeiDouble::spawn(config()).await.expect("spawn");
    let client = reqwest::Client::new();
    let info: serde_json::Value = client
        .get(format!("{}/info", tei.url))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(info["max_client_batch_size"], 4);
    assert_eq!(info["model_type"]["embedding"]["pooling"], "mean");
    let health = client
        .get(format!("{}/health", tei.url))
        .send()
        .await
        .expect("send");
    assert_eq!(health.status().as_u16(), 200);
}

#[tokio::test]
async fn one_call_at_a_time() {
    let tei = spawn_taking(Duration::from_millis(50)).await;
    let client = reqwest::Client::new();
    let start = Instant::now();
    let calls = (0..4).map(|i| {
        let client = client.clone();
        let url = tei.embed_url();
        async move {
            client
                .post(url)
                .json(&serde_json::json!({"inputs": format!("t{i}")}))
                .send()
                .await
                .expect("send")
                .status()
                .as_u16()
        }
    });
    let handles: Vec<_> = calls.map(tokio::spawn).collect();
    for h in handles {
        assert_eq!(h.await.expect("join"), 200);
    }
    // Four 50 ms calls serialized: at least 200 ms.
    assert!(
        start.elapsed() >= Duration::from_millis(200),
        "{:?}",
        start.elapsed()
    );
}
