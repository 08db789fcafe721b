//! SIGTERM on the real worker binary: it stops taking messages, answers every request it had
//! accepted, and exits 0; with a second worker, a client that keeps sending through the SIGTERM
//! loses nothing.

mod process;

use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use embatch_client::EmbedClient;
use embatch_protocol::headers;
use embatch_testkit::{NatsServer, TeiConfig, TeiDouble, start_tei};

use process::{Worker, spawn_worker};

/// A nats-server, the TEI double taking `upstream_time` per call, and a client on the server.
async fn nats_tei_and_client(
    upstream_time: Duration,
) -> (NatsServer, TeiDouble, async_nats::Client) {
    let nats = NatsServer::start();
    let tei = start_tei(TeiConfig {
        base: upstream_time,
        ..TeiConfig::instant()
    })
    .await;
    let client = async_nats::connect(nats.url())
        .await
        .expect("client connects");
    (nats, tei, client)
}

fn sigterm(worker: &Worker) {
    let killed = Command::new("kill")
        .args(["-TERM", &worker.0.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
}

async fn exit_status(worker: Worker) -> std::process::ExitStatus {
    tokio::task::spawn_blocking(move || {
        let mut worker = worker;
        worker.0.wait()
    })
    .await
    .expect("join")
    .expect("worker exits")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sending_through_sigterm_of_one_of_two_workers_loses_nothing() {
    let (nats, tei, nats_client) = nats_tei_and_client(Duration::from_millis(20)).await;
    let settings = [("MAX_WAIT_TIME", "2ms")];
    let leaving = spawn_worker(&nats, &tei, &settings, &nats_client, 1).await;
    let staying = spawn_worker(&nats, &tei, &settings, &nats_client, 2).await;
    let client = EmbedClient::new(nats_client.clone(), "embed");

    // 300 requests at ~150/s; SIGTERM to one worker after 1 s, while requests keep coming.
    let mut tasks = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(7));
    for i in 0..300 {
        tick.tick().await;
        if i == 150 {
            sigterm(&leaving);
        }
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let text = format!("request {i}");
            let body = Bytes::from(serde_json::json!({ "inputs": text }).to_string());
            (text, client.embed(body, Duration::from_secs(5)).await)
        }));
    }
    for task in tasks {
        let (text, result) = task.await.expect("task");
        let reply = result.unwrap_or_else(|e| panic!("{text} failed: {e}"));
        let vectors: Vec<Vec<f32>> = serde_json::from_slice(&reply.payload).expect("vectors");
        assert_eq!(vectors, vec![embatch_testkit::double_vector(&text)]);
    }
    let status = exit_status(leaving).await;
    assert!(
        status.success(),
        "the leaving worker's exit status: {status}"
    );
    sigterm(&staying);
    assert!(exit_status(staying).await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_loses_no_accepted_request() {
    // 4 inputs per call, one call at a time, 300 ms each: 12 requests need ~900 ms.
    let (nats, tei, client) = nats_tei_and_client(Duration::from_millis(300)).await;
    let settings = [
        ("MAX_BATCH_SIZE", "4"),
        ("MAX_CONCURRENT_BATCHES", "1"),
        ("MAX_WAIT_TIME", "1ms"),
    ];
    let worker = spawn_worker(&nats, &tei, &settings, &client, 1).await;

    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .send_request(
                        "embed",
                        async_nats::Request::new()
                            .payload(Bytes::from(format!(r#"{{"inputs":"request {i}"}}"#)))
                            .timeout(Some(Duration::from_secs(10))),
                    )
                    .await
            })
        })
        .collect();
    // Let every request reach the worker's queue, then ask it to stop while most still wait.
    tokio::time::sleep(Duration::from_millis(150)).await;
    sigterm(&worker);

    for (i, task) in tasks.into_iter().enumerate() {
        let reply = task
            .await
            .expect("task")
            .unwrap_or_else(|e| panic!("request {i} lost: {e}"));
        let error = reply
            .headers
            .as_ref()
            .and_then(|h| h.get(headers::SERVICE_ERROR_CODE));
        assert!(
            error.is_none(),
            "request {i} failed: {:?}",
            String::from_utf8_lossy(&reply.payload)
        );
        let vectors: Vec<Vec<f32>> = serde_json::from_slice(&reply.payload).expect("vectors");
        assert_eq!(
            vectors,
            vec![embatch_testkit::double_vector(&format!("request {i}"))]
        );
    }
    let status = exit_status(worker).await;
    assert!(status.success(), "worker exit status: {status}");
    assert_eq!(
        tei.calls().iter().map(|c| c.inputs.len()).sum::<usize>(),
        12
    );

    // Gone from the queue group: a new request finds no responders.
    let after = client
        .send_request(
            "embed",
            async_nats::Request::new()
                .payload(Bytes::from_static(br#"{"inputs":"x"}"#))
                .timeout(Some(Duration::from_secs(2))),
        )
        .await
        .expect_err("no worker left");
    assert_eq!(after.kind(), async_nats::RequestErrorKind::NoResponders);
}
