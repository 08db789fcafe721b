//! Queue-group membership over a real nats-server, against TEI doubles: a worker leaves while its
//! upstream fails and rejoins when it recovers, a slow worker leaves while full so requests go to
//! the one with capacity, and a client tells "every worker is full" (429) from "no worker" (503).

mod common;

use std::time::Duration;

use embatch_client::{EmbedClient, RequestError};
use embatch_protocol::headers::membership;
use embatch_testkit::{
    Faults, NatsServer, ONE_CALL_AT_A_TIME, RunningWorker, TeiConfig, TeiDouble, start_tei,
};

mod discovery;

use discovery::{connect, embed, states};

/// The `membership` metadata of the first worker answering `$SRV.INFO.embatch` (these tests run
/// one worker at a time when they ask), within 200 ms.
async fn state(client: &async_nats::Client) -> Option<String> {
    states(client, 1, Duration::from_millis(200)).await.pop()
}

/// Polls [`state`] until it is `want`, for at most `limit`; the time it took, or the last state.
async fn wait_for_state(
    client: &async_nats::Client,
    want: &str,
    limit: Duration,
) -> Result<Duration, Option<String>> {
    let started = std::time::Instant::now();
    loop {
        let now = state(client).await;
        if now.as_deref() == Some(want) {
            return Ok(started.elapsed());
        }
        if started.elapsed() > limit {
            return Err(now);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A nats-server, the TEI double, one worker on both (batches sent after 1 ms), and a raw NATS
/// client and an [`EmbedClient`] on the server.
async fn one_worker() -> (
    NatsServer,
    TeiDouble,
    RunningWorker,
    async_nats::Client,
    EmbedClient,
) {
    let nats = NatsServer::start();
    let tei = start_tei(TeiConfig::instant()).await;
    let worker =
        RunningWorker::start(&nats, &["--tei-url", &tei.url, "--max-wait-time", "1ms"]).await;
    let raw = connect(&nats).await;
    let client = EmbedClient::new(raw.clone(), "embed");
    (nats, tei, worker, raw, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_leaves_while_its_upstream_fails_and_rejoins_when_it_recovers() {
    let (_nats, tei, worker, raw, client) = one_worker().await;
    assert_eq!(state(&raw).await.as_deref(), Some(membership::JOINED));
    assert_eq!(embed(&client, "before").await, Ok(200));

    tei.set_faults(Faults::failing_with(500));
    for _ in 0..2 {
        assert_eq!(embed(&client, "while failing").await, Ok(424));
    }
    let left = wait_for_state(&raw, membership::UPSTREAM_UNHEALTHY, Duration::from_secs(5))
        .await
        .expect("the worker leaves after two failed calls");
    println!("out {} ms after the second failed call", left.as_millis());
    let calls = tei.calls().len();
    let started = std::time::Instant::now();
    let refused = embed(&client, "no healthy worker").await;
    assert!(
        matches!(refused, Err(RequestError::Unhealthy { .. })),
        "{refused:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "answered without waiting out the budget: {:?}",
        started.elapsed()
    );
    assert_eq!(
        embatch_protocol::EmbedError::from(refused.expect_err("an error")).status(),
        503
    );
    assert_eq!(tei.calls().len(), calls, "no upstream call while out");

    tei.set_faults(Faults::default());
    let rejoined = wait_for_state(&raw, membership::JOINED, Duration::from_secs(5))
        .await
        .expect("the worker rejoins once /health answers");
    println!(
        "back {} ms after the upstream recovered",
        rejoined.as_millis()
    );
    assert_eq!(embed(&client, "after").await, Ok(200));
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_probes_do_not_count_while_the_upstream_answers_calls() {
    let (_nats, tei, worker, raw, client) = one_worker().await;
    assert_eq!(embed(&client, "before").await, Ok(200));
    // /health fails while calls are served: busy, not sick. Probes come every second; four of
    // them fail while a call is answered every 200 ms.
    tei.set_faults(Faults {
        health_status: Some(503),
        ..Faults::default()
    });
    for i in 0..22 {
        assert_eq!(embed(&client, &format!("busy {i}")).await, Ok(200));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        state(&raw).await.as_deref(),
        Some(membership::JOINED),
        "the worker stays while its calls are answered"
    );
    // No calls: the failing probes count, and the worker leaves after two.
    wait_for_state(&raw, membership::UPSTREAM_UNHEALTHY, Duration::from_secs(5))
        .await
        .expect("an idle worker whose upstream fails /health leaves");
    tei.set_faults(Faults::default());
    wait_for_state(&raw, membership::JOINED, Duration::from_secs(5))
        .await
        .expect("and rejoins once /health answers");
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_go_to_the_worker_with_capacity_and_none_is_lost() {
    let nats = NatsServer::start();
    // ~53 req/s at batch 8 with two calls in flight, against ~3,000 req/s.
    let slow = start_tei(common::tei_taking(300, 2)).await;
    let fast = start_tei(common::tei_taking(5, 2)).await;
    let args = |url: &str| {
        [
            "--tei-url",
            url,
            "--max-batch-size",
            "8",
            "--max-wait-time",
            "2ms",
        ]
        .map(str::to_owned)
    };
    let slow_args = args(&slow.url);
    let fast_args = args(&fast.url);
    let slow_worker = RunningWorker::start(&nats, &slow_args.each_ref().map(String::as_str)).await;
    let fast_worker = RunningWorker::start(&nats, &fast_args.each_ref().map(String::as_str)).await;
    let client = EmbedClient::new(connect(&nats).await, "embed");
    // Warm-up: both workers measure their upstream's call time.
    let warm: Vec<_> = (0..16)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { embed(&client, &format!("warm {i}")).await })
        })
        .collect();
    for task in warm {
        assert_eq!(task.await.expect("task"), Ok(200));
    }
    let (slow_before, fast_before) = (inputs(&slow), inputs(&fast));

    // 300 requests at ~200 req/s: an equal share would give the slow worker twice what it can do.
    let mut tasks = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    for i in 0..300 {
        tick.tick().await;
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            embed(&client, &format!("request {i}")).await
        }));
    }
    let mut answered = Vec::new();
    for task in tasks {
        answered.push(task.await.expect("task"));
    }
    let ok = answered.iter().filter(|r| **r == Ok(200)).count();
    assert_eq!(ok, 300, "every request served: {answered:?}");
    let (slow_served, fast_served) = (inputs(&slow) - slow_before, inputs(&fast) - fast_before);
    assert_eq!(slow_served + fast_served, 300, "each input embedded once");
    // An even split would be 150 each; the slow one can do ~53 req/s plus its admitted queue.
    assert!(
        slow_served < fast_served,
        "the slow worker left while full: slow {slow_served}, fast {fast_served}"
    );
    slow_worker.stop().await;
    fast_worker.stop().await;
}

fn inputs(tei: &embatch_testkit::TeiDouble) -> usize {
    tei.calls().iter().map(|c| c.inputs.len()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_worker_leaves_only_while_another_has_room_and_no_worker_is_503() {
    let nats = NatsServer::start();
    // One input per call, one call at a time, 600 ms each: three queued requests put a worker
    // over its admission bound (2 × 600 ms + 1 ms of expected wait).
    let slow = || common::tei_taking(600, 1);
    let tei = start_tei(slow()).await;
    let mut lone_args = vec!["--tei-url", tei.url.as_str()];
    lone_args.extend(ONE_CALL_AT_A_TIME);
    let lone = RunningWorker::start(&nats, &lone_args).await;
    let raw = connect(&nats).await;
    let client = EmbedClient::new(raw.clone(), "embed");
    assert_eq!(embed(&client, "measure").await, Ok(200));
    let flood = |n: usize| {
        (0..n)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move { embed(&client, &format!("flood {i}")).await })
            })
            .collect::<Vec<_>>()
    };
    // Alone, the worker stays a member however full: it sheds with 429 itself.
    let mut answers = Vec::new();
    for task in flood(6) {
        answers.push(task.await.expect("task"));
    }
    assert!(answers.contains(&Ok(429)), "{answers:?}");
    assert!(
        answers.iter().all(|a| matches!(a, Ok(200 | 429))),
        "every request is answered by the worker: {answers:?}"
    );
    assert_eq!(state(&raw).await.as_deref(), Some(membership::JOINED));

    // With a second worker that has room (an instant upstream), the full one leaves while the
    // other serves.
    let other_tei = start_tei(TeiConfig::instant()).await;
    // Default batching: with one input per call and one call at a time, even an instant
    // upstream's worker is full under a burst (its bound is a few ms).
    let other = RunningWorker::start(&nats, &["--tei-url", &other_tei.url]).await;
    tokio::time::sleep(peers_heard()).await;
    let mut left = false;
    let tasks = flood(20);
    let mut seen = Vec::new();
    for _ in 0..50 {
        let now = states(&raw, 2, Duration::from_millis(100)).await;
        if now.iter().any(|s| s == membership::FULL) {
            left = true;
            break;
        }
        seen.push(now);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for task in tasks {
        let answer = task.await.expect("task");
        assert!(
            matches!(answer, Ok(200 | 429) | Err(RequestError::Saturated { .. })),
            "served, or shed with 429, never lost: {answer:?}"
        );
    }
    assert!(
        left,
        "a full worker left the group while the other served; states seen: {seen:?}, slow \
         upstream calls: {}",
        tei.calls().len()
    );
    lone.stop().await;
    other.stop().await;

    let absent = embed(&client, "nobody").await;
    assert!(
        matches!(absent, Err(RequestError::NoResponders { .. })),
        "{absent:?}"
    );
    assert_eq!(
        embatch_protocol::EmbedError::from(absent.expect_err("an error")).status(),
        503
    );
}

/// Long enough for workers to hear each other's first announcement.
fn peers_heard() -> Duration {
    Duration::from_millis(200)
}
