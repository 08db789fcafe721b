//! The rerank routes: TEI 1.9.3's `POST /rerank` (and `POST /models/{model}/rerank`), and
//! Cohere's `POST /v1/rerank` and `POST /v2/rerank` ([`crate::cohere`]). Each HTTP request is
//! one NATS request on the model's rerank subject (`<subject>.rerank`, contract v1.2) through
//! the path the embedding routes take (deadline, in-flight limit, acknowledgements, resends,
//! tenant, metering), so the workers batch the pairs of every caller together.

use axum::response::{IntoResponse, Response};
use embatch_client::Operation;
use embatch_protocol::rerank::Rank;
use embatch_protocol::{EmbedError, ErrorResponse, RerankRequest};
use utoipa::openapi::Ref;
use utoipa::{IntoResponses, PartialSchema, ToSchema};

use super::forward::{Ready, RouteRequest, tei_route};
use super::{ApiError, translated_body};
use crate::cohere::{CohereRerankRequest, CohereRerankResponse, Translated};
use crate::openapi::ok_response;

tei_route! {
    /// `POST /rerank`'s part of the shared path: the model's rerank subject, TEI's `/rerank`
    /// body (TEI 1.9.3's checks: `top_n` and the like), counting its texts.
    const RERANK = Rerank(RerankRequest), inputs |request| request.texts.len();
    responses(RerankOk, RerankErrors);

    /// `POST /rerank`: TEI 1.9.3's `/rerank` for the default model (or the `Embatch-Model`
    /// header's); the body is checked and forwarded as it is, and the worker's reply is the body.
    post "/rerank" => rerank {
        summary: "Rerank texts against a query (TEI's /rerank)",
        description: "Exactly TEI 1.9.3's `POST /rerank`: one score per text, the ranks sorted \
                      by score, highest first; `text` echoed with `return_text`. Pairs of every \
                      caller are batched together. A model that is not a reranker: 424, as TEI.",
        example: {"query": "What is Deep Learning?",
                  "texts": ["Deep Learning is ...", "Cheese is ..."]},
    }

    /// `POST /models/{model}/rerank`: `POST /rerank` for `model`.
    post "/models/{model}/rerank" => model_rerank {
        summary: "Rerank texts with a named model (TEI's /rerank)",
        description: "`POST /rerank` for the model named in the path (percent-encode a `/` in \
                      its name). A model no worker serves: 404.",
    }
}

/// `POST /v1/rerank`: Cohere's rerank API, v1 (documents as strings or `{"text"}` objects).
#[utoipa::path(
    post,
    path = "/v1/rerank",
    tag = "rerank",
    summary = "Rerank documents (Cohere's and Jina's rerank API)",
    description = "Cohere's `POST /v1/rerank` (and, at `/v2/rerank`, its v2), which Jina's \
                   rerank API and LangChain's, LlamaIndex's and RAGFlow's rerankers also speak: \
                   `relevance_score` is the sigmoid of the model's logit (TEI's default score), \
                   results most relevant first, `top_n` of them, each with its `document` when \
                   `return_documents`. `model` picks the model as on `/v1/embeddings`. Documents \
                   over the model's token limit are truncated. Errors have TEI's body and the \
                   statuses of `POST /rerank`.",
    request_body(content = CohereRerankRequest, content_type = "application/json",
        example = json!({"model": "reranker", "query": "What is the capital of the United States?",
                         "documents": ["Carson City is the capital city of Nevada.",
                                       "Washington, D.C. is the capital of the United States."],
                         "top_n": 1, "return_documents": true})),
    params(crate::openapi::TimeoutHeader),
    responses(CohereOk, RerankErrors),
)]
pub(crate) async fn cohere_rerank_v1(request: RouteRequest) -> Response {
    cohere_rerank(request, "1").await
}

/// `POST /v2/rerank`: Cohere's rerank API, v2 (the same route; `meta.api_version` says `2`).
pub(crate) async fn cohere_rerank_v2(request: RouteRequest) -> Response {
    cohere_rerank(request, "2").await
}

/// The Cohere routes' path: translates (checking the documents), sends TEI's `/rerank` body
/// on the rerank subject of the model `model` names and re-shapes TEI's ranks into Cohere's
/// response.
async fn cohere_rerank(request: RouteRequest, version: &'static str) -> Response {
    let parse = |body: &[u8], max_inputs| {
        let translated = CohereRerankRequest::translate(body, max_inputs, version)?;
        let model = translated.model.clone();
        Ok::<_, EmbedError>((translated, model))
    };
    let forward = |translated: Translated, ready: Ready| async move {
        let texts = translated.request.texts.len() as u64;
        let reply = ready
            .send(translated_body(&translated.request)?, Operation::Rerank)
            .await?;
        let shaped = translated.shape.response(&reply.payload, reply.tokens)?;
        Ok(ready.ok(shaped, &reply, texts))
    };
    let answer = |err| ApiError(err).into_response();
    request.translated(parse, forward, answer).await
}

ok_response! {
    /// The 200 of `POST /rerank`: TEI's ranks, highest score first, with the timing headers.
    pub struct RerankOk(
        "One rank per text, highest score first: `index` in `texts`, `score` (the sigmoid of \
         the logit, or the logit with `raw_scores`), `text` with `return_text`.",
        Vec::<Rank>::schema(),
    );
}

ok_response! {
    /// The 200 of `POST /v1/rerank` and `POST /v2/rerank`: Cohere's rerank response, with the
    /// timing headers.
    pub struct CohereOk(
        "The results, most relevant first (`top_n` of them).",
        Ref::from_schema_name(CohereRerankResponse::name()).into(),
    );
}

/// The error statuses of the rerank routes, each with TEI's error body: a declaration for the
/// document, never built (the handlers answer [`EmbedError`]s).
#[derive(IntoResponses)]
#[allow(dead_code)] // Never built: its variants exist for the document.
pub enum RerankErrors {
    /// `Empty`: no texts (documents), as TEI 1.9.3 answers. `Validation`: the body is not
    /// JSON.
    #[response(status = 400)]
    Empty(ErrorResponse),
    /// `Validation`: no worker serves the model the request names.
    #[response(status = 404)]
    ModelNotFound(ErrorResponse),
    /// `Timeout`: the body did not arrive within `BODY_READ_TIMEOUT`.
    #[response(status = 408)]
    BodyTimeout(ErrorResponse),
    /// `Validation`: the body is over `MAX_BODY_BYTES`, or the reply could not fit the NATS
    /// server's `max_payload`.
    #[response(status = 413)]
    TooLarge(ErrorResponse),
    /// `Validation`: the body is not declared as JSON.
    #[response(status = 415)]
    UnsupportedMediaType(ErrorResponse),
    /// `Validation` or `Tokenizer`: JSON of the wrong shape, more than `MAX_CLIENT_BATCH_SIZE`
    /// texts ("batch size N > maximum allowed batch size M", as TEI 1.9.3), `top_n` of 0, an
    /// invalid `x-embatch-timeout-ms`, a pair over the model's token limit with
    /// `truncate: false`.
    #[response(status = 422)]
    Validation(ErrorResponse),
    /// `Backend`: the model is not a reranker ("model is not a re-ranker model", as TEI 1.9.3),
    /// or the upstream failed.
    #[response(status = 424)]
    Backend(ErrorResponse),
    /// `Overloaded`: load shedding, as `POST /embed`'s 429.
    #[response(
        status = 429,
        headers(("Retry-After" = u64, description = "Seconds to wait before retrying: 1."))
    )]
    Overloaded(ErrorResponse),
    /// `Unhealthy`: no worker listens, the gateway is not connected to NATS, or the upstream is
    /// unreachable.
    #[response(status = 503)]
    Unavailable(ErrorResponse),
    /// `Timeout`: the deadline passed before the answer.
    #[response(status = 504)]
    Timeout(ErrorResponse),
}
