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

use crate::Task;
use crate::inputs_request::inputs_request;

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

inputs_request! {
    /// TEI 1.9.3's `POST /embed_all` body.
    ///
    /// ```json
    /// {"inputs": "one text" | ["text", ...] | [101, 7592, 102] | [[101, 102], "text", ...],
    ///  "truncate": false, "truncation_direction": "Right", "prompt_name": null}
    /// ```
    /// Only `inputs` is required. Unknown fields are ignored, as TEI does.
    EmbedAllRequest("/embed_all", Task::EmbedAll, "TEI does not normalize token vectors")
}

#[cfg(test)]
mod tests {
    use super::*;

    // The parsing and the checks are inputs_request!'s, tested on SparseRequest; here, what is
    // this route's own.
    #[test]
    fn batches_token_embedding_inputs_on_their_subject() {
        let body = br#"{"inputs":["a",[101,102]],"truncate":true}"#;
        let (inputs, options) = EmbedAllRequest::from_slice(body)
            .expect("valid")
            .into_parts();
        assert_eq!(inputs.len(), 2);
        assert_eq!(
            (options.task, options.truncate),
            (Task::EmbedAll, Some(true))
        );
        assert!(!options.normalize, "TEI does not normalize token vectors");
        assert_eq!(embed_all_subject("embed.m"), "embed.m.embed_all");
    }
}
