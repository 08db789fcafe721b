//! Integration: the NATS target against a real `nats-server` on a free loopback port (from
//! `embatch-testkit`, which finds the binary) and a tiny in-test responder that answers like a
//! worker.

use std::time::Duration;

use embatch_loadtest::corpus::Payload;
use embatch_loadtest::stats::FailureKind;
use embatch_loadtest::targets::NatsTarget;
use embatch_protocol::{EmbedError, EmbedRequest, headers, reply};
use futures::StreamExt;

async fn connect(url: &str) -> async_nats::Client {
    for _ in 0..100 {
        if let Ok(client) = async_nats::connect(url).await {
            return client;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("nats-server at {url} did not come up");
}

/// Answers like a worker: the embeddings, or a 422 error reply for a poisoned input. Checks that
/// every request carries the deadline header.
async fn responder(client: async_nats::Client, subject: &'static str) {
    let mut sub = client.subscribe(subject).await.expect("subscribe");
    client.flush().await.expect("flush");
    tokio::spawn(async move {
        while let Some(msg) = sub.next().await {
            let Some(reply) = msg.reply.clone() else {
                continue;
            };
            let deadline = msg
                .headers
                .as_ref()
                .and_then(|h| h.get(headers::DEADLINE_MS))
                .and_then(|v| headers::parse_deadline(v.as_str()));
            // The header carries what is left of the 1.5 s budget when the request is sent.
            let deadline = deadline.expect("an Embatch-Deadline-Ms header");
            assert!(
                deadline <= Duration::from_millis(1500) && deadline > Duration::from_millis(1000),
                "{deadline:?}"
            );
            let request = EmbedRequest::from_slice(&msg.payload).expect("valid request");
            let inputs = request.inputs.into_vec();
            if inputs.iter().any(|t| t.contains("__poison__")) {
                let err = EmbedError::Validation("poison".into());
                let mut h = async_nats::HeaderMap::new();
                for (name, value) in reply::error_headers(&err) {
                    h.insert(name, value.as_str());
                }
                let _ = client
                    .publish_with_headers(reply, h, err.to_json().into())
                    .await;
            } else {
                let body =
                    serde_json::to_vec(&vec![vec![0.5f32; 4]; inputs.len()]).expect("serializes");
                let _ = client.publish(reply, body.into()).await;
            }
        }
    });
}

fn payload(body: &'static str, inputs: usize) -> Payload {
    Payload {
        body: bytes::Bytes::from_static(body.as_bytes()),
        inputs,
    }
}

#[tokio::test]
async fn nats_target_classifies_replies() {
    let server = embatch_testkit::NatsServer::start();
    let url = server.url();
    let client = connect(&url).await;
    responder(client, "embed.test").await;

    let timeout = Duration::from_millis(1500);
    let target = NatsTarget::connect(&url, "embed.test", timeout)
        .await
        .expect("connect");
    assert_eq!(
        target.send(payload(r#"{"inputs":["a","b"]}"#, 2)).await,
        Ok(())
    );
    assert_eq!(
        target.send(payload(r#"{"inputs":["a","b"]}"#, 3)).await,
        Err(FailureKind::BadReply)
    );
    assert_eq!(
        target
            .send(payload(r#"{"inputs":"x __poison__"}"#, 1))
            .await,
        Err(FailureKind::Status(422))
    );

    let nobody = NatsTarget::connect(&url, "embed.nobody", timeout)
        .await
        .expect("connect");
    assert_eq!(
        nobody.send(payload(r#"{"inputs":"a"}"#, 1)).await,
        Err(FailureKind::NoResponders)
    );
}
