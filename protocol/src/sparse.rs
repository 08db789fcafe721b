//! Sparse embeddings: exactly TEI 1.9.3's `POST /embed_sparse` body and reply, on the subject
//! [`sparse_subject`] (`<subject>.embed_sparse`, contract v1.3).
//!
//! A worker turns a [`SparseRequest`] into its inputs with [`Task::Sparse`] options
//! ([`SparseRequest::into_parts`]), so sparse inputs go through the batcher, cache and
//! protections of embedding inputs; inputs of different callers share an upstream call. Each
//! input's result is TEI's list of non-zero values, `[{"index": 1012, "value": 0.41}, ...]`,
//! carried as the JSON text the upstream wrote, so the reply is TEI's reply:
//! `[[{"index", "value"}, ...], ...]`, one list per input, in input order.

use serde::{Deserialize, Serialize};

use crate::Task;
use crate::inputs_request::inputs_request;

/// The route's token: TEI's path without its `/`, and the suffix of [`sparse_subject`].
pub const ROUTE: &str = "embed_sparse";

/// The subject of sparse-embedding requests for the workers of `subject` (the plain subject or a
/// model subject): `<subject>.embed_sparse`, in the workers' queue group. Cancels, heartbeats
/// and discovery are `subject`'s own ([`crate::headers::cancel_subject`], ...).
pub fn sparse_subject(subject: &str) -> String {
    format!("{subject}.{ROUTE}")
}

/// The error message of a model that has no sparse output, as TEI 1.9.3's `/embed_sparse`
/// answers it (424 `Backend`) for a model without SPLADE pooling.
pub const NOT_SPLADE: &str = "Model is not an embedding model with SPLADE pooling";

inputs_request! {
    /// TEI 1.9.3's `POST /embed_sparse` body.
    ///
    /// ```json
    /// {"inputs": "one text" | ["text", ...] | [101, 7592, 102] | [[101, 102], "text", ...],
    ///  "truncate": false, "truncation_direction": "Right", "prompt_name": null}
    /// ```
    /// Only `inputs` is required. Unknown fields are ignored, as TEI does (`normalize` is not a
    /// field of this route).
    SparseRequest("/embed_sparse", Task::Sparse, "`normalize` off: TEI refuses it for SPLADE")
}

/// One non-zero value of a sparse embedding, as TEI 1.9.3 writes it: `{"index": 1012,
/// "value": 0.41}` (`index` into the model's vocabulary, a token id).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SparseValue {
    /// The dimension: a token id of the model's vocabulary.
    pub index: u32,
    /// Its weight, not 0 (TEI leaves out the zeros).
    pub value: f32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Input;

    #[test]
    fn parses_teis_body_into_sparse_inputs() {
        let body = br#"{"inputs":["a",[101,102]],"truncate":true,"prompt_name":"q"}"#;
        let request = SparseRequest::from_slice(body).expect("valid");
        request.validate(4).expect("within limits");
        let (inputs, options) = request.into_parts();
        assert_eq!(
            inputs,
            [Input::Text("a".into()), Input::Ids(vec![101, 102])]
        );
        assert_eq!(options.task, Task::Sparse);
        assert_eq!(
            (options.truncate, options.prompt_name.as_deref()),
            (Some(true), Some("q"))
        );
        assert!(!options.normalize);
        let single = SparseRequest::from_slice(br#"{"inputs":"a"}"#).expect("valid");
        assert_eq!(single.inputs.len(), 1);
        assert_eq!(sparse_subject("embed.m"), "embed.m.embed_sparse");
    }

    #[test]
    fn limits_and_errors_are_teis() {
        let err = SparseRequest::from_slice(br#"{"input":"a"}"#).expect_err("no inputs");
        assert_eq!(err.status(), 422);
        assert!(err.to_string().contains("missing field `inputs`"), "{err}");
        assert_eq!(SparseRequest::from_slice(b"[").expect_err("").status(), 400);
        for (body, status) in [
            (&br#"{"inputs":[]}"#[..], 400),
            (br#"{"inputs":["a",""]}"#, 400),
            (br#"{"inputs":["a","b","c"]}"#, 422),
        ] {
            let request = SparseRequest::from_slice(body).expect("parses");
            assert_eq!(request.validate(2).expect_err("refused").status(), status);
        }
        let value: SparseValue =
            serde_json::from_str(r#"{"index":7,"value":0.5}"#).expect("TEI's shape");
        assert_eq!((value.index, value.value), (7, 0.5));
    }
}
