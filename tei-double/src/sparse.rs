//! The double's `POST /embed_sparse`, in TEI 1.9.3's shapes: deterministic sparse embeddings
//! ([`crate::sparse_embedding`]).
//!
//! - `{"inputs", "truncate", "truncation_direction", "prompt_name"}` (`inputs` as `/embed`'s)
//!   → `[[{"index", "value"}, ...], ...]`, one list per input, indices ascending (TEI lists the
//!   non-zero values of the pooled vector in order).
//! - No inputs or an empty one → 400 `Empty`; more than `max_client_batch_size` → 422
//!   `Validation` "batch size N > maximum allowed batch size M"; an input holding
//!   [`crate::POISON`] → 422, as on `/embed`.
//! - A model that is not a SPLADE model ([`crate::Config::splade`] off) → 424 `Backend`
//!   "Model is not an embedding model with SPLADE pooling", as TEI answers.
//!
//! Calls are recorded in the call log like `/embed`'s, their options as
//! `{"route": "/embed_sparse", "truncate", "truncation_direction", "prompt_name"}`. Each call
//! costs the cost model's time for its inputs.

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use embatch_protocol::sparse::{NOT_SPLADE, SparseValue};
use embatch_protocol::{EmbedError, ErrorResponse, ErrorType, Input, SparseRequest};

use crate::rerank::call;
use crate::{AppState, POISON, error_response};

/// The vocabulary size of the double's sparse model (BERT's, as SPLADE models use).
pub const SPARSE_VOCAB: u32 = 30_522;

/// `POST /embed_sparse`.
pub(crate) async fn embed_sparse(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let arrived = Instant::now();
    let request = match SparseRequest::from_slice(&body) {
        Ok(r) => r,
        Err(err) => return error_response(&err),
    };
    let options = serde_json::json!({
        "route": "/embed_sparse", "truncate": request.truncate,
        "truncation_direction": request.truncation_direction,
        "prompt_name": request.prompt_name,
    });
    let checked = request
        .validate(state.config.max_client_batch_size)
        .and_then(|()| check(&state, request.inputs.as_slice()));
    let inputs = request.inputs.into_vec();
    let lists: Vec<Vec<SparseValue>> = inputs.iter().map(sparse_embedding).collect();
    if let Err(response) = call(&state, (inputs, options, arrived), checked).await {
        return response;
    }
    Json(lists).into_response()
}

/// The double's deterministic sparse embedding of one input: 1 to 16 non-zero values at
/// indices below [`SPARSE_VOCAB`], ascending, each in (0, 3), from a 64-bit FNV-1a hash of the
/// input's JSON text expanded with splitmix64 (what a SPLADE model's `log(1 + relu)` max-pooled
/// logits look like: few, positive). Equal inputs get equal embeddings.
pub fn sparse_embedding(input: &Input) -> Vec<SparseValue> {
    let key = serde_json::to_string(input).unwrap_or_default();
    let mut state = crate::vectors::fnv1a(key.as_bytes());
    let n = 1 + crate::vectors::splitmix64(&mut state) % 16;
    let mut values: Vec<SparseValue> = (0..n)
        .map(|_| {
            let bits = crate::vectors::splitmix64(&mut state);
            SparseValue {
                index: u32::try_from((bits >> 32) % u64::from(SPARSE_VOCAB)).unwrap_or(0),
                // 24 random bits → (0, 3).
                value: ((bits & 0xFF_FFFF) as f32 + 1.0) / (1u32 << 24) as f32 * 3.0,
            }
        })
        .collect();
    values.sort_by_key(|v| v.index);
    values.dedup_by_key(|v| v.index);
    values
}

/// The model's and the poison checks of a call's inputs.
fn check(state: &AppState, inputs: &[Input]) -> Result<(), EmbedError> {
    if !state.config.splade {
        return Err(EmbedError::Remote {
            status: 424,
            response: ErrorResponse {
                error: NOT_SPLADE.into(),
                error_type: ErrorType::Backend,
            },
        });
    }
    match crate::poisoned(inputs) {
        Some(i) => Err(EmbedError::Validation(format!(
            "input {i} contains the poison marker `{POISON}`"
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use crate::{Config, TeiDouble};

    async fn post(tei: &TeiDouble, body: serde_json::Value) -> (u16, serde_json::Value) {
        crate::tests::post_to(tei, "embed_sparse", body).await
    }

    #[tokio::test]
    async fn sparse_embeddings_in_teis_shape_deterministic_per_input() {
        let splade = Config {
            splade: true,
            ..Config::instant()
        };
        let tei = TeiDouble::spawn(splade).await.expect("double");
        let (status, body) = post(&tei, serde_json::json!({"inputs": ["a", "b", "a"]})).await;
        assert_eq!(status, 200, "{body}");
        let lists = body.as_array().expect("a list per input");
        assert_eq!(lists.len(), 3);
        assert_eq!(lists[0], lists[2], "same input, same embedding");
        assert_ne!(lists[0], lists[1]);
        let values = lists[0].as_array().expect("values");
        assert!(!values.is_empty());
        let indices: Vec<u64> = values
            .iter()
            .map(|v| v["index"].as_u64().expect("index"))
            .collect();
        assert!(indices.windows(2).all(|w| w[0] < w[1]), "{indices:?}");
        assert!(
            values
                .iter()
                .all(|v| v["value"].as_f64().expect("value") > 0.0)
        );
        let (status, single) = post(&tei, serde_json::json!({"inputs": "a"})).await;
        assert_eq!((status, &single[0]), (200, &lists[0]));
        let (status, body) = post(&tei, serde_json::json!({"inputs": []})).await;
        assert_eq!((status, body["error_type"].as_str()), (400, Some("Empty")));
        let calls = tei.calls();
        assert_eq!(calls.len(), 3);
        assert_eq!(calls[0].options["route"], "/embed_sparse");
    }

    #[tokio::test]
    async fn a_dense_model_answers_424_as_tei() {
        let tei = TeiDouble::spawn(Config::instant()).await.expect("double");
        let (status, body) = post(&tei, serde_json::json!({"inputs": "a"})).await;
        assert_eq!(status, 424);
        assert_eq!(
            body,
            serde_json::json!({"error": super::NOT_SPLADE, "error_type": "Backend"})
        );
    }
}
