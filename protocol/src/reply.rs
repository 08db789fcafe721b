//! The reply codec, independent of any NATS client: what a worker puts in a reply's headers and
//! payload, and how a client turns a reply back into a result.
//!
//! - Success: payload = TEI's response body (`[[f32, ...], ...]`), headers
//!   [`headers::QUEUE_TIME_MS`] and [`headers::INFERENCE_TIME_MS`] (whole ms).
//! - Error: payload = TEI's error body (`{"error": ..., "error_type": ...}`), headers
//!   [`headers::SERVICE_ERROR_CODE`] (the HTTP-style status) and [`headers::SERVICE_ERROR`] (the
//!   message on one line), as in the NATS micro protocol.
//!
//! Every transport (the worker's replies, the gateway, the load generator, the tests) goes
//! through [`success_headers`], [`error_headers`] and [`decode`], so the contract is written once.

use std::time::Duration;

use crate::{EmbedError, ErrorResponse, ErrorType, headers};

/// Headers of a success reply: `(name, value)` pairs, queue and inference time in whole ms.
pub fn success_headers(
    queue_time: Duration,
    inference_time: Duration,
) -> [(&'static str, String); 2] {
    [
        (headers::QUEUE_TIME_MS, queue_time.as_millis().to_string()),
        (
            headers::INFERENCE_TIME_MS,
            inference_time.as_millis().to_string(),
        ),
    ]
}

/// Headers of an error reply: the status code and the message folded onto one line (a header
/// value cannot hold control characters, and an upstream's message may have several lines).
pub fn error_headers(err: &EmbedError) -> [(&'static str, String); 2] {
    let message: String = err
        .to_string()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    [
        (headers::SERVICE_ERROR_CODE, err.status().to_string()),
        (headers::SERVICE_ERROR, message),
    ]
}

/// A decoded success reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timings {
    /// [`headers::QUEUE_TIME_MS`], when present and valid.
    pub queue_time_ms: Option<u64>,
    /// [`headers::INFERENCE_TIME_MS`], when present and valid.
    pub inference_time_ms: Option<u64>,
}

impl Timings {
    /// Reads the timing headers through `header` (a lookup by name in whatever header map the
    /// transport has).
    pub fn read<'a>(header: impl Fn(&'static str) -> Option<&'a str>) -> Timings {
        Timings {
            queue_time_ms: headers::parse_millis(header(headers::QUEUE_TIME_MS)),
            inference_time_ms: headers::parse_millis(header(headers::INFERENCE_TIME_MS)),
        }
    }
}

/// Decodes a reply: `error_code` and `error_message` are the values of
/// [`headers::SERVICE_ERROR_CODE`] and [`headers::SERVICE_ERROR`] (if present), `payload` its body.
///
/// # Errors
/// When `error_code` is present: [`EmbedError::Remote`] carrying the status and TEI's error body
/// from the payload verbatim (or, from a foreign responder that sent only headers, a body made of
/// the message header and the status's `error_type`). An unparsable code counts as 424 `Backend`.
pub fn decode(
    error_code: Option<&str>,
    error_message: Option<&str>,
    payload: &[u8],
) -> Result<(), EmbedError> {
    let Some(code) = error_code else {
        return Ok(());
    };
    let status = code
        .trim()
        .parse::<u16>()
        .ok()
        .filter(|s| (400..600).contains(s))
        .unwrap_or(424);
    let response =
        serde_json::from_slice::<ErrorResponse>(payload).unwrap_or_else(|_| ErrorResponse {
            error: error_message.unwrap_or_default().to_string(),
            error_type: ErrorType::for_status(status),
        });
    Err(EmbedError::Remote { status, response })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_round_trips_with_its_status_type_and_message() {
        let err = EmbedError::Overloaded("queue is full".into());
        let hdrs = error_headers(&err);
        let body = err.to_json();
        let decoded = decode(Some(&hdrs[0].1), Some(&hdrs[1].1), &body).expect_err("an error");
        assert_eq!(decoded.status(), 429);
        assert_eq!(decoded.error_type(), ErrorType::Overloaded);
        assert_eq!(decoded.to_string(), err.to_string());
        assert_eq!(decoded.to_json(), body);
        assert_eq!(decoded.kind(), "overloaded");
    }

    #[test]
    fn the_message_header_is_one_line() {
        let err = EmbedError::Backend("line one\nline two".into());
        assert_eq!(error_headers(&err)[1].1, "Backend error: line one line two");
    }

    #[test]
    fn a_foreign_error_reply_without_body_keeps_its_status() {
        let err = decode(Some("503"), Some("down"), b"").expect_err("an error");
        assert_eq!(err.status(), 503);
        assert_eq!(err.error_type(), ErrorType::Unhealthy);
        assert_eq!(err.to_string(), "down");
        let err = decode(Some("bogus"), None, b"").expect_err("an error");
        assert_eq!(err.status(), 424);
    }

    #[test]
    fn a_success_reply_decodes_with_its_timings() {
        assert_eq!(decode(None, None, b"[[1.0]]"), Ok(()));
        let hdrs = success_headers(Duration::from_micros(5_900), Duration::from_millis(12));
        let timings = Timings::read(|name| {
            hdrs.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_str())
        });
        assert_eq!(timings.queue_time_ms, Some(5));
        assert_eq!(timings.inference_time_ms, Some(12));
    }
}
