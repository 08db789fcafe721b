//! The W3C Trace Context a request carries: `traceparent` and `tracestate`, read from and
//! written into NATS headers ([`headers::TRACEPARENT`], [`headers::TRACESTATE`]).
//!
//! This is the one place that puts a trace context into a NATS message and takes it out again:
//! the gateway sends it through [`crate::SendOptions::trace`], the worker reads it with
//! [`TraceContext::from_headers`]. The values are kept as text, checked for the shape of the
//! W3C format and nothing more: turning them into spans is the OpenTelemetry layer's work
//! (`embatch_runtime::tracing_otel`), so this crate needs no OpenTelemetry dependency.

use std::sync::Arc;

use embatch_protocol::headers;

/// The longest `tracestate` passed on, in bytes: the W3C limit is 32 members of at most 256
/// characters (plus separators); longer values are dropped, as the specification allows.
pub const MAX_TRACESTATE_BYTES: usize = 8192;

/// A W3C trace context: a valid `traceparent` and, optionally, its `tracestate`. Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    traceparent: Arc<str>,
    tracestate: Option<Arc<str>>,
}

impl TraceContext {
    /// The context of `traceparent` and `tracestate` (as HTTP or NATS headers carry them);
    /// `None` when `traceparent` is not of the W3C shape
    /// (`<version>-<32 hex trace id>-<16 hex span id>-<2 hex flags>`, ids not all zero, version
    /// not `ff`; a later version may append fields). A `tracestate` longer than
    /// [`MAX_TRACESTATE_BYTES`] or not printable ASCII is dropped.
    pub fn new(traceparent: &str, tracestate: Option<&str>) -> Option<TraceContext> {
        let traceparent = traceparent.trim();
        if !valid_traceparent(traceparent) {
            return None;
        }
        let tracestate = tracestate
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.len() <= MAX_TRACESTATE_BYTES)
            .filter(|s| s.bytes().all(|b| (0x20..0x7f).contains(&b)))
            .map(Arc::from);
        Some(TraceContext {
            traceparent: Arc::from(traceparent),
            tracestate,
        })
    }

    /// The `traceparent` value.
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// The `tracestate` value, if any.
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The trace id: the 32 hex digits of `traceparent`.
    pub fn trace_id(&self) -> &str {
        self.traceparent.get(3..35).unwrap_or_default()
    }

    /// The context a NATS message carries in [`headers::TRACEPARENT`] and
    /// [`headers::TRACESTATE`] (also under the capitalised names `Traceparent` and
    /// `Tracestate`, as clients that canonicalise header names as HTTP/1 does send them);
    /// `None` without a valid `traceparent`.
    pub fn from_headers(message_headers: &async_nats::HeaderMap) -> Option<TraceContext> {
        let get = |lower: &str, capitalised: &str| {
            message_headers
                .get(lower)
                .or_else(|| message_headers.get(capitalised))
                .map(|v| v.as_str())
        };
        let traceparent = get(headers::TRACEPARENT, "Traceparent")?;
        TraceContext::new(traceparent, get(headers::TRACESTATE, "Tracestate"))
    }

    /// Writes the context into `message_headers` ([`headers::TRACEPARENT`], and
    /// [`headers::TRACESTATE`] when there is one).
    pub fn inject(&self, message_headers: &mut async_nats::HeaderMap) {
        message_headers.insert(headers::TRACEPARENT, &*self.traceparent);
        if let Some(state) = &self.tracestate {
            message_headers.insert(headers::TRACESTATE, &**state);
        }
    }
}

/// Whether `value` has the W3C `traceparent` shape: `vv-<32 hex>-<16 hex>-ff` (lower-case hex),
/// version `ff` invalid, ids not all zero; version `00` exactly 55 characters, later versions
/// at least 55 with `-` after the flags.
fn valid_traceparent(value: &str) -> bool {
    let bytes = value.as_bytes();
    if bytes.len() < 55 || (bytes.len() > 55 && bytes[55] != b'-') {
        return false;
    }
    let hex = |range: std::ops::Range<usize>| {
        bytes[range]
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
    };
    let zero = |range: std::ops::Range<usize>| bytes[range].iter().all(|&b| b == b'0');
    let version = &bytes[0..2];
    bytes[2] == b'-'
        && bytes[35] == b'-'
        && bytes[52] == b'-'
        && hex(0..2)
        && hex(3..35)
        && hex(36..52)
        && hex(53..55)
        && version != b"ff"
        && (version != b"00" || bytes.len() == 55)
        && !zero(3..35)
        && !zero(36..52)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_w3c_traceparent_round_trips_through_nats_headers() {
        let context = TraceContext::new(PARENT, Some("congo=t61rcWkgMzE")).expect("valid");
        let mut message_headers = async_nats::HeaderMap::new();
        context.inject(&mut message_headers);
        assert_eq!(
            message_headers
                .get(headers::TRACEPARENT)
                .map(|v| v.as_str()),
            Some(PARENT)
        );
        assert_eq!(TraceContext::from_headers(&message_headers), Some(context));
        assert_eq!(
            TraceContext::new(PARENT, None).map(|c| c.trace_id().to_owned()),
            Some("4bf92f3577b34da6a3ce929d0e0e4736".to_owned())
        );
    }

    #[test]
    fn capitalised_header_names_are_read_too() {
        let mut message_headers = async_nats::HeaderMap::new();
        message_headers.insert("Traceparent", PARENT);
        let context = TraceContext::from_headers(&message_headers).expect("read");
        assert_eq!(context.traceparent(), PARENT);
        assert_eq!(context.tracestate(), None);
    }

    #[test]
    fn malformed_traceparents_are_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceContext::new(bad, None), None, "{bad:?}");
        }
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future";
        assert!(TraceContext::new(later, None).is_some());
    }

    #[test]
    fn an_oversized_or_binary_tracestate_is_dropped() {
        let long = "a=".to_owned() + &"b".repeat(MAX_TRACESTATE_BYTES);
        let context = TraceContext::new(PARENT, Some(&long)).expect("valid parent");
        assert_eq!(context.tracestate(), None);
        let context = TraceContext::new(PARENT, Some("a=\u{1}")).expect("valid parent");
        assert_eq!(context.tracestate(), None);
    }
}
