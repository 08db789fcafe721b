//! The double's `POST /predict`, in TEI 1.9.3's shapes: deterministic predictions of texts and
//! pairs ([`crate::predictions`]).
//!
//! - `{"inputs": "text" | ["q", "t"] | [["text"], ["q", "t"], ...], "raw_scores", "truncate",
//!   "truncation_direction"}`, read as TEI reads it ([`PredictRequest`]) → one list of
//!   predictions `[{"score", "label"}, ...]` for a single sequence, one per sequence for a batch.
//! - A batch of more than `max_client_batch_size` → 422 `Validation` "batch size N > maximum
//!   allowed batch size M"; an empty text → 400 `Empty`; a sequence holding [`crate::POISON`] →
//!   422, as on `/embed`.
//! - A model that neither classifies nor reranks ([`crate::Config::classifier`] and
//!   [`crate::Config::reranker`] off) → 424 `Backend` "Model is not a classifier model", as TEI
//!   answers.
//!
//! Calls are recorded in the call log like `/embed`'s, their sequences as inputs (texts and
//! pairs) and their options as `{"route": "/predict", "raw_scores", "truncate",
//! "truncation_direction"}`. Each call costs the cost model's time for its sequences.

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use embatch_protocol::predict::{NOT_A_CLASSIFIER, PredictRequest, Prediction};
use embatch_protocol::{EmbedError, ErrorResponse, ErrorType, Input};

use crate::rerank::call;
use crate::{AppState, Config, POISON, error_response};

/// The labels of the double's classifier ([`Config::classifier`]), by id.
pub const CLASSIFIER_LABELS: [&str; 3] = ["negative", "neutral", "positive"];

/// The label of the double's reranker: a classifier with one class, as TEI's rerankers.
pub const RERANKER_LABEL: &str = "LABEL_0";

/// `POST /predict`.
pub(crate) async fn predict(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let arrived = Instant::now();
    let request = match PredictRequest::from_slice(&body) {
        Ok(r) => r,
        Err(err) => return error_response(&err),
    };
    let raw_scores = request.raw_scores;
    let options = serde_json::json!({
        "route": "/predict", "raw_scores": raw_scores,
        "truncate": request.truncate, "truncation_direction": request.truncation_direction,
    });
    let checked = request
        .validate(state.config.max_client_batch_size)
        .and_then(|()| check(&state.config, request.inputs.as_slice()));
    let (inputs, _, single) = request.into_parts();
    let lists: Vec<Vec<Prediction>> = inputs
        .iter()
        .map(|input| predictions(&state.config, input, raw_scores))
        .collect();
    if let Err(response) = call(&state, (inputs, options, arrived), checked).await {
        return response;
    }
    if single {
        Json(lists.into_iter().next().unwrap_or_default()).into_response()
    } else {
        Json(lists).into_response()
    }
}

/// The double's predictions of one sequence (a text, or a pair scored together), highest score
/// first, as TEI 1.9.3 sorts them (ascending, then reversed):
/// - a reranker: one prediction, [`RERANKER_LABEL`], scored [`crate::rerank_score`] (a text
///   alone is scored as the pair `("", text)`);
/// - a classifier: one per [`CLASSIFIER_LABELS`], each label's logit [`crate::logit`] of the
///   sequence and the label, then their softmax unless `raw_scores`;
/// - neither: none (the route answers 424).
pub fn predictions(config: &Config, input: &Input, raw_scores: bool) -> Vec<Prediction> {
    let (first, second) = match input {
        Input::Text(text) => ("", text.as_str()),
        Input::Pair(first, second) => (first.as_str(), second.as_str()),
        Input::Ids(_) => return Vec::new(),
    };
    let mut predictions = if config.reranker {
        vec![Prediction {
            score: crate::rerank_score(first, second, raw_scores),
            label: RERANKER_LABEL.to_owned(),
        }]
    } else if config.classifier {
        classify(first, second, raw_scores)
    } else {
        Vec::new()
    };
    predictions.sort_by(|a, b| a.score.total_cmp(&b.score));
    predictions.reverse();
    predictions
}

/// The classifier's predictions of `(first, second)`, in label order.
fn classify(first: &str, second: &str, raw_scores: bool) -> Vec<Prediction> {
    let logits: Vec<f32> = CLASSIFIER_LABELS
        .iter()
        .map(|label| crate::logit(first, &format!("{second}\u{1}{label}")))
        .collect();
    let scores = if raw_scores {
        logits
    } else {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
        let sum: f32 = exps.iter().sum();
        exps.into_iter().map(|e| e / sum).collect()
    };
    CLASSIFIER_LABELS
        .iter()
        .zip(scores)
        .map(|(label, score)| Prediction {
            score,
            label: (*label).to_owned(),
        })
        .collect()
}

/// The model's and the poison checks of a call's sequences.
fn check(config: &Config, inputs: &[Input]) -> Result<(), EmbedError> {
    if !config.reranker && !config.classifier {
        return Err(EmbedError::Remote {
            status: 424,
            response: ErrorResponse {
                error: NOT_A_CLASSIFIER.into(),
                error_type: ErrorType::Backend,
            },
        });
    }
    let poisoned = inputs.iter().position(|input| match input {
        Input::Pair(first, second) => first.contains(POISON) || second.contains(POISON),
        other => other.as_text().is_some_and(|t| t.contains(POISON)),
    });
    match poisoned {
        Some(i) => Err(EmbedError::Validation(format!(
            "sequence {i} contains the poison marker `{POISON}`"
        ))),
        None => Ok(()),
    }
}
