//! Replicated JetStream on a three-node cluster (real nats-server processes on loopback, each
//! with `-js` and its own store): worker A attached to n1, worker B to n2, the gateway to n3,
//! each given all three URLs. With `JETSTREAM_REPLICAS` at its default (`auto`), every stream
//! embatch creates has 3 replicas.
//!
//! Under interactive load through the gateway (100 req/s, 2 s deadlines) and during a bulk job:
//! - `kill -9` of the JetStream meta leader, then of the bulk work stream's leader, each
//!   restarted and rejoined before the next;
//! - a rolling restart (SIGTERM, start again, rejoin) of all three nodes, one at a time.
//!
//! Each time: no interactive request fails, the bulk job completes with every line in its
//! output exactly once, and every node rejoins the meta group and every stream as a current
//! replica. The two tests take turns ([`ONE_AT_A_TIME`]): the machine's cores are the limit.

#[path = "../common/mod.rs"]
mod common;

mod bulk;
mod load;

use std::time::{Duration, Instant};

use async_nats::jetstream;
use embatch_bulk::FILES_STREAM;
use embatch_protocol::bulk::{BATCHES_BUCKET, RESULTS_STREAM, WORK_STREAM};
use embatch_testkit::{NatsCluster, RunningWorker, TeiConfig, TeiDouble, start_tei};

use common::bulk_api::{Api, is_final};
use load::{Load, Summary};

/// One cluster at a time in this binary.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Lines of a bulk job: a node is lost just after its first lines are done, and it takes
/// about 10 s without a loss.
const LINES: usize = 1000;

/// Lines of the job a rolling restart runs through: about 20 s of work.
const ROLLING_LINES: usize = 2000;

/// Every stream embatch creates here: the bulk work queue, its results, the batch records'
/// KV bucket, the files' object store and the workers' cache bucket.
fn streams() -> Vec<String> {
    vec![
        WORK_STREAM.to_owned(),
        RESULTS_STREAM.to_owned(),
        format!("KV_{BATCHES_BUCKET}"),
        FILES_STREAM.to_owned(),
        "KV_embatch_cache".to_owned(),
    ]
}

/// The cluster, the workers and the gateway, and a JetStream client of the test's own.
struct Fleet {
    cluster: NatsCluster,
    _teis: Vec<TeiDouble>,
    workers: Vec<RunningWorker>,
    gateway: common::RunningGateway,
    js: jetstream::Context,
    /// Each node loss: the node's name, when it went down and when it had rejoined.
    outages: Vec<(String, Instant, Instant)>,
}

async fn start_fleet() -> Fleet {
    let cluster = NatsCluster::start();
    // Upstream time as a model on one GPU has (a call at a time, its cost growing with its
    // inputs): each worker serves about 100 inputs/s, twice the interactive load it gets, and
    // the bulk job takes what is left, so it runs for tens of seconds.
    let tei_config = TeiConfig {
        base: Duration::from_millis(5),
        per_input: Duration::from_millis(8),
        concurrency: 1,
        ..TeiConfig::instant()
    };
    let mut teis = Vec::new();
    let mut workers = Vec::new();
    for node in [0, 1] {
        let tei = start_tei(tei_config.clone()).await;
        let args = [
            "--tei-url",
            tei.url.as_str(),
            "--max-wait-time",
            "2ms",
            "--max-batch-size",
            "16",
            "--bulk-chunk-inputs",
            "8",
            // A message whose consumer leader was lost is delivered again after this.
            "--bulk-ack-wait",
            "3s",
        ];
        workers.push(RunningWorker::start_at(&cluster.urls_preferring(node), &args).await);
        teis.push(tei);
    }
    let gateway = common::start_gateway_at(&cluster.urls_preferring(2), &[], None).await;
    let servers: Vec<async_nats::ServerAddr> = cluster
        .urls_preferring(2)
        .split(',')
        .map(|url| url.parse().expect("a server URL"))
        .collect();
    let client = async_nats::connect(servers)
        .await
        .expect("the test's client connects");
    Fleet {
        cluster,
        _teis: teis,
        workers,
        gateway,
        js: jetstream::new(client),
        outages: Vec::new(),
    }
}

/// The cluster info of `stream` (leader and the other replicas), asked through the test's
/// client; `None` while JetStream does not answer.
async fn cluster_of(
    js: &jetstream::Context,
    stream: &str,
) -> Option<jetstream::stream::ClusterInfo> {
    let mut stream = js.get_stream(stream).await.ok()?;
    stream.info().await.ok()?.cluster.clone()
}

/// Polls `check` every 100 ms for at most `limit`.
async fn eventually<F: std::future::Future<Output = bool>>(
    limit: Duration,
    what: &str,
    mut check: impl FnMut() -> F,
) {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < limit, "{what}: not after {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether node `i` is back: it knows the meta leader, the leader counts it current, and it is
/// the leader or a current replica of every stream.
async fn rejoined(fleet: &Fleet, i: usize) -> bool {
    let name = fleet.cluster.node(i).name.clone();
    let Some(own) = fleet.cluster.meta(i) else {
        return false;
    };
    let Some(leader) = fleet.cluster.meta_leader() else {
        return false;
    };
    let meta_ok = own.cluster_size == 3
        && !own.leader.is_empty()
        && (leader == i
            || fleet.cluster.meta(leader).is_some_and(|m| {
                m.replicas
                    .iter()
                    .any(|p| p.name == name && p.current && !p.offline)
            }));
    if !meta_ok {
        return false;
    }
    for stream in streams() {
        let Some(info) = cluster_of(&fleet.js, &stream).await else {
            return false;
        };
        let current = info.leader.as_deref() == Some(name.as_str())
            || info
                .replicas
                .iter()
                .any(|p| p.name == name && p.current && !p.offline);
        if !current {
            return false;
        }
    }
    true
}

/// Waits (at most 20 s) until the workers have created every stream, then asserts that each has
/// 3 replicas: a leader and two others, all current.
async fn assert_three_replicas(fleet: &Fleet) {
    for stream in streams() {
        // A new stream reports its leader before its followers: wait for both.
        let what = format!("{stream} created with a leader and two replicas");
        eventually(Duration::from_secs(20), &what, || async {
            cluster_of(&fleet.js, &stream)
                .await
                .is_some_and(|c| c.leader.is_some() && c.replicas.len() == 2)
        })
        .await;
        let info = cluster_of(&fleet.js, &stream)
            .await
            .unwrap_or_else(|| panic!("{stream}: no cluster info"));
        let leader = info.leader.clone().unwrap_or_default();
        assert_eq!(info.replicas.len(), 2, "{stream}: {info:?}");
        println!("{stream}: R3, leader {leader}");
    }
}

/// Asserts that the bulk job `id` is still running (so a node loss now happens during it).
async fn assert_running(api: &Api, (id, lines): &(String, usize)) {
    let batch = api.batch(id).await;
    let done = batch["request_counts"]["completed"].as_u64().unwrap_or(0);
    assert!(
        !is_final(&batch) && done < *lines as u64,
        "the job must still run: {batch}"
    );
    println!("  bulk job: {done} of {lines} lines done");
}

/// Restarts node `i`, down since `down`, and waits until it has rejoined; prints how long that
/// took and records the outage.
async fn restart_and_rejoin(fleet: &mut Fleet, i: usize, down: Instant) {
    fleet.cluster.restart(i);
    let started = Instant::now();
    let name = fleet.cluster.node(i).name.clone();
    let what = format!("{name} rejoins");
    eventually(Duration::from_secs(30), &what, || rejoined(fleet, i)).await;
    println!(
        "  {what}: {} ms after its restart, {} ms after it went down",
        started.elapsed().as_millis(),
        down.elapsed().as_millis()
    );
    fleet.outages.push((name, down, Instant::now()));
}

/// Waits until the running nodes agree on a meta leader; its index.
async fn wait_meta_leader(fleet: &Fleet) -> usize {
    let mut leader = None;
    eventually(Duration::from_secs(20), "a meta leader", || {
        leader = fleet.cluster.meta_leader();
        std::future::ready(leader.is_some())
    })
    .await;
    leader.expect("a meta leader")
}

/// Waits for the jobs to end, stops the load, and checks them: requests were sent through every
/// outage and none failed, each job completed, and its output holds every line exactly once.
async fn check_outcome(fleet: &Fleet, api: &Api, jobs: &[(String, usize)], load: Load) {
    for (id, _) in jobs {
        api.wait_final(id, Duration::from_secs(60)).await;
    }
    let outcomes = load.finish().await;
    let summary = Summary::of(&outcomes);
    for (node, down, up) in &fleet.outages {
        let during = outcomes
            .iter()
            .filter(|o| o.sent >= *down && o.sent <= *up)
            .count();
        println!(
            "  while {node} was out ({} ms): {during} requests sent",
            (*up - *down).as_millis()
        );
        assert!(during > 0, "no request was sent while {node} was out");
    }
    for failure in outcomes.iter().filter(|o| o.status != Some(200)) {
        println!(
            "  request {} answered {:?} after {} ms",
            failure.index,
            failure.status,
            (failure.done - failure.sent).as_millis()
        );
    }
    println!(
        "interactive: {} sent, {} failed ({:?}), slowest {} ms",
        summary.sent,
        summary.failed,
        summary.by_status,
        summary.slowest.as_millis()
    );
    assert_eq!(summary.failed, 0, "{:?}", summary.by_status);
    for (id, lines) in jobs {
        check_job(api, id, *lines).await;
    }
    for i in 0..3 {
        assert!(fleet.cluster.node(i).is_running());
    }
}

/// Checks that the job `id` of `lines` lines completed with every line in its output exactly
/// once.
async fn check_job(api: &Api, id: &str, lines: usize) {
    let batch = api.batch(id).await;
    let output = api.custom_ids(&batch["output_file_id"]).await;
    let errors = api.custom_ids(&batch["error_file_id"]).await;
    let missing = (0..lines)
        .filter(|&i| !output.contains_key(&bulk::custom_id(i)))
        .count();
    let repeated = output.values().filter(|&&n| n > 1).count();
    println!(
        "bulk job {id}: {} with {} output lines ({missing} missing, {repeated} repeated), {} error lines",
        batch["status"],
        output.len(),
        errors.len()
    );
    assert_eq!(batch["status"], "completed", "{batch}");
    assert_eq!(
        batch["request_counts"]["completed"], lines as u64,
        "{batch}"
    );
    assert_eq!(missing, 0, "lines lost");
    assert_eq!(repeated, 0, "lines repeated");
    assert_eq!(output.len(), lines, "lines that are no input's");
    assert!(errors.is_empty(), "error lines: {errors:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_meta_leader_and_a_stream_leader_loses_no_request_and_no_line() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut fleet = start_fleet().await;
    assert_three_replicas(&fleet).await;
    let api = Api::at(&fleet.gateway.url, Duration::from_secs(20));
    let id = (api.submit(bulk::input(LINES)).await, LINES);
    bulk::wait_done_lines(&api, &id.0, 1).await;
    let load = Load::start(&fleet.gateway.url);
    tokio::time::sleep(Duration::from_secs(1)).await;

    let meta = wait_meta_leader(&fleet).await;
    println!("kill -9 {}, the meta leader", fleet.cluster.node(meta).name);
    assert_running(&api, &id).await;
    fleet.cluster.kill(meta);
    let down = Instant::now();
    let next = wait_meta_leader(&fleet).await;
    assert_ne!(next, meta, "a surviving node leads");
    println!("  meta leader now {}", fleet.cluster.node(next).name);
    restart_and_rejoin(&mut fleet, meta, down).await;

    let second = (api.submit(bulk::input(LINES)).await, LINES);
    bulk::wait_done_lines(&api, &second.0, 1).await;
    let leader = cluster_of(&fleet.js, WORK_STREAM)
        .await
        .and_then(|c| c.leader)
        .and_then(|name| fleet.cluster.index_of(&name))
        .expect("the work stream's leader");
    println!(
        "kill -9 {}, the leader of {WORK_STREAM}",
        fleet.cluster.node(leader).name
    );
    assert_running(&api, &second).await;
    fleet.cluster.kill(leader);
    let down = Instant::now();
    let killed = fleet.cluster.node(leader).name.clone();
    eventually(
        Duration::from_secs(20),
        "a new work stream leader",
        || async {
            cluster_of(&fleet.js, WORK_STREAM)
                .await
                .and_then(|c| c.leader)
                .is_some_and(|l| l != killed)
        },
    )
    .await;
    restart_and_rejoin(&mut fleet, leader, down).await;

    check_outcome(&fleet, &api, &[id, second], load).await;
    for worker in fleet.workers.drain(..) {
        worker.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_every_node_loses_no_request_and_no_line() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut fleet = start_fleet().await;
    assert_three_replicas(&fleet).await;
    let api = Api::at(&fleet.gateway.url, Duration::from_secs(20));
    let id = (api.submit(bulk::input(ROLLING_LINES)).await, ROLLING_LINES);
    bulk::wait_done_lines(&api, &id.0, 1).await;
    let load = Load::start(&fleet.gateway.url);
    tokio::time::sleep(Duration::from_secs(1)).await;

    for i in 0..3 {
        println!("restart {}", fleet.cluster.node(i).name);
        assert_running(&api, &id).await;
        let down = Instant::now();
        fleet.cluster.stop(i);
        restart_and_rejoin(&mut fleet, i, down).await;
    }

    check_outcome(&fleet, &api, &[id], load).await;
    for worker in fleet.workers.drain(..) {
        worker.stop().await;
    }
}
