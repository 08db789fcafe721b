//! The bulk routes of one gateway (OpenAI's Files and Batches API), for the tests that run
//! bulk jobs.
#![allow(dead_code)] // not every test binary uses every helper

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};

use super::RunningGateway;

/// The bulk routes of one gateway.
pub struct Api {
    pub http: reqwest::Client,
    pub url: String,
    /// How long a read ([`Api::batch`], [`Api::content`]) is retried until it answers 200
    /// (while a JetStream leader is elected the routes answer 503 for a few seconds); zero: a
    /// read that does not answer 200 fails the test.
    pub retry: Duration,
}

impl Api {
    pub fn of(gateway: &RunningGateway) -> Api {
        Api {
            http: reqwest::Client::new(),
            url: gateway.url.clone(),
            retry: Duration::ZERO,
        }
    }

    /// The routes at `url`, each call given 10 s, reads retried for `retry`.
    pub fn at(url: &str, retry: Duration) -> Api {
        Api {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("HTTP client"),
            url: url.to_owned(),
            retry,
        }
    }

    pub async fn upload(&self, jsonl: String) -> (u16, Value) {
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
        let status = response.status().as_u16();
        (status, response.json().await.expect("JSON"))
    }

    pub async fn upload_ok(&self, jsonl: String) -> String {
        let (status, file) = self.upload(jsonl).await;
        assert_eq!(status, 200, "{file}");
        file["id"].as_str().expect("file id").to_owned()
    }

    /// Uploads `jsonl` and creates a batch of it with the 24h window; the batch id.
    pub async fn submit(&self, jsonl: String) -> String {
        let file_id = self.upload_ok(jsonl).await;
        self.create(&file_id, "24h").await["id"]
            .as_str()
            .expect("id")
            .to_owned()
    }

    /// `POST /v1/batches`; a 503 (JetStream briefly unavailable, e.g. a cluster still settling
    /// its leaders) is retried twice after 0.5 s, as the openai SDK retries it by default.
    pub async fn create(&self, file_id: &str, window: &str) -> Value {
        for attempt in 1.. {
            let response = self
                .http
                .post(format!("{}/v1/batches", self.url))
                .json(
                    &json!({"input_file_id": file_id, "endpoint": "/v1/embeddings",
                              "completion_window": window, "metadata": {"job": "test"}}),
                )
                .send()
                .await
                .expect("POST /v1/batches");
            let status = response.status().as_u16();
            let body: Value = response.json().await.expect("JSON");
            if status == 503 && attempt < 3 {
                println!("POST /v1/batches answered 503, retrying: {body}");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                continue;
            }
            assert_eq!(status, 200, "{body}");
            return body;
        }
        unreachable!("the loop returns or panics")
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .expect("GET");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// `GET path`'s body once it answers 200, retried every 200 ms for [`Api::retry`].
    async fn read(&self, path: &str) -> reqwest::Response {
        let started = std::time::Instant::now();
        loop {
            let last = match self.http.get(format!("{}{path}", self.url)).send().await {
                Ok(response) if response.status().as_u16() == 200 => return response,
                Ok(response) => format!(
                    "HTTP {}: {}",
                    response.status(),
                    response.text().await.unwrap_or_default()
                ),
                Err(err) => err.to_string(),
            };
            assert!(started.elapsed() < self.retry, "GET {path}: {last}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The batch `id` as `GET /v1/batches/{id}` answers it.
    pub async fn batch(&self, id: &str) -> Value {
        let response = self.read(&format!("/v1/batches/{id}")).await;
        response.json().await.expect("JSON")
    }

    /// The bytes of file `id` as `GET /v1/files/{id}/content` answers them, as text.
    pub async fn content(&self, id: &str) -> String {
        let response = self.read(&format!("/v1/files/{id}/content")).await;
        response.text().await.expect("text")
    }

    /// Polls the batch until `done` holds (at most `limit`), returning it.
    pub async fn wait(&self, id: &str, limit: Duration, done: impl Fn(&Value) -> bool) -> Value {
        let started = std::time::Instant::now();
        loop {
            let batch = self.batch(id).await;
            if done(&batch) {
                return batch;
            }
            assert!(started.elapsed() < limit, "batch never got there: {batch}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn wait_final(&self, id: &str, limit: Duration) -> Value {
        self.wait(id, limit, is_final).await
    }

    /// The lines of file `id` (none when `id` is null), by `custom_id`; panics on a repeat.
    pub async fn lines(&self, id: &Value) -> HashMap<String, Value> {
        let Some(id) = id.as_str() else {
            return HashMap::new();
        };
        let mut lines = HashMap::new();
        for line in self.content(id).await.lines() {
            let value: Value = serde_json::from_str(line).expect("a JSON line");
            let custom_id = value["custom_id"].as_str().expect("custom_id").to_owned();
            assert!(
                lines.insert(custom_id.clone(), value).is_none(),
                "{custom_id} appears twice"
            );
        }
        lines
    }

    /// How many times each `custom_id` appears in file `id` (none when `id` is null).
    pub async fn custom_ids(&self, id: &Value) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        let Some(id) = id.as_str() else {
            return counts;
        };
        for line in self.content(id).await.lines() {
            let value: Value = serde_json::from_str(line).expect("a JSON line");
            let custom_id = value["custom_id"].as_str().expect("custom_id").to_owned();
            *counts.entry(custom_id).or_default() += 1;
        }
        counts
    }
}

/// Whether the batch's status is final.
pub fn is_final(batch: &Value) -> bool {
    matches!(
        batch["status"].as_str(),
        Some("completed" | "failed" | "expired" | "cancelled")
    )
}
