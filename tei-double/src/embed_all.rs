//! The double's `POST /embed_all`, in TEI 1.9.3's shapes: deterministic token vectors
//! ([`crate::token_embeddings`]).
//!
//! - `{"inputs", "truncate", "truncation_direction", "prompt_name"}` (`inputs` as `/embed`'s)
//!   → `[[[f32; dim]; tokens]; inputs]`: one vector per token of each input.
//! - No inputs or an empty one → 400 `Empty`; more than `max_client_batch_size` → 422
//!   `Validation`; an input holding [`crate::POISON`] → 422, as on `/embed`.
//! - A classifier or reranker → 424 `Backend` "Model is not an embedding model"; a SPLADE
//!   model → 424 "`embed_all` is not available for SPLADE models", as TEI answers.
//!
//! Calls are recorded in the call log, their options as `{"route": "/embed_all", "truncate",
//! "truncation_direction", "prompt_name"}`. Each call costs the cost model's time.

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use embatch_protocol::embed_all::{EmbedAllRequest, NOT_AN_EMBEDDING_MODEL, NOT_FOR_SPLADE};
use embatch_protocol::{EmbedError, ErrorResponse, ErrorType, Input};

use crate::rerank::call;
use crate::{AppState, Config, POISON, error_response};

/// `POST /embed_all`.
pub(crate) async fn embed_all(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let arrived = Instant::now();
    let request = match EmbedAllRequest::from_slice(&body) {
        Ok(r) => r,
        Err(err) => return error_response(&err),
    };
    let options = serde_json::json!({
        "route": "/embed_all", "truncate": request.truncate,
        "truncation_direction": request.truncation_direction,
        "prompt_name": request.prompt_name,
    });
    let checked = request
        .validate(state.config.max_client_batch_size)
        .and_then(|()| check(&state.config, request.inputs.as_slice()));
    let inputs = request.inputs.into_vec();
    let dim = state.config.dim;
    let lists: Vec<Vec<Vec<f32>>> = inputs.iter().map(|i| token_embeddings(i, dim)).collect();
    if let Err(response) = call(&state, (inputs, options, arrived), checked).await {
        return response;
    }
    Json(lists).into_response()
}

/// The double's token vectors of one input: [`crate::tokens_of`] tokens, token `t`'s vector the
/// [`crate::embedding_of`] (not normalized, `dim` floats) of the input with `#t` appended to its
/// JSON text. Equal inputs get equal vectors; each token a vector of its own.
pub fn token_embeddings(input: &Input, dim: usize) -> Vec<Vec<f32>> {
    let key = serde_json::to_string(input).unwrap_or_default();
    (0..crate::tokens_of(input))
        .map(|t| crate::embedding(&format!("{key}#{t}"), dim, None, false))
        .collect()
}

/// The model's and the poison checks of a call's inputs.
fn check(config: &Config, inputs: &[Input]) -> Result<(), EmbedError> {
    let refused = if config.reranker || config.classifier {
        Some(NOT_AN_EMBEDDING_MODEL)
    } else if config.splade {
        Some(NOT_FOR_SPLADE)
    } else {
        None
    };
    if let Some(error) = refused {
        return Err(EmbedError::Remote {
            status: 424,
            response: ErrorResponse {
                error: error.into(),
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
