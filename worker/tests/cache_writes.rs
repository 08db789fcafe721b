//! The shared bucket's writes are off every request's path: an entry one worker writes is a hit
//! for another, and while the store does not answer its writes (a subscriber that takes them
//! and never acknowledges) every request is still answered and the writes beyond the worker's
//! queue are dropped and counted (`embatch_worker_cache_writes_dropped_total`). Real
//! nats-server with JetStream and the TEI double. One test in this binary: it installs the
//! process's metrics recorder.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::metrics_text;
use common::plain::{bucket_holds, request};
use embatch_testkit::{NatsServer, RunningWorker, TeiConfig, double_vector, free_port, start_tei};
use futures::StreamExt;

/// The worker's write queue, in entries (`embatch_cache`'s `writer::QUEUE_ENTRIES`).
const QUEUE_ENTRIES: usize = 1024;

/// Sends `inputs`; returns the vectors and `Embatch-Cache-Hits`.
async fn embed(client: &async_nats::Client, inputs: &[String]) -> (Vec<Vec<f32>>, usize) {
    let reply = request(client, serde_json::json!({ "inputs": inputs }), &[]).await;
    (reply.vectors(), reply.hits.expect("the cache is on"))
}

/// A counter's value on the worker's `/metrics`, summed over its labels (0 when not yet
/// exported).
async fn counter(metrics: SocketAddr, name: &str) -> u64 {
    let text = metrics_text(metrics).await;
    // `name value` or `name{labels} value` (the worker's global label `model`).
    text.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', '{']))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// A worker on `nats` with the double at `tei_url` and `args`.
async fn worker(nats: &NatsServer, tei_url: &str, args: &[&str]) -> RunningWorker {
    let mut argv = vec!["--tei-url", tei_url];
    argv.extend(args);
    RunningWorker::start(nats, &argv).await
}

/// `inputs`' vectors as the double computes them.
fn vectors_of(inputs: &[String]) -> Vec<Vec<f32>> {
    inputs.iter().map(|t| double_vector(t)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_never_hold_a_reply_and_what_a_stuck_store_cannot_take_is_counted() {
    let nats = NatsServer::start_jetstream();
    let tei = start_tei(TeiConfig::instant()).await;
    let client = async_nats::connect(nats.url()).await.expect("connects");
    let js = async_nats::jetstream::new(client.clone());

    // Written by one worker, a hit for the next one (an empty LRU of its own).
    let first = worker(&nats, &tei.url, &["--cache-kv-timeout", "5s"]).await;
    let shared: Vec<String> = (0..40).map(|i| format!("shared {i}")).collect();
    let (vectors, hits) = embed(&client, &shared).await;
    assert_eq!((vectors, hits), (vectors_of(&shared), 0));
    bucket_holds(&client, shared.len()).await;
    first.stop().await;
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let metrics_arg = metrics.to_string();
    // A KV timeout far beyond the test: a write that is never acknowledged stays in its round.
    let second = worker(
        &nats,
        &tei.url,
        &["--cache-kv-timeout", "120s", "--metrics-addr", &metrics_arg],
    )
    .await;
    let calls = tei.calls().len();
    let (vectors, hits) = embed(&client, &shared).await;
    assert_eq!(
        (vectors, hits),
        (vectors_of(&shared), shared.len()),
        "every input a hit from the bucket"
    );
    assert_eq!(tei.calls().len(), calls, "no input embedded again");

    // The store stops answering: the bucket's stream is gone and a subscriber takes every
    // write on the bucket's subjects without acknowledging it.
    js.delete_key_value("embatch_cache").await.expect("deleted");
    let taker = async_nats::connect(nats.url()).await.expect("connects");
    let mut taken = taker
        .subscribe("$KV.embatch_cache.>")
        .await
        .expect("subscribes");
    taker.flush().await.expect("flushed");
    let dropped = "embatch_worker_cache_writes_dropped_total";
    assert_eq!(counter(metrics, dropped).await, 0);

    // More new inputs than the queue holds, 32 a request: every request is answered.
    let requests = QUEUE_ENTRIES / 32 + 8;
    for r in 0..requests {
        let inputs: Vec<String> = (0..32).map(|i| format!("new {r} {i}")).collect();
        let (vectors, hits) = embed(&client, &inputs).await;
        assert_eq!((vectors, hits), (vectors_of(&inputs), 0));
    }
    // The writes went out (the first round is stuck on them), and what the queue could not
    // hold behind them was dropped and counted.
    let write = tokio::time::timeout(Duration::from_secs(10), taken.next())
        .await
        .expect("a write reached the store");
    assert!(write.is_some_and(|m| m.subject.starts_with("$KV.embatch_cache.")));
    let offered = (requests * 32) as u64;
    let dropped = counter(metrics, dropped).await;
    assert!(
        dropped >= offered - QUEUE_ENTRIES as u64 && dropped < offered,
        "{dropped} of {offered} writes dropped with a queue of {QUEUE_ENTRIES}"
    );
    second.stop().await;
}
