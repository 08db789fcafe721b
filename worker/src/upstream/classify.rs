//! Classification and token embeddings on a TEI upstream: one `POST /predict` or
//! `POST /embed_all` per batch, whoever sent its inputs.
//!
//! - `/predict` (TEI 1.9.3): the batch goes as TEI's batch form, `{"inputs": [["text"],
//!   ["query", "text"], ...], "raw_scores", "truncate", "truncation_direction"}` (a one-element
//!   list is a text, a two-element list a pair; a batch of one is still a batch, so the reply is
//!   always one list of predictions per sequence).
//! - `/embed_all` (TEI 1.9.3): `{"inputs": [...], "truncate", "truncation_direction",
//!   "prompt_name"}` (`/embed_sparse`'s fields, sent by the same code), a list of token vectors
//!   per input.
//!
//! Either reply is cut into one slice per input (no copy, no float parsed) by
//! [`super::sparse::split_lists`], so the batcher, the cache and the reply assembly treat each
//! input's list as they treat an embedding, and a request's reply is TEI's reply to its inputs.

use embatch_protocol::{EmbedOptions, Input, TruncationDirection, embed_all, predict};
use serde::Serialize;

use super::sparse::split_lists;
use super::tei::TeiUpstream;
use super::{Embedding, UpstreamError};

/// One sequence of TEI 1.9.3's `/predict` batch: `["text"]` or `["query", "text"]`.
#[derive(Serialize)]
#[serde(transparent)]
struct Sequence<'a>(Vec<&'a str>);

/// TEI 1.9.3's `POST /predict` body with a batch of sequences.
#[derive(Serialize)]
struct PredictBody<'a> {
    inputs: Vec<Sequence<'a>>,
    raw_scores: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    truncate: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    truncation_direction: Option<TruncationDirection>,
}

/// `input` as a `/predict` sequence.
///
/// # Errors
/// [`UpstreamError::Malformed`] for token ids, which `/predict` does not take (the intake never
/// builds them).
fn sequence(input: &Input) -> Result<Sequence<'_>, UpstreamError> {
    match input {
        Input::Text(text) => Ok(Sequence(vec![text])),
        Input::Pair(first, second) => Ok(Sequence(vec![first, second])),
        Input::Ids(_) => Err(UpstreamError::Malformed(
            "a predict call holds token ids, which TEI's /predict does not take".into(),
        )),
    }
}

impl TeiUpstream {
    /// The predictions of `inputs` (texts or pairs) in one `/predict` call, in order: each
    /// TEI's list `[{"score", "label"}, ...]` as written.
    ///
    /// # Errors
    /// As `/embed`'s call (unreachable, timeout, TEI's error passed through: its 424 "Model is
    /// not a classifier model" for an embedding model); a reply that is not one list per
    /// sequence is [`UpstreamError::Malformed`] or [`UpstreamError::CountMismatch`].
    pub(super) async fn predict(
        &self,
        inputs: &[Input],
        options: &EmbedOptions,
        raw_scores: bool,
    ) -> Result<Vec<Embedding>, UpstreamError> {
        let body = PredictBody {
            inputs: inputs.iter().map(sequence).collect::<Result<_, _>>()?,
            raw_scores,
            truncate: options.truncate,
            truncation_direction: options.truncation_direction,
        };
        let reply = self.post(predict::ROUTE, &body).await?;
        split_lists(predict::ROUTE, &reply, inputs.len())
    }

    /// The token vectors of `inputs` (texts or token ids) in one `/embed_all` call, in order:
    /// each TEI's list `[[f32, ...], ...]` as written.
    ///
    /// # Errors
    /// As [`TeiUpstream::predict`] (TEI's 424 for a classifier or a SPLADE model passed
    /// through).
    pub(super) async fn embed_all(
        &self,
        inputs: &[Input],
        options: &EmbedOptions,
    ) -> Result<Vec<Embedding>, UpstreamError> {
        self.per_input_lists(embed_all::ROUTE, inputs, options)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_predict_batch_is_teis_batch_form() {
        let inputs = [Input::Text("a".into()), Input::Pair("q".into(), "t".into())];
        let body = PredictBody {
            inputs: inputs
                .iter()
                .map(sequence)
                .collect::<Result<_, _>>()
                .expect("texts"),
            raw_scores: true,
            truncate: None,
            truncation_direction: None,
        };
        let json = serde_json::to_string(&body).expect("serializes");
        assert_eq!(json, r#"{"inputs":[["a"],["q","t"]],"raw_scores":true}"#);
        assert!(sequence(&Input::Ids(vec![1])).is_err());
    }
}
