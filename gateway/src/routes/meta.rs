//! The routes that describe the service rather than embed: `GET /info`, `GET /health` (and
//! their `/models/{model}/...` forms), `GET /v1/models`, `GET /metrics` and the OpenAPI
//! document.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};

use embatch_protocol::{EmbedError, ErrorResponse};

use super::{ApiError, AppState, header_model, json_response};

/// The `?model=` of `GET /info` and `GET /health`.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ModelQuery {
    /// The model to ask about, as `GET /v1/models` lists it (also the `Embatch-Model` header);
    /// absent: the default model. A model no worker serves: 404.
    pub model: Option<String>,
}

/// The model `GET /info` and `GET /health` ask about: their [`ModelQuery`], else the
/// `Embatch-Model` header's (`None`: the default model). Rejects as `Query<ModelQuery>` does.
pub(crate) struct AskedModel(Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for AskedModel {
    type Rejection = QueryRejection;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Query(query) = Query::<ModelQuery>::from_request_parts(parts, state).await?;
        let header = || header_model(&parts.headers).map(str::to_owned);
        Ok(AskedModel(query.model.or_else(header)))
    }
}

/// `GET /info`: TEI's `/info` document from one worker (see [`crate::info`]), waiting at most
/// `--health-timeout`; 503 in TEI's error shape when no worker answers.
#[utoipa::path(
    get,
    path = "/info",
    tag = "tei",
    summary = "The model served (TEI's /info)",
    description = "TEI's `/info` document, answered by one worker of the model over NATS: the \
                   default model's, or the one `?model=` (or the `Embatch-Model` header) \
                   names.",
    params(ModelQuery),
    responses(
        (status = 200, description = "TEI's `/info` document.", body = crate::openapi::Info),
        (status = 404, description = "`Validation`: no worker serves the model named.",
            body = ErrorResponse),
        (status = 424, description = "`Backend`: the worker's upstream answered a malformed \
                                      `/info`.", body = ErrorResponse),
        (status = 503, description = "`Unhealthy`: no worker answered within \
                                      `HEALTH_TIMEOUT`, or the worker's upstream is \
                                      unreachable.", body = ErrorResponse),
    ),
)]
pub(crate) async fn info(
    State(state): State<Arc<AppState>>,
    AskedModel(model): AskedModel,
) -> Response {
    model_info_of(&state, model.as_deref()).await
}

/// `GET /models/{model}/info`: `GET /info` for `model`.
#[utoipa::path(
    get,
    path = "/models/{model}/info",
    tag = "tei",
    summary = "A named model's TEI /info",
    params(("model" = String, Path, description = "The model's name (`/` percent-encoded).")),
    responses(
        (status = 200, description = "TEI's `/info` document.", body = crate::openapi::Info),
        (status = 404, description = "`Validation`: no worker serves the model.",
            body = ErrorResponse),
        (status = 424, description = "`Backend`: a malformed `/info`.", body = ErrorResponse),
        (status = 503, description = "`Unhealthy`: no worker answered.", body = ErrorResponse),
    ),
)]
pub(crate) async fn model_info(
    State(state): State<Arc<AppState>>,
    Path(model): Path<String>,
) -> Response {
    model_info_of(&state, Some(&model)).await
}

async fn model_info_of(state: &AppState, model: Option<&str>) -> Response {
    let route = match state.models.route(model).await {
        Ok(route) => route,
        Err(err) => return ApiError(err).into_response(),
    };
    match crate::info::fetch(
        &route.client,
        state.health_timeout,
        state.max_client_batch_size,
    )
    .await
    {
        Ok(body) => json_response(StatusCode::OK, body),
        Err(err) => ApiError(err).into_response(),
    }
}

/// `GET /health`: 200 only while connected to NATS and a worker of the model (the default one,
/// or the one `?model=` or the `Embatch-Model` header names) answers its `info` endpoint
/// ([`embatch_protocol::headers::info_subject`] of the model's subject) within
/// `--health-timeout` (an error reply counts: a worker is there); else 503; 404 for a model no
/// worker serves. A worker of another subject or model does not make the gateway healthy.
#[utoipa::path(
    get,
    path = "/health",
    tag = "operations",
    summary = "Readiness",
    params(ModelQuery),
    responses(
        (status = 200, description = "Connected to NATS and a worker of the model answered \
                                      within `HEALTH_TIMEOUT`. Empty body."),
        (status = 404, description = "No worker serves the model named. Empty body."),
        (status = 503, description = "Not connected to NATS, or no worker answered. Empty \
                                      body."),
    ),
)]
pub(crate) async fn health(
    State(state): State<Arc<AppState>>,
    AskedModel(model): AskedModel,
) -> StatusCode {
    model_health_of(&state, model.as_deref()).await
}

/// `GET /models/{model}/health`: `GET /health` for `model`.
#[utoipa::path(
    get,
    path = "/models/{model}/health",
    tag = "operations",
    summary = "A named model's readiness",
    params(("model" = String, Path, description = "The model's name (`/` percent-encoded).")),
    responses(
        (status = 200, description = "A worker of the model answered. Empty body."),
        (status = 404, description = "No worker serves the model. Empty body."),
        (status = 503, description = "Not connected to NATS, or no worker answered. Empty \
                                      body."),
    ),
)]
pub(crate) async fn model_health(
    State(state): State<Arc<AppState>>,
    Path(model): Path<String>,
) -> StatusCode {
    model_health_of(&state, Some(&model)).await
}

async fn model_health_of(state: &AppState, model: Option<&str>) -> StatusCode {
    let route = match state.models.route(model).await {
        Ok(route) => route,
        Err(_) => return StatusCode::NOT_FOUND,
    };
    match route.client.info(state.health_timeout).await {
        Ok(_) | Err(embatch_client::RequestError::Reply(_)) => StatusCode::OK,
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// `GET /v1/models`: the models served now, in OpenAI's list shape, from NATS discovery (see
/// [`crate::models`]): a model is listed from its first worker's announcement until its last
/// worker stops (or misses two discovery rounds in a row). When the table is older than
/// [`crate::models::LIST_TTL`] (2 s) it answers after a fresh round, at most
/// [`crate::models::DISCOVERY_WAIT`] (100 ms) later.
#[utoipa::path(
    get,
    path = "/v1/models",
    tag = "openai",
    summary = "The models served (OpenAI's models API)",
    description = "OpenAI's `GET /v1/models`: one entry per model a worker serves now. \
                   `created` is when the gateway first saw a worker of it (Unix seconds); \
                   `owned_by` is `embatch`. Extra fields: `revision` (the weights' revision, \
                   when known), `default` (it answers requests that name no model) and \
                   `workers` (how many serve it).",
    responses(
        (status = 200, description = "OpenAI's list of models.",
            body = crate::models::ModelList),
    ),
)]
pub(crate) async fn list_models(State(state): State<Arc<AppState>>) -> Response {
    match serde_json::to_vec(&state.models.list().await) {
        Ok(body) => json_response(StatusCode::OK, Bytes::from(body)),
        Err(err) => ApiError(EmbedError::Backend(format!(
            "cannot encode the models: {err}"
        )))
        .into_response(),
    }
}

/// `GET /metrics`: Prometheus text exposition.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    summary = "Prometheus metrics",
    responses(
        (status = 200, description = "Prometheus text exposition format 0.0.4.", body = String,
            content_type = "text/plain"),
        (status = 404, description = "No metrics recorder is installed (embedded gateways, \
                                      tests). Empty body."),
    ),
)]
pub(crate) async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    match &state.metrics {
        Some(handle) => handle.render().into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// `GET /openapi.json` and `GET /api-doc/openapi.json`: the OpenAPI document of these routes (see
/// [`crate::openapi`]), serialized once at start-up.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    summary = "This OpenAPI 3.1 document",
    description = "Also at TEI's path `GET /api-doc/openapi.json`.",
    responses(
        (status = 200, description = "The OpenAPI 3.1 document of the gateway.",
            body = Object, content_type = "application/json"),
    ),
)]
pub(crate) async fn openapi(State(state): State<Arc<AppState>>) -> Response {
    json_response(StatusCode::OK, state.openapi.clone())
}
