//! Tracing of requests in the worker (with `--otlp-endpoint`; see
//! `embatch_runtime::tracing_otel`): the spans of a request's life here, in the trace its
//! `traceparent` header names.
//!
//! - `worker_request` (kind `server`): from the message's arrival to its reply, a child of the
//!   request's [`embatch_protocol::headers::TRACEPARENT`] (the gateway's span), with the
//!   subject, body size, request id and the reply's status;
//! - `admission`: from arrival until the request was handed to the batcher or refused (parsing,
//!   validation, the cache plan, the batcher's admission), recorded when it ends;
//! - `embed_request` (the batcher's, [`embatch_batcher`]): from admission to answer, with
//!   `queue_wait` (admission to its first upstream call) recorded when that call starts;
//! - `upstream_batch` (the batcher's): one upstream call's batch, a child of its oldest request's
//!   `embed_request`, linked to the `embed_request` of every request it serves;
//! - `upstream_call` (kind `client`): the call itself, whose context goes to TEI as its
//!   `traceparent`.
//!
//! With tracing off every function here returns after one atomic load and makes no span.

use async_nats::Message;
use embatch_client::TraceContext;
use embatch_protocol::headers;
use embatch_runtime::tracing_otel::{self, KeyValue};
use tokio::time::Instant;

/// The span of one request message ([`Span::none`](tracing::Span::none) with tracing off).
pub(crate) fn request_span(request: &Message) -> tracing::Span {
    if !tracing_otel::enabled() {
        return tracing::Span::none();
    }
    let message_headers = request.headers.as_ref();
    let request_id = embatch_client::header_in(message_headers, headers::REQUEST_ID).unwrap_or("");
    let span = tracing::info_span!(
        "worker_request",
        otel.name = %format_args!("process {}", request.subject),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        messaging.system = "nats",
        messaging.destination.name = %request.subject,
        messaging.message.body.size = request.payload.len(),
        embatch.request_id = request_id,
        embatch.status_code = tracing::field::Empty,
    );
    let parent = message_headers.and_then(TraceContext::from_headers);
    tracing_otel::set_remote_parent(&span, parent.as_ref());
    span
}

/// The current span with tracing on (to carry a request's span into the tasks it spawns);
/// [`Span::none`](tracing::Span::none) with tracing off, without asking the subscriber.
pub(crate) fn current() -> tracing::Span {
    if tracing_otel::enabled() {
        tracing::Span::current()
    } else {
        tracing::Span::none()
    }
}

/// Records the current request's `admission` span: from `received` to now, refused with
/// `refused` (its HTTP-style status) or handed to the batcher.
pub(crate) fn admitted(received: Instant, refused: Option<u16>) {
    if !tracing_otel::enabled() {
        return;
    }
    let attributes = match refused {
        Some(status) => vec![
            KeyValue::new("embatch.admitted", false),
            KeyValue::new("embatch.status_code", i64::from(status)),
        ],
        None => vec![KeyValue::new("embatch.admitted", true)],
    };
    tracing_otel::record_interval(
        &tracing::Span::current(),
        "admission",
        (received.into_std(), std::time::Instant::now()),
        attributes,
    );
}

/// Records the status of the reply on the current request's span: `status` for an error
/// (`ERROR` from 500 up), 200 for a success.
pub(crate) fn answered(status: Option<u16>) {
    if !tracing_otel::enabled() {
        return;
    }
    let span = tracing::Span::current();
    let status = status.unwrap_or(200);
    span.record("embatch.status_code", status);
    if status >= 500 {
        span.record("otel.status_code", "ERROR");
    }
}

/// The batcher's hooks into these traces: `upstream_batch` a child of its oldest request's
/// `embed_request`, and `queue_wait`.
pub(crate) const BATCHER: embatch_batcher::Traces = embatch_batcher::Traces {
    enabled: tracing_otel::enabled,
    set_parent: tracing_otel::set_parent,
    queue_waited,
};

/// Records the `queue_wait` span of a request whose `span` is its batcher span
/// (`embed_request`): from `accepted` to `first_call`.
fn queue_waited(span: &tracing::Span, accepted: Instant, first_call: Instant) {
    tracing_otel::record_interval(
        span,
        "queue_wait",
        (accepted.into_std(), first_call.into_std()),
        Vec::new(),
    );
}

/// The span of one upstream call of `inputs` inputs to `upstream` (`tei` or `local`), a child
/// of the current span (its batch); [`Span::none`](tracing::Span::none) with tracing off.
pub(crate) fn upstream_call(upstream: &'static str, inputs: usize) -> tracing::Span {
    if !tracing_otel::enabled() {
        return tracing::Span::none();
    }
    let kind = if upstream == "tei" {
        "client"
    } else {
        "internal"
    };
    tracing::info_span!(
        "upstream_call",
        otel.name = %format_args!("upstream {upstream}"),
        otel.kind = kind,
        otel.status_code = tracing::field::Empty,
        embatch.upstream = upstream,
        embatch.inputs = inputs,
        error.type = tracing::field::Empty,
    )
}

/// Records a failed upstream call on `span`.
pub(crate) fn upstream_failed(span: &tracing::Span, err: &crate::upstream::UpstreamError) {
    if span.is_disabled() {
        return;
    }
    span.record("otel.status_code", "ERROR");
    span.record("error.type", tracing::field::display(err));
}

/// The `traceparent` (and `tracestate`) for the upstream call running now: the current span's
/// (`upstream_call`) with tracing on; `None` off.
pub(crate) fn upstream_context() -> Option<TraceContext> {
    if !tracing_otel::enabled() {
        return None;
    }
    tracing_otel::context_of(&tracing::Span::current())
}
