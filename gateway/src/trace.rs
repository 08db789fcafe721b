//! Tracing of HTTP requests: each request's span, a child of the caller's W3C `traceparent`,
//! and the trace context sent on to the workers in the NATS request's headers.
//!
//! With tracing off (no `--otlp-endpoint`) no span is made: [`request_span`] passes the request
//! through after one atomic load, and [`outgoing`] passes the caller's `traceparent` and
//! `tracestate` on as they came, so a worker with tracing on still joins the caller's trace.

use axum::extract::Request;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use embatch_client::TraceContext;
use embatch_protocol::headers;
use embatch_runtime::tracing_otel;
use tracing::Instrument;

/// Middleware, layered by [`crate::serve`] only with tracing on: runs each `POST` request (the
/// embedding routes, files and batches) in a span of kind `server` named after its method and
/// path (`POST /embed`), a child of the caller's `traceparent` when it sent one, with the
/// response's status; other requests (health checks, metrics scrapes) pass through untraced.
pub async fn request_span(request: Request, next: Next) -> Response {
    if !tracing_otel::enabled() || request.method() != axum::http::Method::POST {
        return next.run(request).await;
    }
    let name = format!("{} {}", request.method(), request.uri().path());
    let span = tracing::info_span!(
        "gateway_request",
        otel.name = %name,
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = %request.method(),
        url.path = %request.uri().path(),
        http.response.status_code = tracing::field::Empty,
    );
    tracing_otel::set_remote_parent(&span, incoming(request.headers()).as_ref());
    let response = next.run(request).instrument(span.clone()).await;
    let status = response.status();
    span.record("http.response.status_code", status.as_u16());
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    response
}

/// The trace context to send the workers for a request with `request_headers`, from within its
/// handler: the request's own span with tracing on, else the caller's as it came; `None`
/// without either.
pub fn outgoing(request_headers: &HeaderMap) -> Option<TraceContext> {
    if tracing_otel::enabled()
        && let Some(own) = tracing_otel::context_of(&tracing::Span::current())
    {
        return Some(own);
    }
    incoming(request_headers)
}

/// The caller's W3C trace context: its `traceparent` and `tracestate` headers.
fn incoming(request_headers: &HeaderMap) -> Option<TraceContext> {
    let traceparent = request_headers.get(headers::TRACEPARENT)?.to_str().ok()?;
    let tracestate = request_headers
        .get(headers::TRACESTATE)
        .and_then(|v| v.to_str().ok());
    TraceContext::new(traceparent, tracestate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_tracing_off_the_callers_context_is_passed_on_as_it_came() {
        let mut request_headers = HeaderMap::new();
        assert_eq!(outgoing(&request_headers), None);
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        request_headers.insert("traceparent", parent.parse().expect("header value"));
        request_headers.insert(
            "tracestate",
            "congo=t61rcWkgMzE".parse().expect("header value"),
        );
        let sent = outgoing(&request_headers).expect("passed on");
        assert_eq!(sent.traceparent(), parent);
        assert_eq!(sent.tracestate(), Some("congo=t61rcWkgMzE"));
        request_headers.insert("traceparent", "garbage".parse().expect("header value"));
        assert_eq!(outgoing(&request_headers), None);
    }
}
