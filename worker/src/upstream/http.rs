//! The HTTP pieces both HTTP upstreams share (TEI, [`super::tei`], and an OpenAI-compatible
//! server, [`super::openai`]): the pooled client with the bearer key, the JSON `POST` carrying
//! the trace context, the answer read with its failures by cause, and the health probe. Each
//! upstream keeps what is its own: its URLs, its error bodies, its reply's shape.

use std::time::Duration;

use bytes::Bytes;
use embatch_protocol::EmbedError;
use reqwest::StatusCode;

use super::UpstreamError;

/// A pooled client sending `api_key` as `Authorization: Bearer` on every request (named
/// `key_setting`, e.g. `TEI_API_KEY`, in the error), with `timeout` per call, connections
/// opened within 2 s (or `timeout` when shorter), up to 64 idle connections kept and no Nagle
/// delay. `builder` carries what one upstream adds (TEI's private CA).
///
/// # Errors
/// [`EmbedError::Unavailable`] when the key is not a valid header value or the client cannot
/// be built (an unusable root certificate, say).
pub(super) fn client(
    builder: reqwest::ClientBuilder,
    api_key: Option<&embatch_runtime::Secret>,
    key_setting: &str,
    timeout: Duration,
) -> Result<reqwest::Client, EmbedError> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(key) = api_key {
        let bearer = format!("Bearer {}", key.expose());
        let mut value = reqwest::header::HeaderValue::from_str(&bearer).map_err(|_| {
            EmbedError::Unavailable(format!("{key_setting} is not a valid header value"))
        })?;
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    builder
        .default_headers(headers)
        .timeout(timeout)
        .connect_timeout(Duration::from_secs(2).min(timeout))
        .pool_max_idle_per_host(64)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| EmbedError::Unavailable(format!("cannot build HTTP client: {e}")))
}

/// `POST url` with a JSON body (`Content-Type: application/json`), carrying the request's
/// trace context (`traceparent`, `tracestate`) when tracing exports, so the upstream continues
/// the trace (TEI's own spans, when it exports them).
pub(super) fn post_json(client: &reqwest::Client, url: &str) -> reqwest::RequestBuilder {
    let mut post = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json");
    if let Some(trace) = crate::trace::upstream_context() {
        post = post.header(embatch_protocol::headers::TRACEPARENT, trace.traceparent());
        if let Some(state) = trace.tracestate() {
            post = post.header(embatch_protocol::headers::TRACESTATE, state);
        }
    }
    post
}

/// The status and the whole body of `sent` (a request's answer, or its failure to arrive);
/// `timeout` is the one the request ran under, reported in [`UpstreamError::Timeout`].
///
/// # Errors
/// The transport's failure by cause ([`transport_error`]), while sending or reading the body.
pub(super) async fn answer(
    sent: Result<reqwest::Response, reqwest::Error>,
    timeout: Duration,
) -> Result<(StatusCode, Bytes), UpstreamError> {
    let response = sent.map_err(|e| transport_error(e, timeout))?;
    let status = response.status();
    let body = response
        .bytes()
        .await
        .map_err(|e| transport_error(e, timeout))?;
    Ok((status, body))
}

/// `GET url` as a health probe bounded by `timeout`: `Ok` on a 2xx; another status is
/// [`UpstreamError::Http`] with the body as `message` reads it (an unreadable body is empty).
///
/// # Errors
/// The transport's failure by cause, or the status as above.
pub(super) async fn probe(
    client: &reqwest::Client,
    url: &str,
    timeout: Duration,
    message: fn(&[u8]) -> String,
) -> Result<(), UpstreamError> {
    let response = client
        .get(url)
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| transport_error(e, timeout))?;
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    let body = response.bytes().await.unwrap_or_default();
    Err(UpstreamError::Http {
        status: status.as_u16(),
        body: message(&body),
    })
}

/// Connection refused / DNS, or a connection that broke during the call (the upstream died
/// mid-call) → unreachable (503: not the inputs' fault, so a client resends to another worker);
/// timeouts → 424; a TLS failure → [`UpstreamError::Tls`] with rustls's reason.
pub(super) fn transport_error(err: reqwest::Error, timeout: Duration) -> UpstreamError {
    if let Some(reason) = tls_failure(&err) {
        UpstreamError::Tls(reason)
    } else if err.is_timeout() {
        UpstreamError::Timeout(timeout)
    } else {
        UpstreamError::Unreachable(format!("upstream call failed: {err}"))
    }
}

/// The TLS failure in `err`'s chain of causes, if any. rustls reports it inside (nested) I/O
/// errors, whose `source()` skips the error they wrap, so those are opened with `get_ref()`.
fn tls_failure(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cause = Some(err);
    while let Some(current) = cause {
        if let Some(tls) = current.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        cause = match current.downcast_ref::<std::io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => current.source(),
        };
    }
    None
}
