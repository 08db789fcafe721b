//! The double's `POST /rerank`, in TEI 1.9.3's shapes: deterministic scores of (query, text)
//! pairs ([`crate::rerank_score`]), the same for a pair as `/predict` gives (the `predict`
//! module), as TEI computes both with the same classifier head.
//!
//! - `/rerank` `{"query", "texts", "raw_scores", "return_text", "truncate",
//!   "truncation_direction"}` → `[{"index", "text"?, "score"}, ...]` sorted by score, highest
//!   first; no texts → 400 `Empty` "`texts` cannot be empty"; more than
//!   `max_client_batch_size` → 422 `Validation` "batch size N > maximum allowed batch size M".
//! - A model that is not a reranker ([`crate::Config::reranker`] off) → 424 `Backend`, as TEI
//!   answers.
//!
//! Calls are recorded in the call log like `/embed`'s, their inputs as pairs and their options
//! as `{"route": "/rerank" | "/predict", "raw_scores": ...}`; a pair holding [`crate::POISON`]
//! is refused 422 as on `/embed`. Each call costs the cost model's time for its pairs.

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use embatch_protocol::rerank::{NOT_A_RERANKER, Rank};
use embatch_protocol::{EmbedError, Input, RerankRequest};

use crate::{AppState, POISON, error_response, injected_failure, precise_sleep};

/// `POST /rerank`.
pub(crate) async fn rerank(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let arrived = Instant::now();
    let request = match RerankRequest::from_slice(&body) {
        Ok(r) => r,
        Err(err) => return error_response(&err),
    };
    let pairs: Vec<Input> = request
        .texts
        .iter()
        .map(|t| Input::Pair(request.query.clone(), t.clone()))
        .collect();
    let options = serde_json::json!({
        "route": "/rerank", "raw_scores": request.raw_scores,
        "truncate": request.truncate, "truncation_direction": request.truncation_direction,
    });
    let checked = request
        .validate(state.config.max_client_batch_size)
        .and_then(|()| check(&state, &pairs));
    if let Err(response) = call(&state, (pairs, options, arrived), checked).await {
        return response;
    }
    let mut ranks: Vec<Rank> = request
        .texts
        .iter()
        .enumerate()
        .map(|(index, text)| Rank {
            index,
            text: request.return_text.then(|| text.clone()),
            score: crate::rerank_score(&request.query, text, request.raw_scores),
        })
        .collect();
    // As TEI: ascending, then reversed.
    ranks.sort_by(|a, b| a.score.total_cmp(&b.score));
    ranks.reverse();
    Json(ranks).into_response()
}

/// The model's and the poison checks of a call's pairs.
fn check(state: &AppState, pairs: &[Input]) -> Result<(), EmbedError> {
    if !state.config.reranker {
        return Err(EmbedError::Remote {
            status: 424,
            response: embatch_protocol::ErrorResponse {
                error: NOT_A_RERANKER.into(),
                error_type: embatch_protocol::ErrorType::Backend,
            },
        });
    }
    let poisoned = pairs.iter().position(|p| match p {
        Input::Pair(query, text) => query.contains(POISON) || text.contains(POISON),
        _ => false,
    });
    match poisoned {
        Some(i) => Err(EmbedError::Validation(format!(
            "pair {i} contains the poison marker `{POISON}`"
        ))),
        None => Ok(()),
    }
}

/// Records the call, applies the faults and the cost model: `Err` with the response to send
/// when the call fails (`checked`, or an injected failure). Shared by the double's routes other
/// than `/embed`.
pub(crate) async fn call(
    state: &AppState,
    (pairs, options, arrived): (Vec<Input>, serde_json::Value, Instant),
    checked: Result<(), EmbedError>,
) -> Result<(), Response> {
    let faults = state.faults();
    let cost = state.config.cost_of(&pairs);
    let status = faults
        .fail_with
        .unwrap_or_else(|| checked.as_ref().map_or_else(EmbedError::status, |()| 200));
    state.record(&pairs, || options, status, None, arrived);
    if let Some(status) = faults.injected().await {
        return Err(injected_failure(status));
    }
    checked.map_err(|err| error_response(&err))?;
    let Ok(_gpu) = state.gpu.acquire().await else {
        return Err(error_response(&EmbedError::Unavailable(
            "shutting down".into(),
        )));
    };
    precise_sleep(cost).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::tests::post_to as post;
    use crate::{Config, TeiDouble, logit, rerank_score};

    fn reranker() -> Config {
        Config {
            reranker: true,
            max_client_batch_size: 3,
            ..Config::instant()
        }
    }

    #[tokio::test]
    async fn rerank_and_predict_give_a_pair_the_same_score() {
        let tei = TeiDouble::spawn(reranker()).await.expect("spawn");
        for raw_scores in [false, true] {
            let body =
                serde_json::json!({"query": "q", "texts": ["a", "b"], "raw_scores": raw_scores});
            let (status, ranks) = post(&tei, "rerank", body).await;
            assert_eq!(status, 200, "{ranks}");
            let pairs =
                serde_json::json!({"inputs": [["q", "a"], ["q", "b"]], "raw_scores": raw_scores});
            let (status, predictions) = post(&tei, "predict", pairs).await;
            assert_eq!(status, 200, "{predictions}");
            for rank in ranks.as_array().expect("ranks") {
                let index = rank["index"].as_u64().expect("index") as usize;
                assert_eq!(
                    rank["score"], predictions[index][0]["score"],
                    "{ranks} {predictions}"
                );
                let text = ["a", "b"][index];
                let score = rank["score"].as_f64().expect("score") as f32;
                assert_eq!(score, rerank_score("q", text, raw_scores));
            }
        }
        let sigmoid = 1.0 / (1.0 + (-logit("q", "a")).exp());
        assert_eq!(rerank_score("q", "a", false), sigmoid);
        // A single pair is TEI's single shape: one list of predictions.
        let (status, single) =
            post(&tei, "predict", serde_json::json!({"inputs": ["q", "a"]})).await;
        assert_eq!(status, 200);
        assert_eq!(single[0]["label"], "LABEL_0");
        let routes: Vec<_> = tei
            .calls()
            .iter()
            .map(|c| c.options["route"].clone())
            .collect();
        assert_eq!(
            routes,
            ["/rerank", "/predict", "/rerank", "/predict", "/predict"]
        );
    }

    #[tokio::test]
    async fn errors_are_teis() {
        let tei = TeiDouble::spawn(reranker()).await.expect("spawn");
        let (status, err) = post(
            &tei,
            "rerank",
            serde_json::json!({"query": "q", "texts": []}),
        )
        .await;
        assert_eq!(
            (status, err["error_type"].as_str()),
            (400, Some("Empty")),
            "{err}"
        );
        let four = serde_json::json!({"query": "q", "texts": ["a", "b", "c", "d"]});
        let (status, err) = post(&tei, "rerank", four).await;
        assert_eq!(status, 422, "{err}");
        let pairs = serde_json::json!({"inputs": [["q", "a"], ["q", "b"], ["q", "c"], ["q", "d"]]});
        let (status, err) = post(&tei, "predict", pairs).await;
        assert_eq!(status, 422, "{err}");
        assert!(
            err["error"]
                .as_str()
                .is_some_and(|e| e.contains("batch size 4 > maximum"))
        );
        let embedder = TeiDouble::spawn(Config::instant()).await.expect("spawn");
        let (status, err) = post(
            &embedder,
            "rerank",
            serde_json::json!({"query": "q", "texts": ["a"]}),
        )
        .await;
        assert_eq!(
            (status, err["error_type"].as_str()),
            (424, Some("Backend")),
            "{err}"
        );
    }
}
