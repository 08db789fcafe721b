//! What a worker's model does, from its upstream's `/info` `model_type` (TEI 1.9.3:
//! `{"embedding": {"pooling": "mean" | "cls" | "splade" | ...}}`, `{"classifier": {"id2label",
//! ...}}` or `{"reranker": {"id2label", ...}}`), so that a request for something the model does
//! not do is answered at once with TEI's own error for that route, before any upstream work, and
//! so that discovery can announce it.

use serde_json::Value;

/// The routes a model serves, as TEI 1.9.3 decides them from its model type
/// (`core/src/infer.rs`: `is_classifier`, `is_splade`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// `/embed`, `/embed_all` and `/similarity`: an embedding model (TEI refuses them on a
    /// classifier or reranker: "Model is not an embedding model").
    pub embed: bool,
    /// `/embed_sparse`: an embedding model with SPLADE pooling (which refuses `/embed_all`).
    pub sparse: bool,
    /// `/rerank`: a reranker (a classifier with one label).
    pub rerank: bool,
    /// `/predict`: a classifier or a reranker.
    pub predict: bool,
}

impl Capabilities {
    /// What the model does, by the names of [`embatch_protocol::model::CAPABILITIES`]
    /// (`embed`, `sparse`, `rerank`, `classify`), as discovery announces them.
    pub fn names(&self) -> Vec<String> {
        let on = [self.embed, self.sparse, self.rerank, self.predict];
        embatch_protocol::model::CAPABILITIES
            .iter()
            .zip(on)
            .filter(|&(_, on)| on)
            .map(|(name, _)| (*name).to_owned())
            .collect()
    }
}

impl Capabilities {
    /// Everything: an upstream that says nothing of its model type (its calls then answer for
    /// themselves).
    pub const ALL: Capabilities = Capabilities {
        embed: true,
        sparse: true,
        rerank: true,
        predict: true,
    };

    /// The capabilities of the model `info` (TEI's `/info`, `None` when unread) describes.
    pub fn from_info(info: Option<&Value>) -> Capabilities {
        let Some(model_type) = info.and_then(|i| i.get("model_type")) else {
            return Capabilities::ALL;
        };
        let splade = model_type
            .pointer("/embedding/pooling")
            .and_then(Value::as_str)
            .is_some_and(|p| p.eq_ignore_ascii_case("splade"));
        let reranker = model_type.get("reranker").is_some();
        Capabilities {
            embed: model_type.get("embedding").is_some(),
            sparse: splade,
            rerank: reranker,
            predict: reranker || model_type.get("classifier").is_some(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(model_type: Value) -> Capabilities {
        Capabilities::from_info(Some(&serde_json::json!({ "model_type": model_type })))
    }

    #[test]
    fn teis_model_types_decide_the_routes() {
        let dense = of(serde_json::json!({"embedding": {"pooling": "mean"}}));
        assert_eq!(
            (dense.embed, dense.sparse, dense.predict),
            (true, false, false)
        );
        let splade = of(serde_json::json!({"embedding": {"pooling": "splade"}}));
        assert_eq!(
            (splade.embed, splade.sparse, splade.rerank),
            (true, true, false)
        );
        let classifier = of(serde_json::json!({"classifier": {"id2label": {"0": "neg"}}}));
        assert_eq!(
            (classifier.embed, classifier.rerank, classifier.predict),
            (false, false, true)
        );
        let reranker = of(serde_json::json!({"reranker": {"id2label": {"0": "LABEL_0"}}}));
        assert_eq!(
            (reranker.embed, reranker.rerank, reranker.predict),
            (false, true, true)
        );
        assert_eq!(Capabilities::from_info(None), Capabilities::ALL);
        assert_eq!(reranker.names(), ["rerank", "classify"]);
        assert_eq!(splade.names(), ["embed", "sparse"]);
        assert_eq!(
            Capabilities::from_info(Some(&serde_json::json!({}))),
            Capabilities::ALL
        );
    }
}
