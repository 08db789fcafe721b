//! TEI 1.9.3's `POST /tokenize` and `POST /decode` (and under `/models/{model}/`): each HTTP
//! request is one NATS request on the model's subject for the route (`<subject>.tokenize`,
//! `<subject>.decode`, contract v1.3), which the worker passes to its upstream's route, one call
//! per request (they run no model: a batch would only add its wait), with the request's
//! deadline.

use axum::extract::Path;
use axum::response::Response;
use embatch_client::Operation;
use embatch_protocol::EmbedError;
use embatch_protocol::tokenize::{DecodeRequest, SimpleToken, TokenizeRequest};
use std::collections::BTreeMap;
use utoipa::openapi::{RefOr, Response as DocResponse};
use utoipa::{IntoResponses, PartialSchema};

use super::forward::{RouteRequest, TeiRoute};

/// `POST /tokenize`: TEI 1.9.3's `/tokenize` for the default model (or the `Embatch-Model`
/// header's).
#[utoipa::path(
    post,
    path = "/tokenize",
    tag = "tei",
    summary = "Tokenize texts (TEI's /tokenize)",
    description = "Exactly TEI 1.9.3's `POST /tokenize`: one list of tokens per text, each \
                   `{\"id\", \"text\", \"special\", \"start\", \"stop\"}` (byte offsets; `null` \
                   for a special token). Passed to the model's upstream, one call per request. \
                   The built-in model answers from its own tokenizer. An upstream without the \
                   route (a server answering 404): 424 naming it.",
    request_body(content = TokenizeRequest, content_type = "application/json",
        example = json!({"inputs": ["What is vector search?"], "add_special_tokens": true})),
    params(crate::openapi::TimeoutHeader),
    responses(TokenizeOk, crate::openapi::TeiErrors),
)]
pub(crate) async fn tokenize(request: RouteRequest) -> Response {
    request.forward_by_header(TOKENIZE).await
}

/// `POST /models/{model}/tokenize`: `POST /tokenize` for `model`.
#[utoipa::path(
    post,
    path = "/models/{model}/tokenize",
    tag = "tei",
    summary = "Tokenize texts with a named model's tokenizer (TEI's /tokenize)",
    description = "`POST /tokenize` for the model named in the path (percent-encode a `/` in \
                   its name). A model no worker serves: 404.",
    params(super::forward::ModelPath, crate::openapi::TimeoutHeader),
    request_body(content = TokenizeRequest, content_type = "application/json"),
    responses(TokenizeOk, crate::openapi::TeiErrors),
)]
pub(crate) async fn model_tokenize(Path(model): Path<String>, request: RouteRequest) -> Response {
    request.forward(Some(model), TOKENIZE).await
}

/// `POST /decode`: TEI 1.9.3's `/decode` for the default model (or the `Embatch-Model`
/// header's).
#[utoipa::path(
    post,
    path = "/decode",
    tag = "tei",
    summary = "Decode token ids (TEI's /decode)",
    description = "Exactly TEI 1.9.3's `POST /decode`: one string per list of ids. Passed to \
                   the model's upstream, one call per request (the built-in model answers from \
                   its own tokenizer). An upstream without the route: 424 naming it.",
    request_body(content = DecodeRequest, content_type = "application/json",
        example = json!({"ids": [101, 7592, 102], "skip_special_tokens": true})),
    params(crate::openapi::TimeoutHeader),
    responses(DecodeOk, crate::openapi::TeiErrors),
)]
pub(crate) async fn decode(request: RouteRequest) -> Response {
    request.forward_by_header(DECODE).await
}

/// `POST /models/{model}/decode`: `POST /decode` for `model`.
#[utoipa::path(
    post,
    path = "/models/{model}/decode",
    tag = "tei",
    summary = "Decode token ids with a named model's tokenizer (TEI's /decode)",
    description = "`POST /decode` for the model named in the path (percent-encode a `/` in its \
                   name). A model no worker serves: 404.",
    params(super::forward::ModelPath, crate::openapi::TimeoutHeader),
    request_body(content = DecodeRequest, content_type = "application/json"),
    responses(DecodeOk, crate::openapi::TeiErrors),
)]
pub(crate) async fn model_decode(Path(model): Path<String>, request: RouteRequest) -> Response {
    request.forward(Some(model), DECODE).await
}

/// `POST /tokenize`'s part of the shared path: the model's tokenize subject, TEI's body.
const TOKENIZE: TeiRoute = TeiRoute {
    operation: Operation::Tokenize,
    check: check_tokenize,
};

/// `POST /decode`'s part of the shared path: the model's decode subject, TEI's body.
const DECODE: TeiRoute = TeiRoute {
    operation: Operation::Decode,
    check: check_decode,
};

/// TEI 1.9.3's checks of a `/tokenize` body: its texts.
fn check_tokenize(body: &[u8], max_inputs: usize) -> Result<u64, EmbedError> {
    let request = TokenizeRequest::from_slice(body)?;
    request.validate(max_inputs)?;
    Ok(request.len() as u64)
}

/// TEI 1.9.3's checks of a `/decode` body: its lists of ids.
fn check_decode(body: &[u8], max_inputs: usize) -> Result<u64, EmbedError> {
    let request = DecodeRequest::from_slice(body)?;
    request.validate(max_inputs)?;
    Ok(request.len() as u64)
}

/// The 200 of `POST /tokenize`: a list of tokens per text. A declaration for the document.
pub struct TokenizeOk;

impl IntoResponses for TokenizeOk {
    fn responses() -> BTreeMap<String, RefOr<DocResponse>> {
        crate::openapi::ok_with_timings(
            "One list of tokens per text, in input order.",
            Vec::<Vec<SimpleToken>>::schema(),
        )
    }
}

/// The 200 of `POST /decode`: a string per list of ids. A declaration for the document.
pub struct DecodeOk;

impl IntoResponses for DecodeOk {
    fn responses() -> BTreeMap<String, RefOr<DocResponse>> {
        crate::openapi::ok_with_timings(
            "One text per list of ids, in input order.",
            Vec::<String>::schema(),
        )
    }
}
