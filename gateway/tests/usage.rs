//! `GET /v1/usage` counts what a tenant's bulk jobs embedded, apart from its interactive
//! requests: lines, inputs and the tokens the worker counted with the model's tokenizer.

mod common;

use std::time::Duration;

use common::bulk_api::Api;
use common::start_gateway_at;
use embatch_local_model::Encoder;
use embatch_protocol::Input;
use embatch_testkit::{NatsServer, RunningWorker, TeiConfig, model_dir, start_tei};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_jobs_lines_inputs_and_tokens_are_in_the_days_usage() {
    let nats = NatsServer::start_jetstream();
    let tei = start_tei(TeiConfig::instant()).await;
    let tokenizer = model_dir().join("tokenizer.json");
    let worker = RunningWorker::start(
        &nats,
        &[
            "--tei-url",
            tei.url.as_str(),
            "--tokenizer",
            tokenizer.to_str().expect("UTF-8 path"),
        ],
    )
    .await;
    let gateway = start_gateway_at(&nats.url(), &[], None).await;
    let api = Api::of(&gateway);
    let texts: Vec<String> = (0..6).map(|i| format!("a bulk line number {i}")).collect();
    let jsonl: String = texts
        .iter()
        .enumerate()
        .map(|(i, text)| {
            json!({"custom_id": format!("u-{i}"), "method": "POST", "url": "/v1/embeddings",
                   "body": {"model": "embatch/tei-double", "input": [text, "and a second input"]}})
            .to_string()
                + "\n"
        })
        .collect();
    let id = api.submit(jsonl).await;
    let batch = api.wait_final(&id, Duration::from_secs(30)).await;
    assert_eq!(batch["status"], "completed", "{batch}");

    // What the model's own tokenizer counts, special tokens included.
    let encoder = Encoder::load_file(&tokenizer, 256).expect("tokenizer");
    let count = |text: &str| {
        u64::from(
            encoder
                .count(&[Input::from(text)], None, None)
                .expect("counts")[0],
        )
    };
    let tokens: u64 = texts
        .iter()
        .map(|t| count(t) + count("and a second input"))
        .sum();
    // Counts reach the bucket within the flush interval (5 s).
    let started = std::time::Instant::now();
    let usage = loop {
        let (status, usage) = api.get("/v1/usage").await;
        assert_eq!(status, 200, "{usage}");
        if usage["bulk_lines"] == 6 || started.elapsed() > Duration::from_secs(15) {
            break usage;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let want: Value = json!({"bulk_lines": 6, "bulk_inputs": 12, "bulk_tokens": tokens});
    for field in ["bulk_lines", "bulk_inputs", "bulk_tokens"] {
        assert_eq!(usage[field], want[field], "{field}: {usage}");
    }
    assert_eq!(usage["requests"], 0, "no interactive request: {usage}");
    worker.stop().await;
}
