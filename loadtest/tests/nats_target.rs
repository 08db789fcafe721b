//! Integration: the NATS target against a real `nats-server` on a free loopback port and a real
//! worker (in process, from `embatch-testkit`) in front of the TEI double.

use std::time::Duration;

use embatch_loadtest::corpus::Payload;
use embatch_loadtest::stats::FailureKind;
use embatch_loadtest::targets::NatsTarget;
use embatch_testkit::{NatsServer, POISON, RunningWorker, TeiConfig, start_tei};

fn payload(body: String, inputs: usize) -> Payload {
    Payload {
        body: bytes::Bytes::from(body),
        inputs,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_target_classifies_replies() {
    let server = NatsServer::start();
    let url = server.url();
    let tei = start_tei(TeiConfig::instant()).await;
    let worker = RunningWorker::start(
        &server,
        &[
            "--tei-url",
            &tei.url,
            "--subject",
            "embed.test",
            "--max-wait-time",
            "1ms",
        ],
    )
    .await;

    let timeout = Duration::from_millis(1500);
    let target = NatsTarget::connect(&url, "embed.test", timeout, &Default::default())
        .await
        .expect("connect");
    let two = r#"{"inputs":["a","b"]}"#.to_string();
    assert_eq!(target.send(payload(two.clone(), 2)).await, Ok(()));
    // The target checks that the reply holds one vector per input it sent.
    assert_eq!(
        target.send(payload(two, 3)).await,
        Err(FailureKind::BadReply)
    );
    assert_eq!(
        target
            .send(payload(format!(r#"{{"inputs":"x {POISON}"}}"#), 1))
            .await,
        Err(FailureKind::Status(422))
    );

    let nobody = NatsTarget::connect(&url, "embed.nobody", timeout, &Default::default())
        .await
        .expect("connect");
    assert_eq!(
        nobody
            .send(payload(r#"{"inputs":"a"}"#.to_string(), 1))
            .await,
        Err(FailureKind::NoResponders)
    );
    worker.stop().await;
}
