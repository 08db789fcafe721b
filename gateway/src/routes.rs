//! HTTP routes: TEI-compatible `POST /embed` (and `POST /`, TEI's compat route), `GET /info`,
//! OpenAI-compatible `POST /v1/embeddings` (and `POST /embeddings`), `GET /health`,
//! `GET /metrics`.
//!
//! Every embedding route sends one NATS request through the same path ([`EmbedClient::embed`],
//! with the same deadline, in-flight limit and validation), so the workers batch requests of all
//! routes together.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use embatch_client::Reply;
use embatch_protocol::reply::Timings;
use embatch_protocol::{EmbedError, EmbedRequest};
use tokio::time::Instant;

use crate::body::BodyError;
use crate::metering::Used;
use crate::models::Route;
use crate::openai::{EmbeddingsRequest, OpenAiError, ReplyShape};
use crate::openapi::{EmbedOk, TeiErrors};
use crate::tenancy::Caller;

pub use crate::app::{METERED, PUBLIC, served};
pub use crate::state::AppState;
pub(crate) use classify::{
    embed_all, model_embed_all, model_predict, model_similarity, predict, similarity,
};
pub(crate) use cohere_embed::{cohere_embed_v1, cohere_embed_v2};
pub use meta::ModelQuery;
pub(crate) use meta::{health, info, list_models, metrics, model_health, model_info, openapi};
pub(crate) use rerank::{cohere_rerank_v1, cohere_rerank_v2, model_rerank, rerank};
pub(crate) use sparse::{embed_sparse, model_embed_sparse};
pub(crate) use tokenize::{decode, model_decode, model_tokenize, tokenize};

use forward::{Ready, RouteRequest, tei_route};

pub(crate) mod classify;
pub(crate) mod cohere_embed;
mod forward;
pub(crate) mod meta;
pub(crate) mod rerank;
pub(crate) mod sparse;
pub(crate) mod tokenize;

/// HTTP request header with which a client shortens its own timeout, in whole milliseconds
/// (never lengthens it beyond `--request-timeout`).
pub const TIMEOUT_HEADER: &str = "x-embatch-timeout-ms";

/// HTTP request header with which a TEI client picks a model without changing its body
/// (`Embatch-Model: BAAI/bge-small-en-v1.5`): TEI's routes (`/embed`, `/`, `/info`, `/health`)
/// then go to that model instead of the default one. On the OpenAI route the body's `model`
/// wins; the header applies when the body names none. A model no worker serves: 404.
pub const MODEL_HEADER: &str = "embatch-model";

/// An error answered in TEI's shape: its status and `{"error": ..., "error_type": ...}`.
pub(crate) struct ApiError(pub(crate) EmbedError);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error_response(self.0.status(), Bytes::from(self.0.to_json()))
    }
}

/// An error response of `status` with the JSON `body` (TEI's or OpenAI's error shape). A 429
/// carries `Retry-After: 1`: load shedding answers at once, and a client that retries should
/// wait a moment, not hammer (RFC 9110 Retry-After, whole seconds). A 408 (the body did not
/// arrive in time) carries `Connection: close`, as RFC 9110 §15.5.9 asks: the rest of the body
/// is never read, so the connection cannot serve another request.
fn error_response(status: u16, body: Bytes) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = json_response(status, body);
    if status == StatusCode::TOO_MANY_REQUESTS {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    } else if status == StatusCode::REQUEST_TIMEOUT {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

pub(crate) fn json_response(status: StatusCode, body: Bytes) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

/// Counts a `/embed` request in flight and records how it ended, also when the client hung up
/// and the handler was dropped before answering (status `499`, as nginx logs it), under the
/// metrics of the model it was routed to (the default route's until then).
struct InFlight {
    route: Arc<Route>,
    started: Instant,
    status: Option<StatusCode>,
}

impl InFlight {
    fn start(route: Arc<Route>) -> InFlight {
        route.metrics.started();
        InFlight {
            route,
            started: Instant::now(),
            status: None,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let status = self.status.map_or(499, |s| s.as_u16());
        self.route.metrics.ended(status, self.started.elapsed());
    }
}

/// A response extension naming the route a request took, so its metrics are counted under its
/// model ([`counted`] reads it).
#[derive(Clone)]
struct Routed(Arc<Route>);

/// `response` with the [`Routed`] extension of `route`, when it is known.
pub(crate) fn routed(mut response: Response, route: Option<Arc<Route>>) -> Response {
    if let Some(route) = route {
        response.extensions_mut().insert(Routed(route));
    }
    response
}

/// The model a TEI route's request names: its [`MODEL_HEADER`], if any.
pub(crate) fn header_model(request_headers: &HeaderMap) -> Option<&str> {
    request_headers
        .get(MODEL_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

tei_route! {
    /// `POST /embed`'s part of the shared path: the model's own subject, TEI's `/embed` body
    /// (TEI 1.9.3's checks of its inputs).
    const EMBED = Embed(EmbedRequest), inputs |request| request.inputs.len();
    responses(EmbedOk, TeiErrors);

    /// `POST /embed` and `POST /`: one NATS request per HTTP request; the worker's reply payload
    /// becomes the body as is (the vectors are never decoded here). When the client disconnects
    /// first, the request is withdrawn from the worker's queue (see
    /// `embatch_client::EmbedClient::embed`).
    post "/embed" => embed {
        summary: "Embed texts (TEI's /embed)",
        description: "Exactly TEI 1.9.3's `POST /embed`: one embedding per input, in input \
                      order. `POST /` is the same route (TEI's compat route).",
        example: {"inputs": ["What is vector search?", "Hello, world!"], "normalize": true},
    }

    /// `POST /models/{model}/embed` and `POST /models/{model}`: `POST /embed` for `model`.
    post "/models/{model}/embed" => model_embed {
        summary: "Embed texts with a named model (TEI's /embed)",
        description: "`POST /embed` for the model named in the path (percent-encode a `/` in \
                      its name: `/models/BAAI%2Fbge-small-en-v1.5/embed`), for TEI clients that \
                      can only set a base URL. `POST /models/{model}` is the same route (TEI's \
                      compat route under the prefix). A model no worker serves: 404.",
    }
}

/// Runs one embedding request's handler under the in-flight gauge and the request metrics
/// ([`InFlight`], which also counts a client hang-up); the handler gets the request's start.
async fn counted<F, Fut>(default: &Arc<Route>, handle: F) -> Response
where
    F: FnOnce(Instant) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    let mut in_flight = InFlight::start(Arc::clone(default));
    let mut response = handle(in_flight.started).await;
    if let Some(Routed(route)) = response.extensions_mut().remove::<Routed>() {
        in_flight.route = route;
    }
    in_flight.status = Some(response.status());
    response
}

/// `POST /v1/embeddings` and `POST /embeddings`: OpenAI's embeddings API (see [`crate::openai`]).
/// The request is translated into TEI's `/embed` body and sent down the same path as
/// `POST /embed`; the reply is re-shaped into OpenAI's response. Errors have OpenAI's shape and
/// the status `POST /embed` gives the same error.
#[utoipa::path(
    post,
    path = "/v1/embeddings",
    tag = "openai",
    summary = "Create embeddings (OpenAI's embeddings API)",
    description = "OpenAI's `POST /v1/embeddings`; `POST /embeddings` is the same route. \
                   Embeddings are normalized; `usage` counts the inputs' tokens with the \
                   model's tokenizer (0 when the workers have none). `model` names one of \
                   `GET /v1/models` (absent or empty: the default model; any other: 404 \
                   `model_not_found`). Errors have the status `POST /embed` answers for the \
                   same error, in OpenAI's shape.",
    request_body(content = EmbeddingsRequest, content_type = "application/json",
        example = json!({"input": ["What is vector search?", "Hello, world!"]})),
    params(crate::openapi::TimeoutHeader),
    responses(crate::openapi::OpenAiOk, crate::openapi::OpenAiErrors),
)]
pub(crate) async fn openai_embeddings(request: RouteRequest) -> Response {
    let parse = |body: &[u8], _| {
        let (request, shape) = EmbeddingsRequest::from_slice(body)?.into_embed_request();
        let model = Some(shape.model.clone());
        Ok::<_, OpenAiError>(((request, shape), model))
    };
    let forward = |(request, shape): (EmbedRequest, ReplyShape), ready: Ready| async move {
        let inputs = request.inputs.len() as u64;
        request.validate(ready.max_inputs())?;
        let body = translated_body(&request)?;
        let reply = ready.send(body, embatch_client::Operation::Embed).await?;
        let body = crate::openai::response_body(&reply.payload, shape, reply.tokens)?;
        Ok(ready.ok(body, &reply, inputs))
    };
    let answer = |err| openai_error_response(&err);
    request.translated(parse, forward, answer).await
}

/// An error in OpenAI's shape, with the TEI route's status (and its `Retry-After` on 429).
fn openai_error_response(err: &OpenAiError) -> Response {
    error_response(err.status(), Bytes::from(err.to_json()))
}

/// The model a request routes to: the one its body names (`model`, when not empty), else its
/// [`MODEL_HEADER`]'s (`None`: the default model).
fn body_or_header_model<'a>(
    named: Option<&'a str>,
    request_headers: &'a HeaderMap,
) -> Option<&'a str> {
    named
        .filter(|m| !m.is_empty())
        .or_else(|| header_model(request_headers))
}

/// A translated request (OpenAI's or Cohere's, as TEI's body) as the body sent over NATS; 422
/// `Validation` if it cannot be written as JSON.
fn translated_body(request: &impl serde::Serialize) -> Result<Bytes, EmbedError> {
    serde_json::to_vec(request)
        .map(Bytes::from)
        .map_err(|e| EmbedError::Validation(format!("cannot translate the request: {e}")))
}

/// The 200 of a forwarded request: `body` (the worker's reply, or it re-shaped) with `reply`'s
/// timing and cache headers, metered as `inputs` inputs and the reply's tokens.
fn reply_ok(body: Bytes, reply: &Reply, inputs: u64, started: Instant) -> Response {
    let used = Used {
        inputs,
        tokens: reply.tokens.unwrap_or(0),
    };
    let response = reply_response(body, &reply.timings, started);
    with_used(with_cache_hits(response, reply.cache_hits), used)
}

/// A 200 JSON response of `body` with the reply's timing headers (`x-queue-time`,
/// `x-inference-time`, `x-total-time`, whole ms, as TEI sends them).
fn reply_response(body: Bytes, timings: &Timings, started: Instant) -> Response {
    let mut response = json_response(StatusCode::OK, body);
    let timings = [
        ("x-queue-time", timings.queue_time_ms),
        ("x-inference-time", timings.inference_time_ms),
        ("x-total-time", Some(started.elapsed().as_millis() as u64)),
    ];
    for (name, value) in timings {
        if let Some(value) = value {
            response
                .headers_mut()
                .insert(name, HeaderValue::from(value));
        }
    }
    response
}

/// The HTTP response header carrying the worker's [`embatch_protocol::headers::CACHE_HITS`]:
/// how many of the request's inputs were answered from the workers' cache.
pub(crate) const CACHE_HITS_HEADER: &str = "x-embatch-cache-hits";

/// `response` with [`CACHE_HITS_HEADER`] when the worker reported its cache hits.
fn with_cache_hits(mut response: Response, hits: Option<u64>) -> Response {
    if let Some(hits) = hits {
        response
            .headers_mut()
            .insert(CACHE_HITS_HEADER, HeaderValue::from(hits));
    }
    response
}

/// `response` with the [`Used`] extension the metering layer reads.
fn with_used(mut response: Response, used: Used) -> Response {
    response.extensions_mut().insert(used);
    response
}

/// The request's use of the workers' cache, from HTTP's `Cache-Control` request header
/// (`no-cache`, `no-store`), passed on as [`embatch_protocol::headers::CACHE_CONTROL`]; its trace
/// context ([`crate::trace::outgoing`]).
fn send_options(request_headers: &HeaderMap, caller: &Caller) -> embatch_client::SendOptions {
    embatch_client::SendOptions {
        tenant: Some(caller.0.name.clone()),
        cache_control: request_headers
            .get(axum::http::header::CACHE_CONTROL)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        trace: crate::trace::outgoing(request_headers),
        operation: embatch_client::Operation::Embed,
    }
}

/// The request body, or the 415 for a body not declared as JSON (`Content-Type:
/// application/json`, parameters allowed; mirrors TEI 1.9.3), the 413 for a body over
/// `MAX_BODY_BYTES`, the 408 for one that did not arrive within `BODY_READ_TIMEOUT`, the 422
/// for an unreadable one.
fn read_body(
    state: &AppState,
    request_headers: &HeaderMap,
    body: Result<Bytes, BodyError>,
) -> Result<Bytes, EmbedError> {
    let content_type = request_headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = content_type.split(';').next().unwrap_or("").trim();
    if !essence.eq_ignore_ascii_case("application/json") {
        return Err(EmbedError::UnsupportedMediaType(format!(
            "expected a request with `Content-Type: application/json`, got {:?}",
            content_type
        )));
    }
    body.map_err(|err| err.into_embed_error(state))
}

/// What a route passes on of the HTTP request: its headers and its authenticated caller.
type Call<'a> = (&'a HeaderMap, &'a Caller);

/// The path every route shares once its body is a checked TEI body: takes an in-flight permit
/// and sends it as one NATS request on the route's subject for `operation`, with what is left of
/// `timeout` (the request's, see [`client_timeout`]) as its deadline.
async fn send_as(
    state: &AppState,
    route: &Route,
    (request_headers, caller): Call<'_>,
    body: Bytes,
    (timeout, started): (Duration, Instant),
    operation: embatch_client::Operation,
) -> Result<Reply, EmbedError> {
    let Ok(_permit) = state.in_flight.try_acquire() else {
        return Err(EmbedError::Overloaded(format!(
            "the gateway has {} requests in flight (MAX_IN_FLIGHT)",
            state.max_in_flight
        )));
    };
    let remaining = timeout.saturating_sub(started.elapsed());
    let options = embatch_client::SendOptions {
        operation,
        ..send_options(request_headers, caller)
    };
    route
        .client
        .embed_with(body, remaining, &options)
        .await
        .map_err(EmbedError::from)
}

/// The request's timeout: `--request-timeout`, shortened by the client's [`TIMEOUT_HEADER`].
fn client_timeout(request_headers: &HeaderMap, default: Duration) -> Result<Duration, EmbedError> {
    let Some(value) = request_headers.get(TIMEOUT_HEADER) else {
        return Ok(default);
    };
    let millis = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .ok_or_else(|| {
            EmbedError::Validation(format!(
                "header `{TIMEOUT_HEADER}` must be a positive whole number of milliseconds"
            ))
        })?;
    Ok(Duration::from_millis(millis).min(default))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_header_only_shortens() {
        let default = Duration::from_secs(30);
        let mut h = HeaderMap::new();
        assert_eq!(client_timeout(&h, default), Ok(default));
        h.insert(TIMEOUT_HEADER, HeaderValue::from_static("1500"));
        assert_eq!(client_timeout(&h, default), Ok(Duration::from_millis(1500)));
        h.insert(TIMEOUT_HEADER, HeaderValue::from_static("99999999"));
        assert_eq!(client_timeout(&h, default), Ok(default));
        h.insert(TIMEOUT_HEADER, HeaderValue::from_static("soon"));
        let err = client_timeout(&h, default).expect_err("invalid");
        assert_eq!(err.status(), 422);
        assert!(err.to_string().contains(TIMEOUT_HEADER));
    }
}
