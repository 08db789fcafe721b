//! The path TEI's routes beyond `/embed` and `/rerank` share (`/embed_sparse`, `/tokenize`,
//! `/decode`): route the request to its model, check its body here (so a malformed one never
//! reaches NATS), send it as it is as one NATS request on the route's subject (deadline,
//! in-flight limit, acknowledgements, resends, tenant, metering), and answer the worker's reply
//! as the body.

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use embatch_client::Operation;
use embatch_protocol::EmbedError;

use super::{
    ApiError, client_timeout, counted, read_body, reply_response, routed, send_as, with_cache_hits,
    with_used,
};
use crate::body::BodyError;
use crate::metering::Used;
use crate::state::AppState;
use crate::tenancy::Caller;

/// Checks a route's body against TEI's limits (`max_client_batch_size` given): the number of
/// inputs it holds, for the caller's usage.
pub(super) type Check = fn(&[u8], usize) -> Result<u64, EmbedError>;

/// Serves one request of a TEI route on `operation`'s subject of `model` (`None`: the default
/// model, or the `Embatch-Model` header's, as the caller resolved it).
pub(super) async fn forward_route(
    state: Arc<AppState>,
    model: Option<String>,
    (request_headers, caller): (HeaderMap, Caller),
    body: Result<Bytes, BodyError>,
    (operation, check): (Operation, Check),
) -> Response {
    let shared = Arc::clone(&state);
    counted(shared.models.default_route(), |started| async move {
        let route = match state.models.route(model.as_deref()).await {
            Ok(route) => route,
            Err(err) => return ApiError(err).into_response(),
        };
        let forwarded = async {
            let body = read_body(&state, &request_headers, body)?;
            let timeout = client_timeout(&request_headers, state.request_timeout)?;
            let inputs = check(&body, state.max_client_batch_size)?;
            let call = (&request_headers, &caller);
            let reply = send_as(&state, &route, call, body, (timeout, started), operation).await?;
            Ok::<_, EmbedError>((reply, inputs))
        };
        let response = match forwarded.await {
            Ok((reply, inputs)) => {
                let used = Used {
                    inputs,
                    tokens: reply.tokens.unwrap_or(0),
                };
                let response = reply_response(reply.payload, &reply.timings, started);
                with_used(with_cache_hits(response, reply.cache_hits), used)
            }
            Err(err) => ApiError(err).into_response(),
        };
        routed(response, Some(route))
    })
    .await
}
