//! Sparse-embedding requests at the intake: TEI 1.9.3's `/embed_sparse` body on
//! `<subject>.embed_sparse` (contract v1.3), parsed into its inputs with
//! [`embatch_protocol::Task::Sparse`] options and served by the path of embedding inputs (cache,
//! token count, batcher, bisection, deadline, shedding, tenant). The reply needs no re-shaping:
//! the upstream's list per input, joined in order, is TEI's reply.

use embatch_protocol::sparse::{self, NOT_SPLADE};
use embatch_protocol::{EmbedError, EmbedOptions, Input, SparseRequest};

/// Whether and where this worker computes sparse embeddings.
#[derive(Debug, Clone, Default)]
pub struct SparseConfig {
    /// The sparse subjects served (`<subject>.embed_sparse` of each request subject): a request
    /// that arrives on one of them is a sparse request.
    pub subjects: Vec<String>,
    /// `None` when the model has sparse output (TEI's `/info` names an `embedding` model with
    /// `splade` pooling, or says nothing of its type); else the model's name, answered 424 as
    /// TEI 1.9.3 answers `/embed_sparse` on a model without SPLADE pooling.
    pub not_splade: Option<String>,
}

impl SparseConfig {
    /// The sparse settings of a worker serving `subjects` with `model`, whose upstream describes
    /// itself with `info` (TEI's `/info`; `None` when unread): it serves sparse embeddings unless
    /// `info` has a `model_type` that is not `{"embedding": {"pooling": "splade"}}` (TEI's
    /// `is_splade`).
    pub fn new(subjects: &[String], model: &str, info: Option<&serde_json::Value>) -> Self {
        let splade = match info.and_then(|i| i.get("model_type")) {
            Some(model_type) => model_type
                .pointer("/embedding/pooling")
                .and_then(serde_json::Value::as_str)
                .is_some_and(|pooling| pooling.eq_ignore_ascii_case("splade")),
            None => true,
        };
        SparseConfig {
            subjects: subjects.iter().map(|s| sparse::sparse_subject(s)).collect(),
            not_splade: (!splade).then(|| model.to_owned()),
        }
    }

    /// Whether `subject` is one of the sparse subjects.
    pub fn serves(&self, subject: &str) -> bool {
        self.subjects.iter().any(|s| s == subject)
    }

    /// Parses and validates a sparse body: its inputs and their batching key.
    ///
    /// # Errors
    /// 424 `Backend` "Model is not an embedding model with SPLADE pooling" (TEI 1.9.3's
    /// answer) when the model has no sparse output; the parse errors of
    /// [`SparseRequest::from_slice`] (400, 422) and the limits of [`SparseRequest::validate`]
    /// (400 for no or an empty input, 422 for more than `max_inputs`).
    pub(super) fn parse(
        &self,
        payload: &[u8],
        max_inputs: usize,
    ) -> Result<(Vec<Input>, EmbedOptions), EmbedError> {
        if let Some(model) = &self.not_splade {
            return Err(EmbedError::Backend(format!(
                "{NOT_SPLADE}: this worker's model `{model}` has no sparse output; send \
                 embed_sparse requests to a SPLADE model's subject"
            )));
        }
        let request = SparseRequest::from_slice(payload)?;
        request.validate(max_inputs)?;
        Ok(request.into_parts())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_sparse_only_for_splade_pooling_or_an_unknown_type() {
        let subjects = ["embed.m".to_owned(), "embed".to_owned()];
        let splade = serde_json::json!({"model_type": {"embedding": {"pooling": "splade"}}});
        let dense = serde_json::json!({"model_type": {"embedding": {"pooling": "mean"}}});
        let reranker = serde_json::json!({"model_type": {"reranker": {"id2label": {}}}});
        let config = SparseConfig::new(&subjects, "m", Some(&splade));
        assert_eq!(
            config.subjects,
            ["embed.m.embed_sparse", "embed.embed_sparse"]
        );
        assert!(config.serves("embed.embed_sparse") && !config.serves("embed"));
        assert!(config.not_splade.is_none());
        assert!(SparseConfig::new(&subjects, "m", None).not_splade.is_none());
        let (inputs, options) = config
            .parse(br#"{"inputs":["a","b"]}"#, 8)
            .expect("a SPLADE model");
        assert_eq!(
            (inputs.len(), options.task),
            (2, embatch_protocol::Task::Sparse)
        );
        for info in [&dense, &reranker] {
            let config = SparseConfig::new(&subjects, "m", Some(info));
            let err = config
                .parse(br#"{"inputs":"a"}"#, 8)
                .expect_err("no sparse output");
            assert_eq!(err.status(), 424);
            assert!(err.to_string().contains(NOT_SPLADE), "{err}");
        }
    }
}
