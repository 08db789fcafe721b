//! Two regions, A and B, joined by NATS gateways (a supercluster of real nats-server processes on
//! loopback, from `nats/regions/region-{a,b}.conf`): a worker in each region on its own TEI double,
//! the gateway connected to region A.
//!
//! Shows that NATS queue groups prefer the local cluster: region A's requests are served by A's
//! worker while it is a member, by B's worker across the gateway once it leaves (none fails, even
//! with requests flowing while it stops), and by A's worker again when it returns. Which worker
//! served a request is read from which TEI double got its input (docs/regions.md).
//!
//! The same for the leaf-node variant: an edge site's server (`nats/regions/edge-leaf.conf`), a
//! leaf node of region A, with the gateway and a worker at the edge and another worker in A.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use embatch_protocol::Input;
use embatch_testkit::{Region, RunningWorker, Supercluster, TeiConfig, TeiDouble, start_tei};

/// Requests in each burst.
const BURST: usize = 30;
/// Each request's own timeout (`x-embatch-timeout-ms`).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// The load while A's worker stops: one request every `PERIOD` ...
const PERIOD: Duration = Duration::from_millis(10);
/// ... `STEADY` of them (1.5 s), A's worker stopped just before request `STOP_AT` (0.5 s in).
const STEADY: usize = 150;
const STOP_AT: usize = 50;

/// The worker's connection name on its NATS server.
const WORKER: &str = "embatch-worker";

/// Sends `{"inputs": input}` to the gateway's `/embed`; the HTTP status, `None` without a full
/// response.
async fn embed(http: reqwest::Client, url: Arc<str>, input: String) -> Option<u16> {
    common::embed_status(http, &url, input, REQUEST_TIMEOUT).await
}

/// Sends `BURST` requests at once, inputs `<tag> 0` ..., and asserts that each is answered 200.
async fn burst(http: &reqwest::Client, url: &Arc<str>, tag: &str) -> Vec<String> {
    let inputs: Vec<String> = (0..BURST).map(|i| format!("{tag} {i}")).collect();
    let tasks: Vec<_> = inputs
        .iter()
        .map(|input| tokio::spawn(embed(http.clone(), Arc::clone(url), input.clone())))
        .collect();
    for (input, task) in inputs.iter().zip(tasks) {
        let status = task.await.expect("request task");
        assert_eq!(status, Some(200), "{tag}: request {input:?}");
    }
    inputs
}

/// The text inputs `tei` was called with.
fn served(tei: &TeiDouble) -> HashSet<String> {
    tei.calls()
        .into_iter()
        .flat_map(|call| call.inputs)
        .filter_map(|input| match input {
            Input::Text(text) => Some(text),
            _ => None,
        })
        .collect()
}

/// How many of `inputs` `tei` was called with.
fn count_served(tei: &TeiDouble, inputs: &[String]) -> usize {
    let served = served(tei);
    inputs.iter().filter(|i| served.contains(*i)).count()
}

/// Polls `check` every 50 ms for at most `timeout`.
async fn eventually(timeout: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < timeout, "{what}: not after {timeout:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A worker on `region`'s server whose upstream is `tei`; returns once its queue subscription is
/// on that server (its readiness ping may be answered by the other region's worker).
async fn start_worker(regions: &Supercluster, region: Region, tei: &TeiDouble) -> RunningWorker {
    let args = ["--tei-url", tei.url.as_str(), "--max-wait-time", "2ms"];
    let worker = RunningWorker::start_at(&regions.url(region), &args).await;
    eventually(
        Duration::from_secs(5),
        "the worker's subscription on its region's server",
        || regions.local_subscribers(region, WORKER, embatch_protocol::DEFAULT_SUBJECT) == 1,
    )
    .await;
    worker
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_is_served_by_its_own_worker_and_by_the_other_region_without_one() {
    let regions = Supercluster::start();
    fail_over_and_back(&regions, Region::A, Region::B).await;
}

/// The leaf-node variant: an edge site's server is a leaf node of region A; the gateway and a
/// worker are at the edge, another worker in region A.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_site_is_served_by_its_own_worker_and_by_the_hub_without_one() {
    let mut regions = Supercluster::start();
    regions.start_edge();
    fail_over_and_back(&regions, Region::Edge, Region::A).await;
}

/// The gateway on `local`'s server, a worker in `remote` and then one in `local`, each on its
/// own TEI double: `local`'s requests are served by `remote`'s worker while `local` has none, by
/// `local`'s while it is a member, by `remote`'s again while `local`'s stops (none fails), and by
/// `local`'s once it returns.
async fn fail_over_and_back(regions: &Supercluster, local: Region, remote: Region) {
    let (l, r) = (local.name(), remote.name());
    let tei_local = start_tei(TeiConfig::instant()).await;
    let tei_remote = start_tei(TeiConfig::instant()).await;
    let http = reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT * 3)
        .build()
        .expect("HTTP client");

    // The remote worker first, and the gateway on the local server, with no local worker yet.
    let worker_remote = start_worker(regions, remote, &tei_remote).await;
    let gateway = common::start_gateway_at(&regions.url(local), &[], None).await;
    let url: Arc<str> = Arc::from(gateway.url.as_str());
    assert_eq!(
        regions.local_subscribers(local, WORKER, embatch_protocol::DEFAULT_SUBJECT),
        0
    );
    // The remote queue interest reaches the local server (until then a request gets a 503).
    let started = Instant::now();
    while embed(http.clone(), Arc::clone(&url), "probe".to_owned()).await != Some(200) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{l}'s requests never reached {r}'s worker"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let only_remote = burst(&http, &url, "only-remote").await;
    assert_eq!(
        count_served(&tei_remote, &only_remote),
        BURST,
        "served by {r}"
    );
    assert_eq!(count_served(&tei_local, &only_remote), 0);
    println!("[{l}] no local worker: {BURST} of {BURST} served by {r}'s worker");

    // (a) With a local worker, the requests stay local.
    let worker_local = start_worker(regions, local, &tei_local).await;
    let here = burst(&http, &url, "local").await;
    assert_eq!(
        count_served(&tei_local, &here),
        BURST,
        "served by {l}'s worker"
    );
    assert_eq!(count_served(&tei_remote, &here), 0, "none crossed to {r}");
    println!("[{l}] (a) local worker a member: {BURST} of {BURST} served in {l}");

    // (b) The local worker stops while requests flow: the remote one takes over, none fails.
    let steady = Steady {
        regions,
        local,
        tei_local: &tei_local,
        tei_remote: &tei_remote,
    };
    steady
        .load_while_local_stops(&http, &url, worker_local)
        .await;

    // (c) The local worker returns: traffic goes back to it.
    let worker_local = start_worker(regions, local, &tei_local).await;
    let back = burst(&http, &url, "back").await;
    assert_eq!(
        count_served(&tei_local, &back),
        BURST,
        "served by {l}'s worker again"
    );
    assert_eq!(count_served(&tei_remote, &back), 0, "none crossed to {r}");
    println!("[{l}] (c) local worker back: {BURST} of {BURST} served in {l}");

    worker_local.stop().await;
    worker_remote.stop().await;
}

/// Phase (b) of [`fail_over_and_back`].
struct Steady<'a> {
    regions: &'a Supercluster,
    local: Region,
    tei_local: &'a TeiDouble,
    tei_remote: &'a TeiDouble,
}

impl Steady<'_> {
    /// One request every `PERIOD` through the gateway; the local worker is stopped (gracefully)
    /// before request `STOP_AT`. Every request is answered 200 and served by one of the workers;
    /// every one sent after the local worker stopped is served by the remote one.
    async fn load_while_local_stops(
        &self,
        http: &reqwest::Client,
        url: &Arc<str>,
        worker_local: RunningWorker,
    ) {
        let inputs: Vec<String> = (0..STEADY).map(|i| format!("steady {i}")).collect();
        let mut tick = tokio::time::interval(PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut tasks = Vec::with_capacity(STEADY);
        let mut worker_local = Some(worker_local);
        let mut local_before_stop = 0;
        for (i, input) in inputs.iter().enumerate() {
            tick.tick().await;
            if i == STOP_AT {
                local_before_stop = count_served(self.tei_local, &inputs[..i]);
                if let Some(worker) = worker_local.take() {
                    worker.stop().await;
                }
                assert_eq!(
                    self.regions.local_subscribers(
                        self.local,
                        WORKER,
                        embatch_protocol::DEFAULT_SUBJECT
                    ),
                    0,
                    "the local worker left its server"
                );
            }
            tasks.push(tokio::spawn(embed(
                http.clone(),
                Arc::clone(url),
                input.clone(),
            )));
        }
        let mut failed = Vec::new();
        for (input, task) in inputs.iter().zip(tasks) {
            let status = task.await.expect("request task");
            if status != Some(200) {
                failed.push(format!("{input}: {status:?}"));
            }
        }
        assert!(
            failed.is_empty(),
            "failed while the local worker stopped: {failed:?}"
        );
        let (a, b) = (served(self.tei_local), served(self.tei_remote));
        let unserved: Vec<&String> = inputs
            .iter()
            .filter(|i| !a.contains(*i) && !b.contains(*i))
            .collect();
        assert!(
            unserved.is_empty(),
            "answered but never sent upstream: {unserved:?}"
        );
        let after = &inputs[STOP_AT..];
        assert_eq!(
            count_served(self.tei_local, after),
            0,
            "the local worker served after it stopped"
        );
        assert_eq!(
            count_served(self.tei_remote, after),
            after.len(),
            "the remote worker took over"
        );
        assert!(
            local_before_stop > 0,
            "the local worker served none of the requests before its stop"
        );
        println!(
            "[{l}] (b) {STEADY} requests, 0 failed; before the local worker stopped it served \
         {local_before_stop} of {STOP_AT}, after it {n} of {n} went to {r}",
            l = self.local.name(),
            r = self.local.other().name(),
            n = after.len(),
        );
    }
}
