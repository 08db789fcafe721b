//! Rerank on a TEI upstream: one call per batch of (query, text) pairs, whoever sent them.
//!
//! TEI 1.9.3 scores a pair the same way on both of its routes: `/rerank` and `/predict` each
//! call its `predict` on the pair encoded as one dual input, and apply the sigmoid to the one
//! logit unless `raw_scores` (docs/design/rerank.md). So:
//! - a batch whose pairs share one query goes to `POST /rerank` (`{"query", "texts",
//!   "raw_scores", ...}`): the route a TEI user would call, and the query is sent once;
//! - a batch of several queries (pairs of different callers) goes to `POST /predict` with a
//!   batch of pairs (`{"inputs": [["q", "t"], ...], "raw_scores", ...}`), one call for all.
//!
//! Either way each pair's score comes back as a one-element array (`[0.93]`), in input order.

use bytes::Bytes;
use embatch_protocol::{EmbedOptions, Input, TruncationDirection};
use serde::{Deserialize, Serialize};

use super::tei::TeiUpstream;
use super::{Embedding, UpstreamError};

/// TEI 1.9.3's `POST /rerank` body, as the worker sends it (never `return_text`).
#[derive(Serialize)]
struct RerankBody<'a> {
    query: &'a str,
    texts: Vec<&'a str>,
    raw_scores: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    truncate: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    truncation_direction: Option<TruncationDirection>,
}

/// TEI 1.9.3's `POST /predict` body with a batch of pairs.
#[derive(Serialize)]
struct PredictBody<'a> {
    inputs: Vec<[&'a str; 2]>,
    raw_scores: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    truncate: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    truncation_direction: Option<TruncationDirection>,
}

/// One rank of TEI's `/rerank` reply (its `text` is never asked for).
#[derive(Deserialize)]
struct Rank {
    index: usize,
    score: f32,
}

/// One prediction of TEI's `/predict` reply.
#[derive(Deserialize)]
struct Prediction {
    score: f32,
}

impl TeiUpstream {
    /// Scores `pairs` (every input an [`Input::Pair`]) in one call: `/rerank` when they share
    /// one query, else `/predict` (see the module docs).
    ///
    /// # Errors
    /// As `/embed`'s call (unreachable, timeout, TEI's error passed through); a reply that is not
    /// TEI's shape, or scores another set of texts than was sent, is [`UpstreamError::Malformed`]
    /// or [`UpstreamError::CountMismatch`].
    pub(super) async fn rerank(
        &self,
        pairs: &[Input],
        options: &EmbedOptions,
        raw_scores: bool,
    ) -> Result<Vec<Embedding>, UpstreamError> {
        let split: Vec<[&str; 2]> = pairs
            .iter()
            .map(|input| match input {
                Input::Pair(query, text) => Ok([query.as_str(), text.as_str()]),
                _ => Err(UpstreamError::Malformed(
                    "a rerank call holds an input that is not a (query, text) pair".into(),
                )),
            })
            .collect::<Result<_, _>>()?;
        let one_query = split.windows(2).all(|w| w[0][0] == w[1][0]);
        let (truncate, truncation_direction) = (options.truncate, options.truncation_direction);
        let scores = match split.first() {
            None => Vec::new(),
            Some([query, _]) if one_query => {
                let body = RerankBody {
                    query,
                    texts: split.iter().map(|[_, text]| *text).collect(),
                    raw_scores,
                    truncate,
                    truncation_direction,
                };
                let reply = self.post("rerank", &body).await?;
                from_ranks(&reply, split.len())?
            }
            Some(_) => {
                let body = PredictBody {
                    inputs: split.clone(),
                    raw_scores,
                    truncate,
                    truncation_direction,
                };
                let reply = self.post("predict", &body).await?;
                from_predictions(&reply, split.len())?
            }
        };
        scores
            .into_iter()
            .map(|score| {
                serde_json::to_vec(&[score])
                    .map(Embedding::from_json)
                    .map_err(|e| UpstreamError::Malformed(format!("score {score}: {e}")))
            })
            .collect()
    }

    /// `POST {tei_url}/{route}` with the JSON `body`: the reply body, or the error by cause
    /// (see [`TeiUpstream::post_bytes`]).
    pub(super) async fn post(
        &self,
        route: &str,
        body: &impl Serialize,
    ) -> Result<Bytes, UpstreamError> {
        let body = serde_json::to_vec(body)
            .map_err(|e| UpstreamError::Malformed(format!("cannot write the {route} body: {e}")))?;
        self.post_bytes(route, Bytes::from(body)).await
    }
}

/// The scores of TEI's `/rerank` reply (sorted by score), back in text order.
fn from_ranks(reply: &[u8], sent: usize) -> Result<Vec<f32>, UpstreamError> {
    let ranks: Vec<Rank> = serde_json::from_slice(reply)
        .map_err(|e| UpstreamError::Malformed(format!("TEI /rerank: {e}")))?;
    if ranks.len() != sent {
        return Err(UpstreamError::CountMismatch {
            sent,
            got: ranks.len(),
        });
    }
    let mut scores = vec![None; sent];
    for rank in ranks {
        match scores.get_mut(rank.index) {
            Some(slot @ None) => *slot = Some(rank.score),
            _ => {
                return Err(UpstreamError::Malformed(format!(
                    "TEI /rerank: index {} out of range or repeated",
                    rank.index
                )));
            }
        }
    }
    Ok(scores.into_iter().flatten().collect())
}

/// The scores of TEI's `/predict` reply to a batch of pairs: each pair's predictions (one for a
/// reranker's one class), its first (TEI sorts them by score) is the pair's score.
fn from_predictions(reply: &[u8], sent: usize) -> Result<Vec<f32>, UpstreamError> {
    let predictions: Vec<Vec<Prediction>> = serde_json::from_slice(reply)
        .map_err(|e| UpstreamError::Malformed(format!("TEI /predict: {e}")))?;
    if predictions.len() != sent {
        return Err(UpstreamError::CountMismatch {
            sent,
            got: predictions.len(),
        });
    }
    predictions
        .into_iter()
        .map(|p| {
            p.first().map(|p| p.score).ok_or_else(|| {
                UpstreamError::Malformed("TEI /predict: a pair without a score".into())
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_go_back_to_text_order() {
        let reply = br#"[{"index":1,"score":0.9},{"index":0,"score":0.2}]"#;
        assert_eq!(from_ranks(reply, 2).expect("valid"), [0.2, 0.9]);
        let repeated = br#"[{"index":0,"score":0.9},{"index":0,"score":0.2}]"#;
        assert!(from_ranks(repeated, 2).is_err());
        assert!(matches!(
            from_ranks(reply, 3),
            Err(UpstreamError::CountMismatch { sent: 3, got: 2 })
        ));
    }

    #[test]
    fn predictions_take_each_pairs_score() {
        let reply = br#"[[{"score":0.5,"label":"LABEL_0"}],[{"score":0.25,"label":"LABEL_0"}]]"#;
        assert_eq!(from_predictions(reply, 2).expect("valid"), [0.5, 0.25]);
        assert!(from_predictions(b"[[]]", 1).is_err());
    }
}
