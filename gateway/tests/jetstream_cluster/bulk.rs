//! A bulk job through the gateway's Files and Batches routes, read back to check that every
//! line is in the output exactly once. Reads are retried: while a JetStream leader is being
//! elected the routes answer 503 for a few seconds.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The model the TEI double announces (what batch lines name).
const MODEL: &str = "embatch/tei-double";

/// The bulk routes of one gateway.
pub struct Api {
    http: reqwest::Client,
    url: String,
}

impl Api {
    pub fn new(url: &str) -> Api {
        Api {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("HTTP client"),
            url: url.to_owned(),
        }
    }

    /// Uploads a file of `lines` embedding lines (`custom_id` `line-<i>`) and creates a batch
    /// of it; the batch id.
    pub async fn submit(&self, lines: usize) -> String {
        let jsonl: String = (0..lines)
            .map(|i| {
                json!({"custom_id": custom_id(i), "method": "POST", "url": "/v1/embeddings",
                       "body": {"model": MODEL, "input": format!("bulk line {i}")}})
                .to_string()
                    + "\n"
            })
            .collect();
        let form = reqwest::multipart::Form::new()
            .text("purpose", "batch")
            .part(
                "file",
                reqwest::multipart::Part::bytes(jsonl.into_bytes()).file_name("input.jsonl"),
            );
        let response = self
            .http
            .post(format!("{}/v1/files", self.url))
            .multipart(form)
            .send()
            .await
            .expect("POST /v1/files");
        assert_eq!(response.status().as_u16(), 200, "upload");
        let file: Value = response.json().await.expect("JSON");
        let response = self
            .http
            .post(format!("{}/v1/batches", self.url))
            .json(
                &json!({"input_file_id": file["id"], "endpoint": "/v1/embeddings",
                          "completion_window": "24h"}),
            )
            .send()
            .await
            .expect("POST /v1/batches");
        let status = response.status().as_u16();
        let batch: Value = response.json().await.expect("JSON");
        assert_eq!(status, 200, "create: {batch}");
        batch["id"].as_str().expect("batch id").to_owned()
    }

    /// `GET path` as JSON, retried every 200 ms for at most 20 s until it answers 200.
    async fn get(&self, path: &str) -> Value {
        let started = Instant::now();
        loop {
            let response = self.http.get(format!("{}{path}", self.url)).send().await;
            let last = match response {
                Ok(r) if r.status().as_u16() == 200 => match r.json().await {
                    Ok(value) => return value,
                    Err(err) => err.to_string(),
                },
                Ok(r) => format!("HTTP {}", r.status()),
                Err(err) => err.to_string(),
            };
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "GET {path}: {last} for 20 s"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The batch `id` as `GET /v1/batches/{id}` answers it.
    pub async fn batch(&self, id: &str) -> Value {
        self.get(&format!("/v1/batches/{id}")).await
    }

    /// Polls the batch until its status is final (at most `limit`).
    pub async fn wait_final(&self, id: &str, limit: Duration) -> Value {
        let started = Instant::now();
        loop {
            let batch = self.batch(id).await;
            if is_final(&batch) {
                return batch;
            }
            assert!(started.elapsed() < limit, "batch not done: {batch}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Polls the batch until at least `lines` of its lines are done (at most 20 s).
    pub async fn wait_done_lines(&self, id: &str, lines: u64) {
        let started = Instant::now();
        loop {
            let batch = self.batch(id).await;
            if batch["request_counts"]["completed"].as_u64() >= Some(lines) {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "batch did not start: {batch}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// How many times each `custom_id` appears in file `id` (none when `id` is null).
    pub async fn custom_ids(&self, id: &Value) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        let Some(id) = id.as_str() else {
            return counts;
        };
        let response = self
            .http
            .get(format!("{}/v1/files/{id}/content", self.url))
            .send()
            .await
            .expect("GET content");
        assert_eq!(response.status().as_u16(), 200, "file {id}");
        for line in response.text().await.expect("text").lines() {
            let value: Value = serde_json::from_str(line).expect("a JSON line");
            let custom_id = value["custom_id"].as_str().expect("custom_id").to_owned();
            *counts.entry(custom_id).or_default() += 1;
        }
        counts
    }
}

/// `custom_id` of line `i`.
pub fn custom_id(i: usize) -> String {
    format!("line-{i}")
}

/// Whether the batch's status is final.
pub fn is_final(batch: &Value) -> bool {
    matches!(
        batch["status"].as_str(),
        Some("completed" | "failed" | "expired" | "cancelled")
    )
}
