//! Sentence similarity: exactly TEI 1.9.3's `POST /similarity` body and reply, on the subject
//! [`similarity_subject`] (`<subject>.similarity`, contract v1.4).
//!
//! TEI answers `/similarity` by embedding the source sentence and the sentences in one `/embed`
//! batch (`normalize: false`) and returning the cosine similarity of each sentence's embedding
//! with the source's (`router/src/http/server.rs`, `similarity`). A worker does the same: it
//! turns a [`SimilarityRequest`] into the embedding inputs `[source, sentences...]` with TEI's
//! `/embed` options ([`SimilarityRequest::into_parts`]), so they are batched with other callers'
//! inputs, cached, shed and bisected as embeddings are, and computes the cosines itself from the
//! embeddings ([`cosines`]). The reply is TEI's: `[0.93, 0.12, ...]`, one float per sentence.

use serde::{Deserialize, Serialize};

use crate::request::{Task, TruncationDirection, parse_object};
use crate::{EmbedError, EmbedOptions, Input};

/// The route's token: TEI's path without its `/`, and the suffix of [`similarity_subject`].
pub const ROUTE: &str = "similarity";

/// The subject of similarity requests for the workers of `subject`: `<subject>.similarity`.
pub fn similarity_subject(subject: &str) -> String {
    format!("{subject}.{ROUTE}")
}

/// TEI 1.9.3's `inputs` of `/similarity`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SimilarityInput {
    /// The sentence every other one is compared with.
    #[cfg_attr(feature = "openapi", schema(example = "What is Deep Learning?"))]
    pub source_sentence: String,
    /// The sentences compared with `source_sentence`: at least one, and with it at most
    /// `MAX_CLIENT_BATCH_SIZE`.
    #[cfg_attr(feature = "openapi", schema(example = json!(["What is Machine Learning?"])))]
    pub sentences: Vec<String>,
}

/// TEI 1.9.3's `parameters` of `/similarity`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SimilarityParameters {
    /// Truncate sentences longer than the model's maximum instead of failing. Absent: the
    /// upstream's default (TEI's `--auto-truncate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncate: Option<bool>,
    /// Which end to cut when truncating (default `Right`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncation_direction: Option<TruncationDirection>,
    /// Name of a prompt from the model's sentence-transformers config to prepend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_name: Option<String>,
}

/// TEI 1.9.3's `POST /similarity` body.
///
/// ```json
/// {"inputs": {"source_sentence": "What is Deep Learning?",
///             "sentences": ["What is Machine Learning?", "..."]},
///  "parameters": {"truncate": null, "truncation_direction": "Right", "prompt_name": null}}
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SimilarityRequest {
    /// The source sentence and the sentences to compare with it.
    pub inputs: SimilarityInput,
    /// How the sentences are embedded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<SimilarityParameters>,
}

impl SimilarityRequest {
    /// Parses a `/similarity` body, with the statuses of [`crate::EmbedRequest::from_slice`].
    ///
    /// # Errors
    /// [`EmbedError::InvalidJson`] (400) or [`EmbedError::Validation`] (422).
    pub fn from_slice(body: &[u8]) -> Result<SimilarityRequest, EmbedError> {
        parse_object(
            body,
            "{\"inputs\": {\"source_sentence\": \"a\", \"sentences\": [\"b\"]}}",
        )
    }

    /// TEI 1.9.3's limits of `/similarity`.
    ///
    /// # Errors
    /// - [`EmbedError::Empty`] (400) "`inputs.sentences` cannot be empty", as TEI; and
    ///   "`inputs` cannot be empty" for an empty sentence (TEI's tokenizer refuses it).
    /// - [`EmbedError::Validation`] (422) when the sentences and the source are more than
    ///   `max_inputs` ("batch size N > maximum allowed batch size M", TEI counts the source).
    pub fn validate(&self, max_inputs: usize) -> Result<(), EmbedError> {
        let sentences = &self.inputs.sentences;
        if sentences.is_empty() {
            return Err(EmbedError::Empty(
                "`inputs.sentences` cannot be empty".into(),
            ));
        }
        let n = sentences.len() + 1;
        if n > max_inputs {
            return Err(EmbedError::Validation(format!(
                "batch size {n} > maximum allowed batch size {max_inputs}: the source sentence \
                 and at most MAX_CLIENT_BATCH_SIZE - 1 sentences per similarity request. Given: \
                 {} sentences",
                n - 1
            )));
        }
        let empty = std::iter::once(&self.inputs.source_sentence)
            .chain(sentences)
            .any(String::is_empty);
        if empty {
            return Err(EmbedError::Empty("`inputs` cannot be empty".into()));
        }
        Ok(())
    }

    /// The embedding inputs `[source, sentences...]` and their batching key: TEI's `/embed`
    /// options of its `/similarity` (`normalize: false`, the parameters' `truncate`,
    /// `truncation_direction` and `prompt_name`).
    pub fn into_parts(self) -> (Vec<Input>, EmbedOptions) {
        let parameters = self.parameters.unwrap_or_default();
        let options = EmbedOptions {
            normalize: false,
            truncate: parameters.truncate,
            truncation_direction: parameters.truncation_direction,
            prompt_name: parameters.prompt_name,
            dimensions: None,
            task: Task::Embed,
        };
        let inputs = std::iter::once(self.inputs.source_sentence)
            .chain(self.inputs.sentences)
            .map(Input::Text)
            .collect();
        (inputs, options)
    }
}

/// TEI 1.9.3's `/similarity` reply from the embeddings of `[source, sentences...]` (`reply`, the
/// `/embed` body assembled for the request's inputs): the cosine similarity of each sentence's
/// embedding with the source's, in sentence order. A zero vector is similar to nothing (0).
///
/// # Errors
/// [`EmbedError::Backend`] (424) when `reply` is not at least two vectors of one length.
pub fn cosines(reply: &[u8]) -> Result<Vec<f32>, EmbedError> {
    let vectors: Vec<Vec<f32>> = serde_json::from_slice(reply)
        .map_err(|e| EmbedError::Backend(format!("the embeddings are not TEI's shape: {e}")))?;
    let Some((source, sentences)) = vectors.split_first() else {
        return Err(EmbedError::Backend(
            "no embedding of the source sentence".into(),
        ));
    };
    sentences
        .iter()
        .map(|sentence| {
            if sentence.len() != source.len() {
                return Err(EmbedError::Backend(format!(
                    "embeddings of {} and {} dimensions",
                    source.len(),
                    sentence.len()
                )));
            }
            Ok(cosine(source, sentence))
        })
        .collect()
}

/// The cosine similarity of `a` and `b` (of one length), computed in f64 as simsimd (TEI's
/// `f32::cosine`) does; 0 when either is a zero vector.
fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x), f64::from(y));
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    if aa == 0.0 || bb == 0.0 {
        return 0.0;
    }
    (ab / (aa.sqrt() * bb.sqrt())) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embeds_the_source_and_sentences_with_teis_options() {
        let body = br#"{"inputs":{"source_sentence":"s","sentences":["a","b"]},
                        "parameters":{"truncate":true,"prompt_name":"q"}}"#;
        let request = SimilarityRequest::from_slice(body).expect("TEI's body");
        request.validate(3).expect("the source and two sentences");
        let (inputs, options) = request.clone().into_parts();
        assert_eq!(
            inputs,
            [
                Input::Text("s".into()),
                "a".to_owned().into(),
                "b".to_owned().into()
            ]
        );
        assert_eq!((options.normalize, options.task), (false, Task::Embed));
        assert_eq!(
            (options.truncate, options.prompt_name.as_deref()),
            (Some(true), Some("q"))
        );
        let err = request.validate(2).expect_err("the source counts");
        assert_eq!(err.status(), 422);
        assert!(
            err.to_string()
                .contains("batch size 3 > maximum allowed batch size 2")
        );
        for body in [
            &br#"{"inputs":{"source_sentence":"s","sentences":[]}}"#[..],
            br#"{"inputs":{"source_sentence":"","sentences":["a"]}}"#,
        ] {
            let request = SimilarityRequest::from_slice(body).expect("parses");
            assert_eq!(request.validate(8).expect_err("empty").status(), 400);
        }
        let err = SimilarityRequest::from_slice(br#"{"inputs":["a"]}"#).expect_err("shape");
        assert_eq!(err.status(), 422);
        assert_eq!(similarity_subject("embed.m"), "embed.m.similarity");
    }

    #[test]
    fn cosines_are_of_each_sentence_with_the_source() {
        let reply = br#"[[3,4],[3,4],[-6,-8],[4,-3],[0,0]]"#;
        let got = cosines(reply).expect("vectors");
        assert_eq!(got, [1.0, -1.0, 0.0, 0.0]);
        // Scale does not matter: the same as on normalised vectors.
        let scaled = cosines(br#"[[0.6,0.8],[1,1]]"#).expect("vectors");
        let unit = cosines(br#"[[30,40],[5,5]]"#).expect("vectors");
        assert!((scaled[0] - unit[0]).abs() < 1e-6);
        assert_eq!(cosines(b"[[1,2],[1]]").expect_err("dims").status(), 424);
        assert_eq!(cosines(b"[]").expect_err("none").status(), 424);
    }
}
