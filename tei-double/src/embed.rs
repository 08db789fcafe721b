//! The double's `POST /embed`: TEI 1.9.3's body and reply, the cost model's time per call, the
//! call log, and the faults (see the crate's documentation).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, header};
use axum::response::{IntoResponse, Response};
use embatch_protocol::{EmbedError, EmbedRequest, Input};

use crate::{
    AppState, Config, POISON, embedding_of, error_response, failure, injected_failure, poisoned,
    precise_sleep,
};

/// TEI's validation of `request`; a [`POISON`] input fails it only when `poison_rejected`.
fn check(request: &EmbedRequest, config: &Config, poison_rejected: bool) -> Result<(), EmbedError> {
    request.validate(config.max_client_batch_size)?;
    if let Some(i) = poisoned(request.inputs.as_slice()).filter(|_| poison_rejected) {
        return Err(EmbedError::Validation(format!(
            "input {i} contains the poison marker `{POISON}`"
        )));
    }
    if let Some(d) = request.dimensions
        && d > config.dim
    {
        return Err(EmbedError::Validation(format!(
            "`dimensions` must be at most {}. Given: {d}",
            config.dim
        )));
    }
    Ok(())
}

pub(crate) async fn embed(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let arrived = Instant::now();
    let request = match EmbedRequest::from_slice(&body) {
        Ok(r) => r,
        Err(err) => return error_response(&err),
    };
    let request_options = request.options();
    let normalize = request.normalize;
    let dimensions = request.dimensions;
    let faults = state.faults();
    let checked = check(&request, &state.config, faults.poison_status.is_none());
    let inputs = request.inputs.into_vec();
    // A model failure on a poisoned input: answered after the call's compute time.
    let model_failure = faults.model_failure(checked.is_ok(), &inputs);
    let status = faults
        .fail_with
        .unwrap_or_else(|| match (&checked, model_failure) {
            (Err(err), _) => err.status(),
            (Ok(()), Some((status, _))) => status,
            (Ok(()), None) => 200,
        });
    let options = || serde_json::to_value(request_options).unwrap_or(serde_json::Value::Null);
    state.record(&inputs, options, status, Some(&headers), arrived);
    if let Some(status) = faults.injected().await {
        return injected_failure(status);
    }
    if let Err(err) = checked {
        return error_response(&err);
    }

    let Ok(gpu) = state.gpu.acquire().await else {
        // The semaphore is never closed; answer as TEI would if it were shutting down.
        return error_response(&EmbedError::Unavailable("shutting down".into()));
    };
    let queue_time = arrived.elapsed();
    let cost = state.config.cost_of(&inputs);
    precise_sleep(cost).await;
    // The simulated GPU is free again: building and serializing the reply is not part of the cost.
    drop(gpu);
    if let Some((status, i)) = model_failure {
        return failure(
            status,
            format!("the model failed on input {i} (`{POISON}`)"),
        );
    }
    // That CPU work (about 1 ms for 32 vectors of 384 floats) runs on the blocking pool: done
    // here, it would delay the next call, which the semaphore just woke into this runtime
    // thread's LIFO slot, so the simulated GPU would idle while this reply is serialized.
    let body = match vectors_json(inputs, state.config.dim, dimensions, normalize).await {
        Ok(body) => body,
        Err(err) => return error_response(&err),
    };
    (reply_headers(arrived, queue_time, cost), body).into_response()
}

/// TEI's reply headers: the content type and its `x-*-time` headers (ms).
fn reply_headers(
    arrived: Instant,
    queue_time: Duration,
    cost: Duration,
) -> [(HeaderName, String); 5] {
    [
        (header::CONTENT_TYPE, "application/json".to_string()),
        (
            HeaderName::from_static("x-compute-type"),
            "tei-double".to_string(),
        ),
        (
            HeaderName::from_static("x-compute-time"),
            arrived.elapsed().as_millis().to_string(),
        ),
        (
            HeaderName::from_static("x-queue-time"),
            queue_time.as_millis().to_string(),
        ),
        (
            HeaderName::from_static("x-inference-time"),
            cost.as_millis().to_string(),
        ),
    ]
}

/// TEI's reply body: the JSON array of the inputs' vectors, built on the blocking pool.
async fn vectors_json(
    inputs: Vec<Input>,
    dim: usize,
    dimensions: Option<usize>,
    normalize: bool,
) -> Result<Vec<u8>, EmbedError> {
    let body = tokio::task::spawn_blocking(move || {
        let vectors: Vec<Vec<f32>> = inputs
            .iter()
            .map(|input| embedding_of(input, dim, dimensions, normalize))
            .collect();
        serde_json::to_vec(&vectors)
    })
    .await;
    match body {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(err)) => Err(EmbedError::Backend(format!("cannot encode: {err}"))),
        Err(err) => Err(EmbedError::Backend(format!("reply task failed: {err}"))),
    }
}
