//! How a request's reply is shaped from the body the batcher and the cache assemble for its
//! inputs (`[result, result, ...]`, one per input in order), and which reply-size limit checks
//! it: `/embed` and `/embed_sparse` replies go as assembled, under the embeddings' limit; the
//! other routes' replies are re-shaped, or checked under a limit of their own.

use bytes::Bytes;
use embatch_protocol::compact::OutputDtype;
use embatch_protocol::{EmbedError, similarity};

use super::rerank;
use crate::cache::Answered;

/// A request's reply shape, decided when it is parsed.
#[derive(Debug, Clone)]
pub(super) enum Shape {
    /// TEI's `/rerank` ranks, sorted by score, from one score per pair.
    Rerank(rerank::Shape),
    /// TEI's `/predict` reply: as assembled (a list of predictions per sequence) for a batch;
    /// for a single sequence (`single`), its one list.
    Predict {
        /// The request sent one sequence, not a batch.
        single: bool,
    },
    /// TEI's `/embed_all` reply, as assembled: token vectors per input. Large, so checked
    /// against `max_payload` with a size per input learnt from these replies only.
    EmbedAll,
    /// TEI's `/similarity` reply: the cosine of each sentence's embedding with the source's
    /// ([`similarity::cosines`]), from the embeddings of `[source, sentences...]`.
    Similarity,
    /// An `/embed` reply in the request's `output_dtype` (contract v1.5): each vector quantized
    /// on its own ([`OutputDtype::reshape`]), so the cache and the batch see floats only.
    Compact(OutputDtype),
}

/// Which reply-size limit checks (and learns from) a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Limit {
    /// The embeddings' (`/embed`, `/embed_sparse`): bytes per input of those replies.
    Embeddings,
    /// `/embed_all`'s own: a token vector per token is far more per input than an embedding,
    /// and learning from it would refuse `/embed` requests that fit.
    TokenVectors,
    /// None: a score or a few labels per input, or a float per sentence, never near
    /// `max_payload` for `MAX_CLIENT_BATCH_SIZE` inputs.
    Unchecked,
}

impl Shape {
    /// The limit of a reply of this shape (`None`: an `/embed` or `/embed_sparse` reply).
    pub(super) fn limit(shape: Option<&Shape>) -> Limit {
        match shape {
            // Checked as floats: the assembled body is, and a quantized one is smaller.
            None | Some(Shape::Compact(_)) => Limit::Embeddings,
            Some(Shape::EmbedAll) => Limit::TokenVectors,
            Some(Shape::Rerank(_) | Shape::Predict { .. } | Shape::Similarity) => Limit::Unchecked,
        }
    }

    /// The reply of `answered` in this shape.
    ///
    /// # Errors
    /// 424 `Backend` when the assembled body is not what the shape expects (malformed scores or
    /// embeddings; a NaN score).
    fn apply(self, mut answered: Answered) -> Result<Answered, EmbedError> {
        match self {
            Shape::Rerank(shape) => return shape.apply(answered),
            Shape::Predict { single: true } => answered.payload = only_element(&answered.payload)?,
            Shape::Predict { single: false } | Shape::EmbedAll => {}
            Shape::Similarity => {
                let cosines = similarity::cosines(&answered.payload)?;
                let body = serde_json::to_vec(&cosines)
                    .map_err(|e| EmbedError::Backend(format!("cannot write the cosines: {e}")))?;
                answered.payload = Bytes::from(body);
            }
            Shape::Compact(output) => {
                answered.payload = Bytes::from(output.reshape(&answered.payload)?);
            }
        }
        Ok(answered)
    }
}

/// The one element of the assembled body `[X]` (a slice of it, no copy).
///
/// # Errors
/// 424 `Backend` when `body` is not an array of one element as the reply assembly writes it.
fn only_element(body: &Bytes) -> Result<Bytes, EmbedError> {
    let malformed = || EmbedError::Backend("the predictions are not one list".into());
    let (first, last) = (
        body.first().ok_or_else(malformed)?,
        body.last().ok_or_else(malformed)?,
    );
    if (*first, *last) != (b'[', b']') || body.len() < 3 {
        return Err(malformed());
    }
    Ok(body.slice(1..body.len() - 1))
}

/// `outcome` in `shape` when given, else as it is.
pub(super) fn shaped(
    outcome: Result<Answered, EmbedError>,
    shape: Option<Shape>,
) -> Result<Answered, EmbedError> {
    match shape {
        Some(shape) => outcome.and_then(|answered| shape.apply(answered)),
        None => outcome,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_sequences_predictions_are_its_one_list() {
        let body = Bytes::from_static(br#"[[{"score":0.9,"label":"a"}]]"#);
        let one = only_element(&body).expect("one list");
        assert_eq!(&one[..], br#"[{"score":0.9,"label":"a"}]"#);
        assert!(only_element(&Bytes::from_static(b"[]")).is_err());
        assert!(only_element(&Bytes::from_static(b"{}")).is_err());
        assert_eq!(Shape::limit(None), Limit::Embeddings);
        assert_eq!(Shape::limit(Some(&Shape::EmbedAll)), Limit::TokenVectors);
        assert_eq!(Shape::limit(Some(&Shape::Similarity)), Limit::Unchecked);
    }
}
