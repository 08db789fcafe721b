//! SIGTERM on the real worker binary: it stops taking messages, answers every request it had
//! accepted, and exits 0.

use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use embatch_protocol::headers;
use embatch_testkit::{Behaviour, NatsServer, TeiDouble};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_loses_no_accepted_request() {
    let nats = NatsServer::start();
    // 4 inputs per call, one call at a time, 300 ms each: 12 requests need ~900 ms.
    let tei = TeiDouble::start(Behaviour {
        delay: Duration::from_millis(300),
        ..Behaviour::default()
    })
    .await;
    let mut worker = Command::new(env!("CARGO_BIN_EXE_embatch-worker"))
        .env("NATS_URL", nats.url())
        .env("TEI_URL", &tei.url)
        .env("MAX_BATCH_SIZE", "4")
        .env("MAX_CONCURRENT_BATCHES", "1")
        .env("MAX_WAIT_TIME", "1ms")
        .env("METRICS_ADDR", "")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("worker binary starts");

    let client = async_nats::connect(nats.url())
        .await
        .expect("client connects");
    let mut ready = false;
    for _ in 0..200 {
        if client
            .request("$SRV.PING.embatch", Bytes::new())
            .await
            .is_ok()
        {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(ready, "worker never became ready");

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
    let killed = Command::new("kill")
        .args(["-TERM", &worker.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());

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
    let status = tokio::task::spawn_blocking(move || worker.wait())
        .await
        .expect("join")
        .expect("worker exits");
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
