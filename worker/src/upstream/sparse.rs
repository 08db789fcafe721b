//! Sparse embeddings on a TEI upstream: one `POST /embed_sparse` per batch, whoever sent its
//! inputs (TEI 1.9.3's body: `{"inputs", "truncate", "truncation_direction", "prompt_name"}`).
//!
//! TEI answers one list of non-zero values per input, `[[{"index": 7, "value": 0.4}, ...],
//! ...]`. The reply is cut into one slice per input (sharing the reply's buffer, no copy), each
//! the JSON text TEI wrote, so the batcher, the cache and the reply assembly treat a sparse
//! embedding as they treat a dense one, and a request's reply is TEI's reply to its inputs.

use bytes::Bytes;
use embatch_protocol::sparse::ROUTE;
use embatch_protocol::{EmbedOptions, Input, TruncationDirection};
use serde::Serialize;

use super::tei::TeiUpstream;
use super::{Embedding, UpstreamError};

/// TEI 1.9.3's `POST /embed_sparse` body, as the worker sends it (and `/embed_all`'s: the same
/// fields).
#[derive(Serialize)]
struct SparseBody<'a> {
    inputs: &'a [Input],
    #[serde(skip_serializing_if = "Option::is_none")]
    truncate: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    truncation_direction: Option<TruncationDirection>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_name: Option<&'a str>,
}

impl TeiUpstream {
    /// The sparse embeddings of `inputs` (texts or token ids) in one call, in order.
    ///
    /// # Errors
    /// As `/embed`'s call (unreachable, timeout, TEI's error passed through: its 424
    /// "Model is not an embedding model with SPLADE pooling" for a dense model); a reply that is
    /// not one array per input is [`UpstreamError::Malformed`] or
    /// [`UpstreamError::CountMismatch`].
    pub(super) async fn embed_sparse(
        &self,
        inputs: &[Input],
        options: &EmbedOptions,
    ) -> Result<Vec<Embedding>, UpstreamError> {
        self.per_input_lists(ROUTE, inputs, options).await
    }

    /// One `POST /{route}` (`embed_sparse` or `embed_all`: TEI 1.9.3's body of `inputs`,
    /// `truncate`, `truncation_direction`, `prompt_name`) whose reply is one list per input:
    /// the lists, in order, each a slice of the reply.
    ///
    /// # Errors
    /// As [`TeiUpstream::embed_sparse`].
    pub(super) async fn per_input_lists(
        &self,
        route: &str,
        inputs: &[Input],
        options: &EmbedOptions,
    ) -> Result<Vec<Embedding>, UpstreamError> {
        let body = SparseBody {
            inputs,
            truncate: options.truncate,
            truncation_direction: options.truncation_direction,
            prompt_name: options.prompt_name.as_deref(),
        };
        let reply = self.post(route, &body).await?;
        split_lists(route, &reply, inputs.len())
    }
}

/// Cuts TEI's reply of `route` (`/embed_sparse`, `/predict`, `/embed_all`: a list per input)
/// into its lists, in order, each a slice of `reply` ([`Embedding::split_reply`], which checks
/// each list's shape).
///
/// # Errors
/// [`UpstreamError::Malformed`] for another shape, [`UpstreamError::CountMismatch`] for another
/// number of lists than inputs sent.
pub(super) fn split_lists(
    route: &str,
    reply: &Bytes,
    sent: usize,
) -> Result<Vec<Embedding>, UpstreamError> {
    let lists = Embedding::split_reply(reply)
        .map_err(|e| UpstreamError::Malformed(format!("TEI /{route}: {e}")))?;
    if lists.len() != sent {
        return Err(UpstreamError::CountMismatch {
            sent,
            got: lists.len(),
        });
    }
    Ok(lists)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_is_cut_into_each_inputs_list_as_written() {
        let reply =
            Bytes::from_static(br#"[[{"index":3,"value":0.5}], [] ,[{"index":1,"value":2e-1}]]"#);
        let lists = split_lists(ROUTE, &reply, 3).expect("TEI's shape");
        let texts: Vec<&[u8]> = lists.iter().map(Embedding::json).collect();
        assert_eq!(
            texts,
            [
                &br#"[{"index":3,"value":0.5}]"#[..],
                b"[]",
                br#"[{"index":1,"value":2e-1}]"#
            ]
        );
        assert_eq!(lists[0].json().as_ptr(), reply[1..].as_ptr(), "no copy");
    }

    #[test]
    fn another_shape_or_count_is_refused() {
        let reply = Bytes::from_static(br#"[[{"index":3,"value":0.5}]]"#);
        assert!(matches!(
            split_lists(ROUTE, &reply, 2),
            Err(UpstreamError::CountMismatch { sent: 2, got: 1 })
        ));
        for body in [&b"{}"[..], b"[{\"index\":3}]", b"[[{\"index\":3}]]", b"[1]"] {
            let err = split_lists(ROUTE, &Bytes::copy_from_slice(body), 1).expect_err("shape");
            assert!(matches!(err, UpstreamError::Malformed(_)), "{err}");
        }
    }
}
