//! The gateway's OpenAPI 3.1 document, served at `GET /openapi.json` and at TEI's path
//! `GET /api-doc/openapi.json` (the same document).
//!
//! It describes every route the router serves: `POST /embed` and `POST /` (TEI's `/embed`),
//! `POST /v1/embeddings` and `POST /embeddings` (OpenAI's embeddings API), `GET /info`,
//! `GET /health`, `GET /metrics`, the two document routes and the bulk routes (`/v1/files`,
//! `/v1/batches`, see [`crate::bulk`]), with request bodies, the 200
//! bodies and headers, and every error status a route answers with its error body (TEI's
//! `{"error", "error_type"}` or OpenAI's `{"error": {"message", "type", "param", "code"}}`).
//!
//! The operations are declared on the handlers in [`crate::routes`] (`#[utoipa::path]`), the
//! request and response schemas on the wire types ([`embatch_protocol`] with its `openapi`
//! feature, [`crate::openai`]); this module holds what the routes share (the error responses,
//! the timeout header, the `/info` document's schema) and assembles the document, adding the
//! alias paths that share a handler (`/` as `/embed`, `/embeddings` as `/v1/embeddings`,
//! `/api-doc/openapi.json` as `/openapi.json`).

use bytes::Bytes;
use embatch_protocol::{EmbedRequest, ErrorResponse, ErrorType, Input, TruncationDirection};
use std::collections::BTreeMap;

use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::{Content, OpenApi as Document, Ref, RefOr};
use utoipa::{IntoParams, IntoResponses, OpenApi, PartialSchema, ToSchema};

use crate::openai::{
    EmbeddingObject, EmbeddingValue, EmbeddingsRequest, EmbeddingsResponse, EncodingFormat,
    ErrorBody as OpenAiErrorBody, ErrorResponse as OpenAiErrorResponse, Usage,
};

/// Paths of the document: `GET /openapi.json` and TEI's `GET /api-doc/openapi.json`.
pub const DOCUMENT_PATHS: [&str; 2] = ["/openapi.json", "/api-doc/openapi.json"];

/// Paths served by the same handler as another path: `(alias, original, alias's operationId)`.
/// The alias gets a copy of the original's operations (operationIds must be unique).
const ALIASES: [(&str, &str, &str); 6] = [
    ("/v2/rerank", "/v1/rerank", "cohere_rerank_v2"),
    ("/v2/embed", "/v1/embed", "cohere_embed_v2"),
    (
        "/models/{model}",
        "/models/{model}/embed",
        "model_embed_root",
    ),
    ("/", "/embed", "embed_root"),
    (
        "/embeddings",
        "/v1/embeddings",
        "openai_embeddings_unversioned",
    ),
    ("/api-doc/openapi.json", "/openapi.json", "openapi_tei_path"),
];

#[derive(OpenApi)]
#[openapi(
    info(
        title = "embatch gateway",
        description = "Text-embeddings-inference (TEI 1.9.3) compatible `POST /embed` and \
                       OpenAI-compatible `POST /v1/embeddings` in front of embatch workers on \
                       NATS; requests of every route are batched together.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        crate::routes::embed,
        crate::routes::openai_embeddings,
        crate::routes::meta::info,
        crate::routes::meta::health,
        crate::routes::meta::metrics,
        crate::routes::model_embed,
        crate::routes::rerank::rerank,
        crate::routes::rerank::model_rerank,
        crate::routes::rerank::cohere_rerank_v1,
        crate::routes::cohere_embed::cohere_embed_v1,
        crate::routes::sparse::embed_sparse,
        crate::routes::sparse::model_embed_sparse,
        crate::routes::tokenize::tokenize,
        crate::routes::tokenize::model_tokenize,
        crate::routes::tokenize::decode,
        crate::routes::tokenize::model_decode,
        crate::routes::classify::predict,
        crate::routes::classify::model_predict,
        crate::routes::classify::embed_all,
        crate::routes::classify::model_embed_all,
        crate::routes::classify::similarity,
        crate::routes::classify::model_similarity,
        crate::routes::meta::model_info,
        crate::routes::meta::model_health,
        crate::routes::meta::list_models,
        crate::routes::meta::openapi,
        crate::bulk::files::upload,
        crate::bulk::files::list,
        crate::bulk::files::retrieve,
        crate::bulk::files::content,
        crate::bulk::files::delete,
        crate::bulk::batches::create,
        crate::bulk::batches::list,
        crate::bulk::batches::retrieve,
        crate::bulk::batches::cancel,
        crate::usage::route,
    ),
    components(schemas(
        EmbedRequest,
        Input,
        embatch_protocol::request::Inputs,
        TruncationDirection,
        ErrorResponse,
        ErrorType,
        EmbeddingsRequest,
        EncodingFormat,
        EmbeddingsResponse,
        EmbeddingObject,
        EmbeddingValue,
        Usage,
        OpenAiErrorResponse,
        OpenAiErrorBody,
        Info,
        crate::models::ModelList,
        crate::models::ModelObject,
        embatch_protocol::RerankRequest,
        embatch_protocol::rerank::Rank,
        crate::cohere::CohereRerankRequest,
        crate::cohere::Document,
        crate::cohere::CohereRerankResponse,
        crate::cohere::RerankResult,
        crate::cohere::ResultDocument,
        crate::cohere_embed::CohereEmbedRequest,
        crate::cohere_embed::CohereEmbedResponse,
        crate::cohere_embed::CohereErrorResponse,
        crate::cohere_embed::InputType,
        crate::cohere_embed::EmbeddingType,
        crate::cohere_embed::Truncate,
        embatch_protocol::compact::OutputDtype,
        embatch_protocol::compact::Dtype,
        embatch_protocol::SparseRequest,
        embatch_protocol::sparse::SparseValue,
        embatch_protocol::tokenize::TokenizeRequest,
        embatch_protocol::tokenize::TokenizeInput,
        embatch_protocol::tokenize::SimpleToken,
        embatch_protocol::tokenize::DecodeRequest,
        embatch_protocol::tokenize::InputIds,
        embatch_protocol::predict::PredictRequest,
        embatch_protocol::predict::PredictInputs,
        embatch_protocol::predict::Prediction,
        embatch_protocol::embed_all::EmbedAllRequest,
        embatch_protocol::similarity::SimilarityRequest,
        embatch_protocol::similarity::SimilarityInput,
        embatch_protocol::similarity::SimilarityParameters,
    )),
    tags(
        (name = "tei", description = "Hugging Face text-embeddings-inference 1.9.3's HTTP API."),
        (name = "openai", description = "OpenAI's embeddings API."),
        (name = "rerank", description = "Cohere's rerank API (v1 and v2), as Jina's and the \
                                         frameworks' rerankers speak it."),
        (name = "cohere", description = "Cohere's embed API (v1 and v2), with int8, uint8, \
                                         binary and ubinary embeddings."),
        (name = "operations", description = "Health, metrics and this document."),
        (name = "batch", description = "OpenAI's Files and Batches APIs: bulk embedding jobs on \
                                        NATS JetStream (503 without JetStream)."),
    ),
)]
struct ApiDoc;

/// The gateway's OpenAPI document, with the alias paths.
pub fn document() -> Document {
    let mut doc = ApiDoc::openapi();
    for (alias, original, operation_id) in ALIASES {
        let Some(mut item) = doc.paths.paths.get(original).cloned() else {
            continue;
        };
        for operation in [&mut item.get, &mut item.post].into_iter().flatten() {
            operation.operation_id = Some(operation_id.to_owned());
        }
        doc.paths.paths.insert(alias.to_owned(), item);
    }
    add_bearer_scheme(&mut doc);
    doc
}

/// Declares the API keys of a gateway with a tenants file (docs/tenants.md): HTTP bearer
/// authentication, optional for the document as a whole because an open gateway needs none
/// (`security: [{}, {"bearer": []}]`).
fn add_bearer_scheme(doc: &mut Document) {
    use utoipa::openapi::security::{
        HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
    };
    let scheme = HttpBuilder::new()
        .scheme(HttpAuthScheme::Bearer)
        .description(Some(
            "A tenant's API key, `Authorization: Bearer <key>`, when the gateway has a tenants \
             file; a missing or unknown key gets 401. /health, /metrics and this document need none.",
        ))
        .build();
    doc.components
        .get_or_insert_with(Default::default)
        .add_security_scheme("bearer", SecurityScheme::Http(scheme));
    doc.security = Some(vec![
        SecurityRequirement::default(),
        SecurityRequirement::new("bearer", Vec::<String>::new()),
    ]);
}

/// [`document`], serialized as JSON: the body of `GET /openapi.json`.
pub fn document_json() -> Bytes {
    // A tree of strings, numbers and string-keyed maps cannot fail to serialize (the unit test
    // below serializes it).
    serde_json::to_vec(&document())
        .map(Bytes::from)
        .unwrap_or_default()
}

/// The request header every embedding route takes: a declaration for the document (the handlers
/// read [`crate::routes::TIMEOUT_HEADER`] themselves).
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
pub struct TimeoutHeader {
    /// Shortens this request's deadline to this many milliseconds (whole, at least 1); never
    /// lengthens it beyond the gateway's `REQUEST_TIMEOUT`. Not a positive whole number: 422.
    /// A deadline that passes before the answer: 504 (or 429 when the work queued ahead cannot
    /// finish within it).
    #[param(rename = "x-embatch-timeout-ms", minimum = 1, required = false)]
    pub timeout_ms: u64,
}

/// Declares `$name`, a route's 200 for the document (never built): a JSON body of `$schema`
/// (a `RefOr<Schema>`) described as `$description`, with TEI's timing headers
/// ([`ok_with_timings`]).
macro_rules! ok_response {
    ($(#[doc = $doc:literal])* pub struct $name:ident($description:expr, $schema:expr $(,)?);) => {
        $(#[doc = $doc])*
        pub struct $name;

        impl utoipa::IntoResponses for $name {
            fn responses(
            ) -> std::collections::BTreeMap<String, utoipa::openapi::RefOr<utoipa::openapi::Response>>
            {
                $crate::openapi::ok_with_timings($description, $schema)
            }
        }
    };
}
pub(crate) use ok_response;

ok_response! {
    /// The 200 of `POST /embed` and `POST /`: one embedding per input, in input order (an array
    /// of f32 arrays), with the timing headers.
    pub struct EmbedOk(
        "One embedding per input, in input order: an array of f32 arrays, each of the model's \
         dimensions (or `dimensions`); with `output_dtype`, integers, or for a list of types an \
         object of such arrays by type.",
        embatch_protocol::compact::embed_reply_schema(),
    );
}

ok_response! {
    /// The 200 of `POST /v1/embeddings` and `POST /embeddings`: OpenAI's embeddings response,
    /// with the timing headers.
    pub struct OpenAiOk(
        "One embedding per input, in input order.",
        Ref::from_schema_name(EmbeddingsResponse::name()).into(),
    );
}

/// A 200 with a JSON `body` and TEI's timing headers (whole ms, as TEI sends them).
pub(crate) fn ok_with_timings(
    description: &str,
    body: RefOr<Schema>,
) -> BTreeMap<String, RefOr<Response>> {
    let timings = [
        (
            "x-queue-time",
            "Whole ms the request waited in the worker before the upstream call.",
        ),
        ("x-inference-time", "Whole ms of upstream work."),
        ("x-total-time", "Whole ms the request spent in the gateway."),
    ];
    let response = timings.into_iter().fold(
        ResponseBuilder::new()
            .description(description)
            .content("application/json", Content::new(Some(body))),
        |response, (name, description)| {
            let header = HeaderBuilder::new()
                .schema(u64::schema())
                .description(Some(description))
                .build();
            response.header(name, header)
        },
    );
    BTreeMap::from([("200".to_owned(), response.build().into())])
}

/// The error statuses of `POST /embed` and `POST /`, each with TEI's error body
/// `{"error": string, "error_type": string}`: a declaration for the document, never built (the
/// handlers answer [`embatch_protocol::EmbedError`]s).
#[derive(IntoResponses)]
pub enum TeiErrors {
    /// `Empty`: `inputs` is an empty array, or one input is an empty string or an empty array of
    /// token ids. `Validation`: the body is not JSON (empty, truncated, a byte-order mark,
    /// single quotes, invalid UTF-8, raw control characters, trailing characters), as TEI 1.9.3
    /// answers.
    #[response(status = 400)]
    Empty(ErrorResponse),
    /// `Timeout`: the request body did not arrive within `BODY_READ_TIMEOUT` (the connection
    /// is closed).
    #[response(status = 408)]
    BodyTimeout(ErrorResponse),
    /// `Validation`: no worker serves the model the request names (the `Embatch-Model` header
    /// or the `/models/{model}` path); the message lists the models served.
    #[response(status = 404)]
    ModelNotFound(ErrorResponse),
    /// `Validation`: the body is over `MAX_BODY_BYTES`, or the reply could not fit the NATS
    /// server's `max_payload`.
    #[response(status = 413)]
    TooLarge(ErrorResponse),
    /// `Validation`: the body is not declared as JSON (`Content-Type` missing or not
    /// `application/json`).
    #[response(status = 415)]
    UnsupportedMediaType(ErrorResponse),
    /// `Validation` or `Tokenizer`: a JSON body that is not a JSON object, a missing `inputs`, a
    /// field of the wrong type, an invalid option value, more than `MAX_CLIENT_BATCH_SIZE`
    /// inputs, an invalid `x-embatch-timeout-ms`, an input over the model's token limit with
    /// `truncate: false` (without it, inputs are truncated, as TEI 1.9.3 does), or an input the
    /// tokenizer refuses.
    #[response(status = 422)]
    Validation(ErrorResponse),
    /// `Backend`: the upstream model failed (5xx, timeout, malformed reply).
    #[response(status = 424)]
    Backend(ErrorResponse),
    /// `Overloaded`: load shedding (the worker's queue is full, the work ahead cannot finish
    /// before the deadline or within `MAX_QUEUE_DELAY`, or the gateway holds `MAX_IN_FLIGHT`
    /// requests). Retry after `Retry-After` seconds.
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

/// The error statuses of `POST /v1/embeddings` and `POST /embeddings`: the statuses
/// `POST /embed` answers for the same errors, each with OpenAI's error body
/// `{"error": {"message", "type", "param", "code"}}`: a declaration for the document, never built
/// (the handlers answer [`crate::openai::OpenAiError`]s).
#[derive(IntoResponses)]
pub enum OpenAiErrors {
    /// `invalid_request_error`: `input` is an empty array, or one input is an empty string or an
    /// empty array of token ids, or the body is not JSON.
    #[response(status = 400)]
    Empty(OpenAiErrorResponse),
    /// `invalid_request_error`: the request body did not arrive within `BODY_READ_TIMEOUT`
    /// (the connection is closed).
    #[response(status = 408)]
    BodyTimeout(OpenAiErrorResponse),
    /// `invalid_request_error` with code `model_not_found`, as OpenAI answers: no worker serves
    /// the `model` named; the message lists the models served.
    #[response(status = 404)]
    ModelNotFound(OpenAiErrorResponse),
    /// `invalid_request_error`: the body is over `MAX_BODY_BYTES`, or the reply could not fit
    /// the NATS server's `max_payload`.
    #[response(status = 413)]
    TooLarge(OpenAiErrorResponse),
    /// `invalid_request_error`: the body is not declared as JSON.
    #[response(status = 415)]
    UnsupportedMediaType(OpenAiErrorResponse),
    /// `invalid_request_error`: a missing `input`, a field of the wrong type, an unknown
    /// `encoding_format`, more than `MAX_CLIENT_BATCH_SIZE` inputs, an invalid
    /// `x-embatch-timeout-ms`, or an input the tokenizer refuses (`param` names the field when
    /// known).
    #[response(status = 422)]
    Validation(OpenAiErrorResponse),
    /// `server_error`: the upstream model failed.
    #[response(status = 424)]
    Backend(OpenAiErrorResponse),
    /// `rate_limit_error`: load shedding, as `POST /embed`'s 429.
    #[response(
        status = 429,
        headers(("Retry-After" = u64, description = "Seconds to wait before retrying: 1."))
    )]
    Overloaded(OpenAiErrorResponse),
    /// `server_error`: no worker listens, the gateway is not connected to NATS, or the upstream
    /// is unreachable.
    #[response(status = 503)]
    Unavailable(OpenAiErrorResponse),
    /// `server_error`: the deadline passed before the answer.
    #[response(status = 504)]
    Timeout(OpenAiErrorResponse),
}

/// TEI's `GET /info` document, as a worker answers it: TEI's own `/info` for a TEI upstream, a
/// TEI-shaped document for the built-in model. Only `model_id` and `max_client_batch_size` are
/// always present; other fields are TEI's and may be `null` or absent. A declaration for the
/// document: the body is the worker's JSON, passed through.
pub struct Info;

impl PartialSchema for Info {
    fn schema() -> RefOr<Schema> {
        let nullable = |kind: Type, description: &str| {
            ObjectBuilder::new()
                .schema_type(utoipa::openapi::schema::SchemaType::from_iter([
                    kind,
                    Type::Null,
                ]))
                .description(Some(description))
        };
        let count = |description: &str| nullable(Type::Integer, description).minimum(Some(0));
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "TEI's `/info` document. Fields other than `model_id` and \
                 `max_client_batch_size` are passed through from the upstream and may be `null` \
                 or absent; unknown fields may appear.",
            ))
            .property(
                "model_id",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .description(Some("The model served (Hugging Face model id or path).")),
            )
            .required("model_id")
            .property(
                "max_client_batch_size",
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(0))
                    .description(Some(
                        "Most inputs one request may carry (the smallest of the upstream's, the \
                         worker's and the gateway's limits).",
                    )),
            )
            .required("max_client_batch_size")
            .property("model_sha", nullable(Type::String, "The model's revision."))
            .property(
                "model_dtype",
                nullable(Type::String, "The weights' type, e.g. `float32`."),
            )
            .property(
                "model_type",
                ObjectBuilder::new()
                    .schema_type(Type::Object)
                    .description(Some("TEI's model type, e.g. `{\"embedding\": {...}}`.")),
            )
            .property(
                "max_input_length",
                count("Longest input, in tokens (longer: 413 unless `truncate`)."),
            )
            .property("max_concurrent_requests", count("TEI's concurrency limit."))
            .property("max_batch_tokens", count("TEI's tokens per batch."))
            .property("max_batch_requests", count("TEI's requests per batch."))
            .property(
                "auto_truncate",
                nullable(
                    Type::Boolean,
                    "Whether over-long inputs are truncated by default.",
                ),
            )
            .property("tokenization_workers", count("TEI's tokenizer threads."))
            .property(
                "version",
                nullable(Type::String, "The upstream's (or worker's) version."),
            )
            .property("sha", nullable(Type::String, "The upstream's git commit."))
            .property(
                "docker_label",
                nullable(Type::String, "The upstream's image label."),
            )
            .into()
    }
}

impl ToSchema for Info {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_serializes_with_every_route() {
        let json: serde_json::Value = serde_json::from_slice(&document_json()).expect("JSON");
        assert_eq!(json["openapi"], "3.1.0");
        let paths = json["paths"].as_object().expect("paths");
        for (path, method) in [
            ("/embed", "post"),
            ("/", "post"),
            ("/v1/embeddings", "post"),
            ("/embeddings", "post"),
            ("/info", "get"),
            ("/health", "get"),
            ("/metrics", "get"),
            ("/openapi.json", "get"),
            ("/api-doc/openapi.json", "get"),
        ] {
            assert!(paths[path][method].is_object(), "{path} {method}");
        }
        let mut ids: Vec<&str> = paths
            .values()
            .flat_map(|item| item.as_object().into_iter().flat_map(|m| m.values()))
            .filter_map(|op| op["operationId"].as_str())
            .collect();
        let count = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), count, "operationIds are unique");
    }
}
