//! The acknowledgement contract over a real nats-server and worker: a plain request gets
//! exactly one reply; a request with `Embatch-Ack: 1` answered within the acknowledgement delay
//! gets one reply that says the worker acknowledges (`Embatch-Ack-Delay-Ms`), one held longer an
//! acknowledgement naming the worker then the reply; `EmbedClient` resends a request that no
//! worker acknowledged or answered (here: a queue member that swallows messages, as nats-server
//! drops one around an UNSUB), does not keep resending to workers that never acknowledge, and
//! does not take a worker that answers before acknowledging for one of those.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use embatch_client::EmbedClient;
use embatch_protocol::{DEFAULT_QUEUE_GROUP, headers};
use embatch_testkit::{Faults, NatsServer, Stack, TeiConfig};
use futures::StreamExt;

/// The value of header `name` of `message`.
fn header(message: &async_nats::Message, name: &str) -> Option<String> {
    message
        .headers
        .as_ref()
        .and_then(|h| h.get(name))
        .map(|v| v.as_str().to_owned())
}

/// Every message on `inbox` within `quiet` of the previous one.
async fn messages(sub: &mut async_nats::Subscriber, quiet: Duration) -> Vec<async_nats::Message> {
    let mut got = Vec::new();
    while let Ok(Some(message)) = tokio::time::timeout(quiet, sub.next()).await {
        got.push(message);
    }
    got
}

/// A raw connection to `nats` and its member of `embed`'s queue group, flushed so the server
/// routes requests to it from now on: a stand-in worker.
async fn queue_member(nats: &NatsServer) -> (async_nats::Client, async_nats::Subscriber) {
    let raw = async_nats::connect(nats.url()).await.expect("connects");
    let member = raw
        .queue_subscribe("embed", DEFAULT_QUEUE_GROUP.to_owned())
        .await
        .expect("subscribe");
    raw.flush().await.expect("flush");
    (raw, member)
}

/// An `EmbedClient` of subject `embed` on its own connection to `nats`.
async fn embed_client(nats: &NatsServer) -> EmbedClient {
    EmbedClient::new(
        async_nats::connect(nats.url()).await.expect("connects"),
        "embed",
    )
}

/// Sends `{"inputs":"text <i>"}` for `i` in `0..n`, one after another, each within 5 s, and
/// checks that each is answered `[[0.5]]` (the stand-in responders' answer).
async fn embed_texts(client: &EmbedClient, n: usize) {
    for i in 0..n {
        let reply = client
            .embed(
                Bytes::from(format!(r#"{{"inputs":"text {i}"}}"#)),
                Duration::from_secs(5),
            )
            .await
            .expect("answered");
        assert_eq!(reply.payload, Bytes::from_static(b"[[0.5]]"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_request_gets_one_reply_and_an_acked_one_an_acknowledgement_first() {
    let stack = Stack::start(TeiConfig::instant(), &["--max-wait-time", "1ms"]).await;
    let nats = async_nats::connect(stack.nats.url())
        .await
        .expect("connects");
    let body = Bytes::from_static(br#"{"inputs":"hello"}"#);

    let inbox = nats.new_inbox();
    let mut sub = nats.subscribe(inbox.clone()).await.expect("subscribe");
    nats.publish_with_reply("embed", inbox, body.clone())
        .await
        .expect("publish");
    let plain = messages(&mut sub, Duration::from_millis(300)).await;
    assert_eq!(plain.len(), 1, "a plain request gets exactly one reply");
    assert_eq!(header(&plain[0], headers::ACCEPTED_BY), None);
    assert_eq!(header(&plain[0], headers::ACK_DELAY_MS), None);

    // Answered within the acknowledgement delay: the reply alone, saying that an
    // acknowledgement would have come. A stalled test process can hold one past the delay;
    // then it gets the acknowledgement first, so a few tries show the fast form.
    let mut fast_replies = 0;
    for _ in 0..5 {
        let inbox = nats.new_inbox();
        let mut sub = nats.subscribe(inbox.clone()).await.expect("subscribe");
        let mut ack = async_nats::HeaderMap::new();
        ack.insert(headers::ACK, "1");
        nats.publish_with_reply_and_headers("embed", inbox, ack, body.clone())
            .await
            .expect("publish");
        let got = messages(&mut sub, Duration::from_millis(300)).await;
        let reply = got.last().expect("a reply");
        let vectors: Vec<Vec<f32>> = serde_json::from_slice(&reply.payload).expect("vectors");
        assert_eq!(vectors, vec![embatch_testkit::double_vector("hello")]);
        assert_eq!(header(reply, headers::ACCEPTED_BY), None);
        assert_eq!(
            header(reply, headers::ACK_DELAY_MS),
            Some(headers::ACK_DELAY.as_millis().to_string())
        );
        if got.len() == 1 {
            fast_replies += 1;
        } else {
            assert_eq!(got.len(), 2, "at most an acknowledgement and the reply");
            assert!(header(&got[0], headers::ACCEPTED_BY).is_some());
        }
    }
    assert!(fast_replies > 0, "no reply came before its acknowledgement");

    // Held beyond the delay (the upstream takes 400 ms): the acknowledgement, heartbeats from
    // 100 to 200 ms after it, then the reply. A new text: "hello" is in the workers' cache by
    // now, and a hit is answered at once.
    stack.tei.set_faults(Faults {
        delay: Duration::from_millis(400),
        ..Faults::default()
    });
    let mut beats = nats
        .subscribe(headers::heartbeat_subject("embed"))
        .await
        .expect("subscribe");
    let inbox = nats.new_inbox();
    let mut sub = nats.subscribe(inbox.clone()).await.expect("subscribe");
    let mut ack = async_nats::HeaderMap::new();
    ack.insert(headers::ACK, "1");
    let held = Bytes::from_static(br#"{"inputs":"held past the delay"}"#);
    nats.publish_with_reply_and_headers("embed", inbox, ack, held)
        .await
        .expect("publish");
    let acked = messages(&mut sub, Duration::from_millis(900)).await;
    assert_eq!(acked.len(), 2, "an acknowledgement, then the reply");
    let worker =
        header(&acked[0], headers::ACCEPTED_BY).expect("the first message names the worker");
    assert!(acked[0].payload.is_empty());
    assert!(!worker.is_empty());
    assert_eq!(
        header(&acked[0], headers::WORKER_CONNECTS).as_deref(),
        Some("1"),
        "the worker's first connection"
    );
    assert_eq!(header(&acked[1], headers::ACCEPTED_BY), None);
    assert_eq!(
        header(&acked[1], headers::ACK_DELAY_MS),
        Some(headers::ACK_DELAY.as_millis().to_string()),
        "on every reply to a request that asked for an acknowledgement"
    );
    let vectors: Vec<Vec<f32>> = serde_json::from_slice(&acked[1].payload).expect("vectors");
    assert_eq!(
        vectors,
        vec![embatch_testkit::double_vector("held past the delay")]
    );

    // The worker's heartbeat, while it held the request, carries the same id and connect count.
    let beat = tokio::time::timeout(Duration::from_secs(2), beats.next())
        .await
        .expect("a heartbeat within 2 s")
        .expect("subscription open");
    assert_eq!(beat.payload, Bytes::from(worker.clone()));
    assert_eq!(
        header(&beat, headers::WORKER_CONNECTS).as_deref(),
        Some("1")
    );
    own_heartbeat_subject(&nats, &mut beats, &worker).await;
    stack.worker.stop().await;
}

/// A held request that names its client's heartbeat subject (`Embatch-Heartbeat-To`) is beaten
/// for there, and no longer on the shared subject (`beats`, drained first); one that names a
/// wildcard is refused (422) naming the header. The upstream takes 400 ms a call.
async fn own_heartbeat_subject(
    nats: &async_nats::Client,
    beats: &mut async_nats::Subscriber,
    worker: &str,
) {
    while tokio::time::timeout(Duration::from_millis(300), beats.next())
        .await
        .is_ok()
    {}
    let own = format!("{}.alive", nats.new_inbox());
    let mut own_beats = nats.subscribe(own.clone()).await.expect("subscribe");
    let inbox = nats.new_inbox();
    let mut sub = nats.subscribe(inbox.clone()).await.expect("subscribe");
    let mut asks = async_nats::HeaderMap::new();
    asks.insert(headers::ACK, "1");
    asks.insert(headers::HEARTBEAT_TO, own.as_str());
    let held = Bytes::from_static(br#"{"inputs":"held with a subject of its own"}"#);
    nats.publish_with_reply_and_headers("embed", inbox, asks.clone(), held)
        .await
        .expect("publish");
    assert_eq!(
        messages(&mut sub, Duration::from_millis(900)).await.len(),
        2
    );
    let beat = tokio::time::timeout(Duration::from_secs(2), own_beats.next())
        .await
        .expect("a heartbeat on the client's own subject within 2 s")
        .expect("subscription open");
    assert_eq!(beat.payload, Bytes::from(worker.to_owned()));
    assert!(
        tokio::time::timeout(Duration::from_millis(300), beats.next())
            .await
            .is_err(),
        "no beat on the shared subject for a request that named its own"
    );

    asks.insert(headers::HEARTBEAT_TO, "_INBOX.*");
    let inbox = nats.new_inbox();
    let mut sub = nats.subscribe(inbox.clone()).await.expect("subscribe");
    let body = Bytes::from_static(br#"{"inputs":"a wildcard heartbeat subject"}"#);
    nats.publish_with_reply_and_headers("embed", inbox, asks, body)
        .await
        .expect("publish");
    let refused = messages(&mut sub, Duration::from_millis(900)).await;
    let last = refused.last().expect("an answer");
    assert_eq!(
        header(last, headers::SERVICE_ERROR_CODE).as_deref(),
        Some("422")
    );
    let error = String::from_utf8_lossy(&last.payload);
    assert!(error.contains(headers::HEARTBEAT_TO), "{error}");
}

/// A queue member that reads every request and never answers: half the requests are routed to
/// it and lost there, as nats-server may lose a request around a member's UNSUB. Each is resent
/// after the acknowledgement wait until the real worker gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_no_worker_acknowledged_is_resent_until_one_does() {
    let stack = Stack::start(TeiConfig::instant(), &["--max-wait-time", "1ms"]).await;
    let (_raw, mut hole) = queue_member(&stack.nats).await;
    let swallowed = Arc::new(AtomicUsize::new(0));
    let swallowed_resends = Arc::new(AtomicUsize::new(0));
    let hole_task = tokio::spawn({
        let swallowed = Arc::clone(&swallowed);
        let swallowed_resends = Arc::clone(&swallowed_resends);
        async move {
            while let Some(copy) = hole.next().await {
                swallowed.fetch_add(1, Ordering::Relaxed);
                // A resent copy says which copy it is: 2 and up.
                if let Some(attempt) = header(&copy, headers::ATTEMPT) {
                    assert!(attempt.parse::<u32>().is_ok_and(|n| n >= 2), "{attempt}");
                    swallowed_resends.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    });
    let client = embed_client(&stack.nats).await;
    let results = futures::future::join_all((0..40).map(|i| {
        let client = client.clone();
        async move {
            let text = format!("text {i}");
            let reply = client
                .embed(
                    Bytes::from(serde_json::json!({ "inputs": text }).to_string()),
                    // Each copy has an even chance of the swallowing member; with resends at
                    // most ACK_TIMEOUT_MAX apart, 30 s allows ~30 of them, so all 40 requests
                    // get through but with a chance of about 40 / 2^30.
                    Duration::from_secs(30),
                )
                .await;
            (text, reply)
        }
    }))
    .await;
    for (text, reply) in results {
        let reply = reply.unwrap_or_else(|e| panic!("{text}: {e}"));
        let vectors: Vec<Vec<f32>> = serde_json::from_slice(&reply.payload).expect("vectors");
        assert_eq!(vectors, vec![embatch_testkit::double_vector(&text)]);
    }
    let lost = swallowed.load(Ordering::Relaxed);
    eprintln!("40 answered; {lost} copies swallowed and resent");
    assert!(
        lost > 0,
        "the queue group never routed to the swallowing member"
    );
    assert!(
        swallowed_resends.load(Ordering::Relaxed) > 0,
        "no resent copy carried its attempt number"
    );
    assert!(!hole_task.is_finished(), "the swallowing member failed");
    hole_task.abort();
    stack.worker.stop().await;
}

/// A responder that answers at once and never acknowledges (a worker older than the
/// acknowledgement): its successes come without one, and the client stops resending for want of
/// one, so it gets each request once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_that_never_acknowledge_get_each_request_once() {
    let nats = NatsServer::start();
    let (raw, mut requests) = queue_member(&nats).await;
    let received = Arc::new(AtomicUsize::new(0));
    let responder = tokio::spawn({
        let received = Arc::clone(&received);
        let raw = raw.clone();
        async move {
            while let Some(request) = requests.next().await {
                received.fetch_add(1, Ordering::Relaxed);
                if let Some(reply) = request.reply {
                    // Answers after 300 ms: beyond the acknowledgement wait.
                    let raw = raw.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        let _ = raw.publish(reply, Bytes::from_static(b"[[0.5]]")).await;
                    });
                }
            }
        }
    });
    let client = embed_client(&nats).await;
    embed_texts(&client, 5).await;
    let copies = received.load(Ordering::Relaxed);
    // The first request is resent while the client still expects acknowledgements (after 100
    // and 300 ms of waiting: 2 copies before its answer); the other four are sent once.
    assert!(
        (5..=8).contains(&copies),
        "{copies} copies of 5 requests reached the responder"
    );
    responder.abort();
}

/// A responder that answers at once, before an acknowledgement would be due, with the
/// acknowledgement delay on its reply (as a worker does), and swallows the first copy of every
/// request whose body says `lost`. After many fast unacknowledged successes the client still
/// expects acknowledgements, so the swallowed request is resent and answered; a client that
/// took the responder for one that never acknowledges would wait for it until its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_answers_before_acknowledging_still_gets_lost_requests_resent() {
    let nats = NatsServer::start();
    let (raw, mut requests) = queue_member(&nats).await;
    let lost_copies = Arc::new(AtomicUsize::new(0));
    let responder = tokio::spawn({
        let lost_copies = Arc::clone(&lost_copies);
        let raw = raw.clone();
        async move {
            while let Some(request) = requests.next().await {
                let Some(reply) = request.reply else { continue };
                if request.payload.windows(4).any(|w| w == b"lost")
                    && lost_copies.fetch_add(1, Ordering::Relaxed) == 0
                {
                    continue;
                }
                let mut reply_headers = async_nats::HeaderMap::new();
                reply_headers.insert(headers::ACK_DELAY_MS, "20");
                let _ = raw
                    .publish_with_headers(reply, reply_headers, Bytes::from_static(b"[[0.5]]"))
                    .await;
            }
        }
    });
    let client = embed_client(&nats).await;
    embed_texts(&client, 20).await;
    let reply = client
        .embed(
            Bytes::from_static(br#"{"inputs":"lost"}"#),
            Duration::from_secs(5),
        )
        .await
        .expect("the swallowed request is resent and answered");
    assert_eq!(reply.payload, Bytes::from_static(b"[[0.5]]"));
    assert_eq!(
        lost_copies.load(Ordering::Relaxed),
        2,
        "the swallowed copy and one resend"
    );
    responder.abort();
}
