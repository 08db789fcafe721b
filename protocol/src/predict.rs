//! Classification: exactly TEI 1.9.3's `POST /predict` body and reply, on the subject
//! [`predict_subject`] (`<subject>.predict`, contract v1.4).
//!
//! A worker turns a [`PredictRequest`] into its sequences, each an [`Input::Text`] or an
//! [`Input::Pair`], with [`Task::Predict`] options ([`PredictRequest::into_parts`]), so they go
//! through the batcher, cache and protections of embedding inputs, and sequences of different
//! callers share one upstream call. Each sequence's result is TEI's list of predictions,
//! `[{"score": 0.93, "label": "positive"}, ...]` (every label of the model, highest score
//! first), carried as the JSON text the upstream wrote. The reply is that list for a single
//! sequence, and a list of them for a batch, as TEI answers (`PredictResponse`).

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::request::{Task, TruncationDirection, parse_object};
use crate::{EmbedError, EmbedOptions, Input};

/// The route's token: TEI's path without its `/`, and the suffix of [`predict_subject`].
pub const ROUTE: &str = "predict";

/// The subject of classification requests for the workers of `subject` (the plain subject or a
/// model subject): `<subject>.predict`, in the workers' queue group. Cancels, heartbeats and
/// discovery are `subject`'s own.
pub fn predict_subject(subject: &str) -> String {
    format!("{subject}.{ROUTE}")
}

/// The error message of a model that does not classify, as TEI 1.9.3's `/predict` answers it
/// (424 `Backend`) for an embedding model (`core/src/infer.rs`, `predict`).
pub const NOT_A_CLASSIFIER: &str = "Model is not a classifier model";

/// TEI 1.9.3's `/predict` `inputs`: one sequence, or a batch of them. A sequence is a text or a
/// pair of texts (scored together, as a cross-encoder does).
///
/// Read as TEI's `PredictInput` reads it (`router/src/http/types.rs`): `"text"` is one text;
/// `["a", "b"]` is one pair (not a batch of two); `["a"]` one text; `[["a"], ["q", "t"], ...]`
/// a batch; an array of three or more strings, an empty array or a sequence of 0 or 3 strings is
/// refused (422).
#[derive(Debug, Clone, PartialEq)]
pub enum PredictInputs {
    /// One sequence: the reply is one list of predictions.
    Single(Input),
    /// A batch: the reply is one list of predictions per sequence, in order.
    Batch(Vec<Input>),
}

impl PredictInputs {
    /// The sequences, in order.
    pub fn as_slice(&self) -> &[Input] {
        match self {
            PredictInputs::Single(input) => std::slice::from_ref(input),
            PredictInputs::Batch(inputs) => inputs,
        }
    }
}

/// `["a"]` as a text, `["a", "b"]` as a pair; any other length is TEI's error.
fn sequence<E: de::Error>(
    mut strings: Vec<String>,
    expected: &dyn de::Expected,
) -> Result<Input, E> {
    match (strings.len(), strings.pop(), strings.pop()) {
        (1, Some(text), None) => Ok(Input::Text(text)),
        (2, Some(second), Some(first)) => Ok(Input::Pair(first, second)),
        (n, ..) => Err(E::invalid_length(n, expected)),
    }
}

impl<'de> Deserialize<'de> for PredictInputs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// The first element decides: a string (one sequence) or an array (a batch).
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum First {
            Single(String),
            Multiple(Vec<String>),
        }

        struct InputsVisitor;

        impl<'de> Visitor<'de> for InputsVisitor {
            type Value = PredictInputs;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                // TEI 1.9.3's words.
                f.write_str(
                    "a string, a pair of strings [string, string] or a batch of mixed strings \
                     and pairs [[string], [string, string], ...]",
                )
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(PredictInputs::Single(Input::Text(v.to_owned())))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let first = seq
                    .next_element::<First>()?
                    .ok_or_else(|| de::Error::invalid_length(0, &self))?;
                let first = match first {
                    First::Single(text) => {
                        let second = seq.next_element::<String>()?;
                        if seq.next_element::<String>()?.is_some() {
                            return Err(de::Error::invalid_length(3, &self));
                        }
                        return Ok(PredictInputs::Single(match second {
                            Some(second) => Input::Pair(text, second),
                            None => Input::Text(text),
                        }));
                    }
                    First::Multiple(strings) => sequence(strings, &self)?,
                };
                let mut batch = vec![first];
                while let Some(strings) = seq.next_element::<Vec<String>>()? {
                    batch.push(sequence(strings, &self)?);
                }
                Ok(PredictInputs::Batch(batch))
            }
        }

        deserializer.deserialize_any(InputsVisitor)
    }
}

/// TEI 1.9.3's `POST /predict` body.
///
/// ```json
/// {"inputs": "text" | ["query", "text"] | [["text"], ["query", "text"], ...],
///  "raw_scores": false, "truncate": null, "truncation_direction": "Right"}
/// ```
/// Only `inputs` is required. Unknown fields are ignored, as TEI does.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PredictRequest {
    /// One sequence (a text, or a pair `[a, b]`) or a batch of sequences `[[a], [a, b], ...]`.
    pub inputs: PredictInputs,
    /// Truncate sequences longer than the model's maximum instead of failing. Absent: the
    /// upstream's default (TEI's `--auto-truncate`).
    #[serde(default)]
    pub truncate: Option<bool>,
    /// Which end to cut when truncating (default `Right`).
    #[serde(default)]
    pub truncation_direction: Option<TruncationDirection>,
    /// The classifier's logits instead of their softmax (or sigmoid, for one label).
    #[serde(default)]
    pub raw_scores: bool,
}

/// One prediction of TEI 1.9.3's `/predict` reply: `{"score": 0.93, "label": "positive"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Prediction {
    /// The label's probability (softmax over the labels; sigmoid for a one-label model), or its
    /// logit with `raw_scores`.
    pub score: f32,
    /// The label, from the model's `id2label`.
    pub label: String,
}

impl PredictRequest {
    /// Parses a `/predict` body, with the statuses of [`crate::EmbedRequest::from_slice`] (400
    /// for a body that is not JSON, 422 naming the field for JSON of the wrong shape, such as
    /// an `inputs` TEI does not read).
    ///
    /// # Errors
    /// [`EmbedError::InvalidJson`] or [`EmbedError::Validation`].
    pub fn from_slice(body: &[u8]) -> Result<PredictRequest, EmbedError> {
        parse_object(body, "{\"inputs\": \"text\"}")
    }

    /// TEI 1.9.3's limits of `/predict`.
    ///
    /// # Errors
    /// - [`EmbedError::Validation`] (422) for a batch of more than `max_inputs` sequences
    ///   ("batch size N > maximum allowed batch size M", TEI's words; a single sequence is not
    ///   counted, as TEI).
    /// - [`EmbedError::Empty`] (400) "`inputs` cannot be empty" for an empty text, or a pair of
    ///   two empty texts (TEI's tokenizer refuses those; a pair with one text is scored).
    pub fn validate(&self, max_inputs: usize) -> Result<(), EmbedError> {
        if let PredictInputs::Batch(batch) = &self.inputs
            && batch.len() > max_inputs
        {
            let n = batch.len();
            return Err(EmbedError::Validation(format!(
                "batch size {n} > maximum allowed batch size {max_inputs}: at most \
                 MAX_CLIENT_BATCH_SIZE ({max_inputs}) sequences per predict request. Given: {n}"
            )));
        }
        let empty = |input: &Input| match input {
            Input::Pair(a, b) => a.is_empty() && b.is_empty(),
            other => other.is_empty(),
        };
        if let Some(i) = self.inputs.as_slice().iter().position(empty) {
            return Err(EmbedError::Empty(format!(
                "`inputs` cannot be empty: sequence {i} is empty"
            )));
        }
        Ok(())
    }

    /// The request's sequences, their batching key ([`Task::Predict`] with its `raw_scores`,
    /// `truncate` and `truncation_direction`) and whether it is a single sequence (its reply is
    /// then one list, not a list of lists).
    pub fn into_parts(self) -> (Vec<Input>, EmbedOptions, bool) {
        let options = EmbedOptions {
            normalize: false,
            truncate: self.truncate,
            truncation_direction: self.truncation_direction,
            task: Task::Predict {
                raw_scores: self.raw_scores,
            },
            ..EmbedOptions::default()
        };
        match self.inputs {
            PredictInputs::Single(input) => (vec![input], options, true),
            PredictInputs::Batch(inputs) => (inputs, options, false),
        }
    }
}

#[cfg(feature = "openapi")]
mod schema {
    //! The schema of [`PredictInputs`], which serde's derive does not give (TEI's own, as its
    //! `openapi.json` writes it, with the empty cases left out).
    use utoipa::openapi::RefOr;
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};
    use utoipa::{PartialSchema, ToSchema};

    use super::PredictInputs;

    fn strings(n: usize, description: &str) -> ArrayBuilder {
        ArrayBuilder::new()
            .items(ObjectBuilder::new().schema_type(Type::String))
            .min_items(Some(n))
            .max_items(Some(n))
            .description(Some(description))
    }

    impl PartialSchema for PredictInputs {
        fn schema() -> RefOr<Schema> {
            let sequence = OneOfBuilder::new()
                .item(strings(1, "A single string"))
                .item(strings(2, "A pair of strings"));
            OneOfBuilder::new()
                .item(
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .min_length(Some(1))
                        .description(Some("A single string")),
                )
                .item(strings(2, "A pair of strings"))
                .item(
                    ArrayBuilder::new()
                        .items(sequence)
                        .min_items(Some(1))
                        .description(Some(
                            "A batch: one list of predictions per sequence. At most \
                             `MAX_CLIENT_BATCH_SIZE` sequences.",
                        )),
                )
                .description(Some(
                    "Model input: a single string, a pair of strings, or a batch of mixed \
                     single strings and pairs (TEI 1.9.3's `PredictInput`).",
                ))
                .into()
        }
    }

    impl ToSchema for PredictInputs {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(body: &str) -> (Vec<Input>, EmbedOptions, bool) {
        let request = PredictRequest::from_slice(body.as_bytes()).expect("TEI's body");
        request.validate(4).expect("within limits");
        request.into_parts()
    }

    fn text(s: &str) -> Input {
        Input::Text(s.into())
    }

    fn pair(a: &str, b: &str) -> Input {
        Input::Pair(a.into(), b.into())
    }

    #[test]
    fn reads_inputs_as_tei_does() {
        assert_eq!(parts(r#"{"inputs":"a"}"#).0, [text("a")]);
        let (inputs, options, single) = parts(r#"{"inputs":["q","t"],"raw_scores":true}"#);
        assert_eq!((inputs, single), (vec![pair("q", "t")], true));
        assert_eq!(options.task, Task::Predict { raw_scores: true });
        assert_eq!(parts(r#"{"inputs":["a"]}"#).0, [text("a")]);
        let (inputs, _, single) = parts(r#"{"inputs":[["a"],["q","t"]],"truncate":true}"#);
        assert_eq!((inputs, single), (vec![text("a"), pair("q", "t")], false));
        assert!(!parts(r#"{"inputs":[["a"]]}"#).2, "a batch of one");
        assert_eq!(predict_subject("embed.m"), "embed.m.predict");
    }

    #[test]
    fn refuses_what_tei_refuses() {
        for body in [
            r#"{"inputs":[]}"#,
            r#"{"inputs":["a","b","c"]}"#,
            r#"{"inputs":[["a","b","c"]]}"#,
            r#"{"inputs":[["a"],[]]}"#,
            r#"{"inputs":[1]}"#,
            r#"{"input":"a"}"#,
        ] {
            let err = PredictRequest::from_slice(body.as_bytes()).expect_err(body);
            assert_eq!(err.status(), 422, "{body}: {err}");
        }
        assert_eq!(
            PredictRequest::from_slice(b"{").expect_err("").status(),
            400
        );
        for (body, status) in [
            (r#"{"inputs":""}"#, 400),
            (r#"{"inputs":[["a"],["",""]]}"#, 400),
            (r#"{"inputs":[["a"],["b"],["c"]]}"#, 422),
        ] {
            let request = PredictRequest::from_slice(body.as_bytes()).expect(body);
            assert_eq!(
                request.validate(2).expect_err(body).status(),
                status,
                "{body}"
            );
        }
        let one_sided = PredictRequest::from_slice(br#"{"inputs":["q",""]}"#).expect("pair");
        assert_eq!(
            one_sided.validate(2),
            Ok(()),
            "a pair with one text is scored"
        );
        let single = PredictRequest::from_slice(br#"{"inputs":["q","t"]}"#).expect("pair");
        assert_eq!(
            single.validate(0),
            Ok(()),
            "a single sequence is not counted"
        );
    }
}
