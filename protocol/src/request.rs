//! The request body: exactly TEI's `POST /embed` JSON.

use std::fmt;

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::EmbedError;
use crate::compact::OutputDtype;

/// TEI's `POST /embed` body.
///
/// ```json
/// {"inputs": "one text" | ["text", ...] | [101, 7592, 102] | [[101, 102], "text", ...],
///  "normalize": true, "truncate": false,
///  "truncation_direction": "Right", "prompt_name": null, "dimensions": null}
/// ```
/// Only `inputs` is required. Unknown fields are ignored, as TEI does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EmbedRequest {
    /// One input or an array of inputs; an input is a text or an array of token ids.
    pub inputs: Inputs,
    /// L2-normalize each embedding (default `true`, as in TEI).
    #[serde(default = "default_normalize")]
    #[cfg_attr(feature = "openapi", schema(default = true))]
    pub normalize: bool,
    /// Truncate inputs longer than the model's maximum instead of failing with 413. Absent: the
    /// upstream's default (TEI's `--auto-truncate`, `false` for the built-in model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncate: Option<bool>,
    /// Which end to cut when truncating (default `Right`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncation_direction: Option<TruncationDirection>,
    /// Name of a prompt from the model's sentence-transformers config to prepend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_name: Option<String>,
    /// A prompt to prepend only if the model defines it (contract v1.5, not TEI's; Cohere's
    /// `input_type` arrives as this): a worker that knows its model's prompts applies it when
    /// the model has a prompt of this name and embeds without one otherwise; a worker that
    /// cannot tell passes it on as `prompt_name`, and the upstream answers it. Ignored when
    /// `prompt_name` is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_hint: Option<String>,
    /// Matryoshka output size: keep the first `dimensions` values of each embedding (a count of
    /// values, at least 1; 0 is answered 422).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub dimensions: Option<usize>,
    /// Compact outputs (contract v1.5, not TEI's): `"int8"`, `"uint8"`, `"binary"` or
    /// `"ubinary"` vectors instead of floats, or a list of types for an object of arrays keyed
    /// by type ([`OutputDtype`], quantized by the worker after the batch). Absent or `"float"`:
    /// TEI's reply, unchanged. Not part of the batching key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_dtype: Option<OutputDtype>,
}

fn default_normalize() -> bool {
    true
}

/// One input: a text, or the token ids of one (pre-tokenized) text, as TEI 1.9.3 accepts them.
///
/// Token ids are used as given: the model adds no special tokens to them (TEI decodes them to
/// text and re-encodes it without adding special tokens, which keeps the ids the caller sent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Input {
    /// `"text"`.
    Text(String),
    /// `[101, 7592, 102]`: token ids of the model's vocabulary.
    Ids(Vec<u32>),
    /// `["query", "text"]`: one (query, text) pair of a rerank request, scored together by a
    /// cross-encoder (as TEI 1.9.3's `/predict` takes a pair). Never parsed from an `/embed`
    /// body: built by [`crate::rerank::RerankRequest::into_parts`].
    Pair(String, String),
}

impl Input {
    /// `true` for `""` and `[]` (TEI 1.9.3 answers 400 `Empty` for either); a pair never is
    /// (TEI 1.9.3's `/rerank` scores an empty text against its query).
    pub fn is_empty(&self) -> bool {
        match self {
            Input::Text(text) => text.is_empty(),
            Input::Ids(ids) => ids.is_empty(),
            Input::Pair(..) => false,
        }
    }

    /// The text of a [`Input::Text`]; `None` for token ids.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Input::Text(text) => Some(text),
            Input::Ids(_) | Input::Pair(..) => None,
        }
    }

    /// The size of the input as sent: bytes of a text, 4 bytes per token id. Used for byte
    /// bounds (request size, queue bytes).
    pub fn size_bytes(&self) -> usize {
        match self {
            Input::Text(text) => text.len(),
            Input::Ids(ids) => ids.len() * std::mem::size_of::<u32>(),
            Input::Pair(query, text) => query.len() + text.len(),
        }
    }
}

impl From<String> for Input {
    fn from(text: String) -> Input {
        Input::Text(text)
    }
}

/// An input equals a text when it is that text (not token ids).
impl PartialEq<str> for Input {
    fn eq(&self, other: &str) -> bool {
        self.as_text() == Some(other)
    }
}

/// See `PartialEq<str>`.
impl PartialEq<&str> for Input {
    fn eq(&self, other: &&str) -> bool {
        self.as_text() == Some(*other)
    }
}

impl From<&str> for Input {
    fn from(text: &str) -> Input {
        Input::Text(text.to_owned())
    }
}

/// `inputs`: one input or an array of inputs.
///
/// As in TEI 1.9.3, an array of numbers is *one* input of token ids (`[101, 7592, 102]`), and
/// an array whose elements are texts or arrays of numbers is a batch
/// (`["a", [101, 102]]`). An array mixing numbers with texts is refused.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Inputs {
    /// `"inputs": "text"` or `"inputs": [101, 7592, 102]`: the reply holds one embedding.
    Single(Input),
    /// `"inputs": ["a", "b"]`: the reply holds one embedding per element, in order.
    Batch(Vec<Input>),
}

impl Inputs {
    /// Number of inputs (1 for [`Inputs::Single`]).
    pub fn len(&self) -> usize {
        match self {
            Inputs::Single(_) => 1,
            Inputs::Batch(v) => v.len(),
        }
    }

    /// `true` for an empty array.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The inputs as a slice, in order.
    pub fn as_slice(&self) -> &[Input] {
        match self {
            Inputs::Single(input) => std::slice::from_ref(input),
            Inputs::Batch(v) => v.as_slice(),
        }
    }

    /// The inputs as a vector, in order.
    pub fn into_vec(self) -> Vec<Input> {
        match self {
            Inputs::Single(input) => vec![input],
            Inputs::Batch(v) => v,
        }
    }

    /// TEI 1.9.3's checks of `inputs` (on `/embed`, `/embed_sparse` and `/embed_all` alike).
    ///
    /// # Errors
    /// - [`EmbedError::Empty`] (400) for an empty array, or an input that is an empty string or
    ///   an empty array of token ids.
    /// - [`EmbedError::Validation`] (422) for more than `max_inputs` inputs (TEI's
    ///   `max_client_batch_size` check).
    pub fn validate(&self, max_inputs: usize) -> Result<(), EmbedError> {
        let n = self.len();
        if n == 0 {
            return Err(EmbedError::Empty("`inputs` cannot be empty".into()));
        }
        if let Some(i) = self.as_slice().iter().position(Input::is_empty) {
            return Err(EmbedError::Empty(format!(
                "`inputs` cannot be empty: input {i} is empty"
            )));
        }
        if n > max_inputs {
            return Err(EmbedError::Validation(format!(
                "batch size {n} > maximum allowed batch size {max_inputs}: `inputs` must have at \
                 most {max_inputs} elements. Given: {n}"
            )));
        }
        Ok(())
    }
}

/// One element of an `inputs` array, before it is known whether the array is a batch (texts and
/// id arrays) or a single input of ids (numbers).
enum Element {
    Text(String),
    Id(u32),
    Ids(Vec<u32>),
}

impl<'de> Deserialize<'de> for Element {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ElementVisitor;

        impl<'de> Visitor<'de> for ElementVisitor {
            type Value = Element;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string, a token id or an array of token ids")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Element, E> {
                Ok(Element::Text(v.to_owned()))
            }

            fn visit_string<E: de::Error>(self, v: String) -> Result<Element, E> {
                Ok(Element::Text(v))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Element, E> {
                u32::try_from(v).map(Element::Id).map_err(|_| {
                    E::invalid_value(de::Unexpected::Unsigned(v), &"a token id below 2^32")
                })
            }

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Element, A::Error> {
                Vec::<u32>::deserialize(de::value::SeqAccessDeserializer::new(seq))
                    .map(Element::Ids)
            }
        }

        deserializer.deserialize_any(ElementVisitor)
    }
}

impl<'de> Deserialize<'de> for Inputs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct InputsVisitor;

        impl<'de> Visitor<'de> for InputsVisitor {
            type Value = Inputs;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a string, an array of token ids, or an array of strings and arrays of \
                     token ids",
                )
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Inputs, E> {
                Ok(Inputs::Single(Input::Text(v.to_owned())))
            }

            fn visit_string<E: de::Error>(self, v: String) -> Result<Inputs, E> {
                Ok(Inputs::Single(Input::Text(v)))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Inputs, A::Error> {
                let capacity = seq.size_hint().unwrap_or(1).min(1024);
                let mut batch = Vec::with_capacity(capacity);
                let mut ids = Vec::new();
                while let Some(element) = seq.next_element::<Element>()? {
                    match element {
                        Element::Id(id) if batch.is_empty() => ids.push(id),
                        Element::Text(_) | Element::Ids(_) if !ids.is_empty() => {
                            return Err(mixed());
                        }
                        Element::Id(_) => return Err(mixed()),
                        Element::Text(text) => batch.push(Input::Text(text)),
                        Element::Ids(v) => batch.push(Input::Ids(v)),
                    }
                }
                Ok(if ids.is_empty() {
                    Inputs::Batch(batch)
                } else {
                    Inputs::Single(Input::Ids(ids))
                })
            }
        }

        fn mixed<E: de::Error>() -> E {
            E::custom(
                "an array of token ids cannot mix numbers with strings or arrays: send \
                 [101, 102] for one input of token ids, or [[101, 102], \"text\"] for several \
                 inputs",
            )
        }

        deserializer.deserialize_any(InputsVisitor)
    }
}

/// Which end of an over-long input is cut when truncating (TEI's `truncation_direction`):
/// `"Left"` or `"Right"` (`"left"` and `"right"` are accepted too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum TruncationDirection {
    /// Keep the end of the input.
    #[serde(alias = "left")]
    Left,
    /// Keep the start of the input (default).
    #[default]
    #[serde(alias = "right")]
    Right,
}

/// The options of a request that change what the model computes. Requests share an upstream call
/// only when their options are equal; this is the batching key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct EmbedOptions {
    /// See [`EmbedRequest::normalize`].
    pub normalize: bool,
    /// See [`EmbedRequest::truncate`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncate: Option<bool>,
    /// See [`EmbedRequest::truncation_direction`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncation_direction: Option<TruncationDirection>,
    /// See [`EmbedRequest::prompt_name`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_name: Option<String>,
    /// See [`EmbedRequest::dimensions`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<usize>,
    /// What the upstream computes for each input: embeddings (`/embed`, the default, left out
    /// when serialized, so an `/embed` body is unchanged) or rerank scores of (query, text)
    /// pairs. Part of the batching key: embeddings and scores never share an upstream call.
    #[serde(skip_serializing)]
    pub task: Task,
}

/// What an upstream call computes: the batching key's kind of work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Task {
    /// One embedding per input (TEI 1.9.3's `/embed`).
    #[default]
    Embed,
    /// One relevance score per [`Input::Pair`], as TEI 1.9.3's `/rerank` and `/predict` compute
    /// it with the model's classifier head: the sigmoid of the logit, or the logit itself with
    /// `raw_scores`.
    Rerank {
        /// TEI's `raw_scores`: the logit instead of its sigmoid.
        raw_scores: bool,
    },
    /// One sparse embedding per input, as TEI 1.9.3's `/embed_sparse` computes it with a SPLADE
    /// model: the non-zero values of the pooled vector as `[{"index", "value"}, ...]`
    /// ([`crate::sparse`], contract v1.3).
    Sparse,
    /// The predictions of one sequence (a text or an [`Input::Pair`]), as TEI 1.9.3's
    /// `/predict` computes them with the model's classifier head: `[{"score", "label"}, ...]`
    /// for every label, highest first ([`crate::predict`], contract v1.4).
    Predict {
        /// TEI's `raw_scores`: the logits instead of their softmax.
        raw_scores: bool,
    },
    /// One vector per token of each input, as TEI 1.9.3's `/embed_all` computes them (the last
    /// hidden state, no pooling): `[[f32, ...], ...]` ([`crate::embed_all`], contract v1.4).
    EmbedAll,
}

impl Default for EmbedOptions {
    fn default() -> Self {
        EmbedOptions {
            normalize: true,
            truncate: None,
            truncation_direction: None,
            prompt_name: None,
            dimensions: None,
            task: Task::Embed,
        }
    }
}

impl EmbedRequest {
    /// Parses a request body, with the status TEI 1.9.3's JSON extractor (axum's `Json`) gives
    /// each failure.
    ///
    /// # Errors
    /// - [`EmbedError::InvalidJson`] (400) when the body is not JSON: empty, truncated, not
    ///   JSON, a UTF-8 byte-order mark, single quotes, invalid UTF-8, raw control characters in a
    ///   string, or trailing characters after the object ([`invalid_json`]).
    /// - [`EmbedError::Validation`] (422) naming the offending field for valid JSON of the wrong
    ///   shape: a missing `inputs`, a field of the wrong type, or a body that is not a JSON
    ///   object (TEI 1.9.3 answers 422 for a top-level array, which serde alone would read as
    ///   the fields in order).
    pub fn from_slice(body: &[u8]) -> Result<EmbedRequest, EmbedError> {
        parse_object(body, "{\"inputs\": \"text\"}")
    }

    /// Checks the limits a request must meet before it is queued.
    ///
    /// # Errors
    /// - [`EmbedError::Empty`] (400) when `inputs` is an empty array or one input is an empty
    ///   string or an empty array of token ids (TEI 1.9.3 answers 400 `Empty` for these).
    /// - [`EmbedError::Validation`] (422) when it holds more than `max_inputs` inputs (mirrors
    ///   TEI 1.9.3's `max_client_batch_size` check, which answers 422), or `dimensions` is 0,
    ///   or `output_dtype` is `[]` ([`OutputDtype::validate`]).
    pub fn validate(&self, max_inputs: usize) -> Result<(), EmbedError> {
        self.inputs.validate(max_inputs)?;
        if self.dimensions == Some(0) {
            return Err(EmbedError::Validation(
                "`dimensions` must be at least 1".into(),
            ));
        }
        if let Some(output) = &self.output_dtype {
            output.validate()?;
        }
        Ok(())
    }

    /// The batching key of this request.
    pub fn options(&self) -> EmbedOptions {
        EmbedOptions {
            normalize: self.normalize,
            truncate: self.truncate,
            truncation_direction: self.truncation_direction,
            prompt_name: self.prompt_name.clone(),
            dimensions: self.dimensions,
            task: Task::Embed,
        }
    }

    /// Splits the request into its inputs and its batching key.
    pub fn into_parts(self) -> (Vec<Input>, EmbedOptions) {
        let options = self.options();
        (self.inputs.into_vec(), options)
    }
}

/// Parses a JSON object body into `T`, with the status TEI 1.9.3's JSON extractor (axum's
/// `Json`) gives each failure: [`EmbedError::InvalidJson`] (400) for a body that is not JSON,
/// [`EmbedError::Validation`] (422) naming the field for JSON of the wrong shape, and for a
/// body that is not an object (`example` shows one in the message). Shared by every request
/// body of the contract (`/embed`'s and `/rerank`'s).
pub fn parse_object<T: serde::de::DeserializeOwned>(
    body: &[u8],
    example: &str,
) -> Result<T, EmbedError> {
    let not_an_object = || {
        EmbedError::Validation(format!(
            "the request body must be a JSON object, e.g. {example}"
        ))
    };
    let mut de = serde_json::Deserializer::from_slice(body);
    let request: T = match serde_path_to_error::deserialize(&mut de) {
        Ok(request) => request,
        Err(err) if err.inner().is_syntax() || err.inner().is_eof() => {
            return Err(invalid_json(&err));
        }
        Err(_) if first_byte(body) != Some(b'{') => return Err(not_an_object()),
        Err(err) => {
            let path = err.path().to_string();
            let inner = err.into_inner();
            return Err(if path == "." || path.is_empty() {
                EmbedError::Validation(format!("invalid request body: {inner}"))
            } else {
                EmbedError::Validation(format!("`{path}`: {inner}"))
            });
        }
    };
    de.end().map_err(|err| invalid_json(&err))?;
    if first_byte(body) != Some(b'{') {
        return Err(not_an_object());
    }
    Ok(request)
}

/// The first byte of `body` that is not JSON whitespace.
fn first_byte(body: &[u8]) -> Option<u8> {
    body.iter().copied().find(|b| !b.is_ascii_whitespace())
}

/// [`EmbedError::InvalidJson`] (400) for a JSON syntax error, with serde_json's description (and
/// the field it was in, when known), as TEI 1.9.3's axum extractor words it: "Failed to parse
/// the request body as JSON: inputs: EOF while parsing a string at line 1 column 13". Shared by
/// every route that reads a JSON body (TEI's and OpenAI's).
pub fn invalid_json(err: &impl fmt::Display) -> EmbedError {
    EmbedError::InvalidJson(err.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<EmbedRequest, EmbedError> {
        EmbedRequest::from_slice(body.as_bytes())
    }

    #[test]
    fn single_string_and_defaults() {
        let r = parse(r#"{"inputs":"hello"}"#).expect("valid");
        assert_eq!(r.inputs, Inputs::Single(Input::from("hello")));
        assert_eq!(r.options(), EmbedOptions::default());
    }

    #[test]
    fn batch_and_all_options() {
        let r = parse(
            r#"{"inputs":["a","b"],"normalize":false,"truncate":true,
                "truncation_direction":"Left","prompt_name":"query","dimensions":64,"extra":1}"#,
        )
        .expect("valid");
        assert_eq!(r.inputs.len(), 2);
        let o = r.options();
        assert!(!o.normalize);
        assert_eq!(o.truncate, Some(true));
        assert_eq!(o.truncation_direction, Some(TruncationDirection::Left));
        assert_eq!(o.prompt_name.as_deref(), Some("query"));
        assert_eq!(o.dimensions, Some(64));
    }

    #[test]
    fn wrong_types_name_the_field() {
        let err = parse(r#"{"inputs":"a","normalize":"yes"}"#).expect_err("invalid");
        assert_eq!(err.status(), 422);
        assert!(err.to_string().contains("`normalize`"), "{err}");

        let err = parse(r#"{"inputs":[1,"a"]}"#).expect_err("invalid");
        assert!(err.to_string().contains("`inputs`"), "{err}");
        assert!(err.to_string().contains("cannot mix numbers"), "{err}");

        let err = parse(r#"{"inputs":["a",{"b":1}]}"#).expect_err("invalid");
        assert!(err.to_string().contains("`inputs[1]`"), "{err}");
        assert!(err.to_string().contains("array of token ids"), "{err}");

        let err = parse(r#"{"inputs":[-1]}"#).expect_err("invalid");
        assert!(err.to_string().contains("`inputs[0]`"), "{err}");

        let err = parse(r#"{"inputs":{"a":1}}"#).expect_err("invalid");
        assert!(
            err.to_string().contains("a string, an array of token ids"),
            "{err}"
        );
    }

    #[test]
    fn token_ids_as_tei_reads_them() {
        let one = parse(r#"{"inputs":[101,7592,102]}"#).expect("one input of ids");
        assert_eq!(one.inputs, Inputs::Single(Input::Ids(vec![101, 7592, 102])));
        let batch = parse(r#"{"inputs":[[101,102],"text",[7592]]}"#).expect("a batch");
        assert_eq!(
            batch.inputs,
            Inputs::Batch(vec![
                Input::Ids(vec![101, 102]),
                Input::from("text"),
                Input::Ids(vec![7592]),
            ])
        );
        let json = serde_json::to_value(&batch).expect("serializes");
        assert_eq!(
            json["inputs"],
            serde_json::json!([[101, 102], "text", [7592]])
        );
        for body in [r#"{"inputs":[[]]}"#, r#"{"inputs":["a",[]]}"#] {
            let err = parse(body).expect("parses").validate(8).expect_err("empty");
            assert_eq!(err.status(), 400, "{body}");
        }
    }

    #[test]
    fn missing_inputs_is_a_validation_error() {
        let err = parse(r#"{"normalize":true}"#).expect_err("invalid");
        assert!(err.to_string().contains("missing field `inputs`"), "{err}");
        assert_eq!(err.status(), 422);
    }

    /// TEI 1.9.3 (axum's `Json`) answers 400 for a body that is not JSON, 422 for JSON of the
    /// wrong shape.
    #[test]
    fn a_body_that_is_not_json_is_400() {
        let cases: [&[u8]; 10] = [
            b"",
            b"   ",
            b"{not json",
            br#"{"inputs":"a"#,
            b"hello",
            b"\xEF\xBB\xBF{\"inputs\":\"a\"}",
            b"{'inputs':'a'}",
            b"{\"inputs\":\"\xFF\xFE\"}",
            b"{\"inputs\":\"a\x01b\"}",
            br#"{"inputs":"a"} trailing"#,
        ];
        for body in cases {
            let err = EmbedRequest::from_slice(body).expect_err("not JSON");
            assert_eq!(err.status(), 400, "{body:?}: {err}");
            assert_eq!(err.error_type(), crate::ErrorType::Validation, "{body:?}");
            assert!(
                err.to_string()
                    .starts_with("Failed to parse the request body as JSON: "),
                "{err}"
            );
        }
        let err = parse(r#"{"inputs":1}"#).expect_err("wrong shape");
        assert_eq!(err.status(), 422, "{err}");
    }

    #[test]
    fn limits() {
        let empty = parse(r#"{"inputs":[]}"#).expect("parses");
        assert_eq!(empty.validate(8).expect_err("empty").status(), 400);
        let three = parse(r#"{"inputs":["a","b","c"]}"#).expect("parses");
        let err = three.validate(2).expect_err("too many");
        assert_eq!(err.status(), 422, "TEI 1.9.3 answers 422");
        assert!(
            err.to_string().contains("at most 2 elements. Given: 3"),
            "{err}"
        );
        assert!(three.validate(3).is_ok());
        for body in [r#"{"inputs":""}"#, r#"{"inputs":["a",""]}"#] {
            let err = parse(body)
                .expect("parses")
                .validate(8)
                .expect_err("empty text");
            assert_eq!(err.status(), 400, "{body}");
            assert_eq!(err.error_type(), crate::ErrorType::Empty, "{body}");
        }
    }

    #[test]
    fn the_body_must_be_an_object() {
        for body in [r#"["a"]"#, r#""a""#, " [1]"] {
            let err = parse(body).expect_err("not an object");
            assert_eq!(err.status(), 422, "{body}");
            assert!(err.to_string().contains("JSON object"), "{err}");
        }
    }

    #[test]
    fn serializes_back_to_tei_shape_without_absent_options() {
        let r = parse(r#"{"inputs":["a"]}"#).expect("valid");
        let json = serde_json::to_value(&r).expect("serializes");
        assert_eq!(json, serde_json::json!({"inputs":["a"],"normalize":true}));
    }
}
