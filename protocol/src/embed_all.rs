//! Token embeddings: exactly TEI 1.9.3's `POST /embed_all` body and reply, on the subject
//! [`embed_all_subject`] (`<subject>.embed_all`, contract v1.4).
//!
//! A worker turns an [`EmbedAllRequest`] into its inputs with [`Task::EmbedAll`] options
//! ([`EmbedAllRequest::into_parts`]), so they go through the batcher, cache and protections of
//! embedding inputs, and inputs of different callers share one upstream call. Each input's result
//! is TEI's list of its tokens' vectors (the model's last hidden state, no pooling),
//! `[[0.1, ...], [0.2, ...], ...]`, carried as the JSON text the upstream wrote, so the reply is
//! TEI's: `[[[f32; dim]; tokens]; inputs]`. These replies are large (a vector per token), so the
//! worker checks them against the NATS server's `max_payload` as it checks `/embed`'s, with a
//! reply size per input learnt from `/embed_all` replies only.

use serde::{Deserialize, Serialize};

use crate::request::{Inputs, Task, TruncationDirection, parse_object};
use crate::{EmbedError, EmbedOptions, Input};

/// The route's token: TEI's path without its `/`, and the suffix of [`embed_all_subject`].
pub const ROUTE: &str = "embed_all";

/// The subject of token-embedding requests for the workers of `subject`:
/// `<subject>.embed_all`, in the workers' queue group.
pub fn embed_all_subject(subject: &str) -> String {
    format!("{subject}.{ROUTE}")
}

/// The error message of a classifier model, as TEI 1.9.3 answers `/embed_all` (and `/embed`)
/// on one (424 `Backend`, `core/src/infer.rs`).
pub const NOT_AN_EMBEDDING_MODEL: &str = "Model is not an embedding model";

/// The error message of a SPLADE model, as TEI 1.9.3 answers `/embed_all` on one (424
/// `Backend`).
pub const NOT_FOR_SPLADE: &str = "`embed_all` is not available for SPLADE models";

/// TEI 1.9.3's `POST /embed_all` body.
///
/// ```json
/// {"inputs": "one text" | ["text", ...] | [101, 7592, 102] | [[101, 102], "text", ...],
///  "truncate": false, "truncation_direction": "Right", "prompt_name": null}
/// ```
/// Only `inputs` is required. Unknown fields are ignored, as TEI does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EmbedAllRequest {
    /// One input or an array of inputs; an input is a text or an array of token ids.
    pub inputs: Inputs,
    /// Truncate inputs longer than the model's maximum instead of failing. Absent: the
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

impl EmbedAllRequest {
    /// Parses an `/embed_all` body, with the statuses of [`crate::EmbedRequest::from_slice`].
    ///
    /// # Errors
    /// [`EmbedError::InvalidJson`] (400) or [`EmbedError::Validation`] (422).
    pub fn from_slice(body: &[u8]) -> Result<EmbedAllRequest, EmbedError> {
        parse_object(body, "{\"inputs\": \"text\"}")
    }

    /// Checks TEI 1.9.3's limits of `inputs` ([`Inputs::validate`]: 400 for none or an empty
    /// one, 422 for more than `max_inputs`).
    ///
    /// # Errors
    /// [`EmbedError::Empty`] or [`EmbedError::Validation`].
    pub fn validate(&self, max_inputs: usize) -> Result<(), EmbedError> {
        self.inputs.validate(max_inputs)
    }

    /// The request's inputs and their batching key ([`Task::EmbedAll`] with its `truncate`,
    /// `truncation_direction` and `prompt_name`; TEI does not normalize token vectors).
    pub fn into_parts(self) -> (Vec<Input>, EmbedOptions) {
        let options = EmbedOptions {
            normalize: false,
            truncate: self.truncate,
            truncation_direction: self.truncation_direction,
            prompt_name: self.prompt_name,
            dimensions: None,
            task: Task::EmbedAll,
        };
        (self.inputs.into_vec(), options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_teis_body_into_token_embedding_inputs() {
        let body = br#"{"inputs":["a",[101,102]],"truncate":true,"prompt_name":"q"}"#;
        let request = EmbedAllRequest::from_slice(body).expect("valid");
        request.validate(4).expect("within limits");
        let (inputs, options) = request.into_parts();
        assert_eq!(
            inputs,
            [Input::Text("a".into()), Input::Ids(vec![101, 102])]
        );
        assert_eq!(options.task, Task::EmbedAll);
        assert!(!options.normalize);
        assert_eq!(embed_all_subject("embed.m"), "embed.m.embed_all");
        for (body, status) in [
            (&br#"{"inputs":[]}"#[..], 400),
            (br#"{"inputs":["a","b","c"]}"#, 422),
        ] {
            let request = EmbedAllRequest::from_slice(body).expect("parses");
            assert_eq!(request.validate(2).expect_err("refused").status(), status);
        }
    }
}
