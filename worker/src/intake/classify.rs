//! TEI's batched routes beyond `/embed`, `/rerank` and `/embed_sparse` at the intake:
//! `/predict`, `/embed_all` and `/similarity` on `<subject>.predict`, `<subject>.embed_all` and
//! `<subject>.similarity` (contract v1.4). Each is parsed into inputs with its batching key and
//! served by the path of embedding inputs (cache, token count, batcher, bisection, deadline,
//! shedding, tenant); only its reply is shaped ([`Shape`]). A route the model does not serve
//! ([`Capabilities`]) is answered at once with TEI 1.9.3's 424 for it.

use embatch_protocol::embed_all::{self, EmbedAllRequest, NOT_AN_EMBEDDING_MODEL, NOT_FOR_SPLADE};
use embatch_protocol::predict::{self, NOT_A_CLASSIFIER, PredictRequest};
use embatch_protocol::similarity::{self, SimilarityRequest};
use embatch_protocol::{EmbedError, EmbedOptions, Input};

use super::capabilities::Capabilities;
use super::shape::Shape;

/// A request of one of these routes, parsed: its inputs, their batching key, its reply's shape.
pub(super) type Parsed = (Vec<Input>, EmbedOptions, Shape);

/// Where this worker serves `/predict`, `/embed_all` and `/similarity`, and whether its model
/// does.
#[derive(Debug, Clone)]
pub struct ClassifyRoutes {
    /// `<subject>.predict` of each request subject.
    pub predict: Vec<String>,
    /// `<subject>.embed_all` of each request subject.
    pub embed_all: Vec<String>,
    /// `<subject>.similarity` of each request subject.
    pub similarity: Vec<String>,
    /// What the model does.
    pub capabilities: Capabilities,
    /// The model's name, for the errors.
    pub model: String,
    /// Whether `/similarity` embeds with `normalize: true` rather than TEI's `false` (see
    /// [`ClassifyRoutes::normalizing_similarity`]).
    pub normalize_similarity: bool,
}

impl Default for ClassifyRoutes {
    /// No subjects (a worker built without them, in tests).
    fn default() -> Self {
        ClassifyRoutes {
            predict: Vec::new(),
            embed_all: Vec::new(),
            similarity: Vec::new(),
            capabilities: Capabilities::ALL,
            model: String::new(),
            normalize_similarity: false,
        }
    }
}

impl ClassifyRoutes {
    /// The routes of a worker serving `subjects` with `model`, whose upstream describes itself
    /// with `info` (TEI's `/info`; `None` when unread: every route is tried).
    pub fn new(subjects: &[String], model: &str, info: Option<&serde_json::Value>) -> Self {
        let each = |subject: fn(&str) -> String| subjects.iter().map(|s| subject(s)).collect();
        ClassifyRoutes {
            predict: each(predict::predict_subject),
            embed_all: each(embed_all::embed_all_subject),
            similarity: each(similarity::similarity_subject),
            capabilities: Capabilities::from_info(info),
            model: model.to_owned(),
            normalize_similarity: false,
        }
    }

    /// These routes with `/similarity` embedding its sentences normalized when `normalize`
    /// (an upstream without unnormalized vectors, `Upstream::unnormalized`: an OpenAI-compatible
    /// server refuses TEI's `normalize: false`). The cosines are the same either way,
    /// a·b / (|a||b|), up to f32 rounding; TEI's `/similarity` embeds with `normalize: false`,
    /// which stays the default so a TEI upstream sees TEI's own calls.
    pub fn normalizing_similarity(mut self, normalize: bool) -> Self {
        self.normalize_similarity = normalize;
        self
    }

    /// Every subject of these routes, for the queue group.
    pub fn subjects(&self) -> Vec<String> {
        [&self.predict, &self.embed_all, &self.similarity]
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// Parses a request on `subject` when it is one of these routes' (`None` otherwise).
    ///
    /// # Errors
    /// TEI 1.9.3's 424 `Backend` for a route the model does not serve ("Model is not a
    /// classifier model", "Model is not an embedding model", "`embed_all` is not available
    /// for SPLADE models"), then the body's parse errors (400, 422) and limits (400 `Empty`,
    /// 422 past `max_inputs`).
    pub(super) fn parse(
        &self,
        subject: &str,
        payload: &[u8],
        max_inputs: usize,
    ) -> Option<Result<Parsed, EmbedError>> {
        let has = |subjects: &[String]| subjects.iter().any(|s| s == subject);
        let caps = self.capabilities;
        if has(&self.predict) {
            return Some(self.refuse(!caps.predict, NOT_A_CLASSIFIER).and_then(|()| {
                let request = PredictRequest::from_slice(payload)?;
                request.validate(max_inputs)?;
                let (inputs, options, single) = request.into_parts();
                Ok((inputs, options, Shape::Predict { single }))
            }));
        }
        if has(&self.embed_all) {
            let refused = self
                .refuse(!caps.embed, NOT_AN_EMBEDDING_MODEL)
                .and_then(|()| self.refuse(caps.sparse && caps.embed, NOT_FOR_SPLADE));
            return Some(refused.and_then(|()| {
                let request = EmbedAllRequest::from_slice(payload)?;
                request.validate(max_inputs)?;
                let (inputs, options) = request.into_parts();
                Ok((inputs, options, Shape::EmbedAll))
            }));
        }
        if has(&self.similarity) {
            return Some(
                self.refuse(!caps.embed, NOT_AN_EMBEDDING_MODEL)
                    .and_then(|()| {
                        let request = SimilarityRequest::from_slice(payload)?;
                        request.validate(max_inputs)?;
                        let (inputs, mut options) = request.into_parts();
                        options.normalize |= self.normalize_similarity;
                        Ok((inputs, options, Shape::Similarity))
                    }),
            );
        }
        None
    }

    /// Whether `/embed` (and OpenAI's route, which is `/embed`) is served.
    ///
    /// # Errors
    /// TEI 1.9.3's 424 `Backend` "Model is not an embedding model" for a classifier or a
    /// reranker, before any upstream work.
    pub(super) fn check_embed(&self) -> Result<(), EmbedError> {
        self.refuse(!self.capabilities.embed, NOT_AN_EMBEDDING_MODEL)
    }

    /// TEI's 424 `Backend` `message` when `refused`, naming this worker's model.
    fn refuse(&self, refused: bool, message: &str) -> Result<(), EmbedError> {
        if !refused {
            return Ok(());
        }
        Err(EmbedError::Backend(format!(
            "{message}: this worker's model `{}` does not serve this route; send it to a \
             model whose `GET /v1/models` capabilities include it",
            self.model
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(model_type: serde_json::Value) -> ClassifyRoutes {
        let info = serde_json::json!({ "model_type": model_type });
        ClassifyRoutes::new(&["embed.m".to_owned()], "m", Some(&info))
    }

    #[test]
    fn each_route_is_parsed_or_refused_as_tei_does() {
        let classifier = routes(serde_json::json!({"classifier": {"id2label": {}}}));
        let dense = routes(serde_json::json!({"embedding": {"pooling": "mean"}}));
        let splade = routes(serde_json::json!({"embedding": {"pooling": "splade"}}));
        assert_eq!(classifier.predict, ["embed.m.predict"]);
        assert!(
            classifier.parse("embed.m", b"{}", 8).is_none(),
            "not a route of these"
        );
        let (inputs, _, shape) = classifier
            .parse("embed.m.predict", br#"{"inputs":["q","t"]}"#, 8)
            .expect("a route")
            .expect("a classifier");
        assert_eq!(inputs, [Input::Pair("q".into(), "t".into())]);
        assert!(matches!(shape, Shape::Predict { single: true }));
        let sim = br#"{"inputs":{"source_sentence":"s","sentences":["a"]}}"#;
        let (inputs, ..) = dense
            .parse("embed.m.similarity", sim, 8)
            .expect("route")
            .expect("ok");
        assert_eq!(inputs.len(), 2);
        // TEI's `normalize: false`, unless the upstream has only unit vectors.
        for (normalizing, normalize) in [(false, false), (true, true)] {
            let (_, options, _) = dense
                .clone()
                .normalizing_similarity(normalizing)
                .parse("embed.m.similarity", sim, 8)
                .expect("route")
                .expect("ok");
            assert_eq!(options.normalize, normalize, "normalizing: {normalizing}");
        }
        for (routes, subject, body, message) in [
            (
                &dense,
                "embed.m.predict",
                &br#"{"inputs":"a"}"#[..],
                NOT_A_CLASSIFIER,
            ),
            (
                &classifier,
                "embed.m.embed_all",
                br#"{"inputs":"a"}"#,
                NOT_AN_EMBEDDING_MODEL,
            ),
            (
                &splade,
                "embed.m.embed_all",
                br#"{"inputs":"a"}"#,
                NOT_FOR_SPLADE,
            ),
            (
                &classifier,
                "embed.m.similarity",
                sim,
                NOT_AN_EMBEDDING_MODEL,
            ),
        ] {
            let err = routes
                .parse(subject, body, 8)
                .expect("route")
                .expect_err(subject);
            assert_eq!(err.status(), 424);
            assert!(err.to_string().contains(message), "{err}");
        }
        let err = classifier
            .check_embed()
            .expect_err("a classifier does not embed");
        assert!(err.to_string().contains(NOT_AN_EMBEDDING_MODEL), "{err}");
        assert_eq!((err.status(), dense.check_embed()), (424, Ok(())));
    }
}
