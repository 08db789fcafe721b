//! The cache and the in-worker de-duplication on a real nats-server with JetStream (a temporary
//! store) and the TEI double, which records every input it is sent: hits answer byte for byte
//! what misses did, entries never cross options or model revisions, a KV outage or a full
//! bucket gives misses, duplicates reach the upstream once and every caller gets its own copy,
//! and the per-request bypass and the `CACHE` switch work.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use async_nats::HeaderMap;
use bytes::Bytes;
use common::plain::{bucket_holds, request};
use embatch_protocol::{DEFAULT_SUBJECT, headers};
use embatch_testkit::{
    Faults, NatsServer, POISON, RunningWorker, TeiConfig, TeiDouble, double_vector, embedding_of,
    start_tei,
};
use futures::StreamExt;

/// Every KV call may take this long here: a loaded test host must not turn a hit into a miss.
const KV_TIMEOUT: &str = "5s";

/// How many times the double was sent each text.
fn sends(tei: &TeiDouble) -> HashMap<String, usize> {
    let mut sends = HashMap::new();
    for call in tei.calls() {
        for input in call.inputs {
            *sends
                .entry(input.as_text().unwrap_or_default().to_owned())
                .or_default() += 1;
        }
    }
    sends
}

/// A worker on `nats` with the double as its upstream and `args`.
async fn worker(nats: &NatsServer, tei: &TeiDouble, args: &[&str]) -> RunningWorker {
    let mut argv = vec![
        "--tei-url",
        tei.url.as_str(),
        "--cache-kv-timeout",
        KV_TIMEOUT,
    ];
    argv.extend(args);
    RunningWorker::start(nats, &argv).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_answer_byte_for_byte_what_misses_did_from_either_tier() {
    let nats = NatsServer::start_jetstream();
    let tei = start_tei(TeiConfig::instant()).await;
    let first = worker(&nats, &tei, &[]).await;
    let client = async_nats::connect(nats.url()).await.expect("connects");
    let body = serde_json::json!({"inputs": ["alpha", "beta"]});

    let miss = request(&client, body.clone(), &[]).await;
    assert_eq!(miss.hits, Some(0));
    assert_eq!(
        miss.vectors(),
        vec![double_vector("alpha"), double_vector("beta")]
    );
    let local = request(&client, body.clone(), &[]).await;
    assert_eq!(local.hits, Some(2), "from the in-process LRU");
    assert_eq!(local.payload, miss.payload, "byte for byte");
    // A hit and a miss in one request, in order.
    let mixed = request(
        &client,
        serde_json::json!({"inputs": ["gamma", "alpha"]}),
        &[],
    )
    .await;
    assert_eq!(mixed.hits, Some(1));
    assert_eq!(
        mixed.vectors(),
        vec![double_vector("gamma"), double_vector("alpha")]
    );
    bucket_holds(&client, 3).await;
    first.stop().await;

    // A fresh worker (an empty LRU) answers from the shared bucket.
    let second = worker(&nats, &tei, &[]).await;
    let shared = request(&client, body, &[]).await;
    assert_eq!(shared.hits, Some(2), "from the shared bucket");
    assert_eq!(shared.payload, miss.payload, "byte for byte");
    assert_eq!(
        sends(&tei),
        HashMap::from([("alpha".into(), 1), ("beta".into(), 1), ("gamma".into(), 1)]),
        "each input embedded once"
    );
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_options_or_model_revisions_never_share_an_entry() {
    let nats = NatsServer::start_jetstream();
    let tei = start_tei(TeiConfig::instant()).await;
    let first = worker(&nats, &tei, &[]).await;
    let client = async_nats::connect(nats.url()).await.expect("connects");
    let variants = [
        serde_json::json!({"inputs": "same"}),
        serde_json::json!({"inputs": "same", "normalize": false}),
        serde_json::json!({"inputs": "same", "truncate": true}),
        serde_json::json!({"inputs": "same", "truncation_direction": "left"}),
        serde_json::json!({"inputs": "same", "dimensions": 4}),
    ];
    for body in &variants {
        let reply = request(&client, body.clone(), &[]).await;
        assert_eq!(reply.hits, Some(0), "{body}: a miss");
    }
    for body in &variants {
        let reply = request(&client, body.clone(), &[]).await;
        assert_eq!(reply.hits, Some(1), "{body}: its own entry");
    }
    let unnormalized = request(&client, variants[1].clone(), &[]).await;
    assert_eq!(
        unnormalized.vectors(),
        vec![embedding_of(
            &embatch_protocol::Input::from("same"),
            TeiConfig::instant().dim,
            None,
            false
        )],
        "the entry of its own options"
    );
    assert_eq!(tei.calls().len(), variants.len());
    bucket_holds(&client, variants.len()).await;
    first.stop().await;

    // The same model under another revision: nothing shared.
    let revised = worker(&nats, &tei, &["--cache-revision", "2"]).await;
    let reply = request(&client, variants[0].clone(), &[]).await;
    assert_eq!(reply.hits, Some(0), "another revision misses");
    assert_eq!(tei.calls().len(), variants.len() + 1);
    revised.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kv_outage_gives_misses_not_errors() {
    // No JetStream at all: the shared tier never opens; requests are served.
    let plain = NatsServer::start();
    let tei = start_tei(TeiConfig::instant()).await;
    let without = worker(&plain, &tei, &["--cache-local-bytes", "0"]).await;
    let client = async_nats::connect(plain.url()).await.expect("connects");
    for _ in 0..2 {
        let reply = request(&client, serde_json::json!({"inputs": "x"}), &[]).await;
        assert_eq!(reply.vectors(), vec![double_vector("x")]);
        assert_eq!(reply.hits, Some(0));
    }
    without.stop().await;

    // The bucket deleted under a running worker: reads fail, and are misses.
    let nats = NatsServer::start_jetstream();
    let running = worker(&nats, &tei, &["--cache-local-bytes", "0"]).await;
    let client = async_nats::connect(nats.url()).await.expect("connects");
    let body = serde_json::json!({"inputs": ["y", "z"]});
    assert_eq!(request(&client, body.clone(), &[]).await.hits, Some(0));
    bucket_holds(&client, 2).await;
    assert_eq!(request(&client, body.clone(), &[]).await.hits, Some(2));
    let js = async_nats::jetstream::new(client.clone());
    js.delete_key_value("embatch_cache").await.expect("deleted");
    tei.calls.clear();
    for _ in 0..2 {
        let reply = request(&client, body.clone(), &[]).await;
        assert_eq!(
            reply.vectors(),
            vec![double_vector("y"), double_vector("z")]
        );
        assert_eq!(reply.hits, Some(0));
    }
    assert_eq!(
        sends(&tei),
        HashMap::from([("y".into(), 2), ("z".into(), 2)]),
        "every request embedded its inputs"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_bucket_gives_misses_not_errors() {
    let nats = NatsServer::start_jetstream();
    let tei = start_tei(TeiConfig::instant()).await;
    let client = async_nats::connect(nats.url()).await.expect("connects");
    // A bucket made beforehand as `nats kv add` makes it: discard `new`, so once full every
    // write is refused. A few hundred bytes: a handful of entries.
    let js = async_nats::jetstream::new(client.clone());
    let kv = js
        .create_key_value(async_nats::jetstream::kv::Config {
            bucket: "embatch_cache".into(),
            max_bytes: 1024,
            ..Default::default()
        })
        .await
        .expect("created");
    let running = worker(&nats, &tei, &["--cache-local-bytes", "0"]).await;
    let texts: Vec<String> = (0..20).map(|i| format!("full {i}")).collect();
    for text in &texts {
        let reply = request(&client, serde_json::json!({"inputs": text}), &[]).await;
        assert_eq!(
            reply.vectors(),
            vec![double_vector(text)],
            "answered while full"
        );
    }
    bucket_holds_some(&kv).await;
    let mut hits = 0;
    for text in &texts {
        let reply = request(&client, serde_json::json!({"inputs": text}), &[]).await;
        assert_eq!(reply.vectors(), vec![double_vector(text)]);
        hits += reply.hits.expect("the cache is on");
    }
    let held = keys(&kv).await;
    assert!(held < texts.len(), "the bucket is full: {held} entries");
    assert!(hits > 0 && hits <= held, "{hits} hits from {held} entries");
    running.stop().await;
}

/// The keys of `kv`.
async fn keys(kv: &async_nats::jetstream::kv::Store) -> usize {
    kv.keys()
        .await
        .expect("keys")
        .filter_map(|k| async move { k.ok() })
        .collect::<Vec<String>>()
        .await
        .len()
}

/// Waits until `kv` holds an entry, at most 10 s.
async fn bucket_holds_some(kv: &async_nats::jetstream::kv::Store) {
    for _ in 0..500 {
        if keys(kv).await > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the bucket never held an entry");
}

/// Waits until the double has received `calls` calls (recorded on arrival, before their
/// delay), at most 10 s.
async fn calls_arrived(tei: &TeiDouble, calls: usize) {
    for _ in 0..500 {
        if tei.calls().len() >= calls {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the double never received {calls} calls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_reach_the_upstream_once_and_each_caller_gets_its_copy() {
    let nats = NatsServer::start_jetstream();
    let tei = start_tei(TeiConfig::instant()).await;
    // The cache off: only the in-flight de-duplication can fold these.
    let running = worker(&nats, &tei, &["--cache", "false"]).await;
    let client = async_nats::connect(nats.url()).await.expect("connects");

    // Inside one request.
    let reply = request(
        &client,
        serde_json::json!({"inputs": ["d", "e", "d", "d"]}),
        &[],
    )
    .await;
    assert_eq!(reply.hits, None, "the cache is off: no hits header");
    let (d, e) = (double_vector("d"), double_vector("e"));
    assert_eq!(
        reply.vectors(),
        vec![d.clone(), e.clone(), d.clone(), d.clone()]
    );
    assert_eq!(
        sends(&tei),
        HashMap::from([("d".into(), 1), ("e".into(), 1)])
    );

    // Across requests: while the first is upstream (held by the double), equal inputs of
    // other requests wait for its result instead of being sent again.
    tei.calls.clear();
    tei.set_faults(Faults {
        delay: Duration::from_millis(1500),
        ..Faults::default()
    });
    let leader = tokio::spawn({
        let client = client.clone();
        async move { request(&client, serde_json::json!({"inputs": ["f", "g"]}), &[]).await }
    });
    calls_arrived(&tei, 1).await;
    let followers: Vec<_> = [
        serde_json::json!({"inputs": ["g"]}),
        serde_json::json!({"inputs": ["f", "h", "g"]}),
        serde_json::json!({"inputs": ["g", "f"]}),
    ]
    .into_iter()
    .map(|body| {
        let client = client.clone();
        tokio::spawn(async move { request(&client, body, &[]).await })
    })
    .collect();
    let (f, g, h) = (double_vector("f"), double_vector("g"), double_vector("h"));
    assert_eq!(
        leader.await.expect("joins").vectors(),
        vec![f.clone(), g.clone()]
    );
    let mut answers = Vec::new();
    for follower in followers {
        answers.push(follower.await.expect("joins").vectors());
    }
    assert_eq!(
        answers,
        vec![
            vec![g.clone()],
            vec![f.clone(), h.clone(), g.clone()],
            vec![g.clone(), f.clone()]
        ]
    );
    assert_eq!(
        sends(&tei),
        HashMap::from([("f".into(), 1), ("g".into(), 1), ("h".into(), 1)]),
        "each input sent upstream once"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_leader_fails_sends_its_input_itself() {
    let nats = NatsServer::start_jetstream();
    let tei = start_tei(TeiConfig::instant()).await;
    let running = worker(&nats, &tei, &["--cache", "false"]).await;
    let client = async_nats::connect(nats.url()).await.expect("connects");
    // The leader's request holds a poisoned input: the upstream rejects its call (422).
    tei.set_faults(Faults {
        delay: Duration::from_millis(1500),
        ..Faults::default()
    });
    let poisoned = format!("bad {POISON}");
    let leader = tokio::spawn({
        let client = client.clone();
        let body = serde_json::json!({"inputs": ["shared", poisoned]});
        async move { request(&client, body, &[]).await }
    });
    calls_arrived(&tei, 1).await;
    tei.set_faults(Faults::default());
    let waiter = request(&client, serde_json::json!({"inputs": ["shared"]}), &[]).await;
    assert_eq!(
        waiter.vectors(),
        vec![double_vector("shared")],
        "not the leader's error"
    );
    assert_eq!(
        leader.await.expect("joins").status,
        422,
        "the leader's own error"
    );
    assert_eq!(
        sends(&tei).get("shared"),
        Some(&2),
        "sent again by the waiter"
    );

    // A withdrawn leader: its waiter is still answered.
    tei.calls.clear();
    tei.set_faults(Faults {
        delay: Duration::from_millis(1500),
        ..Faults::default()
    });
    let mut withdrawn = HeaderMap::new();
    withdrawn.insert(headers::REQUEST_ID, "leader-1");
    let inbox = client.new_inbox();
    client
        .publish_with_reply_and_headers(
            DEFAULT_SUBJECT,
            inbox,
            withdrawn,
            Bytes::from(r#"{"inputs":["w","v"]}"#),
        )
        .await
        .expect("publishes");
    calls_arrived(&tei, 1).await;
    tei.set_faults(Faults::default());
    let waiter = tokio::spawn({
        let client = client.clone();
        async move { request(&client, serde_json::json!({"inputs": ["w"]}), &[]).await }
    });
    // Give the waiter time to join the leader's flight before the leader is withdrawn (had it
    // not joined yet, it leads "w" itself: answered all the same).
    tokio::time::sleep(Duration::from_millis(200)).await;
    client
        .publish(
            headers::cancel_subject(DEFAULT_SUBJECT),
            Bytes::from("leader-1"),
        )
        .await
        .expect("cancels");
    assert_eq!(
        waiter.await.expect("joins").vectors(),
        vec![double_vector("w")]
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_may_bypass_the_cache_and_the_cache_may_be_off() {
    let nats = NatsServer::start_jetstream();
    let tei = start_tei(TeiConfig::instant()).await;
    let running = worker(&nats, &tei, &[]).await;
    let client = async_nats::connect(nats.url()).await.expect("connects");
    let body = serde_json::json!({"inputs": "p"});
    assert_eq!(request(&client, body.clone(), &[]).await.hits, Some(0));
    let fresh = request(
        &client,
        body.clone(),
        &[(headers::CACHE_CONTROL, "no-cache")],
    )
    .await;
    assert_eq!(fresh.hits, Some(0), "no-cache reads nothing");
    assert_eq!(fresh.vectors(), vec![double_vector("p")]);
    let unstored = serde_json::json!({"inputs": "q"});
    let reply = request(
        &client,
        unstored.clone(),
        &[(headers::CACHE_CONTROL, "no-store")],
    )
    .await;
    assert_eq!(reply.hits, Some(0));
    assert_eq!(
        request(&client, unstored, &[]).await.hits,
        Some(0),
        "no-store wrote nothing"
    );
    assert_eq!(
        request(&client, body, &[]).await.hits,
        Some(1),
        "p is cached"
    );
    assert_eq!(
        sends(&tei),
        HashMap::from([("p".into(), 2), ("q".into(), 2)])
    );
    running.stop().await;

    // The cache off: no hits header, every request embedded.
    tei.calls.clear();
    let off = worker(&nats, &tei, &["--cache", "false"]).await;
    for _ in 0..2 {
        let reply = request(&client, serde_json::json!({"inputs": "p"}), &[]).await;
        assert_eq!(reply.hits, None);
        assert_eq!(reply.vectors(), vec![double_vector("p")]);
    }
    assert_eq!(sends(&tei), HashMap::from([("p".into(), 2)]));
    off.stop().await;
}

/// A bucket that finds nothing (a corpus never seen before) is not waited for: once 256
/// lookups found no entry, requests send their misses upstream at once and one in 16 has its
/// keys probed in the background; when the probes find entries again, requests look up again
/// and are answered from the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_bucket_is_probed_not_waited_for_until_it_has_entries() {
    let nats = NatsServer::start_jetstream();
    let tei = start_tei(TeiConfig::instant()).await;
    let running = worker(&nats, &tei, &["--cache-local-bytes", "0"]).await;
    let client = async_nats::connect(nats.url()).await.expect("connects");

    // 300 lookups that find nothing: the bucket is cold.
    let corpus: Vec<String> = (0..300).map(|i| format!("new {i}")).collect();
    let reply = request(&client, serde_json::json!({ "inputs": corpus }), &[]).await;
    assert_eq!(reply.hits, Some(0));
    // Inputs embedded while cold are still written.
    let texts: Vec<String> = (0..200).map(|i| format!("again {i}")).collect();
    for text in &texts {
        let reply = request(&client, serde_json::json!({ "inputs": text }), &[]).await;
        assert_eq!(reply.hits, Some(0));
    }
    bucket_holds(&client, 500).await;

    // The same inputs again: the bucket holds every one, but a cold bucket is not waited for,
    // so the first requests are embedded again; the probes find the entries, and the
    // requests after them are hits.
    tei.calls.clear();
    let mut hits = Vec::new();
    for text in &texts {
        let reply = request(&client, serde_json::json!({ "inputs": text }), &[]).await;
        assert_eq!(reply.vectors(), vec![double_vector(text)]);
        hits.push(reply.hits.expect("the cache is on"));
    }
    assert_eq!(hits[0], 0, "a cold bucket is not looked up first");
    let first_hit = hits
        .iter()
        .position(|&h| h == 1)
        .expect("the bucket warms up");
    assert!(
        hits[first_hit..].iter().all(|&h| h == 1),
        "every request after the first hit is answered from the bucket: {hits:?}"
    );
    assert_eq!(
        sends(&tei).len(),
        first_hit,
        "only the requests before the bucket warmed up reached the upstream"
    );
    running.stop().await;
}
