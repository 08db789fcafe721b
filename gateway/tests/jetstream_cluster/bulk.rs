//! A bulk job's input for the cluster tests (through `common::bulk_api`, whose reads are
//! retried: while a JetStream leader is being elected the routes answer 503 for a few seconds).

use std::time::Duration;

use serde_json::json;

use crate::common::bulk_api::Api;

/// The model the TEI double announces (what batch lines name).
const MODEL: &str = "embatch/tei-double";

/// A file of `lines` embedding lines (`custom_id` `line-<i>`).
pub fn input(lines: usize) -> String {
    (0..lines)
        .map(|i| {
            json!({"custom_id": custom_id(i), "method": "POST", "url": "/v1/embeddings",
                   "body": {"model": MODEL, "input": format!("bulk line {i}")}})
            .to_string()
                + "\n"
        })
        .collect()
}

/// `custom_id` of line `i`.
pub fn custom_id(i: usize) -> String {
    format!("line-{i}")
}

/// Polls the batch until at least `lines` of its lines are done (at most 20 s).
pub async fn wait_done_lines(api: &Api, id: &str, lines: u64) {
    let started =
        |batch: &serde_json::Value| batch["request_counts"]["completed"].as_u64() >= Some(lines);
    api.wait(id, Duration::from_secs(20), started).await;
}
