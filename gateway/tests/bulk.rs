//! OpenAI's Files and Batches APIs end to end: a real `nats-server -js` on a temporary store, the
//! TEI double, in-process workers and gateways.

mod common;

use std::time::Duration;

use common::bulk_api::Api;
use common::start_gateway_at;
use embatch_testkit::{NatsServer, POISON, RunningWorker, TeiConfig, TeiDouble, start_tei};
use serde_json::{Value, json};

/// The model the TEI double announces: what the workers serve, so what a batch line names.
const MODEL: &str = "embatch/tei-double";

fn openai_line(custom_id: &str, text: &str) -> String {
    json!({"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
           "body": {"model": MODEL, "input": text}})
    .to_string()
}

fn jsonl(lines: impl IntoIterator<Item = String>) -> String {
    lines.into_iter().map(|l| l + "\n").collect()
}

/// A JetStream server, the TEI double `tei` and one worker with `worker_args`.
async fn stack(tei: TeiConfig, worker_args: &[&str]) -> (NatsServer, TeiDouble, RunningWorker) {
    let nats = NatsServer::start_jetstream();
    let tei = start_tei(tei).await;
    let mut args = vec!["--tei-url", tei.url.as_str()];
    args.extend(worker_args);
    let worker = RunningWorker::start(&nats, &args).await;
    (nats, tei, worker)
}

fn slow_tei(base: Duration) -> TeiConfig {
    TeiConfig {
        base,
        concurrency: 1,
        ..TeiConfig::instant()
    }
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_runs_end_to_end_through_files_and_batches() {
    let (nats, _tei, worker) = stack(TeiConfig::instant(), &["--bulk-chunk-inputs", "4"]).await;
    let gateway = start_gateway_at(&nats.url(), &[], None).await;
    let api = Api::of(&gateway);
    let events = async_nats::connect(nats.url()).await.expect("connect");
    let mut finished = events
        .subscribe("embatch.bulk.v1.events.>")
        .await
        .expect("subscribe");

    let mut lines: Vec<String> = (0..20)
        .map(|i| openai_line(&format!("req-{i}"), &format!("text {i}")))
        .collect();
    lines.push(
        json!({"custom_id": "tei-0", "method": "POST", "url": "/embed",
               "body": {"inputs": ["a", "b"]}})
        .to_string(),
    );
    lines.push(
        json!({"custom_id": "b64", "method": "POST", "url": "/v1/embeddings",
               "body": {"model": MODEL, "input": ["text 1"], "encoding_format": "base64"}})
        .to_string(),
    );
    let file_id = api.upload_ok(jsonl(lines)).await;
    let (status, file) = api.get(&format!("/v1/files/{file_id}")).await;
    assert_eq!(status, 200);
    assert_eq!(file["purpose"], "batch");
    assert_eq!(file["object"], "file");
    assert_eq!(file["filename"], "input.jsonl");

    let created = api.create(&file_id, "24h").await;
    assert_eq!(created["status"], "validating");
    assert_eq!(created["object"], "batch");
    assert_eq!(created["metadata"]["job"], "test");
    let id = created["id"].as_str().expect("id").to_owned();
    let batch = api.wait_final(&id, Duration::from_secs(30)).await;
    assert_eq!(batch["status"], "completed", "{batch}");
    assert_eq!(
        batch["request_counts"],
        json!({"total": 22, "completed": 22, "failed": 0})
    );
    assert!(batch["error_file_id"].is_null());
    for field in [
        "in_progress_at",
        "finalizing_at",
        "completed_at",
        "expires_at",
    ] {
        assert!(batch[field].is_u64(), "{field}: {batch}");
    }

    let output = api.lines(&batch["output_file_id"]).await;
    assert_eq!(output.len(), 22);
    for i in 0..20 {
        let line = &output[&format!("req-{i}")];
        assert_eq!(line["response"]["status_code"], 200);
        assert!(line["error"].is_null());
        let body = &line["response"]["body"];
        assert_eq!(body["object"], "list");
        assert_eq!(body["model"], MODEL);
        let vector: Vec<f32> =
            serde_json::from_value(body["data"][0]["embedding"].clone()).expect("floats");
        assert!(close(
            &vector,
            &embatch_testkit::double_vector(&format!("text {i}"))
        ));
    }
    let tei_body = &output["tei-0"]["response"]["body"];
    assert_eq!(tei_body.as_array().map(Vec::len), Some(2), "{tei_body}");
    let b64 = output["b64"]["response"]["body"]["data"][0]["embedding"]
        .as_str()
        .expect("a base64 string");
    assert!(!b64.is_empty());

    // Told by a message, not only by polling.
    let event = tokio::time::timeout(
        Duration::from_secs(5),
        futures::StreamExt::next(&mut finished),
    )
    .await
    .expect("an event")
    .expect("a message");
    let event: Value = serde_json::from_slice(&event.payload).expect("JSON");
    assert_eq!(event["id"], id.as_str());
    assert_eq!(event["status"], "completed");

    let (status, page) = api.get("/v1/batches?limit=1").await;
    assert_eq!(status, 200);
    assert_eq!(page["object"], "list");
    assert_eq!(page["data"][0]["id"], id.as_str());
    let (status, files) = api.get("/v1/files").await;
    assert_eq!(status, 200);
    assert_eq!(files["data"].as_array().map(Vec::len), Some(2), "{files}");
    let deleted = api
        .http
        .delete(format!("{}/v1/files/{file_id}", api.url))
        .send()
        .await
        .expect("DELETE");
    assert_eq!(deleted.status().as_u16(), 200);
    let (status, _) = api.get(&format!("/v1/files/{file_id}")).await;
    assert_eq!(status, 404);
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_the_model_rejects_goes_to_the_error_file_and_its_mates_succeed() {
    let (nats, tei, worker) = stack(TeiConfig::instant(), &[]).await;
    let gateway = start_gateway_at(&nats.url(), &[], None).await;
    let api = Api::of(&gateway);
    let lines = vec![
        openai_line("good-0", "fine"),
        openai_line("bad", &format!("a {POISON} here")),
        openai_line("good-1", "also fine"),
    ];
    let id = api.submit(jsonl(lines)).await;
    let batch = api.wait_final(&id, Duration::from_secs(30)).await;
    assert_eq!(batch["status"], "completed", "{batch}");
    assert_eq!(
        batch["request_counts"],
        json!({"total": 3, "completed": 2, "failed": 1})
    );
    let output = api.lines(&batch["output_file_id"]).await;
    let errors = api.lines(&batch["error_file_id"]).await;
    assert_eq!(output.len(), 2);
    assert!(output.contains_key("good-0") && output.contains_key("good-1"));
    let bad = &errors["bad"];
    assert_eq!(bad["response"]["status_code"], 422, "{bad}");
    let message = bad["response"]["body"]["error"]["message"]
        .as_str()
        .expect("OpenAI's error shape");
    assert!(message.contains("poison"), "TEI's reason: {message}");
    assert!(tei.calls().len() >= 2, "the batch was retried line by line");
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_batch_delivers_what_finished_and_each_line_once() {
    // One input per call (bulk inputs share calls otherwise), 150 ms each.
    let (nats, _tei, worker) = stack(
        slow_tei(Duration::from_millis(150)),
        &["--bulk-chunk-inputs", "1", "--max-batch-size", "1"],
    )
    .await;
    let gateway = start_gateway_at(&nats.url(), &[], None).await;
    let api = Api::of(&gateway);
    let n = 40;
    let id = api
        .submit(jsonl(
            (0..n).map(|i| openai_line(&format!("c-{i}"), &format!("t{i}"))),
        ))
        .await;
    api.wait(&id, Duration::from_secs(30), |b| {
        b["request_counts"]["completed"].as_u64() >= Some(2)
    })
    .await;
    let cancel = api
        .http
        .post(format!("{}/v1/batches/{id}/cancel", api.url))
        .send()
        .await
        .expect("cancel");
    assert_eq!(cancel.status().as_u16(), 200);
    let cancelling: Value = cancel.json().await.expect("JSON");
    assert!(
        matches!(
            cancelling["status"].as_str(),
            Some("cancelling" | "cancelled")
        ),
        "{cancelling}"
    );
    let batch = api.wait_final(&id, Duration::from_secs(30)).await;
    assert_eq!(batch["status"], "cancelled", "{batch}");
    assert!(batch["cancelled_at"].is_u64() && batch["cancelling_at"].is_u64());
    let output = api.lines(&batch["output_file_id"]).await;
    let errors = api.lines(&batch["error_file_id"]).await;
    assert!(
        output.len() >= 2 && output.len() < n,
        "{} done",
        output.len()
    );
    assert_eq!(output.len() + errors.len(), n, "every line once");
    assert!(output.keys().all(|k| !errors.contains_key(k)));
    assert!(
        errors
            .values()
            .all(|e| e["error"]["code"] == "batch_cancelled")
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_past_its_window_expires_and_delivers_what_finished() {
    // One input per call (bulk inputs share calls otherwise), 200 ms each.
    let (nats, _tei, worker) = stack(
        slow_tei(Duration::from_millis(200)),
        &["--bulk-chunk-inputs", "1", "--max-batch-size", "1"],
    )
    .await;
    let gateway =
        start_gateway_at(&nats.url(), &["--bulk-completion-windows", "24h,2s"], None).await;
    let api = Api::of(&gateway);
    let n = 60; // 12 s of upstream work: far beyond the window
    let file_id = api
        .upload_ok(jsonl(
            (0..n).map(|i| openai_line(&format!("e-{i}"), &format!("t{i}"))),
        ))
        .await;
    let created = api.create(&file_id, "2s").await;
    assert_eq!(
        created["expires_at"].as_u64(),
        created["created_at"].as_u64().map(|c| c + 2)
    );
    let id = created["id"].as_str().expect("id").to_owned();
    let batch = api.wait_final(&id, Duration::from_secs(30)).await;
    assert_eq!(batch["status"], "expired", "{batch}");
    assert!(batch["expired_at"].is_u64());
    let output = api.lines(&batch["output_file_id"]).await;
    let errors = api.lines(&batch["error_file_id"]).await;
    assert!(
        !output.is_empty() && output.len() < n,
        "{} done",
        output.len()
    );
    assert_eq!(output.len() + errors.len(), n, "every line once");
    assert!(
        errors
            .values()
            .all(|e| e["error"]["code"] == "batch_expired")
    );

    // A window the gateway does not accept names the field and the accepted values.
    let refused = api
        .http
        .post(format!("{}/v1/batches", api.url))
        .json(
            &json!({"input_file_id": file_id, "endpoint": "/v1/embeddings",
                      "completion_window": "1h"}),
        )
        .send()
        .await
        .expect("POST");
    assert_eq!(refused.status().as_u16(), 400);
    let body: Value = refused.json().await.expect("JSON");
    assert_eq!(body["error"]["param"], "completion_window", "{body}");
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_restart_mid_job_loses_nothing() {
    let (nats, _tei, worker) = stack(
        slow_tei(Duration::from_millis(50)),
        &["--bulk-chunk-inputs", "2"],
    )
    .await;
    let first = start_gateway_at(&nats.url(), &[], None).await;
    let api = Api::of(&first);
    let n = 30;
    let id = api
        .submit(jsonl(
            (0..n).map(|i| openai_line(&format!("g-{i}"), &format!("t{i}"))),
        ))
        .await;
    api.wait(&id, Duration::from_secs(30), |b| {
        b["status"] == "in_progress"
    })
    .await;
    first.kill().await;

    let second = start_gateway_at(&nats.url(), &[], None).await;
    let api = Api::of(&second);
    let batch = api.wait_final(&id, Duration::from_secs(30)).await;
    assert_eq!(batch["status"], "completed", "{batch}");
    let output = api.lines(&batch["output_file_id"]).await;
    assert_eq!(output.len(), n);
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_lines_fail_the_batch_with_openais_errors_list() {
    let (nats, _tei, worker) = stack(TeiConfig::instant(), &[]).await;
    let gateway = start_gateway_at(&nats.url(), &[], None).await;
    let api = Api::of(&gateway);
    let lines = vec![
        openai_line("a", "x"),
        "{not json".to_owned(),
        openai_line("a", "repeated id"),
        json!({"custom_id": "c", "url": "/v1/chat/completions", "body": {}}).to_string(),
        json!({"custom_id": "d", "url": "/v1/embeddings", "body": {"model": "other", "input": "x"}})
            .to_string(),
    ];
    let id = api.submit(jsonl(lines)).await;
    let batch = api.wait_final(&id, Duration::from_secs(30)).await;
    assert_eq!(batch["status"], "failed", "{batch}");
    assert!(batch["failed_at"].is_u64());
    assert_eq!(batch["errors"]["object"], "list");
    let errors: Vec<(String, u64)> = batch["errors"]["data"]
        .as_array()
        .expect("errors")
        .iter()
        .map(|e| {
            (
                e["code"].as_str().unwrap_or_default().to_owned(),
                e["line"].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        errors,
        [
            ("invalid_json".to_owned(), 2),
            ("duplicate_custom_id".to_owned(), 3),
            ("invalid_url".to_owned(), 4),
            ("model_not_found".to_owned(), 5),
        ]
    );

    // A purpose other than `batch` and a missing file are refused at once.
    let (status, body) = api.get("/v1/files/file-nope").await;
    assert_eq!(status, 404, "{body}");
    let form = reqwest::multipart::Form::new()
        .text("purpose", "fine-tune")
        .part(
            "file",
            reqwest::multipart::Part::bytes(b"{}\n".to_vec()).file_name("x.jsonl"),
        );
    let refused = api
        .http
        .post(format!("{}/v1/files", api.url))
        .multipart(form)
        .send()
        .await
        .expect("POST");
    assert_eq!(refused.status().as_u16(), 400);
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_jetstream_the_bulk_routes_answer_503_and_embed_still_works() {
    let nats = NatsServer::start();
    let tei = start_tei(TeiConfig::instant()).await;
    let worker = RunningWorker::start(&nats, &["--tei-url", tei.url.as_str()]).await;
    let gateway = start_gateway_at(&nats.url(), &[], None).await;
    let api = Api::of(&gateway);
    let (status, body) = api.upload("{}\n".to_owned()).await;
    assert_eq!(status, 503, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("JetStream"), "{message}");
    let (status, _) = api.get("/v1/batches").await;
    assert_eq!(status, 503);

    let embedded = common::json_post(
        &api.http,
        &format!("{}/embed", api.url),
        r#"{"inputs":"still here"}"#,
    )
    .send()
    .await
    .expect("POST /embed");
    assert_eq!(embedded.status().as_u16(), 200);
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_beyond_the_body_limit_upload_whole_and_beyond_the_file_limit_are_413() {
    let nats = NatsServer::start_jetstream();
    let gateway = start_gateway_at(
        &nats.url(),
        &[
            "--max-body-bytes",
            "65536",
            "--bulk-max-file-bytes",
            "3000000",
        ],
        None,
    )
    .await;
    let api = Api::of(&gateway);
    // 2.5 MB: far over MAX_BODY_BYTES (an embedding request's limit), under the file limit.
    let big: String = jsonl((0..25_000).map(|i| format!("{{\"custom_id\":\"{i:080}\"}}")));
    assert!(big.len() > 2_400_000 && big.len() < 3_000_000);
    let (status, file) = api.upload(big.clone()).await;
    assert_eq!(status, 200, "{file}");
    assert_eq!(file["bytes"].as_u64(), Some(big.len() as u64));
    let id = file["id"].as_str().expect("id");
    let content = api.content(id).await;
    assert!(content == big, "the content comes back byte for byte");

    // Just over the limit, so the client has sent (nearly) all of it when the 413 comes.
    let over = big.clone() + &big[..600_000];
    assert!(over.len() > 3_000_000 && over.len() < 3_200_000);
    let (status, body) = api.upload(over).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["param"], "file", "{body}");
    // A fresh client: the gateway closed the connection of the refused upload, whose body it
    // did not read to the end, and a pooled connection may be that one.
    let (_, files) = Api::of(&gateway).get("/v1/files").await;
    assert_eq!(
        files["data"].as_array().map(Vec::len),
        Some(1),
        "nothing kept of it: {files}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_backlog_never_causes_an_interactive_429() {
    // One call at a time upstream, 100 ms each; 640 bulk chunks of one input, of which a worker
    // holds 16 at once (16 inputs a call): 4 s of backlog.
    let n = 640;
    let (nats, _tei, worker) = stack(
        slow_tei(Duration::from_millis(100)),
        &["--bulk-chunk-inputs", "1"],
    )
    .await;
    let gateway = start_gateway_at(&nats.url(), &[], None).await;
    let api = Api::of(&gateway);
    let id = api
        .submit(jsonl(
            (0..n).map(|i| openai_line(&format!("p-{i}"), &format!("t{i}"))),
        ))
        .await;
    api.wait(&id, Duration::from_secs(30), |b| {
        b["request_counts"]["completed"].as_u64() >= Some(1)
    })
    .await;
    // Interactive requests, four at a time, during the backlog: every one is served.
    for round in 0..5 {
        let requests: Vec<_> = (0..4)
            .map(|i| {
                let url = format!("{}/embed", api.url);
                let http = api.http.clone();
                tokio::spawn(async move {
                    common::json_post(&http, &url, format!(r#"{{"inputs":"i {round} {i}"}}"#))
                        .send()
                        .await
                        .map(|r| r.status().as_u16())
                })
            })
            .collect();
        for request in requests {
            assert_eq!(request.await.expect("joins").expect("HTTP"), 200);
        }
    }
    let batch = api.batch(&id).await;
    assert!(
        batch["request_counts"]["completed"].as_u64() < Some(n),
        "the bulk backlog was still there: {batch}"
    );
    let batch = api.wait_final(&id, Duration::from_secs(30)).await;
    assert_eq!(batch["status"], "completed", "{batch}");
    worker.stop().await;
}

/// What schemathesis found: a `limit` out of range and an id no KV key or object name can be
/// are answered in OpenAI's JSON error shape (400 naming `limit`, 404), never axum's plain-text
/// rejection nor a 503 from JetStream's key check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_limit_is_400_and_an_impossible_id_is_404_in_openai_shape() {
    let nats = NatsServer::start_jetstream();
    let gateway = start_gateway_at(&nats.url(), &[], None).await;
    let api = Api::of(&gateway);
    let error_of = |response: reqwest::Response| async move {
        let status = response.status().as_u16();
        let kind = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        assert_eq!(kind, "application/json", "status {status}");
        let body: Value = response.json().await.expect("JSON");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        (status, body)
    };
    for (path, max) in [("/v1/batches", 100), ("/v1/files", 10_000)] {
        for limit in ["-1", "0", "abc", &(max + 1).to_string()] {
            let response = api
                .http
                .get(format!("{}{path}?limit={limit}", api.url))
                .send()
                .await
                .expect("GET");
            let (status, body) = error_of(response).await;
            assert_eq!(status, 400, "{path}?limit={limit}: {body}");
            assert_eq!(body["error"]["param"], "limit", "{body}");
            let message = body["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains(&max.to_string()), "{message}");
        }
        let (status, page) = api.get(&format!("{path}?limit={max}")).await;
        assert_eq!(status, 200, "{page}");
    }
    for id in ["bad.", ".bad", "0..0", "a%2Ab", "a%20b", "%FF", "a..b%3E"] {
        for (method, path) in [
            (reqwest::Method::GET, format!("/v1/batches/{id}")),
            (reqwest::Method::POST, format!("/v1/batches/{id}/cancel")),
            (reqwest::Method::GET, format!("/v1/files/{id}")),
            (reqwest::Method::GET, format!("/v1/files/{id}/content")),
            (reqwest::Method::DELETE, format!("/v1/files/{id}")),
        ] {
            let response = api
                .http
                .request(method.clone(), format!("{}{path}", api.url))
                .send()
                .await
                .expect("request");
            let (status, body) = error_of(response).await;
            assert_eq!(status, 404, "{method} {path}: {body}");
            assert_eq!(body["error"]["code"], "not_found", "{body}");
        }
    }
}

/// Work items stranded below their consumer's ack floor (stored, never delivered again: what a
/// nats-server restart left once after a worker's `kill -9`) are given back by the workers'
/// sweep, and the batch completes. The stranded state is made exactly: the model's `bulk-items-`
/// consumer is created first with a filter that misses the batch's items, moves its ack floor
/// past them on another message, and only then gets the items filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_stranded_below_the_ack_floor_are_swept_back() {
    use async_nats::jetstream::consumer::{AckPolicy, pull};
    use embatch_protocol::bulk::{items_consumer, items_filter, items_subject};

    let nats = NatsServer::start_jetstream();
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let store = embatch_bulk::BulkStore::open(client)
        .await
        .expect("JetStream");
    let config = |filter: String| pull::Config {
        durable_name: Some(items_consumer(MODEL)),
        filter_subject: filter,
        ack_policy: AckPolicy::Explicit,
        ack_wait: Duration::from_secs(1),
        max_deliver: -1,
        ..Default::default()
    };
    let elsewhere = items_subject(MODEL, "batch_elsewhere");
    store
        .work
        .create_consumer(config(elsewhere.clone()))
        .await
        .expect("consumer");
    let (_tei, worker) = {
        let tei = start_tei(TeiConfig::instant()).await;
        let args = [
            "--tei-url",
            tei.url.as_str(),
            "--bulk-chunk-inputs",
            "1",
            "--bulk-ack-wait",
            "1s",
        ];
        let worker = RunningWorker::start(&nats, &args).await;
        (tei, worker)
    };
    let gateway = start_gateway_at(&nats.url(), &[], None).await;
    let api = Api::of(&gateway);
    let lines = (0..3).map(|i| openai_line(&format!("req-{i}"), &format!("text {i}")));
    let id = api.submit(jsonl(lines)).await;
    api.wait(&id, Duration::from_secs(30), |b| {
        b["status"] == "in_progress"
    })
    .await;
    // An item of a batch that does not exist: the worker acks it, the floor passes the batch's.
    let ack = store
        .js
        .publish(
            elsewhere,
            json!({"batch_id": "batch_elsewhere", "chunk": 0, "lines": []})
                .to_string()
                .into(),
        )
        .await
        .expect("publish")
        .await
        .expect("stored");
    let mut consumer = store
        .work
        .get_consumer::<pull::Config>(&items_consumer(MODEL))
        .await
        .expect("consumer");
    let started = std::time::Instant::now();
    while consumer
        .info()
        .await
        .expect("info")
        .ack_floor
        .stream_sequence
        < ack.sequence
    {
        assert!(started.elapsed() < Duration::from_secs(10), "never acked");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    store
        .work
        .update_consumer(config(items_filter(MODEL)))
        .await
        .expect("update the filter");
    let info = consumer.info().await.expect("info");
    assert_eq!(
        (info.num_pending, info.num_ack_pending),
        (0, 0),
        "the items must be stranded: {info:?}"
    );
    let batch = api.wait_final(&id, Duration::from_secs(30)).await;
    assert_eq!(batch["status"], "completed", "{batch}");
    assert_eq!(
        batch["request_counts"],
        json!({"total": 3, "completed": 3, "failed": 0})
    );
    worker.stop().await;
}

/// A batch runs on the workers of the model its lines name (one model per batch, as OpenAI
/// requires), a batch naming none on the default model, and a batch naming a model nobody
/// serves fails validation with `model_not_found`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_runs_on_the_workers_of_its_model() {
    let nats = NatsServer::start_jetstream();
    let (a, b) = ("model-a", "org/model-b.v2");
    let tei_of = |model_id: &str| {
        start_tei(TeiConfig {
            model_id: model_id.into(),
            ..TeiConfig::instant()
        })
    };
    let (tei_a, tei_b) = (tei_of(a).await, tei_of(b).await);
    let default = ["--default-model", a, "--bulk-chunk-inputs", "1"];
    let worker_a = RunningWorker::start(
        &nats,
        &[&["--tei-url", tei_a.url.as_str()], &default[..]].concat(),
    )
    .await;
    let worker_b = RunningWorker::start(
        &nats,
        &[&["--tei-url", tei_b.url.as_str()], &default[..]].concat(),
    )
    .await;
    let gateway = start_gateway_at(&nats.url(), &["--default-model", a], None).await;
    let api = Api::of(&gateway);
    let line = |id: String, model: Option<&str>| {
        let mut body = json!({"input": format!("bulk {id}")});
        if let Some(model) = model {
            body["model"] = json!(model);
        }
        json!({"custom_id": id, "method": "POST", "url": "/v1/embeddings", "body": body})
            .to_string()
    };

    let for_b = api
        .submit(jsonl((0..4).map(|i| line(format!("b-{i}"), Some(b)))))
        .await;
    let batch = api.wait_final(&for_b, Duration::from_secs(30)).await;
    assert_eq!(batch["status"], "completed", "{batch}");
    let output = api.lines(&batch["output_file_id"]).await;
    assert!(output.values().all(|l| l["response"]["body"]["model"] == b));
    // Items pulled together may share an upstream call: count inputs, not calls.
    let inputs = |tei: &TeiDouble| -> usize { tei.calls().iter().map(|c| c.inputs.len()).sum() };
    assert_eq!(inputs(&tei_b), 4, "b's items went to b's workers");
    assert!(tei_a.calls().is_empty(), "a got none of b's items");

    let for_default = api
        .submit(jsonl((0..3).map(|i| line(format!("d-{i}"), None))))
        .await;
    let batch = api.wait_final(&for_default, Duration::from_secs(30)).await;
    assert_eq!(batch["status"], "completed", "{batch}");
    assert_eq!(inputs(&tei_a), 3, "no model: the default model");
    assert_eq!(inputs(&tei_b), 4);

    let unknown = api
        .submit(jsonl([line("u-0".into(), Some("nobody"))]))
        .await;
    let batch = api.wait_final(&unknown, Duration::from_secs(30)).await;
    assert_eq!(batch["status"], "failed", "{batch}");
    let error = &batch["errors"]["data"][0];
    assert_eq!(error["code"], "model_not_found", "{batch}");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains(a) && m.contains(b)),
        "lists the models served: {error}"
    );
    worker_a.stop().await;
    worker_b.stop().await;
}
