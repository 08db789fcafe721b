//! The worker over a real nats-server, against a TEI test double: the wire contract, batching
//! across concurrent clients, fault isolation, overload and shutdown.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::embed_status;
use embatch_client::EmbedClient;
use embatch_protocol::{Input, headers};
use embatch_testkit::{
    Faults, NatsServer, POISON, RunningWorker, TeiConfig, double_vector, embedding_of, start_tei,
};

/// [`embatch_testkit::Stack`] and a client on its server.
struct Stack {
    base: embatch_testkit::Stack,
    client: async_nats::Client,
}

/// A [`Stack`] on an instant TEI double, the worker started with `args`.
async fn stack(args: &[&str]) -> Stack {
    stack_on(TeiConfig::instant(), args).await
}

/// A [`Stack`] on a TEI double configured by `tei_config`, the worker started with `args`.
async fn stack_on(tei_config: TeiConfig, args: &[&str]) -> Stack {
    let base = embatch_testkit::Stack::start(tei_config, args).await;
    let client = connect(&base.nats).await;
    Stack { base, client }
}

/// A plain NATS client on `nats`.
async fn connect(nats: &NatsServer) -> async_nats::Client {
    async_nats::connect(nats.url())
        .await
        .expect("client connects")
}

/// The reply of a direct NATS request sent through `embatch-client` with a 10 s budget: status
/// (200 or the error code) and the payload (TEI's response or error body).
async fn request(client: &async_nats::Client, body: &str) -> (u16, serde_json::Value) {
    let client = EmbedClient::new(client.clone(), "embed");
    embed_status(&client, Bytes::from(body.to_owned())).await
}

/// The reply's vectors as f32, as a client decodes them.
fn vectors(body: &serde_json::Value) -> Vec<Vec<f32>> {
    serde_json::from_value(body.clone()).expect("an array of float arrays")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_share_full_batches_and_each_gets_its_own_slice() {
    // Every request waits for company (no dispatch when idle), so the batches are exactly full.
    let stack = stack(&[
        "--max-batch-size",
        "32",
        "--max-wait-time",
        "250ms",
        "--dispatch-when-idle",
        "false",
    ])
    .await;
    let (tei, client) = (&stack.base.tei, &stack.client);

    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let text = format!("client {i} says hello");
                let (code, body) =
                    request(&client, &serde_json::json!({"inputs": text}).to_string()).await;
                (text, code, body)
            })
        })
        .collect();
    for task in tasks {
        let (text, code, body) = task.await.expect("client task");
        assert_eq!(code, 200, "{body}");
        assert_eq!(
            vectors(&body),
            vec![double_vector(&text)],
            "{text} got someone else's vector"
        );
    }
    let sizes: Vec<usize> = tei.calls().iter().map(|c| c.inputs.len()).collect();
    println!("upstream batch sizes for 64 concurrent single-input clients: {sizes:?}");
    assert_eq!(sizes.iter().sum::<usize>(), 64);
    assert_eq!(
        sizes,
        vec![32, 32],
        "⌈64 / MAX_BATCH_SIZE 32⌉ = 2 full calls"
    );
    stack.base.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_request_fails_alone_over_nats() {
    let stack = stack(&["--max-batch-size", "16", "--max-wait-time", "250ms"]).await;
    let client = &stack.client;
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let inputs = if i == 7 {
                    vec![format!("ok {i}"), POISON.to_string()]
                } else {
                    vec![format!("ok {i}")]
                };
                let body = serde_json::json!({ "inputs": inputs }).to_string();
                (i, request(&client, &body).await)
            })
        })
        .collect();
    for task in tasks {
        let (i, (code, body)) = task.await.expect("client task");
        if i == 7 {
            assert_eq!(code, 422, "{body}");
            assert_eq!(body["error_type"], "Validation");
        } else {
            assert_eq!(code, 200, "request {i}: {body}");
            assert_eq!(vectors(&body), vec![double_vector(&format!("ok {i}"))]);
        }
    }
    stack.base.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_id_inputs_reach_tei_as_sent_and_share_a_batch_with_texts() {
    let stack = stack(&[
        "--max-batch-size",
        "3",
        "--max-wait-time",
        "250ms",
        "--dispatch-when-idle",
        "false",
    ])
    .await;
    let client = &stack.client;
    let (ids, mixed) = tokio::join!(
        request(client, r#"{"inputs":[101,7592,102]}"#),
        request(client, r#"{"inputs":["a",[7592]]}"#),
    );
    assert_eq!(ids.0, 200, "{}", ids.1);
    assert_eq!(mixed.0, 200, "{}", mixed.1);
    let calls = stack.base.tei.calls();
    assert_eq!(calls.len(), 1, "one upstream call for both requests");
    let mut sent = calls[0].inputs.clone();
    sent.sort_by_key(|input| format!("{input:?}"));
    assert_eq!(
        sent,
        [
            Input::Ids(vec![101, 7592, 102]),
            Input::Ids(vec![7592]),
            Input::from("a"),
        ],
        "token ids are forwarded as TEI's arrays of ids"
    );
    let vector = |input: &Input| embedding_of(input, TeiConfig::instant().dim, None, true);
    assert_eq!(
        vectors(&ids.1),
        vec![vector(&Input::Ids(vec![101, 7592, 102]))]
    );
    assert_eq!(
        vectors(&mixed.1),
        vec![vector(&Input::from("a")), vector(&Input::Ids(vec![7592]))]
    );
    stack.base.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_down_answers_503_fast_and_upstream_5xx_answers_424() {
    let nats = NatsServer::start();
    let closed = format!("http://127.0.0.1:{}", embatch_testkit::free_port());
    // With MODEL_ALIAS the worker needs no /info to name its model, so it starts without TEI.
    let args = [
        "--tei-url",
        &closed,
        "--max-wait-time",
        "1ms",
        "--model-alias",
        "m",
    ];
    let worker = RunningWorker::start(&nats, &args).await;
    let client = connect(&nats).await;
    let started = std::time::Instant::now();
    let (code, body) = request(&client, r#"{"inputs":"x"}"#).await;
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["error_type"], "Unhealthy");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "failed slowly: {:?}",
        started.elapsed()
    );
    worker.stop().await;

    let tei = start_tei(TeiConfig::instant()).await;
    tei.set_faults(Faults::failing_with(500));
    // Static membership: this is about the answers of a worker whose upstream fails (an
    // adaptive worker would leave the group; see tests/membership.rs).
    let worker = RunningWorker::start(
        &nats,
        &[
            "--tei-url",
            &tei.url,
            "--max-wait-time",
            "1ms",
            "--membership",
            "static",
        ],
    )
    .await;
    let (code, body) = request(&client, r#"{"inputs":"x"}"#).await;
    assert_eq!(code, 424, "{body}");
    assert_eq!(body["error_type"], "Backend");
    tei.set_faults(Faults::default());
    let (code, _) = request(&client, r#"{"inputs":"x"}"#).await;
    assert_eq!(
        code, 200,
        "the worker keeps serving once the upstream recovers"
    );
    worker.stop().await;
}

/// Sends `body` by hand with `Embatch-Deadline-Ms: deadline_ms` and waits up to 10 s, far past
/// the deadline, so that a late answer is seen as what it is (not through `embatch-client`,
/// whose own timeout is the budget); the status (200 or the error code) and the body.
async fn request_with_deadline(
    client: &async_nats::Client,
    body: &'static [u8],
    deadline_ms: u64,
) -> (u16, serde_json::Value) {
    let mut h = async_nats::HeaderMap::new();
    h.insert(headers::DEADLINE_MS, deadline_ms.to_string().as_str());
    let message = client
        .send_request(
            "embed",
            async_nats::Request::new()
                .payload(Bytes::from_static(body))
                .headers(h)
                .timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("a reply");
    let code = message
        .headers
        .as_ref()
        .and_then(|h| h.get(headers::SERVICE_ERROR_CODE))
        .and_then(|v| v.as_str().parse().ok())
        .unwrap_or(200);
    let body = serde_json::from_slice(&message.payload).expect("JSON");
    (code, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_deadline_gets_504_without_an_upstream_call() {
    let stack = stack(&[]).await;
    let (tei, client) = (&stack.base.tei, &stack.client);
    let (code, body) = request_with_deadline(client, br#"{"inputs":"late"}"#, 0).await;
    assert_eq!(code, 504, "{body}");
    assert_eq!(body["error_type"], "Timeout");
    assert!(
        tei.calls().is_empty(),
        "no upstream work for an expired request"
    );
    stack.base.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_shorter_than_one_upstream_call_gets_no_upstream_work() {
    // A 22 ms upstream; the worker learns its call time from three requests, then idles until
    // its moving estimate has faded (as on a quiet worker between bursts).
    let slow = TeiConfig {
        base: Duration::from_millis(22),
        ..TeiConfig::instant()
    };
    let stack = stack_on(slow, &[]).await;
    let (tei, client) = (&stack.base.tei, &stack.client);
    for text in ["warm a", "warm b", "warm c"] {
        let (code, body) =
            request(client, &serde_json::json!({ "inputs": text }).to_string()).await;
        assert_eq!(code, 200, "{body}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let calls = tei.calls().len();
    for deadline_ms in [1, 2, 5, 10, 15] {
        let (code, body) =
            request_with_deadline(client, br#"{"inputs":"too soon"}"#, deadline_ms).await;
        assert!(
            code == 429 || code == 504,
            "a {deadline_ms} ms deadline on a 22 ms upstream: {code} {body}"
        );
    }
    assert_eq!(
        tei.calls().len(),
        calls,
        "no upstream call for requests whose caller gives up before it ends"
    );
    // A cache hit within the deadline is still answered.
    let (code, body) = request_with_deadline(client, br#"{"inputs":"warm a"}"#, 15).await;
    assert_eq!(code, 200, "a cache hit needs no upstream call: {body}");
    // A deadline the upstream can meet is served.
    let (code, body) = request_with_deadline(client, br#"{"inputs":"in time"}"#, 2_000).await;
    assert_eq!(code, 200, "{body}");
    stack.base.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_queue_cap_requests_are_answered_429_at_once() {
    let stack = stack_on(
        TeiConfig {
            base: Duration::from_millis(800),
            ..TeiConfig::instant()
        },
        &[
            "--queue-cap",
            "4",
            "--max-batch-size",
            "4",
            "--max-concurrent-batches",
            "1",
            "--max-wait-time",
            "1ms",
        ],
    )
    .await;
    let client = &stack.client;
    let slow = {
        let client = client.clone();
        tokio::spawn(async move { request(&client, r#"{"inputs":["a","b","c","d"]}"#).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (code, body) = request(client, r#"{"inputs":"one too many"}"#).await;
    assert_eq!(code, 429, "{body}");
    assert_eq!(body["error_type"], "Overloaded");
    assert!(
        !slow.is_finished(),
        "the excess request was answered at once, not after the queue drained"
    );
    let (code, _) = slow.await.expect("slow request");
    assert_eq!(code, 200, "the accepted request is still served");
    stack.base.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_teis_error_body_and_nats_error_headers() {
    let stack = stack(&["--max-client-batch-size", "3"]).await;
    let (tei, client) = (&stack.base.tei, &stack.client);
    let cases = embatch_testkit::BAD_REQUESTS.iter().copied();
    for (body, status, kind, needle) in cases {
        let (code, reply) = request(client, body).await;
        assert_eq!(code, status, "{body} → {reply}");
        assert_eq!(reply["error_type"], kind, "{body}");
        let message = reply["error"].as_str().expect("error message");
        assert!(
            message.contains(needle),
            "{body}: {message:?} lacks {needle:?}"
        );
    }
    assert!(
        tei.calls().is_empty(),
        "bad requests never reach the upstream"
    );
    // And a good request after all of them still works.
    let (code, _) = request(client, r#"{"inputs":"fine"}"#).await;
    assert_eq!(code, 200);
    stack.base.worker.stop().await;
}

/// A body that is not JSON gets 400 `Validation` (TEI 1.9.3's answer) in the error header and
/// the error body, as a plain NATS request sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_json_is_400_in_the_error_header() {
    let stack = stack(&[]).await;
    let (tei, client) = (&stack.base.tei, &stack.client);
    let (status, kind, needle) = embatch_testkit::MALFORMED_JSON_ANSWER;
    for body in embatch_testkit::MALFORMED_JSON {
        let reply = client
            .request("embed", Bytes::from_static(body))
            .await
            .expect("a reply");
        let code = reply
            .headers
            .as_ref()
            .and_then(|h| h.get(headers::SERVICE_ERROR_CODE))
            .map(|v| v.as_str().to_owned());
        assert_eq!(
            code.as_deref(),
            Some(status.to_string().as_str()),
            "{body:?}"
        );
        let error: serde_json::Value = serde_json::from_slice(&reply.payload).expect("TEI's body");
        assert_eq!(error["error_type"], kind, "{body:?}: {error}");
        let message = error["error"].as_str().expect("error message");
        assert!(message.starts_with(needle), "{body:?}: {message:?}");
    }
    assert!(tei.calls().is_empty(), "nothing reaches the upstream");
    stack.base.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_registers_as_a_nats_micro_service() {
    let stack = stack(&[]).await;
    let client = &stack.client;
    let info = client
        .request("$SRV.INFO.embatch", Bytes::new())
        .await
        .expect("info reply");
    let info: serde_json::Value = serde_json::from_slice(&info.payload).expect("json");
    assert_eq!(info["name"], "embatch");
    assert_eq!(
        info["metadata"]["protocol_version"],
        embatch_protocol::PROTOCOL_VERSION
    );
    assert_eq!(info["metadata"]["model"], "embatch/tei-double");
    assert_eq!(info["metadata"]["default_model"], "true");
    let endpoints = info["endpoints"].as_array().expect("endpoints");
    let embed: Vec<_> = endpoints
        .iter()
        .filter(|e| e["name"] == "embed")
        .map(|e| (e["subject"].as_str(), e["queue_group"].as_str()))
        .collect();
    // Its model subject, and the plain subject (no EMBATCH_DEFAULT_MODEL: it serves both).
    assert_eq!(
        embed,
        [
            (Some("embed.embatch/tei-double"), Some("embatch")),
            (Some("embed"), Some("embatch"))
        ]
    );

    // Two good requests and one bad: `$SRV.STATS` counts the error (with its code and message)
    // while the error reply itself still carries TEI's error body.
    for body in [r#"{"inputs":"a"}"#, r#"{"inputs":["b"]}"#] {
        assert_eq!(request(client, body).await.0, 200);
    }
    let (code, body) = request(client, r#"{"inputs":[]}"#).await;
    assert_eq!(code, 400);
    assert_eq!(body["error_type"], "Empty", "{body}");
    let stats = client
        .request("$SRV.STATS.embatch", Bytes::new())
        .await
        .expect("stats reply");
    let stats: serde_json::Value = serde_json::from_slice(&stats.payload).expect("json");
    let embed = stats["endpoints"]
        .as_array()
        .expect("endpoints")
        .iter()
        .find(|e| e["name"] == "embed")
        .expect("stats of `embed`")
        .clone();
    assert_eq!(embed["num_requests"], 3, "{embed}");
    assert_eq!(embed["num_errors"], 1, "{embed}");
    let last_error = embed["last_error"].as_str().expect("last_error");
    assert!(
        last_error.contains("400") && last_error.contains("`inputs` cannot be empty"),
        "{last_error}"
    );
    stack.base.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tei_api_key_is_sent_as_a_bearer_token_and_never_logged() {
    use clap::Parser;
    let nats = NatsServer::start();
    let tei = start_tei(TeiConfig::instant()).await;
    let args = [
        "--tei-url",
        tei.url.as_str(),
        "--tei-api-key",
        "s3cret-token",
    ];
    let config = embatch_worker::Config::parse_from(["embatch-worker"].iter().chain(&args));
    assert!(
        !format!("{config:?}").contains("s3cret-token"),
        "the startup log line would leak the key"
    );
    let worker = RunningWorker::start(&nats, &args).await;
    let client = connect(&nats).await;
    let (code, _) = request(&client, r#"{"inputs":"x"}"#).await;
    assert_eq!(code, 200);
    let calls = tei.calls();
    assert_eq!(
        calls[0].authorization.as_deref(),
        Some("Bearer s3cret-token")
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_over_the_servers_max_payload_is_a_413_not_a_timeout() {
    let nats = NatsServer::start_with_max_payload("4096");
    let tei = start_tei(TeiConfig::instant()).await;
    let worker = RunningWorker::start(&nats, &["--tei-url", &tei.url]).await;
    let client = connect(&nats).await;
    let many = |n: usize| {
        serde_json::json!({ "inputs": (0..n).map(|i| format!("input {i}")).collect::<Vec<_>>() })
            .to_string()
    };

    // The first too-large reply is computed, then replaced by the 413 (the size was not known).
    let (code, body) = request(&client, &many(300)).await;
    assert_eq!(code, 413, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|m| m.contains("max_payload of 4096 bytes")),
        "{body}"
    );
    let calls = tei.calls().len();
    // Now the size per input is known: refused up front, with no upstream work.
    let (code, body) = request(&client, &many(200)).await;
    assert_eq!(code, 413, "{body}");
    assert_eq!(tei.calls().len(), calls, "refused before any upstream call");
    // Small requests are still served.
    let (code, body) = request(&client, &many(10)).await;
    assert_eq!(code, 200, "{body}");
    worker.stop().await;
}
