//! Rerank: exactly TEI 1.9.3's `POST /rerank` body and reply, on the subject
//! [`rerank_subject`] (`<subject>.rerank`, contract v1.2).
//!
//! A worker turns a [`RerankRequest`] into one [`Input::Pair`] `(query, text)` per text with
//! [`Task::Rerank`] options ([`RerankRequest::into_parts`]), so rerank pairs go through the same
//! batcher, cache and protections as embedding inputs; pairs of different callers (and different
//! queries) share an upstream call. The upstream's score of each pair comes back as a
//! one-element array (`[0.93]`), the shape of an embedding; [`ranks`] turns them into TEI's reply.

use serde::{Deserialize, Serialize};

use crate::request::{Task, TruncationDirection, parse_object};
use crate::{EmbedError, EmbedOptions, Input};

/// The subject of rerank requests for the workers of `subject` (the plain subject or a model
/// subject): `<subject>.rerank`, in the workers' queue group. Cancels, heartbeats and discovery
/// are `subject`'s own ([`crate::headers::cancel_subject`], ...).
pub fn rerank_subject(subject: &str) -> String {
    format!("{subject}.rerank")
}

/// The error message of a model that cannot rerank, as TEI 1.9.3's `/rerank` answers it (424
/// `Backend`) for a model that is not a sequence classifier with one class.
pub const NOT_A_RERANKER: &str = "model is not a re-ranker model";

/// TEI 1.9.3's `POST /rerank` body.
///
/// ```json
/// {"query": "What is Deep Learning?", "texts": ["Deep Learning is ...", "Cheese is ..."],
///  "raw_scores": false, "return_text": false, "truncate": null, "truncation_direction": "Right"}
/// ```
/// `query` and `texts` are required. Unknown fields are ignored, as TEI does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RerankRequest {
    /// The query every text is scored against.
    #[cfg_attr(feature = "openapi", schema(example = "What is Deep Learning?"))]
    pub query: String,
    /// The texts to score, at most `MAX_CLIENT_BATCH_SIZE` (TEI's `max_client_batch_size`).
    #[cfg_attr(feature = "openapi", schema(example = json!(["Deep Learning is ..."])))]
    pub texts: Vec<String>,
    /// Cut a (query, text) pair over the model's token limit instead of refusing it with 422.
    /// Absent: the upstream's default (TEI's `--auto-truncate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncate: Option<bool>,
    /// Which end to cut when truncating (default `Right`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncation_direction: Option<TruncationDirection>,
    /// The classifier's logit instead of its sigmoid (default `false`, as TEI).
    #[serde(default)]
    pub raw_scores: bool,
    /// Echo each text in its rank's `text` (default `false`, as TEI).
    #[serde(default)]
    pub return_text: bool,
}

/// One element of TEI 1.9.3's `/rerank` reply: `{"index": 0, "text": "...", "score": 0.98}`;
/// `text` only with `return_text`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Rank {
    /// The text's position in the request's `texts`.
    pub index: usize,
    /// The text, with `return_text`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The relevance score: the sigmoid of the classifier's logit, in (0, 1), or the logit with
    /// `raw_scores`.
    pub score: f32,
}

impl RerankRequest {
    /// Parses a `/rerank` body, with the statuses of [`crate::EmbedRequest::from_slice`] (400
    /// for a body that is not JSON, 422 naming the field for JSON of the wrong shape).
    ///
    /// # Errors
    /// [`EmbedError::InvalidJson`] or [`EmbedError::Validation`].
    pub fn from_slice(body: &[u8]) -> Result<RerankRequest, EmbedError> {
        parse_object(body, "{\"query\": \"q\", \"texts\": [\"a\", \"b\"]}")
    }

    /// Checks TEI 1.9.3's limits of `/rerank`.
    ///
    /// # Errors
    /// - [`EmbedError::Empty`] (400) "`texts` cannot be empty", as TEI.
    /// - [`EmbedError::Validation`] (422) for more than `max_texts` texts (TEI's
    ///   `max_client_batch_size`, embatch's `MAX_CLIENT_BATCH_SIZE`), with TEI's message
    ///   "batch size N > maximum allowed batch size M" followed by the setting's name.
    pub fn validate(&self, max_texts: usize) -> Result<(), EmbedError> {
        validate_count(self.texts.len(), max_texts)
    }

    /// The request's pairs, one `(query, text)` per text in order, and its batching key
    /// ([`Task::Rerank`] with its `raw_scores`, `truncate` and `truncation_direction`).
    pub fn into_parts(self) -> (Vec<Input>, EmbedOptions) {
        let options = EmbedOptions {
            truncate: self.truncate,
            truncation_direction: self.truncation_direction,
            task: Task::Rerank {
                raw_scores: self.raw_scores,
            },
            ..EmbedOptions::default()
        };
        let query = self.query;
        let pairs = self
            .texts
            .into_iter()
            .map(|text| Input::Pair(query.clone(), text))
            .collect();
        (pairs, options)
    }
}

/// TEI 1.9.3's count checks of `/rerank`, for `n` texts (Cohere's `documents` count the same).
///
/// # Errors
/// As [`RerankRequest::validate`].
pub fn validate_count(n: usize, max_texts: usize) -> Result<(), EmbedError> {
    if n == 0 {
        return Err(EmbedError::Empty("`texts` cannot be empty".into()));
    }
    if n > max_texts {
        return Err(EmbedError::Validation(format!(
            "batch size {n} > maximum allowed batch size {max_texts}: at most \
             MAX_CLIENT_BATCH_SIZE ({max_texts}) texts (documents) per rerank request. Given: {n}"
        )));
    }
    Ok(())
}

/// TEI 1.9.3's `/rerank` reply from the scores of the pairs: `scores` is the reply body the
/// batcher assembled for the request's pairs (`[[0.93],[0.12],...]`, one one-element array per
/// text, in order). Ranks are sorted by score, highest first, as TEI sorts them (ascending, then
/// reversed: of equal scores the later text comes first); `texts` are echoed when given
/// (`return_text`).
///
/// # Errors
/// [`EmbedError::Backend`] (424) when `scores` is not one one-element array of numbers per text,
/// or a score is NaN (TEI's "score is NaN").
pub fn ranks(scores: &[u8], texts: Option<Vec<String>>) -> Result<Vec<Rank>, EmbedError> {
    let scores: Vec<[Option<f32>; 1]> = serde_json::from_slice(scores)
        .map_err(|e| EmbedError::Backend(format!("malformed rerank scores: {e}")))?;
    if let Some(texts) = &texts
        && texts.len() != scores.len()
    {
        return Err(EmbedError::Backend(format!(
            "{} scores for {} texts",
            scores.len(),
            texts.len()
        )));
    }
    let mut texts = texts.map(Vec::into_iter);
    let mut ranks = Vec::with_capacity(scores.len());
    for (index, [score]) in scores.into_iter().enumerate() {
        let score = score
            .filter(|s| !s.is_nan())
            .ok_or_else(|| EmbedError::Backend("score is NaN".into()))?;
        let text = texts.as_mut().and_then(Iterator::next);
        ranks.push(Rank { index, text, score });
    }
    ranks.sort_by(|a, b| a.score.total_cmp(&b.score));
    ranks.reverse();
    Ok(ranks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_teis_body_with_defaults() {
        let r = RerankRequest::from_slice(br#"{"query":"q","texts":["a","b"]}"#).expect("valid");
        assert!(!r.raw_scores && !r.return_text);
        let (pairs, options) = r.into_parts();
        assert_eq!(
            pairs,
            [
                Input::Pair("q".into(), "a".into()),
                Input::Pair("q".into(), "b".into())
            ]
        );
        assert_eq!(options.task, Task::Rerank { raw_scores: false });
        let err = RerankRequest::from_slice(br#"{"query":"q"}"#).expect_err("no texts");
        assert_eq!(err.status(), 422);
        assert!(err.to_string().contains("missing field `texts`"), "{err}");
        let err = RerankRequest::from_slice(b"{").expect_err("not JSON");
        assert_eq!(err.status(), 400);
    }

    #[test]
    fn limits_are_teis() {
        let empty = RerankRequest::from_slice(br#"{"query":"q","texts":[]}"#).expect("parses");
        let err = empty.validate(4).expect_err("empty");
        assert_eq!(
            (err.status(), err.error_type()),
            (400, crate::ErrorType::Empty)
        );
        assert!(err.to_string().contains("`texts` cannot be empty"), "{err}");
        let err = validate_count(5, 4).expect_err("too many");
        assert_eq!(err.status(), 422);
        assert!(
            err.to_string()
                .contains("batch size 5 > maximum allowed batch size 4"),
            "{err}"
        );
        assert!(err.to_string().contains("MAX_CLIENT_BATCH_SIZE"), "{err}");
    }

    #[test]
    fn ranks_sort_by_score_and_echo_texts() {
        let ranks = ranks(
            b"[[0.1],[0.9],[0.5]]",
            Some(vec!["a".into(), "b".into(), "c".into()]),
        )
        .expect("valid");
        let order: Vec<_> = ranks.iter().map(|r| (r.index, r.text.as_deref())).collect();
        assert_eq!(order, [(1, Some("b")), (2, Some("c")), (0, Some("a"))]);
        let json = serde_json::to_value(super::ranks(b"[[2.5]]", None).expect("valid"))
            .expect("serializes");
        assert_eq!(json, serde_json::json!([{"index": 0, "score": 2.5}]));
        assert_eq!(
            super::ranks(b"[[null]]", None).expect_err("NaN").status(),
            424
        );
        assert_eq!(super::ranks(b"[1]", None).expect_err("shape").status(), 424);
    }
}
