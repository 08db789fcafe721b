//! Several TEI URLs behind one worker (`--tei-url a,b`), or several OpenAI-compatible ones
//! (`--openai-url a,b`): replicas of one model, each call to the one with the fewest calls in
//! flight; one that dies is skipped and its calls go to the other; TEI replicas of different
//! models stop the worker at start.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use embatch_client::EmbedClient;
use embatch_testkit::{NatsServer, RunningWorker, TeiConfig, TeiDouble, double_vector, start_tei};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A TCP forwarder to `to`: killing it (aborting its task) closes its listener and every
/// connection through it at once, as a replica's process dying does, while the double behind it
/// keeps its call log.
async fn forwarder(to: SocketAddr) -> (String, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let task = tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        while let Ok((mut inbound, _)) = listener.accept().await {
            connections.spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (url, task)
}

async fn client(nats: &NatsServer) -> EmbedClient {
    EmbedClient::new(
        async_nats::connect(nats.url()).await.expect("connects"),
        "embed",
    )
}

/// Sends `texts` at once, each its own request: every text's vector, or the failures.
async fn embed_all(client: &EmbedClient, texts: Vec<String>) -> Vec<Result<(), String>> {
    let mut sent = tokio::task::JoinSet::new();
    for text in texts {
        let client = client.clone();
        sent.spawn(async move {
            let body = serde_json::json!({ "inputs": text }).to_string();
            let reply = client
                .embed(Bytes::from(body), Duration::from_secs(10))
                .await
                .map_err(|e| format!("{text}: {e}"))?;
            let vectors: Vec<Vec<f32>> =
                serde_json::from_slice(&reply.payload).map_err(|e| format!("{text}: {e}"))?;
            if vectors == vec![double_vector(&text)] {
                Ok(())
            } else {
                Err(format!("{text}: another vector"))
            }
        });
    }
    sent.join_all().await
}

fn inputs_of(tei: &TeiDouble) -> usize {
    tei.calls().iter().map(|c| c.inputs.len()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_spreads_its_batches_over_two_replicas() {
    let nats = NatsServer::start();
    // One call at a time each, 20 ms a call: a GPU each.
    let a = start_tei(common::tei_taking(20, 1)).await;
    let b = start_tei(common::tei_taking(20, 1)).await;
    let urls = format!("{},{}", a.url, b.url);
    let args = ["--tei-url", &urls, "--max-batch-size", "4"];
    // MAX_CONCURRENT_BATCHES at its default: 2 per replica.
    let worker = RunningWorker::start(&nats, &args).await;
    spread_over(&client(&nats).await, "replica text", [&a, &b]).await;
    worker.stop().await;
}

/// Sends 64 texts (`prefix` and a number) at once: every one is served, embedded once in all,
/// and both `replicas` got some.
async fn spread_over(client: &EmbedClient, prefix: &str, replicas: [&TeiDouble; 2]) {
    let texts: Vec<String> = (0..64).map(|i| format!("{prefix} {i}")).collect();
    let results = embed_all(client, texts).await;
    let failed: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(failed.is_empty(), "{failed:?}");
    let (on_a, on_b) = (inputs_of(replicas[0]), inputs_of(replicas[1]));
    assert_eq!(on_a + on_b, 64, "each input embedded once");
    assert!(
        on_a > 0 && on_b > 0,
        "both replicas serve: {on_a} inputs on a, {on_b} on b"
    );
}

/// `OPENAI_URL` takes replicas too: calls spread over the live ones, and one that refuses
/// connections (nothing listens there) is skipped without failing a request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_upstream_spreads_its_calls_and_skips_a_dead_replica() {
    let nats = NatsServer::start();
    let a = start_tei(common::tei_taking(20, 1)).await;
    let b = start_tei(common::tei_taking(20, 1)).await;
    let dead = {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        listener.local_addr().expect("addr")
    };
    let urls = format!("{}/v1,{}/v1,http://{dead}/v1", a.url, b.url);
    let model = TeiConfig::instant().model_id;
    let args = [
        "--openai-url",
        &urls,
        "--openai-model",
        &model,
        "--max-batch-size",
        "4",
    ];
    let worker = RunningWorker::start(&nats, &args).await;
    spread_over(&client(&nats).await, "openai replica text", [&a, &b]).await;
    worker.stop().await;
}

/// A replica dies mid-run (its listener and open connections close): a call in flight on it
/// fails as unreachable and goes to the other replica, which also gets every later call while
/// the dead one cools; no request fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_dies_mid_run_loses_no_request() {
    let nats = NatsServer::start();
    let a = start_tei(common::tei_taking(10, 1)).await;
    let b = start_tei(common::tei_taking(10, 1)).await;
    let (a_url, a_process) = forwarder(a.addr).await;
    let urls = format!("{a_url},{}", b.url);
    // Batches of up to 8: one replica alone serves a burst of 100 within MAX_QUEUE_DELAY, so
    // no request is shed for overload once a is gone.
    let args = ["--tei-url", &urls, "--max-batch-size", "8"];
    let worker = RunningWorker::start(&nats, &args).await;
    let client = client(&nats).await;

    let texts = |from: usize, n: usize| (from..from + n).map(|i| format!("text {i}")).collect();
    let load = tokio::spawn({
        let client = client.clone();
        async move { embed_all(&client, texts(0, 400)).await }
    });
    // Kill a once it has served part of the load, with calls in flight on it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.calls().len() < 5 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(a.calls().len() >= 5, "a served before it died");
    a_process.abort();
    let killed = Instant::now();
    let mut results = load.await.expect("load task");
    // After the kill: new requests, all answered by b.
    let b_before = inputs_of(&b);
    results.extend(embed_all(&client, texts(400, 100)).await);

    let failed: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(failed.is_empty(), "{} failed: {failed:?}", failed.len());
    assert_eq!(
        inputs_of(&b) - b_before,
        100,
        "b took everything after the kill"
    );
    let late_on_a = a
        .calls()
        .iter()
        .filter(|c| c.at > killed + Duration::from_millis(50))
        .count();
    assert_eq!(late_on_a, 0, "nothing reaches a dead replica");
    worker.stop().await;
}

/// A worker's settings with `TEI_URL` listing `urls`, no admin server.
fn listing(urls: &[&str]) -> embatch_worker::Config {
    embatch_worker::Config::parse_from([
        "embatch-worker",
        "--tei-url",
        &urls.join(","),
        "--metrics-addr",
        "",
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_of_different_models_stop_the_worker_at_start() {
    let a = start_tei(TeiConfig::instant()).await;
    let b = start_tei(TeiConfig {
        model_id: "other/model".into(),
        ..TeiConfig::instant()
    })
    .await;
    let config = listing(&[&a.url, &b.url]);
    let err = match embatch_worker::build_upstream(&config).await {
        Ok(_) => panic!("replicas of two models must stop the worker"),
        Err(err) => err,
    };
    assert!(
        matches!(err, embatch_worker::WorkerError::Tei(_)),
        "a typed error: {err:?}"
    );
    let text = err.to_string();
    for part in [
        a.url.as_str(),
        b.url.as_str(),
        TeiConfig::instant().model_id.as_str(),
        "other/model",
    ] {
        assert!(text.contains(part), "names {part}: {text}");
    }

    // The same model twice: the worker starts, with the first replica's limits.
    let same = start_tei(TeiConfig {
        max_client_batch_size: 7,
        ..TeiConfig::instant()
    })
    .await;
    let config = listing(&[&same.url, &a.url]);
    let upstream = embatch_worker::build_upstream(&config)
        .await
        .expect("one model on both");
    use embatch_worker::upstream::Backend;
    assert_eq!(upstream.max_batch_size(), 7);
}
