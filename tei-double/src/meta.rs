//! The double's `GET /info` (TEI 1.9.3's shape, its `model_type` from the configuration) and
//! `GET /health` (with the faults' statuses).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;

use crate::{AppState, MAX_INPUT_LENGTH};

pub(crate) async fn info(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let c = &state.config;
    Json(serde_json::json!({
        "model_id": c.model_id,
        "model_sha": null,
        "model_dtype": if c.pad_group.is_some() { "float32" } else { "float16" },
        "model_type": if c.reranker {
            serde_json::json!({"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}})
        } else if c.classifier {
            let labels = crate::CLASSIFIER_LABELS;
            let id2label: serde_json::Map<String, serde_json::Value> = labels
                .iter()
                .enumerate()
                .map(|(id, label)| (id.to_string(), serde_json::json!(label)))
                .collect();
            let label2id: serde_json::Map<String, serde_json::Value> = labels
                .iter()
                .enumerate()
                .map(|(id, label)| ((*label).to_owned(), serde_json::json!(id)))
                .collect();
            serde_json::json!({"classifier": {"id2label": id2label, "label2id": label2id}})
        } else if c.splade {
            serde_json::json!({"embedding": {"pooling": "splade"}})
        } else {
            serde_json::json!({"embedding": {"pooling": "mean"}})
        },
        "max_concurrent_requests": 512,
        "max_input_length": MAX_INPUT_LENGTH,
        "max_batch_tokens": 16384,
        "max_batch_requests": c.pad_group,
        "max_client_batch_size": c.max_client_batch_size,
        "auto_truncate": false,
        "tokenization_workers": 1,
        "version": env!("CARGO_PKG_VERSION"),
        "sha": null,
        "docker_label": "embatch-fake-upstream",
    }))
}

/// [`Faults::health_status`] when set; else 200, or 503 (as TEI answers while its model cannot
/// run) while [`Faults::fail_with`] holds a 5xx status: a failing server also fails its health
/// check.
pub(crate) async fn health(State(state): State<Arc<AppState>>) -> StatusCode {
    let faults = state.faults();
    if let Some(status) = faults
        .health_status
        .and_then(|s| StatusCode::from_u16(s).ok())
    {
        return status;
    }
    if faults.fail_with.is_some_and(|status| status >= 500) {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}
