//! HTTP routes: TEI-compatible `POST /embed`, `GET /health`, `GET /metrics`.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use embatch_protocol::{EmbedError, EmbedRequest, PROTOCOL_VERSION, SERVICE_NAME, headers};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::time::Instant;

use crate::telemetry::names;

/// HTTP request header with which a client shortens its own timeout, in whole milliseconds
/// (never lengthens it beyond `--request-timeout`).
pub const TIMEOUT_HEADER: &str = "x-embatch-timeout-ms";

/// What the routes share.
#[derive(Clone)]
pub struct AppState {
    /// Connection to NATS.
    pub client: async_nats::Client,
    /// Subject requests are published on.
    pub subject: String,
    /// Longest end-to-end time of a request.
    pub request_timeout: Duration,
    /// Most inputs in one request (413 beyond).
    pub max_client_batch_size: usize,
    /// Largest body in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// How long `/health` waits for a worker's ping reply.
    pub health_timeout: Duration,
    /// Renders `/metrics`; `None` when no recorder is installed (tests).
    pub metrics: Option<PrometheusHandle>,
}

impl AppState {
    /// The state for `config`, on an open NATS connection; `metrics` renders `/metrics` (`None`:
    /// 404).
    pub fn new(
        client: async_nats::Client,
        config: &crate::Config,
        metrics: Option<PrometheusHandle>,
    ) -> AppState {
        AppState {
            client,
            subject: config.subject.clone(),
            request_timeout: config.request_timeout,
            max_client_batch_size: config.max_client_batch_size,
            max_body_bytes: config.max_body_bytes,
            health_timeout: config.health_timeout,
            metrics,
        }
    }
}

/// The gateway's router, apart from serving, so tests can drive it without a socket.
pub fn app(state: AppState) -> Router {
    let limit = state.max_body_bytes;
    Router::new()
        .route("/embed", post(embed))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(limit))
        // Shared behind an `Arc`: axum clones the state for every request, and a deep clone (the
        // subject `String`, the NATS client's handles) was the gateway's own top symbol in the
        // profile.
        .with_state(Arc::new(state))
}

/// An error answered in TEI's shape: its status and `{"error": ..., "error_type": ...}`.
struct ApiError(EmbedError);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.0.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        json_response(status, Bytes::from(self.0.to_json()))
    }
}

fn json_response(status: StatusCode, body: Bytes) -> Response {
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

/// `POST /embed`: one NATS request per HTTP request; the worker's reply payload becomes the body
/// as is (the vectors are never decoded here).
async fn embed(
    State(state): State<Arc<AppState>>,
    request_headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    metrics::gauge!(names::IN_FLIGHT).increment(1.0);
    let response = match forward(&state, &request_headers, body, started).await {
        Ok(response) => response,
        Err(err) => ApiError(err).into_response(),
    };
    metrics::gauge!(names::IN_FLIGHT).decrement(1.0);
    metrics::counter!(names::REQUESTS, "status" => response.status().as_str().to_owned())
        .increment(1);
    metrics::histogram!(names::REQUEST_TIME).record(started.elapsed().as_secs_f64());
    response
}

async fn forward(
    state: &AppState,
    request_headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    started: Instant,
) -> Result<Response, EmbedError> {
    let body = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            EmbedError::TooLarge(format!(
                "the request body must be at most {} bytes (MAX_BODY_BYTES)",
                state.max_body_bytes
            ))
        } else {
            EmbedError::Validation(format!("cannot read the request body: {rejection}"))
        }
    })?;
    let timeout = client_timeout(request_headers, state.request_timeout)?;
    EmbedRequest::from_slice(&body)?.validate(state.max_client_batch_size)?;

    let mut nats_headers = async_nats::HeaderMap::new();
    let remaining = timeout.saturating_sub(started.elapsed());
    nats_headers.insert(
        headers::DEADLINE_MS,
        headers::encode_deadline(remaining).as_str(),
    );
    nats_headers.insert(headers::VERSION, PROTOCOL_VERSION);
    let request = async_nats::Request::new()
        .payload(body)
        .headers(nats_headers)
        .timeout(Some(remaining));
    let message = state
        .client
        .send_request(state.subject.clone(), request)
        .await
        .map_err(|err| match err.kind() {
            async_nats::RequestErrorKind::NoResponders => EmbedError::Unavailable(format!(
                "no embatch worker is listening on subject `{}`",
                state.subject
            )),
            async_nats::RequestErrorKind::TimedOut => {
                EmbedError::DeadlineExceeded(format!("no reply within {} ms", timeout.as_millis()))
            }
            async_nats::RequestErrorKind::MaxPayloadExceeded => EmbedError::TooLarge(format!(
                "the request body is larger than the NATS server's max_payload: {err}"
            )),
            _ => EmbedError::Unavailable(format!("NATS request failed: {err}")),
        })?;

    let reply_headers = message.headers.as_ref();
    let header_str = |name: &str| reply_headers.and_then(|h| h.get(name)).map(|v| v.as_str());
    if let Some(code) = header_str(headers::SERVICE_ERROR_CODE) {
        let code = code.trim().parse::<u16>().unwrap_or(424);
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::FAILED_DEPENDENCY);
        // The worker sends TEI's error body; a foreign responder may send only the headers.
        let body = if message.payload.is_empty() {
            Bytes::from(
                EmbedError::from_reply(code, header_str(headers::SERVICE_ERROR).unwrap_or(""))
                    .to_json(),
            )
        } else {
            message.payload
        };
        return Ok(json_response(status, body));
    }

    let mut response = json_response(StatusCode::OK, message.payload);
    let timings = [
        (
            "x-queue-time",
            headers::parse_millis(header_str(headers::QUEUE_TIME_MS)),
        ),
        (
            "x-inference-time",
            headers::parse_millis(header_str(headers::INFERENCE_TIME_MS)),
        ),
        ("x-total-time", Some(started.elapsed().as_millis() as u64)),
    ];
    for (name, value) in timings {
        if let Some(value) = value {
            response
                .headers_mut()
                .insert(name, HeaderValue::from(value));
        }
    }
    Ok(response)
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

/// `GET /health`: 200 only while connected to NATS and at least one worker answers a NATS micro
/// ping (`$SRV.PING.embatch`) within `--health-timeout`; else 503.
async fn health(State(state): State<Arc<AppState>>) -> StatusCode {
    if state.client.connection_state() != async_nats::connection::State::Connected {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let ping = state
        .client
        .request(format!("$SRV.PING.{SERVICE_NAME}"), Bytes::new());
    match tokio::time::timeout(state.health_timeout, ping).await {
        Ok(Ok(_)) => StatusCode::OK,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// `GET /metrics`: Prometheus text exposition.
async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    match &state.metrics {
        Some(handle) => handle.render().into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
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
