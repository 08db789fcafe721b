//! A reply lost with its NATS server: the worker acknowledged the request and answered it, but
//! the answer went into the connection of a server that died, and the worker, reconnected to
//! another server at once, beats on. Its heartbeats never stop, so only their connect count
//! (`Embatch-Worker-Connects`) can tell the client to resend. Here a stand-in worker (a raw
//! queue member) acknowledges, never answers the first copy, keeps beating, and later beats with
//! a larger count; it answers the copy that comes after that.

use std::time::Duration;

use bytes::Bytes;
use embatch_client::{EmbedClient, RequestError};
use embatch_protocol::{DEFAULT_QUEUE_GROUP, headers};
use embatch_testkit::NatsServer;
use futures::StreamExt;

/// The stand-in worker's service id.
const WORKER: &str = "w1";

/// A stand-in worker on `nats`: acknowledges every copy with the connect count `1`, answers
/// none of the first connection's, and beats every 100 ms on `embed.alive`, with count `1`
/// until `reconnect_after` (if any) has passed and `2` from then on; copies that arrive after
/// that are answered `[[0.5]]`. Returns how many copies it saw when `stop` fires.
async fn stand_in(
    nats: &NatsServer,
    reconnect_after: Option<Duration>,
) -> (
    tokio::task::JoinHandle<usize>,
    tokio::sync::oneshot::Sender<()>,
) {
    let raw = async_nats::connect(nats.url()).await.expect("connects");
    let mut member = raw
        .queue_subscribe("embed", DEFAULT_QUEUE_GROUP.to_owned())
        .await
        .expect("subscribe");
    raw.flush().await.expect("flush");
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let start = tokio::time::Instant::now();
        let connects = || {
            let reconnected = reconnect_after.is_some_and(|after| start.elapsed() >= after);
            if reconnected { "2" } else { "1" }
        };
        let mut beat = tokio::time::interval(Duration::from_millis(100));
        let mut copies = 0;
        loop {
            tokio::select! {
                _ = &mut stopped => return copies,
                _ = beat.tick() => {
                    let mut h = async_nats::HeaderMap::new();
                    h.insert(headers::WORKER_CONNECTS, connects());
                    let beat_subject = headers::heartbeat_subject("embed");
                    raw.publish_with_headers(beat_subject, h, Bytes::from(WORKER)).await.expect("beat");
                }
                Some(copy) = member.next() => {
                    copies += 1;
                    let Some(reply) = copy.reply.clone() else { continue };
                    let mut ack = async_nats::HeaderMap::new();
                    ack.insert(headers::ACCEPTED_BY, WORKER);
                    ack.insert(headers::WORKER_CONNECTS, connects());
                    raw.publish_with_headers(reply.clone(), ack, Bytes::new()).await.expect("ack");
                    if connects() == "2" {
                        let mut done = async_nats::HeaderMap::new();
                        done.insert(headers::ACK_DELAY_MS, "20");
                        let answer = Bytes::from_static(b"[[0.5]]");
                        raw.publish_with_headers(reply, done, answer).await.expect("reply");
                    }
                }
            }
        }
    });
    (task, stop)
}

/// Sends one request of `budget` on a client of its own.
async fn embed(nats: &NatsServer, budget: Duration) -> Result<Bytes, RequestError> {
    let client = EmbedClient::new(
        async_nats::connect(nats.url()).await.expect("connects"),
        "embed",
    );
    let body = Bytes::from_static(br#"{"inputs":"a reply lost with its server"}"#);
    client.embed(body, budget).await.map(|reply| reply.payload)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_worker_reconnected_since_its_acknowledgement_is_resent() {
    let nats = NatsServer::start();
    let (worker, stop) = stand_in(&nats, Some(Duration::from_millis(400))).await;
    let reply = embed(&nats, Duration::from_secs(5)).await;
    let _ = stop.send(());
    let copies = worker.await.expect("the stand-in ran");
    assert_eq!(reply.expect("answered"), Bytes::from_static(b"[[0.5]]"));
    // Only a copy sent after the count grew is answered. (A loaded host may add a copy resent
    // for want of an acknowledgement before that: the stand-in acknowledges it, answers nothing.)
    assert!(
        copies >= 2,
        "the first copy and one resent after the reconnect: {copies}"
    );
}

/// The control: the same worker beating on its first connection throughout holds the request
/// to its deadline (nothing else would resend it), so the test above passes by the count alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_larger_count_the_held_request_waits_to_its_deadline() {
    let nats = NatsServer::start();
    let (worker, stop) = stand_in(&nats, None).await;
    let reply = embed(&nats, Duration::from_millis(1500)).await;
    let _ = stop.send(());
    let copies = worker.await.expect("the stand-in ran");
    assert!(
        matches!(reply, Err(RequestError::TimedOut { .. })),
        "{reply:?}"
    );
    assert!(copies >= 1, "the stand-in saw the request");
}
