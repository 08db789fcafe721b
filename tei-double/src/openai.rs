//! The double as an OpenAI-compatible embeddings server (vLLM, Infinity and the like), for the
//! worker's `OPENAI_URL` upstream: `POST /v1/embeddings` and `GET /v1/models`.
//!
//! - The body is OpenAI's: `model` (must be the double's `model_id`, else 404
//!   `model_not_found`), `input` (a text, texts, token ids or arrays of token ids),
//!   `encoding_format` (`float` or absent; anything else is 400) and `dimensions`.
//! - The vectors are the ones `/embed` answers for the same inputs (normalized, cut to
//!   `dimensions`), at the same cost and under the same concurrency limit; each call is
//!   recorded in the same [`CallLog`](crate::CallLog), its `options` being
//!   `{"model", "encoding_format", "dimensions"}` as sent.
//! - `data` lists the embeddings in REVERSE order, each with its `index`: the API promises
//!   the index, not the order, so a client that ignores `index` gets the wrong vectors here.
//! - Errors have OpenAI's body, `{"error": {"message", "type", "param", "code"}}`: a request
//!   OpenAI would refuse (empty input, more than `max_client_batch_size` inputs, `dimensions`
//!   above the dimension, a [`POISON`](crate::POISON) input) is 400 `invalid_request_error`;
//!   the [`Faults`](crate::Faults) apply as on `/embed` (a delay, every call failing, a poisoned
//!   input failing after its compute time); `/v1/models` follows `/health`'s faults.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use embatch_protocol::Input;
use serde::Deserialize;

use crate::{AppState, embedding_of, poisoned, precise_sleep, tokens_of};

/// The double's OpenAI routes, merged into its router.
pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(models))
}

/// OpenAI's `POST /v1/embeddings` body (the fields the double reads).
#[derive(Deserialize)]
struct EmbeddingsRequest {
    model: String,
    input: OpenAiInput,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<usize>,
}

/// OpenAI's `input`: one text, texts, one input's token ids, or several inputs' token ids.
#[derive(Deserialize)]
#[serde(untagged)]
enum OpenAiInput {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

impl OpenAiInput {
    fn into_inputs(self) -> Vec<Input> {
        match self {
            OpenAiInput::Text(text) => vec![Input::Text(text)],
            OpenAiInput::Texts(texts) => texts.into_iter().map(Input::Text).collect(),
            OpenAiInput::Ids(ids) => vec![Input::Ids(ids)],
            OpenAiInput::IdLists(lists) => lists.into_iter().map(Input::Ids).collect(),
        }
    }
}

/// OpenAI's error answer: `status` with `{"error": {"message", "type", "param", "code"}}`.
fn openai_error(status: u16, message: String, code: Option<&str>) -> Response {
    let kind = match status {
        400..=499 => "invalid_request_error",
        _ => "server_error",
    };
    let body = serde_json::json!({
        "error": {"message": message, "type": kind, "param": null, "code": code}
    });
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(body)).into_response()
}

/// What OpenAI refuses in `request` of `inputs` (400, or 404 for another model).
fn check(
    state: &AppState,
    request: &EmbeddingsRequest,
    inputs: &[Input],
    poison_rejected: bool,
) -> Result<(), (u16, String, Option<&'static str>)> {
    let config = &state.config;
    let invalid = |message: String| Err((400, message, None));
    if request.model != config.model_id {
        let message = format!("The model `{}` does not exist.", request.model);
        return Err((404, message, Some("model_not_found")));
    }
    if request
        .encoding_format
        .as_deref()
        .is_some_and(|f| f != "float")
    {
        return invalid("the double writes only encoding_format `float`".into());
    }
    if inputs.is_empty() || inputs.iter().any(Input::is_empty) {
        return invalid("'$.input' is invalid: an input is empty".into());
    }
    if inputs.len() > config.max_client_batch_size {
        return invalid(format!(
            "at most {} inputs per request, given {}",
            config.max_client_batch_size,
            inputs.len()
        ));
    }
    if request.dimensions.is_some_and(|d| d == 0 || d > config.dim) {
        return invalid(format!("`dimensions` must be 1 to {}", config.dim));
    }
    if let Some(i) = poisoned(inputs).filter(|_| poison_rejected) {
        return invalid(format!("input {i} contains the poison marker"));
    }
    Ok(())
}

async fn embeddings(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let arrived = Instant::now();
    let mut request: EmbeddingsRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(err) => return openai_error(400, format!("invalid body: {err}"), None),
    };
    let faults = state.faults();
    let options = serde_json::json!({
        "model": request.model,
        "encoding_format": request.encoding_format,
        "dimensions": request.dimensions,
    });
    let dimensions = request.dimensions;
    let inputs =
        std::mem::replace(&mut request.input, OpenAiInput::Texts(Vec::new())).into_inputs();
    let checked = check(&state, &request, &inputs, faults.poison_status.is_none());
    let model_failure = faults.model_failure(checked.is_ok(), &inputs);
    let status = faults
        .fail_with
        .or_else(|| checked.as_ref().err().map(|(status, ..)| *status))
        .or(model_failure.map(|(status, _)| status))
        .unwrap_or(200);
    state.record(&inputs, || options, status, Some(&headers), arrived);
    if let Some(status) = faults.injected().await {
        return openai_error(status, format!("injected failure ({status})"), None);
    }
    if let Err((status, message, code)) = checked {
        return openai_error(status, message, code);
    }
    let Ok(gpu) = state.gpu.acquire().await else {
        return openai_error(503, "shutting down".into(), None);
    };
    precise_sleep(state.config.cost_of(&inputs)).await;
    drop(gpu);
    if let Some((status, i)) = model_failure {
        return openai_error(status, format!("the model failed on input {i}"), None);
    }
    reply(&inputs, state.config.dim, dimensions, &request.model)
}

/// OpenAI's reply: each input's vector (as `/embed`'s, normalized) listed in reverse order with
/// its `index`, the model and the token usage.
fn reply(inputs: &[Input], dim: usize, dimensions: Option<usize>, model: &str) -> Response {
    let tokens: u64 = inputs.iter().map(|i| u64::from(tokens_of(i))).sum();
    let data: Vec<serde_json::Value> = inputs
        .iter()
        .enumerate()
        .rev()
        .map(|(index, input)| {
            serde_json::json!({
                "object": "embedding",
                "index": index,
                "embedding": embedding_of(input, dim, dimensions, true),
            })
        })
        .collect();
    axum::Json(serde_json::json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response()
}

/// OpenAI's `GET /v1/models`: the double's model; the status `/health` would answer under the
/// faults when that is not 200.
async fn models(State(state): State<Arc<AppState>>) -> Response {
    let health = crate::meta::health(State(Arc::clone(&state))).await;
    if health != StatusCode::OK {
        return openai_error(health.as_u16(), "unhealthy".into(), None);
    }
    axum::Json(serde_json::json!({
        "object": "list",
        "data": [{"id": state.config.model_id, "object": "model", "owned_by": "embatch"}],
    }))
    .into_response()
}
