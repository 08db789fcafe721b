//! Recovery within the deadline, with real processes: a worker killed with SIGKILL, a
//! nats-server restarted, an upstream that fails on one of two workers, and workers that leave
//! and rejoin the queue group while 20,000 requests flow. In every case each request sent
//! through `EmbedClient` (which asks for acknowledgements and resends) is answered, with its own
//! vectors, within its deadline.

mod process;

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use embatch_client::EmbedClient;
use embatch_protocol::request::Input;
use embatch_testkit::{Faults, NatsServer, TeiConfig, TeiDouble, start_slow_tei, start_tei};
use futures::StreamExt;
use tokio::time::Instant;

use process::{Worker, spawn_worker};

fn body(text: &str) -> Bytes {
    Bytes::from(serde_json::json!({ "inputs": text }).to_string())
}

/// Sends `text` and checks the reply holds its own vector; the time it took.
async fn embed_checked(client: &EmbedClient, text: &str, budget: Duration) -> Duration {
    let started = Instant::now();
    let reply = client
        .embed(body(text), budget)
        .await
        .unwrap_or_else(|e| panic!("{text:?} failed after {:?}: {e}", started.elapsed()));
    let vectors: Vec<Vec<f32>> = serde_json::from_slice(&reply.payload).expect("vectors");
    assert_eq!(
        vectors,
        vec![embatch_testkit::double_vector(text)],
        "{text}"
    );
    let took = started.elapsed();
    assert!(
        took <= budget,
        "{text:?} answered after its deadline: {took:?}"
    );
    took
}

/// How many of the texts a double was called with it saw more than once.
fn called_twice(doubles: &[&TeiDouble]) -> usize {
    let mut seen: HashMap<String, usize> = HashMap::new();
    for double in doubles {
        for call in double.calls() {
            for input in call.inputs {
                if let Input::Text(text) = input {
                    *seen.entry(text).or_default() += 1;
                }
            }
        }
    }
    seen.values().filter(|&&n| n > 1).count()
}

/// Two worker processes with `settings`, on `upstreams[0]` and `upstreams[1]`, both ready, and
/// a client of theirs on `nats`.
async fn two_workers(
    nats: &NatsServer,
    upstreams: [&TeiDouble; 2],
    settings: &[(&str, &str)],
) -> ([Worker; 2], EmbedClient) {
    let nats_client = embatch_client::connect(&nats.url(), "recovery-test")
        .await
        .expect("client connects");
    let first = spawn_worker(nats, upstreams[0], settings, &nats_client, 1).await;
    let second = spawn_worker(nats, upstreams[1], settings, &nats_client, 2).await;
    ([first, second], EmbedClient::new(nats_client, "embed"))
}

/// `n` requests at one per `every`, with `budget` each; `at_half` runs when half are sent.
/// Every request must succeed with its own vector within its budget; the latencies.
async fn load(
    client: &EmbedClient,
    n: usize,
    every: Duration,
    budget: Duration,
    at_half: impl FnOnce(),
) -> Vec<Duration> {
    let mut at_half = Some(at_half);
    let mut tasks = Vec::with_capacity(n);
    let mut tick = tokio::time::interval(every);
    for i in 0..n {
        tick.tick().await;
        if i == n / 2
            && let Some(action) = at_half.take()
        {
            action();
        }
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            embed_checked(&client, &format!("request {i}"), budget).await
        }));
    }
    let mut took = Vec::with_capacity(n);
    for task in tasks {
        took.push(task.await.expect("request task"));
    }
    took
}

/// Two workers (`MAX_WAIT_TIME=2ms`) on a TEI double taking 20 ms per call, and a client, on
/// a nats-server that [`RestartStack::restart`] kills and restarts on the same port.
struct RestartStack {
    _workers: [Worker; 2],
    _tei: TeiDouble,
    nats: Arc<Mutex<NatsServer>>,
    client: EmbedClient,
}

impl RestartStack {
    async fn start() -> RestartStack {
        let server = NatsServer::start();
        let tei = start_slow_tei(Duration::from_millis(20)).await;
        let (workers, client) =
            two_workers(&server, [&tei, &tei], &[("MAX_WAIT_TIME", "2ms")]).await;
        RestartStack {
            _workers: workers,
            _tei: tei,
            nats: Arc::new(Mutex::new(server)),
            client,
        }
    }

    /// Kills the nats-server and starts it again on the same port 1 s later, in a blocking
    /// task.
    fn restart(&self) -> tokio::task::JoinHandle<()> {
        let nats = Arc::clone(&self.nats);
        tokio::task::spawn_blocking(move || {
            nats.lock().expect("server").restart(Duration::from_secs(1));
        })
    }
}

fn max(took: &[Duration]) -> Duration {
    took.iter().copied().max().unwrap_or_default()
}

/// A worker killed with SIGKILL while it holds requests in its queue and in an upstream call:
/// the client sees the worker's heartbeat stop and resends what it held; the other worker
/// answers all of it within the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_with_sigkill_loses_none_of_what_it_held() {
    let nats = NatsServer::start();
    let tei = start_slow_tei(Duration::from_millis(200)).await;
    let ([mut killed, _staying], client) =
        two_workers(&nats, [&tei, &tei], &[("MAX_WAIT_TIME", "2ms")]).await;
    // Warm up: the client has heard both workers' heartbeats.
    embed_checked(&client, "warm-up", Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let took = load(
        &client,
        200,
        Duration::from_millis(10),
        Duration::from_secs(5),
        || {
            let _ = killed.0.kill();
        },
    )
    .await;
    let _ = killed.0.wait();
    let resent = called_twice(&[&tei]);
    eprintln!(
        "200 answered; max latency {:?}; {resent} texts reached the upstream twice",
        max(&took)
    );
    assert!(
        resent > 0,
        "the killed worker held no request in an upstream call: the kill tested nothing"
    );
}

/// The nats-server is killed and restarted on the same port after 1 s while requests flow:
/// requests in flight are resent after the reconnect, requests made while disconnected wait for
/// it, and all are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_server_restart_mid_load_loses_none() {
    let stack = RestartStack::start().await;
    let client = stack.client.clone();
    embed_checked(&client, "warm-up", Duration::from_secs(5)).await;

    let took = load(
        &client,
        400,
        Duration::from_millis(10),
        Duration::from_secs(15),
        || {
            stack.restart();
        },
    )
    .await;
    eprintln!(
        "400 answered through a 1 s restart; max latency {:?}",
        max(&took)
    );
    assert!(
        max(&took) >= Duration::from_secs(1),
        "no request waited through the restart: it did not happen mid-load"
    );
}

/// Requests made while nats-server is down wait for it in the client, and reach the workers
/// together when it is back: 600 at once, about 100 ms of upstream work for the two workers
/// (20 ms per call of up to 32 inputs, 2 calls at a time each), while `MAX_QUEUE_DELAY=auto`
/// (2 calls + `MAX_WAIT_TIME` = 42 ms) would refuse most of them 429. After its reconnect a
/// worker admits that backlog by deadline, so every request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backlog_of_a_nats_server_restart_is_served_not_refused() {
    let stack = RestartStack::start().await;
    let client = stack.client.clone();
    // Measured call times, so MAX_QUEUE_DELAY=auto is in force.
    for i in 0..20 {
        embed_checked(&client, &format!("warm-up {i}"), Duration::from_secs(5)).await;
    }
    let restart = stack.restart();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        client.nats().connection_state() != async_nats::connection::State::Connected,
        "the server is not down yet"
    );
    let took =
        futures::future::join_all(
            (0..600).map(|i| {
                let client = client.clone();
                async move {
                    embed_checked(&client, &format!("backlog {i}"), Duration::from_secs(10)).await
                }
            }),
        )
        .await;
    restart.await.expect("restarted");
    eprintln!(
        "600 requests made during a 1 s outage answered; max latency {:?}",
        max(&took)
    );
}

/// One of two workers' upstream fails (503) while it holds requests, for 300 ms of every
/// second: that worker answers 503 for what it held (then leaves the queue group, and rejoins
/// when its upstream's `/health` recovers), the client resends it to the group, and the healthy
/// worker answers it. 3,000 requests at 500/s: each leave and rejoin loses nothing either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_upstream_fails_hands_what_it_holds_to_another() {
    const TOTAL: usize = 3_000;
    let nats = NatsServer::start();
    let sick = Arc::new(start_tei(TeiConfig::instant()).await);
    let healthy = start_tei(TeiConfig::instant()).await;
    let (_workers, client) =
        two_workers(&nats, [&sick, &healthy], &[("MAX_WAIT_TIME", "1ms")]).await;
    embed_checked(&client, "warm-up", Duration::from_secs(5)).await;

    let (done_tx, mut done) = tokio::sync::watch::channel(false);
    let faults = {
        let sick = Arc::clone(&sick);
        tokio::spawn(async move {
            let mut cycles = 0;
            loop {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(700)) => {}
                    _ = done.changed() => return cycles,
                }
                sick.set_faults(Faults {
                    fail_with: Some(503),
                    ..Faults::default()
                });
                tokio::time::sleep(Duration::from_millis(300)).await;
                sick.set_faults(Faults::default());
                cycles += 1;
            }
        })
    };
    let started = Instant::now();
    let took = load(
        &client,
        TOTAL,
        Duration::from_millis(2),
        Duration::from_secs(10),
        || {},
    )
    .await;
    let _ = done_tx.send(true);
    let cycles = faults.await.expect("fault task");
    let failed_calls = sick.calls().iter().filter(|c| c.status == 503).count();
    eprintln!(
        "{} answered in {:?}; {cycles} upstream failure spells, {failed_calls} failed calls; \
         max latency {:?}",
        took.len(),
        started.elapsed(),
        max(&took)
    );
    assert_eq!(took.len(), TOTAL);
    assert!(
        cycles >= 2 && failed_calls > 0,
        "the upstream failed too rarely to test anything: {cycles} spells, {failed_calls} calls"
    );
}

/// One of two workers' upstream hangs mid-load (its calls take 5 s from then on), while the
/// requests have a 3 s budget: that worker sees its calls stall, leaves the queue group and
/// goes silent on the heartbeat subject; the client resends what it held to the group, and the
/// other worker answers all of it within the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_upstream_hangs_hands_what_it_holds_to_another() {
    const TOTAL: usize = 600;
    let nats = NatsServer::start();
    let hung = Arc::new(start_slow_tei(Duration::from_millis(5)).await);
    let healthy = start_slow_tei(Duration::from_millis(5)).await;
    let (_workers, client) =
        two_workers(&nats, [&hung, &healthy], &[("MAX_WAIT_TIME", "1ms")]).await;
    for i in 0..20 {
        embed_checked(&client, &format!("warm-up {i}"), Duration::from_secs(5)).await;
    }
    let hang = Arc::clone(&hung);
    let took = load(
        &client,
        TOTAL,
        Duration::from_millis(5),
        Duration::from_secs(3),
        move || {
            hang.set_faults(Faults {
                delay: Duration::from_secs(5),
                ..Faults::default()
            });
        },
    )
    .await;
    eprintln!(
        "{} answered within 3 s through a 5 s upstream hang; max latency {:?}",
        took.len(),
        max(&took)
    );
    assert_eq!(took.len(), TOTAL);
}

/// 20,000 requests, 200 in flight, to two workers (whose `MAX_QUEUE_DELAY` lets them queue
/// that many); one leaves the queue group (SIGTERM: it
/// drains its subscription, answers what it read and exits) after 2,500 have been sent. Messages
/// routed to it around its UNSUB that it never read (async-nats ends the drain before the
/// server's PONG; nats-server may drop them) were never acknowledged, so the client resends them
/// after the acknowledgement wait: none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_group_leave_in_the_middle_of_20000_requests_loses_none() {
    const TOTAL: usize = 20_000;
    let nats = NatsServer::start();
    let tei = start_tei(TeiConfig::instant()).await;
    let settings = [("MAX_WAIT_TIME", "1ms"), ("MAX_QUEUE_DELAY", "10s")];
    let ([leaving, _staying], client) = two_workers(&nats, [&tei, &tei], &settings).await;
    embed_checked(&client, "warm-up", Duration::from_secs(5)).await;

    let pid = leaving.0.id().to_string();
    let started = Instant::now();
    let took: Vec<Duration> =
        futures::stream::iter(0..TOTAL)
            .map(|i| {
                if i == TOTAL / 8 {
                    let killed = Command::new("kill")
                        .args(["-TERM", &pid])
                        .status()
                        .expect("kill runs");
                    assert!(killed.success());
                }
                let client = client.clone();
                async move {
                    embed_checked(&client, &format!("request {i}"), Duration::from_secs(10)).await
                }
            })
            .buffer_unordered(200)
            .collect()
            .await;
    eprintln!(
        "{} answered in {:?}; max latency {:?}",
        took.len(),
        started.elapsed(),
        max(&took)
    );
    assert_eq!(took.len(), TOTAL);
    let mut leaving = leaving;
    let status = tokio::task::spawn_blocking(move || {
        let status = leaving.0.wait();
        (leaving, status)
    })
    .await
    .expect("join")
    .1
    .expect("the worker exits");
    assert!(
        status.success(),
        "the leaving worker's exit status: {status}"
    );
}

/// An indexing client: 8 requests of 512 inputs in flight, closed loop, each with a 30 s
/// deadline, to a worker process with every setting at its default (`MAX_QUEUE_DELAY=auto`,
/// a few call times) over a real nats-server. Each request needs 16 upstream calls and the
/// queue holds up to 8 × 16 calls, far past the auto bound: every request is still admitted and
/// served with its own vectors, since a request of several calls is bounded by its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_concurrent_512_input_requests_with_long_deadlines_are_all_served() {
    let nats = NatsServer::start();
    let tei = start_slow_tei(Duration::from_millis(5)).await;
    let nats_client = embatch_client::connect(&nats.url(), "indexing-test")
        .await
        .expect("client connects");
    let _worker = spawn_worker(&nats, &tei, &[], &nats_client, 1).await;
    let client = EmbedClient::new(nats_client, "embed");
    // Measured call times, so MAX_QUEUE_DELAY=auto is in force.
    for i in 0..20 {
        embed_checked(&client, &format!("warm-up {i}"), Duration::from_secs(5)).await;
    }
    let budget = Duration::from_secs(30);
    let tasks: Vec<_> = (0..8)
        .map(|c| {
            let client = client.clone();
            tokio::spawn(async move {
                for round in 0..3 {
                    let texts: Vec<String> =
                        (0..512).map(|i| format!("chunk {c}-{round}-{i}")).collect();
                    let started = Instant::now();
                    let reply = client
                        .embed(
                            Bytes::from(serde_json::json!({ "inputs": texts }).to_string()),
                            budget,
                        )
                        .await
                        .unwrap_or_else(|e| panic!("client {c} round {round} failed: {e}"));
                    assert!(started.elapsed() <= budget, "answered after its deadline");
                    let vectors: Vec<Vec<f32>> =
                        serde_json::from_slice(&reply.payload).expect("vectors");
                    let expected: Vec<Vec<f32>> = texts
                        .iter()
                        .map(|t| embatch_testkit::double_vector(t))
                        .collect();
                    assert_eq!(vectors, expected, "client {c} round {round}");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("every request admitted and served");
    }
    let calls = tei.calls().len();
    assert!(
        calls >= 8 * 3 * 16,
        "512 inputs take 16 calls of 32: {calls} calls for 24 requests"
    );
}
