//! TEI's pass-through routes on the built-in model: `/tokenize` and `/decode` answered from the
//! model's own tokenizer, in TEI 1.9.3's shapes ([`embatch_local_model::Encoder::simple_tokens`],
//! [`embatch_local_model::Encoder::decode`]), on tokio's blocking pool.

use std::sync::Arc;

use bytes::Bytes;
use embatch_local_model::Encoder;
use embatch_protocol::EmbedError;
use embatch_protocol::tokenize::{self, DecodeRequest, InputIds, TokenizeInput, TokenizeRequest};

use super::UpstreamError;
use super::route::RouteCall;

/// Answers `route` with `body` (already checked by the intake) from `encoder`.
pub(super) fn call(encoder: Arc<Encoder>, route: &'static str, body: Bytes) -> RouteCall<'static> {
    Box::pin(async move {
        tokio::task::spawn_blocking(move || answer(&encoder, route, &body))
            .await
            .map_err(|e| UpstreamError::Crashed(format!("tokenizer task failed: {e}")))?
    })
}

/// The reply body of `route` for `body`.
fn answer(encoder: &Encoder, route: &str, body: &[u8]) -> Result<Bytes, UpstreamError> {
    let reply = match route {
        tokenize::TOKENIZE => {
            let request = TokenizeRequest::from_slice(body).map_err(UpstreamError::Model)?;
            let texts = match &request.inputs {
                TokenizeInput::Single(text) => std::slice::from_ref(text),
                TokenizeInput::Batch(texts) => texts.as_slice(),
            };
            let prompt = request.prompt_name.as_deref();
            let lists = texts
                .iter()
                .map(|t| encoder.simple_tokens(t, request.add_special_tokens, prompt))
                .collect::<Result<Vec<_>, _>>()
                .map_err(UpstreamError::Model)?;
            serde_json::to_vec(&lists)
        }
        tokenize::DECODE => {
            let request = DecodeRequest::from_slice(body).map_err(UpstreamError::Model)?;
            let lists = match &request.ids {
                InputIds::Single(ids) => std::slice::from_ref(ids),
                InputIds::Batch(lists) => lists.as_slice(),
            };
            let texts = lists
                .iter()
                .map(|ids| encoder.decode(ids, request.skip_special_tokens))
                .collect::<Result<Vec<_>, _>>()
                .map_err(UpstreamError::Model)?;
            serde_json::to_vec(&texts)
        }
        _ => {
            return Err(UpstreamError::Model(EmbedError::Backend(format!(
                "the built-in model does not serve POST /{route}"
            ))));
        }
    };
    reply
        .map(Bytes::from)
        .map_err(|e| UpstreamError::Malformed(format!("cannot write the {route} reply: {e}")))
}
