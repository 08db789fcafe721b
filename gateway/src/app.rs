//! The gateway's router: every route, which of them need an API key ([`PUBLIC`] do not), which
//! count against a tenant's quota ([`METERED`]), and the layers that do both.

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{MethodRouter, get, post};

use crate::routes::{cohere_embed_v1, cohere_embed_v2};
use crate::routes::{
    cohere_rerank_v1, cohere_rerank_v2, embed, health, info, list_models, metrics, model_embed,
    model_health, model_info, model_rerank, openai_embeddings, openapi, rerank,
};
use crate::routes::{
    decode, embed_sparse, model_decode, model_embed_sparse, model_tokenize, tokenize,
};
use crate::routes::{
    embed_all, model_embed_all, model_predict, model_similarity, predict, similarity,
};
use crate::state::AppState;

/// Every route the gateway serves, as `(method, path)`: exactly what [`app`] registers (the
/// OpenAPI document describes each; `tests/openapi.rs` checks both).
pub fn served() -> Vec<(&'static str, &'static str)> {
    handlers()
        .into_iter()
        .map(|(method, path, _)| (method, path))
        .chain(crate::bulk::SERVED)
        .chain([("GET", "/v1/usage")])
        .collect()
}

/// The routes that need no API key: liveness, metrics and the API's description (as TEI leaves
/// `/health` and `/metrics` open under `--api-key`).
pub const PUBLIC: [&str; 5] = [
    "/health",
    "/metrics",
    "/models/{model}/health",
    crate::openapi::DOCUMENT_PATHS[0],
    crate::openapi::DOCUMENT_PATHS[1],
];

/// The embedding routes, whose requests count against their tenant's quota and usage
/// ([`crate::metering`]).
pub const METERED: [&str; 24] = [
    "/embed",
    "/",
    "/v1/embeddings",
    "/embeddings",
    "/models/{model}/embed",
    "/models/{model}",
    "/rerank",
    "/models/{model}/rerank",
    "/v1/rerank",
    "/v2/rerank",
    "/v1/embed",
    "/v2/embed",
    "/embed_sparse",
    "/models/{model}/embed_sparse",
    "/tokenize",
    "/models/{model}/tokenize",
    "/decode",
    "/models/{model}/decode",
    "/predict",
    "/models/{model}/predict",
    "/embed_all",
    "/models/{model}/embed_all",
    "/similarity",
    "/models/{model}/similarity",
];

/// The routes: method (for [`served`]), path and handler.
fn handlers() -> [(&'static str, &'static str, MethodRouter<Arc<AppState>>); 32] {
    [
        ("POST", "/embed", post(embed)),
        // TEI's compat route (`huggingface_hub`'s `InferenceClient(base_url=...)` posts here).
        ("POST", "/", post(embed)),
        ("POST", "/v1/embeddings", post(openai_embeddings)),
        ("POST", "/embeddings", post(openai_embeddings)),
        // TEI's `/rerank`, and Cohere's (and Jina's) rerank API.
        ("POST", "/rerank", post(rerank)),
        ("POST", "/models/{model}/rerank", post(model_rerank)),
        ("POST", "/v1/rerank", post(cohere_rerank_v1)),
        ("POST", "/v2/rerank", post(cohere_rerank_v2)),
        // Cohere's embed API, with compact outputs (contract v1.5).
        ("POST", "/v1/embed", post(cohere_embed_v1)),
        ("POST", "/v2/embed", post(cohere_embed_v2)),
        // TEI's other routes (contract v1.3).
        ("POST", "/embed_sparse", post(embed_sparse)),
        (
            "POST",
            "/models/{model}/embed_sparse",
            post(model_embed_sparse),
        ),
        ("POST", "/tokenize", post(tokenize)),
        ("POST", "/models/{model}/tokenize", post(model_tokenize)),
        ("POST", "/decode", post(decode)),
        ("POST", "/models/{model}/decode", post(model_decode)),
        // Contract v1.4.
        ("POST", "/predict", post(predict)),
        ("POST", "/models/{model}/predict", post(model_predict)),
        ("POST", "/embed_all", post(embed_all)),
        ("POST", "/models/{model}/embed_all", post(model_embed_all)),
        ("POST", "/similarity", post(similarity)),
        ("POST", "/models/{model}/similarity", post(model_similarity)),
        ("GET", "/info", get(info)),
        ("GET", "/health", get(health)),
        ("GET", "/metrics", get(metrics)),
        ("GET", "/v1/models", get(list_models)),
        // TEI's routes under a model's path prefix, for clients that can only set a base URL
        // (`/` in a model name percent-encoded: `/models/BAAI%2Fbge-small-en-v1.5/embed`).
        ("POST", "/models/{model}/embed", post(model_embed)),
        ("POST", "/models/{model}", post(model_embed)),
        ("GET", "/models/{model}/info", get(model_info)),
        ("GET", "/models/{model}/health", get(model_health)),
        ("GET", crate::openapi::DOCUMENT_PATHS[0], get(openapi)),
        ("GET", crate::openapi::DOCUMENT_PATHS[1], get(openapi)),
    ]
}

/// The gateway's router, apart from serving, so tests can drive it without a socket.
pub fn app(state: AppState) -> Router {
    let limit = state.max_body_bytes;
    let (public, protected): (Vec<_>, Vec<_>) = handlers()
        .into_iter()
        .partition(|(_, path, _)| PUBLIC.contains(path));
    let (metered, protected): (Vec<_>, Vec<_>) = protected
        .into_iter()
        .partition(|(_, path, _)| METERED.contains(path));
    let routes = |routes: Vec<(_, &'static str, _)>| {
        routes
            .into_iter()
            .fold(Router::new(), |router, (_, path, handler)| {
                router.route(path, handler)
            })
    };
    let authenticate =
        axum::middleware::from_fn_with_state(state.tenants.clone(), crate::tenancy::authenticate);
    let meter =
        axum::middleware::from_fn_with_state(Arc::new(state.meter.clone()), crate::metering::meter);
    let usage = Router::new()
        .route("/v1/usage", get(crate::usage::route))
        .with_state(state.meter.usage.clone());
    routes(metered)
        .route_layer(meter)
        .merge(routes(protected))
        .layer(DefaultBodyLimit::max(limit))
        .merge(usage)
        // The Files and Batches routes, with their own body limits (after the layer above).
        .merge(crate::bulk::router(state.bulk.clone()))
        .route_layer(authenticate)
        .merge(routes(public))
        // Shared behind an `Arc`: axum clones the state for every request, and a deep clone (the
        // subject `String`, the NATS client's handles) was the gateway's own top symbol in the
        // profile.
        .with_state(Arc::new(state))
}
