//! A reply message as the contract defines it: the payload and the worker's headers, or the
//! error its headers carry.

use bytes::Bytes;
use embatch_protocol::headers;
use embatch_protocol::reply::{self, Timings};

use crate::RequestError;

/// A successful reply: TEI's response body and the worker's timings.
#[derive(Debug, Clone)]
pub struct Reply {
    /// TEI's `POST /embed` response body, `[[f32, ...], ...]`, one array per input, as JSON bytes.
    pub payload: Bytes,
    /// Milliseconds waited in the worker before the upstream call, and spent in it.
    pub timings: Timings,
    /// The request's tokens as the worker's tokenizer counts them (the reply's
    /// [`headers::TOKENS`]); `None` when the worker counts inputs, not tokens.
    pub tokens: Option<u64>,
    /// Inputs the worker answered from its cache (the reply's [`headers::CACHE_HITS`]); `None`
    /// when its cache is off (or it predates the cache).
    pub cache_hits: Option<u64>,
}

/// The value of header `name` of `message`, if any ([`header_in`]).
pub fn header<'a>(message: &'a async_nats::Message, name: &'static str) -> Option<&'a str> {
    header_in(message.headers.as_ref(), name)
}

/// The value of header `name` in `message_headers`, if any. `name` is one of the contract's
/// names ([`headers`]), looked up as a `HeaderName::from_static`: async-nats copies and checks
/// a `&str` name on every lookup, about ten times per request on the worker and per reply here.
pub fn header_in<'a>(
    message_headers: Option<&'a async_nats::HeaderMap>,
    name: &'static str,
) -> Option<&'a str> {
    message_headers
        .and_then(|h| h.get(async_nats::header::HeaderName::from_static(name)))
        .map(|v| v.as_str())
}

/// A reply message as the contract defines it: the payload, or the error its headers carry.
pub(crate) fn decode(message: async_nats::Message) -> Result<Reply, RequestError> {
    let header = |name: &'static str| header(&message, name);
    reply::decode(
        header(headers::SERVICE_ERROR_CODE),
        header(headers::SERVICE_ERROR),
        &message.payload,
    )
    .map_err(RequestError::Reply)?;
    let timings = Timings::read(header);
    let tokens = header(headers::TOKENS).and_then(|v| v.trim().parse().ok());
    let cache_hits = header(headers::CACHE_HITS).and_then(|v| v.trim().parse().ok());
    Ok(Reply {
        payload: message.payload,
        timings,
        tokens,
        cache_hits,
    })
}
