//! Tokenization: exactly TEI 1.9.3's `POST /tokenize` and `POST /decode` bodies and replies, on
//! the subjects [`tokenize_subject`] (`<subject>.tokenize`) and [`decode_subject`]
//! (`<subject>.decode`), contract v1.3.
//!
//! Both are cheap (no model run), so a worker passes each request to its upstream's route as one
//! call, with the request's deadline, and answers the upstream's reply or TEI's error as it
//! came; the bodies are checked first, by the gateway and by the worker, with TEI's limits.

use serde::{Deserialize, Serialize};

use crate::EmbedError;
use crate::request::parse_object;

/// The tokenize route's token: TEI's path without its `/`, and the suffix of
/// [`tokenize_subject`].
pub const TOKENIZE: &str = "tokenize";

/// The decode route's token: TEI's path without its `/`, and the suffix of [`decode_subject`].
pub const DECODE: &str = "decode";

/// The subject of tokenize requests for the workers of `subject` (the plain subject or a model
/// subject): `<subject>.tokenize`, in the workers' queue group.
pub fn tokenize_subject(subject: &str) -> String {
    format!("{subject}.{TOKENIZE}")
}

/// The subject of decode requests for the workers of `subject`: `<subject>.decode`, in the
/// workers' queue group.
pub fn decode_subject(subject: &str) -> String {
    format!("{subject}.{DECODE}")
}

/// TEI 1.9.3's `POST /tokenize` body: `{"inputs": "text" | ["text", ...],
/// "add_special_tokens": true, "prompt_name": null}`. Only `inputs` is required; unknown fields
/// are ignored, as TEI does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenizeRequest {
    /// One text or an array of texts.
    pub inputs: TokenizeInput,
    /// Add the model's special tokens (`[CLS]`, `[SEP]`, ...), default `true`, as TEI.
    #[serde(default = "default_true")]
    #[cfg_attr(feature = "openapi", schema(default = true))]
    pub add_special_tokens: bool,
    /// Name of a prompt from the model's sentence-transformers config to prepend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_name: Option<String>,
}

/// `inputs` of [`TokenizeRequest`]: one text (the reply holds one list of tokens) or an array of
/// texts (one list per text, in order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum TokenizeInput {
    /// `"text"`.
    Single(String),
    /// `["text", ...]`.
    Batch(Vec<String>),
}

/// One token of TEI 1.9.3's `/tokenize` reply (the reply is one list per input):
/// `{"id": 7592, "text": "hello", "special": false, "start": 0, "stop": 5}`; a special token has
/// no `start` and `stop` (`null`), and its `text` is the token itself (`[CLS]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SimpleToken {
    /// The token id.
    pub id: u32,
    /// The input's text the token covers (bytes `start..stop`), or a special token's text.
    pub text: String,
    /// Whether it is a special token added by the tokenizer.
    pub special: bool,
    /// Byte offset of the token's start in the input (`null` for a special token).
    pub start: Option<usize>,
    /// Byte offset one past the token's end in the input (`null` for a special token).
    pub stop: Option<usize>,
}

/// TEI 1.9.3's `POST /decode` body: `{"ids": [101, 7592, 102] | [[101, ...], ...],
/// "skip_special_tokens": true}`; the reply is one string per list of ids.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DecodeRequest {
    /// One list of token ids, or an array of lists.
    pub ids: InputIds,
    /// Leave the special tokens out of the text, default `true`, as TEI.
    #[serde(default = "default_true")]
    #[cfg_attr(feature = "openapi", schema(default = true))]
    pub skip_special_tokens: bool,
}

/// `ids` of [`DecodeRequest`]: one list of token ids, or an array of lists (as TEI, `[]` is one
/// empty list).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum InputIds {
    /// `[101, 7592, 102]`.
    Single(Vec<u32>),
    /// `[[101, 7592, 102], ...]`.
    Batch(Vec<Vec<u32>>),
}

fn default_true() -> bool {
    true
}

impl TokenizeRequest {
    /// Parses a `/tokenize` body (400 for a body that is not JSON, 422 naming the field for JSON
    /// of the wrong shape).
    ///
    /// # Errors
    /// [`EmbedError::InvalidJson`] or [`EmbedError::Validation`].
    pub fn from_slice(body: &[u8]) -> Result<TokenizeRequest, EmbedError> {
        parse_object(body, "{\"inputs\": \"text\"}")
    }

    /// The number of texts: 1 for a single text.
    pub fn len(&self) -> usize {
        match &self.inputs {
            TokenizeInput::Single(_) => 1,
            TokenizeInput::Batch(texts) => texts.len(),
        }
    }

    /// Whether `inputs` is an empty array.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// TEI 1.9.3's checks: 400 `Empty` "`inputs` cannot be empty" for an empty array, 422 for
    /// more than `max_inputs` texts.
    ///
    /// # Errors
    /// [`EmbedError::Empty`] or [`EmbedError::Validation`].
    pub fn validate(&self, max_inputs: usize) -> Result<(), EmbedError> {
        check_count("inputs", self.len(), max_inputs)
    }
}

impl DecodeRequest {
    /// Parses a `/decode` body (400 for a body that is not JSON, 422 naming the field for JSON
    /// of the wrong shape).
    ///
    /// # Errors
    /// [`EmbedError::InvalidJson`] or [`EmbedError::Validation`].
    pub fn from_slice(body: &[u8]) -> Result<DecodeRequest, EmbedError> {
        parse_object(body, "{\"ids\": [101, 7592, 102]}")
    }

    /// The number of lists of ids: 1 for a single list.
    pub fn len(&self) -> usize {
        match &self.ids {
            InputIds::Single(_) => 1,
            InputIds::Batch(lists) => lists.len(),
        }
    }

    /// Whether `ids` is an empty array of lists (never: `[]` is one empty list, as TEI reads
    /// it).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// TEI 1.9.3's checks: 400 `Empty` "`ids` cannot be empty" for an empty batch, 422 for more
    /// than `max_inputs` lists.
    ///
    /// # Errors
    /// [`EmbedError::Empty`] or [`EmbedError::Validation`].
    pub fn validate(&self, max_inputs: usize) -> Result<(), EmbedError> {
        check_count("ids", self.len(), max_inputs)
    }
}

/// TEI 1.9.3's count checks of a `/tokenize` or `/decode` batch of `n` in `field`.
fn check_count(field: &str, n: usize, max: usize) -> Result<(), EmbedError> {
    if n == 0 {
        return Err(EmbedError::Empty(format!("`{field}` cannot be empty")));
    }
    if n > max {
        return Err(EmbedError::Validation(format!(
            "batch size {n} > maximum allowed batch size {max}: `{field}` must have at most \
             {max} elements (MAX_CLIENT_BATCH_SIZE). Given: {n}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenize_bodies_and_limits_are_teis() {
        let one = TokenizeRequest::from_slice(br#"{"inputs":"hi"}"#).expect("valid");
        assert_eq!((one.len(), one.add_special_tokens), (1, true));
        let two =
            TokenizeRequest::from_slice(br#"{"inputs":["a","b"],"add_special_tokens":false}"#)
                .expect("valid");
        assert_eq!((two.len(), two.add_special_tokens), (2, false));
        assert_eq!(two.validate(1).expect_err("too many").status(), 422);
        let none = TokenizeRequest::from_slice(br#"{"inputs":[]}"#).expect("parses");
        let err = none.validate(4).expect_err("empty");
        assert_eq!(err.status(), 400);
        assert!(
            err.to_string().contains("`inputs` cannot be empty"),
            "{err}"
        );
        let err = TokenizeRequest::from_slice(br#"{"inputs":[1]}"#).expect_err("ids");
        assert_eq!(err.status(), 422);
        assert_eq!(tokenize_subject("embed.m"), "embed.m.tokenize");
    }

    #[test]
    fn decode_bodies_and_limits_are_teis() {
        let one = DecodeRequest::from_slice(br#"{"ids":[101,102]}"#).expect("valid");
        assert_eq!(one.ids, InputIds::Single(vec![101, 102]));
        assert!(one.skip_special_tokens);
        let empty = DecodeRequest::from_slice(br#"{"ids":[]}"#).expect("valid");
        assert_eq!(
            empty.ids,
            InputIds::Single(vec![]),
            "TEI reads `[]` as one list"
        );
        let batch = DecodeRequest::from_slice(br#"{"ids":[[1],[2,3]]}"#).expect("valid");
        assert_eq!(batch.len(), 2);
        assert_eq!(batch.validate(1).expect_err("too many").status(), 422);
        assert_eq!(DecodeRequest::from_slice(b"{").expect_err("").status(), 400);
        assert_eq!(decode_subject("embed"), "embed.decode");
        let token: SimpleToken = serde_json::from_str(
            r#"{"id":101,"text":"[CLS]","special":true,"start":null,"stop":null}"#,
        )
        .expect("TEI's shape");
        assert!(token.special && token.start.is_none());
    }
}
