//! The path TEI's routes share (`/embed`, `/rerank`, `/embed_sparse`, `/tokenize`, `/decode`,
//! each also under `/models/{model}/`): route the request to its model, check its body here (so
//! a malformed one never reaches NATS), send it as it is as one NATS request on the route's
//! subject (deadline, in-flight limit, acknowledgements, resends, tenant, metering), and answer
//! the worker's reply as the body. A route file keeps only its own part, declared once with
//! `tei_route!` for `/x` and `/models/{model}/x`: a [`TeiRoute`] (its subject's operation and
//! its body check) and the words of its document.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::ExtensionRejection;
use axum::extract::{Extension, FromRequest, FromRequestParts, Request};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use embatch_client::{Operation, Reply};
use embatch_protocol::EmbedError;
use tokio::time::Instant;
use utoipa::IntoParams;

use super::{
    ApiError, body_or_header_model, client_timeout, counted, header_model, read_body, reply_ok,
    routed, send_as,
};
use crate::body::{BodyError, TimedBody};
use crate::models::Route;
use crate::state::AppState;
use crate::tenancy::Caller;

/// Checks a route's body against TEI's limits (`max_client_batch_size` given): the number of
/// inputs it holds, for the caller's usage.
pub(super) type Check = fn(&[u8], usize) -> Result<u64, EmbedError>;

/// What one TEI route adds to the shared path: the operation that picks its NATS subject
/// (`<subject>`, `<subject>.rerank`, ...) and the check of its body.
pub(super) struct TeiRoute {
    pub(super) operation: Operation,
    pub(super) check: Check,
}

/// Declares one TEI route of the shared path, written once for `POST /x` and
/// `POST /models/{model}/x`: its [`TeiRoute`] constant (the operation that picks the subject,
/// and the check of the body type `$body`, counting the inputs `$inputs` names of the parsed
/// body `$r`), and its two handlers with their documents (`$ok` the 200, `$errors` the error
/// statuses): `$plain` serves the default model (or the `Embatch-Model` header's), `$model` the
/// model in the path. Only the words of each route are its own.
macro_rules! tei_route {
    (
        $(#[doc = $route_doc:literal])*
        const $route:ident = $operation:ident($body:ident), inputs |$r:ident| $inputs:expr;
        responses($ok:ident, $errors:ident);
        $(#[doc = $plain_doc:literal])*
        post $path:literal => $plain:ident {
            summary: $summary:literal,
            description: $description:literal,
            example: $example:tt $(,)?
        }
        $(#[doc = $model_doc:literal])*
        post $model_path:literal => $model:ident {
            summary: $model_summary:literal,
            description: $model_description:literal $(,)?
        }
    ) => {
        $(#[doc = $route_doc])*
        const $route: $crate::routes::forward::TeiRoute = $crate::routes::forward::TeiRoute {
            operation: ::embatch_client::Operation::$operation,
            check: |body, max_inputs| {
                let $r = $body::from_slice(body)?;
                $r.validate(max_inputs)?;
                Ok($inputs as u64)
            },
        };

        $(#[doc = $plain_doc])*
        #[utoipa::path(
            post,
            path = $path,
            tag = "tei",
            summary = $summary,
            description = $description,
            request_body(content = $body, content_type = "application/json",
                example = json!($example)),
            params($crate::openapi::TimeoutHeader),
            responses($ok, $errors),
        )]
        pub(crate) async fn $plain(
            request: $crate::routes::forward::RouteRequest,
        ) -> ::axum::response::Response {
            request.forward_by_header($route).await
        }

        $(#[doc = $model_doc])*
        #[utoipa::path(
            post,
            path = $model_path,
            tag = "tei",
            summary = $model_summary,
            description = $model_description,
            params($crate::routes::forward::ModelPath, $crate::openapi::TimeoutHeader),
            request_body(content = $body, content_type = "application/json"),
            responses($ok, $errors),
        )]
        pub(crate) async fn $model(
            ::axum::extract::Path(model): ::axum::extract::Path<String>,
            request: $crate::routes::forward::RouteRequest,
        ) -> ::axum::response::Response {
            request.forward(Some(model), $route).await
        }
    };
}
pub(super) use tei_route;

/// The `{model}` parameter of the `/models/{model}/...` routes: a declaration for the
/// document (the handlers take it with axum's `Path`).
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct ModelPath {
    /// The model's name, as `GET /v1/models` lists it.
    #[allow(dead_code)] // Never built: it exists for the document.
    model: String,
}

/// What a route's handler takes of an HTTP request, in the order axum's own extractors took
/// it (so a rejection is the same): the caller (`Extension<Caller>`, a 500 without it), the
/// headers and the body ([`TimedBody`], which never rejects). Must be a handler's last
/// argument.
pub(crate) struct RouteRequest {
    state: Arc<AppState>,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BodyError>,
}

impl FromRequest<Arc<AppState>> for RouteRequest {
    type Rejection = ExtensionRejection;

    async fn from_request(
        request: Request,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        let (mut parts, body) = request.into_parts();
        let Extension(caller) = Extension::<Caller>::from_request_parts(&mut parts, state).await?;
        let headers = parts.headers.clone();
        let request = Request::from_parts(parts, body);
        let body = match TimedBody::from_request(request, state).await {
            Ok(TimedBody(body)) => body,
            Err(never) => match never {},
        };
        Ok(RouteRequest {
            state: Arc::clone(state),
            caller,
            headers,
            body,
        })
    }
}

/// A [`RouteRequest`]'s parts: the gateway's state, the caller, the headers, the body.
type Parts = (Arc<AppState>, Caller, HeaderMap, Result<Bytes, BodyError>);

impl RouteRequest {
    /// The request's parts, for a handler of its own (OpenAI's, Cohere's).
    pub(super) fn into_parts(self) -> Parts {
        (self.state, self.caller, self.headers, self.body)
    }

    /// Serves the request on `tei`'s subject of the default model, or of the `Embatch-Model`
    /// header's ([`super::MODEL_HEADER`]).
    pub(super) async fn forward_by_header(self, tei: TeiRoute) -> Response {
        let model = header_model(&self.headers).map(str::to_owned);
        self.forward(model, tei).await
    }

    /// Serves the request on `tei`'s subject of `model` (`None`: the default model): a 404 for
    /// a model no worker serves, then the body's errors (415, 413, 408, 422), the timeout
    /// header's (422), the check's, the worker's; else the reply's payload as a 200 with its
    /// timing and cache headers.
    pub(super) async fn forward(self, model: Option<String>, tei: TeiRoute) -> Response {
        let (state, caller, headers, body) = self.into_parts();
        let shared = Arc::clone(&state);
        counted(shared.models.default_route(), |started| async move {
            let route = match state.models.route(model.as_deref()).await {
                Ok(route) => route,
                Err(err) => return ApiError(err).into_response(),
            };
            let forwarded = async {
                let body = read_body(&state, &headers, body)?;
                let timeout = client_timeout(&headers, state.request_timeout)?;
                let inputs = (tei.check)(&body, state.max_client_batch_size)?;
                let call = (&headers, &caller);
                let timed = (timeout, started);
                let reply = send_as(&state, &route, call, body, timed, tei.operation).await?;
                Ok::<_, EmbedError>((reply, inputs))
            };
            let response = match forwarded.await {
                Ok((reply, inputs)) => reply_ok(reply.payload.clone(), &reply, inputs, started),
                Err(err) => ApiError(err).into_response(),
            };
            routed(response, Some(route))
        })
        .await
    }
}

/// A request with a translated body (OpenAI's, Cohere's), routed and timed: what its route
/// sends through the shared path ([`RouteRequest::translated`]).
pub(super) struct Ready {
    state: Arc<AppState>,
    caller: Caller,
    headers: HeaderMap,
    route: Arc<Route>,
    timeout: Duration,
    started: Instant,
}

impl Ready {
    /// `MAX_CLIENT_BATCH_SIZE`: the most inputs a request may hold.
    pub(super) fn max_inputs(&self) -> usize {
        self.state.max_client_batch_size
    }

    /// Sends `body` (a TEI body) on the route's subject for `operation`, with what is left of
    /// the request's timeout.
    pub(super) async fn send(
        &self,
        body: Bytes,
        operation: Operation,
    ) -> Result<Reply, EmbedError> {
        let call = (&self.headers, &self.caller);
        let timed = (self.timeout, self.started);
        send_as(&self.state, &self.route, call, body, timed, operation).await
    }

    /// The 200 of `body` (the reply re-shaped) with the reply's headers, metered as `inputs`.
    pub(super) fn ok(&self, body: Vec<u8>, reply: &Reply, inputs: u64) -> Response {
        reply_ok(Bytes::from(body), reply, inputs, self.started)
    }
}

impl RouteRequest {
    /// Serves a request whose body is another API's (OpenAI's embeddings, Cohere's rerank) in
    /// the order of errors of the TEI routes: the body's (415, 413, 408, 422), `parse`'s (the
    /// body to the API's request, checked against `MAX_CLIENT_BATCH_SIZE` where the API checks
    /// first, and the model it names), the model's 404 (no model named: the `Embatch-Model`
    /// header's), the timeout header's 422, then `forward`'s (the checks left, the TEI body
    /// sent, the reply re-shaped). `answer` writes an error in the API's shape.
    pub(super) async fn translated<T, E, Fut>(
        self,
        parse: impl FnOnce(&[u8], usize) -> Result<(T, Option<String>), E>,
        forward: impl FnOnce(T, Ready) -> Fut,
        answer: fn(E) -> Response,
    ) -> Response
    where
        E: From<EmbedError>,
        Fut: Future<Output = Result<Response, E>>,
    {
        let (state, caller, headers, body) = self.into_parts();
        let shared = Arc::clone(&state);
        counted(shared.models.default_route(), |started| async move {
            let mut taken = None;
            let forwarded = async {
                let body = read_body(&state, &headers, body)?;
                let (request, named) = parse(&body, state.max_client_batch_size)?;
                let model = body_or_header_model(named.as_deref(), &headers);
                let route = state.models.route(model).await?;
                taken = Some(Arc::clone(&route));
                let timeout = client_timeout(&headers, state.request_timeout)?;
                let ready = Ready {
                    state,
                    caller,
                    headers,
                    route,
                    timeout,
                    started,
                };
                forward(request, ready).await
            };
            let response = forwarded.await.unwrap_or_else(answer);
            routed(response, taken)
        })
        .await
    }
}
