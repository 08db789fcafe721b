//! Rerank requests at the intake: TEI 1.9.3's `/rerank` body on `<subject>.rerank` (contract
//! v1.2), parsed into one (query, text) pair per text and served by the same path as embedding
//! inputs (cache, token count, batcher, bisection, deadline, shedding, tenant); only its reply is
//! re-shaped, from one score per pair in text order into TEI's ranks sorted by score.

use bytes::Bytes;
use embatch_protocol::rerank::{self, NOT_A_RERANKER};
use embatch_protocol::{EmbedError, EmbedOptions, Input, RerankRequest};

use crate::cache::Answered;

/// Whether and where this worker reranks.
#[derive(Debug, Clone, Default)]
pub struct RerankConfig {
    /// The rerank subjects served (`<subject>.rerank` of each request subject): a request that
    /// arrives on one of them is a rerank request.
    pub subjects: Vec<String>,
    /// `None` when the model can rerank (TEI's `/info` names a `reranker` model type, or says
    /// nothing of its type); else the model's name, answered 424 as TEI 1.9.3 answers `/rerank`
    /// on a model that is not a reranker.
    pub not_a_reranker: Option<String>,
}

impl RerankConfig {
    /// The rerank settings of a worker serving `subjects` with `model`, whose upstream describes
    /// itself with `info` (TEI's `/info`; `None` when unread): it reranks unless `info` has a
    /// `model_type` without a `reranker` key (TEI's `{"embedding": ...}` or
    /// `{"classifier": ...}`, or the built-in model's).
    pub fn new(subjects: &[String], model: &str, info: Option<&serde_json::Value>) -> Self {
        let reranks = match info.and_then(|i| i.get("model_type")) {
            Some(model_type) => model_type.get("reranker").is_some(),
            None => true,
        };
        RerankConfig {
            subjects: subjects.iter().map(|s| rerank::rerank_subject(s)).collect(),
            not_a_reranker: (!reranks).then(|| model.to_owned()),
        }
    }

    /// Whether `subject` is one of the rerank subjects.
    pub fn serves(&self, subject: &str) -> bool {
        self.subjects.iter().any(|s| s == subject)
    }

    /// Parses and validates a rerank body: its pairs, their batching key, and how to shape its
    /// reply.
    ///
    /// # Errors
    /// 424 `Backend` "model is not a re-ranker model" (TEI 1.9.3's answer) when the model
    /// cannot rerank; the parse errors of [`RerankRequest::from_slice`] (400, 422) and the
    /// limits of [`RerankRequest::validate`] (400 for no texts, 422 for more than
    /// `max_texts`).
    pub(super) fn parse(
        &self,
        payload: &[u8],
        max_texts: usize,
    ) -> Result<(Vec<Input>, EmbedOptions, Shape), EmbedError> {
        if let Some(model) = &self.not_a_reranker {
            return Err(EmbedError::Backend(format!(
                "{NOT_A_RERANKER}: this worker's model `{model}` computes embeddings; send \
                 rerank requests to a reranker model's subject"
            )));
        }
        let request = RerankRequest::from_slice(payload)?;
        request.validate(max_texts)?;
        let texts = request.return_text.then(|| request.texts.clone());
        let (pairs, options) = request.into_parts();
        Ok((pairs, options, Shape { texts }))
    }
}

/// How a rerank request's reply is shaped: its texts when it asked for them (`return_text`).
#[derive(Debug, Clone)]
pub(super) struct Shape {
    texts: Option<Vec<String>>,
}

impl Shape {
    /// The reply of `answered` (one `[score]` per pair, in text order) as TEI 1.9.3's `/rerank`
    /// reply: `[{"index", "text"?, "score"}, ...]`, highest score first.
    ///
    /// # Errors
    /// 424 `Backend` when the scores are malformed or NaN ([`rerank::ranks`]).
    pub(super) fn apply(self, mut answered: Answered) -> Result<Answered, EmbedError> {
        let ranks = rerank::ranks(&answered.payload, self.texts)?;
        let body = serde_json::to_vec(&ranks)
            .map_err(|e| EmbedError::Backend(format!("cannot write the ranks: {e}")))?;
        answered.payload = Bytes::from(body);
        Ok(answered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reranks_unless_info_names_another_model_type() {
        let subjects = ["embed.m".to_owned(), "embed".to_owned()];
        let reranker = serde_json::json!({"model_type": {"reranker": {"id2label": {}}}});
        let embedder = serde_json::json!({"model_type": {"embedding": {"pooling": "mean"}}});
        let config = RerankConfig::new(&subjects, "m", Some(&reranker));
        assert_eq!(config.subjects, ["embed.m.rerank", "embed.rerank"]);
        assert!(config.serves("embed.rerank") && !config.serves("embed"));
        assert!(config.not_a_reranker.is_none());
        assert!(
            RerankConfig::new(&subjects, "m", None)
                .not_a_reranker
                .is_none()
        );
        let config = RerankConfig::new(&subjects, "m", Some(&embedder));
        let err = config
            .parse(br#"{"query":"q","texts":["a"]}"#, 8)
            .expect_err("not a reranker");
        assert_eq!(err.status(), 424);
        assert!(err.to_string().contains(NOT_A_RERANKER), "{err}");
    }
}
