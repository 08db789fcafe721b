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
}

impl Api {
    pub fn of(gateway: &RunningGateway) -> Api {
        Api {
            http: reqwest::Client::new(),
            url: gateway.url.clone(),
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

    pub async fn create(&self, file_id: &str, window: &str) -> Value {
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
        assert_eq!(response.status().as_u16(), 200);
        response.json().await.expect("JSON")
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

    pub async fn batch(&self, id: &str) -> Value {
        let (status, batch) = self.get(&format!("/v1/batches/{id}")).await;
        assert_eq!(status, 200, "{batch}");
        batch
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
        self.wait(id, limit, |b| {
            matches!(
                b["status"].as_str(),
                Some("completed" | "failed" | "expired" | "cancelled")
            )
        })
        .await
    }

    /// The lines of file `id` (none when `id` is null), by `custom_id`; panics on a repeat.
    pub async fn lines(&self, id: &Value) -> HashMap<String, Value> {
        let Some(id) = id.as_str() else {
            return HashMap::new();
        };
        let text = self
            .http
            .get(format!("{}/v1/files/{id}/content", self.url))
            .send()
            .await
            .expect("GET content")
            .text()
            .await
            .expect("text");
        let mut lines = HashMap::new();
        for line in text.lines() {
            let value: Value = serde_json::from_str(line).expect("a JSON line");
            let custom_id = value["custom_id"].as_str().expect("custom_id").to_owned();
            assert!(
                lines.insert(custom_id.clone(), value).is_none(),
                "{custom_id} appears twice"
            );
        }
        lines
    }
}
