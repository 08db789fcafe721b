//! Cohere's embed routes, `POST /v2/embed` and `POST /v1/embed` ([`crate::cohere_embed`]): each
//! HTTP request is one NATS request on the model's subject (TEI's `/embed` body with the
//! contract's `output_dtype`) through the path `POST /embed` takes, so the workers batch its
//! texts with every other caller's and quantize its reply; errors have Cohere's shape and the
//! status `POST /embed` answers for the same error.

use axum::body::Bytes;
use axum::response::Response;
use embatch_client::Operation;
use utoipa::openapi::Ref;
use utoipa::{IntoResponses, ToSchema};

use super::forward::{Ready, RouteRequest};
use super::{error_response, translated_body};
use crate::cohere_embed::{
    CohereEmbedRequest, CohereEmbedResponse, CohereError, CohereErrorResponse, Translated,
};
use crate::openapi::ok_response;

/// `POST /v1/embed`: Cohere's embed API, v1 (floats only unless `embedding_types` is given).
#[utoipa::path(
    post,
    path = "/v1/embed",
    tag = "cohere",
    summary = "Embed texts (Cohere's embed API)",
    description = "Cohere's `POST /v1/embed` (and, at `/v2/embed`, its Embed API v2): one \
                   vector per text in each of `embedding_types` (`float`, `int8`, `uint8`, \
                   `binary`, `ubinary`, `base64`; default `float`), quantized by the worker \
                   as docs/http-api.md's \"Compact outputs\" says. `input_type` selects the \
                   model's prompt (`search_query`: `query`, `search_document`: `document`, \
                   `classification`, `clustering`); a model without it answers 422. v1 without \
                   `embedding_types` answers `embeddings_floats`. `model` picks the model as on \
                   `/v1/embeddings`. Errors are `{\"message\"}` with the statuses of \
                   `POST /embed`.",
    request_body(content = CohereEmbedRequest, content_type = "application/json",
        example = json!({"model": "all-MiniLM-L6-v2", "texts": ["What is vector search?"],
                         "embedding_types": ["float", "int8", "ubinary"]})),
    params(crate::openapi::TimeoutHeader),
    responses(CohereEmbedOk, CohereEmbedErrors),
)]
pub(crate) async fn cohere_embed_v1(request: RouteRequest) -> Response {
    cohere_embed(request, "1").await
}

/// `POST /v2/embed`: Cohere's Embed API v2 (the same route; always by type).
pub(crate) async fn cohere_embed_v2(request: RouteRequest) -> Response {
    cohere_embed(request, "2").await
}

/// The Cohere embed routes' path: translates (checking the texts and types), sends TEI's
/// `/embed` body with `output_dtype` on the model's subject and re-shapes the reply.
async fn cohere_embed(request: RouteRequest, version: &'static str) -> Response {
    let parse = |body: &[u8], max_inputs| {
        let translated = CohereEmbedRequest::translate(body, max_inputs, version)?;
        let model = translated.model.clone();
        Ok::<_, CohereError>((translated, model))
    };
    let forward = |translated: Translated, ready: Ready| async move {
        let inputs = translated.request.inputs.len() as u64;
        let reply = ready
            .send(translated_body(&translated.request)?, Operation::Embed)
            .await?;
        let shaped = translated.shape.response(&reply.payload, reply.tokens)?;
        Ok(ready.ok(shaped, &reply, inputs))
    };
    let answer = |err: CohereError| error_response(err.status(), Bytes::from(err.to_json()));
    request.translated(parse, forward, answer).await
}

ok_response! {
    /// The 200 of `POST /v1/embed` and `POST /v2/embed`: Cohere's embed response, with the
    /// timing headers.
    pub struct CohereEmbedOk(
        "One vector per text in each type asked, in `embeddings`.",
        Ref::from_schema_name(CohereEmbedResponse::name()).into(),
    );
}

/// The error statuses of the Cohere embed routes, each with Cohere's error body: a declaration
/// for the document, never built (the handlers answer [`CohereError`]s).
#[derive(IntoResponses)]
#[allow(dead_code)] // Never built: its variants exist for the document.
pub enum CohereEmbedErrors {
    /// No texts; the body is not JSON.
    #[response(status = 400)]
    Empty(CohereErrorResponse),
    /// No worker serves the model the request names.
    #[response(status = 404)]
    ModelNotFound(CohereErrorResponse),
    /// The body did not arrive within `BODY_READ_TIMEOUT`.
    #[response(status = 408)]
    BodyTimeout(CohereErrorResponse),
    /// The body is over `MAX_BODY_BYTES`, or the reply could not fit the NATS server's
    /// `max_payload`.
    #[response(status = 413)]
    TooLarge(CohereErrorResponse),
    /// The body is not declared as JSON.
    #[response(status = 415)]
    UnsupportedMediaType(CohereErrorResponse),
    /// JSON of the wrong shape (an unknown `embedding_types`, `input_type` or `truncate`
    /// value, naming the values allowed), `images` or `inputs`, more than
    /// `MAX_CLIENT_BATCH_SIZE` texts, an `input_type` whose prompt the model lacks, a text over
    /// the model's limit with `truncate: "NONE"`, an invalid `x-embatch-timeout-ms`.
    #[response(status = 422)]
    Validation(CohereErrorResponse),
    /// The upstream failed.
    #[response(status = 424)]
    Backend(CohereErrorResponse),
    /// Load shedding, as `POST /embed`'s 429.
    #[response(
        status = 429,
        headers(("Retry-After" = u64, description = "Seconds to wait before retrying: 1."))
    )]
    Overloaded(CohereErrorResponse),
    /// No worker listens, the gateway is not connected to NATS, or the upstream is unreachable.
    #[response(status = 503)]
    Unavailable(CohereErrorResponse),
    /// The deadline passed before the answer.
    #[response(status = 504)]
    Timeout(CohereErrorResponse),
}
