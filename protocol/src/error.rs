//! The one error type of the contract and its single mapping to HTTP status, TEI's error body and
//! NATS error headers.

use serde::{Deserialize, Serialize};

/// TEI's `error_type` values (serialized as in TEI: `"Validation"`, `"Overloaded"`, …), plus
/// `Timeout` for a deadline that passed, which TEI has no equivalent for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum ErrorType {
    /// No worker or upstream can serve the request (503).
    Unhealthy,
    /// The upstream model failed (424).
    Backend,
    /// Load shedding: the queue is full or cannot finish in time (429).
    Overloaded,
    /// The request is invalid or too large (422 or 413).
    Validation,
    /// The tokenizer rejected an input (422).
    Tokenizer,
    /// The request has no inputs (400).
    Empty,
    /// The request's deadline passed before it could be answered (504).
    Timeout,
}

impl ErrorType {
    /// The `error_type` TEI uses for an HTTP status (for an error that arrived with a status
    /// only): 400 `Empty`, 403/413/422 `Validation`, 429 `Overloaded`, 503 `Unhealthy`, 504/408
    /// `Timeout`, anything else `Backend`.
    pub fn for_status(status: u16) -> ErrorType {
        match status {
            400 => ErrorType::Empty,
            403 | 413 | 422 => ErrorType::Validation,
            429 => ErrorType::Overloaded,
            503 => ErrorType::Unhealthy,
            504 | 408 => ErrorType::Timeout,
            _ => ErrorType::Backend,
        }
    }
}

/// TEI's error body: `{"error": "<message>", "error_type": "<ErrorType>"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorResponse {
    /// Human-readable message; names the offending field and limit for validation errors.
    pub error: String,
    /// The error class.
    pub error_type: ErrorType,
}

/// Every way an embed request can fail, as seen by a client.
///
/// [`EmbedError::status`] is the single mapping to a status code; the gateway uses it as the HTTP
/// status, the worker sends it as [`crate::headers::SERVICE_ERROR_CODE`]. Cloneable, so one failed
/// upstream call can fail every waiter of its batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmbedError {
    /// A body that is valid JSON but not a valid request (wrong types, a missing field, unknown
    /// option values), or an input TEI's validation refuses (e.g. over the model's token limit
    /// with `truncate: false`) (422, `Validation`; mirrors TEI 1.9.3, whose JSON extractor answers
    /// 422 for a body it cannot deserialize into its request type, and whose validation answers
    /// 422).
    #[error("Input validation error: {0}")]
    Validation(String),
    /// The body is not JSON at all: empty, truncated, a UTF-8 byte-order mark, single quotes,
    /// invalid UTF-8, raw control characters in a string, trailing characters (400,
    /// `Validation`). Mirrors TEI 1.9.3, whose JSON extractor (axum's `Json`) answers 400
    /// "Failed to parse the request body as JSON: ..." for a syntax error; TEI sends that as
    /// plain text without an `error_type`, embatch in TEI's error body with `Validation`.
    #[error("Failed to parse the request body as JSON: {0}")]
    InvalidJson(String),
    /// Body, request or reply size over a limit (413, `Validation`; mirrors TEI's 413 for bodies
    /// over its payload limit). An input over the model's token limit is not this: TEI 1.9.3
    /// truncates it by default and answers 422 ([`EmbedError::Validation`]) with
    /// `truncate: false`.
    #[error("Input validation error: {0}")]
    TooLarge(String),
    /// The request body is not declared as JSON (415, `Validation`; mirrors TEI 1.9.3, which
    /// answers 415 for `text/plain` or a missing `Content-Type`).
    #[error("Input validation error: {0}")]
    UnsupportedMediaType(String),
    /// `inputs` is empty (400, `Empty`; mirrors TEI).
    #[error("Input validation error: {0}")]
    Empty(String),
    /// A request header holds a value the contract does not allow, e.g. an `Embatch-Tenant`
    /// that is not a tenant name (400, `Validation`); the message names the header. TEI has no
    /// such headers to mirror.
    #[error("Invalid request header: {0}")]
    InvalidHeader(String),
    /// The caller may not be served as the tenant it is (403, `Validation`): a tenant, or a NATS
    /// account, that the worker's `TENANTS_FILE` does not name. TEI has no tenants to mirror.
    #[error("Forbidden: {0}")]
    Forbidden(String),
    /// The tokenizer could not process an input (422, `Tokenizer`; mirrors TEI).
    #[error("Tokenizer error: {0}")]
    Tokenizer(String),
    /// The upstream failed: 5xx, malformed reply or timeout (424, `Backend`; mirrors TEI's 424).
    #[error("Backend error: {0}")]
    Backend(String),
    /// Load shedding: the worker's queue is full, or cannot finish the request before its
    /// deadline (429, `Overloaded`; mirrors TEI's 429).
    #[error("Model is overloaded: {0}")]
    Overloaded(String),
    /// No worker answers, or the upstream is unreachable (503, `Unhealthy`; mirrors TEI's 503).
    #[error("Service unavailable: {0}")]
    Unavailable(String),
    /// The request's deadline passed before it was answered (504, `Timeout`).
    #[error("Deadline exceeded: {0}")]
    DeadlineExceeded(String),
    /// The request body did not arrive within the gateway's `BODY_READ_TIMEOUT` (408 Request
    /// Timeout, RFC 9110; `Timeout`). TEI 1.9.3 has no body timeout to mirror.
    #[error("Request timeout: {0}")]
    BodyTimeout(String),
    /// The request names a model no worker serves (404, `Validation`; mirrors OpenAI's 404
    /// `model_not_found`, whose message this is: "The model `x` does not exist or you do not
    /// have access to it.", followed by the models served). See [`crate::model`].
    #[error(
        "The model `{model}` does not exist or you do not have access to it. Models served: {served}"
    )]
    ModelNotFound {
        /// The model asked for.
        model: String,
        /// The models served, comma-separated (`none` when none is).
        served: String,
    },
    /// An error another party answered (a worker's error reply, or a TEI upstream's error
    /// response), carried verbatim: its status and TEI's error body, message and `error_type`
    /// unchanged (so TEI's `Tokenizer` stays `Tokenizer` and no prefix is added twice).
    #[error("{}", .response.error)]
    Remote {
        /// The HTTP-style status it was answered with (400–599).
        status: u16,
        /// TEI's error body as received.
        response: ErrorResponse,
    },
}

impl EmbedError {
    /// The HTTP-style status code of this error: the one mapping used for HTTP responses and for
    /// the NATS `Nats-Service-Error-Code` header.
    pub fn status(&self) -> u16 {
        match self {
            EmbedError::Validation(_) | EmbedError::Tokenizer(_) => 422,
            EmbedError::TooLarge(_) => 413,
            EmbedError::UnsupportedMediaType(_) => 415,
            EmbedError::Empty(_) | EmbedError::InvalidJson(_) | EmbedError::InvalidHeader(_) => 400,
            EmbedError::Forbidden(_) => 403,
            EmbedError::Backend(_) => 424,
            EmbedError::Overloaded(_) => 429,
            EmbedError::Unavailable(_) => 503,
            EmbedError::DeadlineExceeded(_) => 504,
            EmbedError::BodyTimeout(_) => 408,
            EmbedError::ModelNotFound { .. } => 404,
            EmbedError::Remote { status, .. } => *status,
        }
    }

    /// The TEI `error_type` of this error.
    pub fn error_type(&self) -> ErrorType {
        match self {
            EmbedError::Validation(_)
            | EmbedError::InvalidJson(_)
            | EmbedError::TooLarge(_)
            | EmbedError::UnsupportedMediaType(_)
            | EmbedError::InvalidHeader(_)
            | EmbedError::Forbidden(_)
            | EmbedError::ModelNotFound { .. } => ErrorType::Validation,
            EmbedError::Empty(_) => ErrorType::Empty,
            EmbedError::Tokenizer(_) => ErrorType::Tokenizer,
            EmbedError::Backend(_) => ErrorType::Backend,
            EmbedError::Overloaded(_) => ErrorType::Overloaded,
            EmbedError::Unavailable(_) => ErrorType::Unhealthy,
            EmbedError::DeadlineExceeded(_) | EmbedError::BodyTimeout(_) => ErrorType::Timeout,
            EmbedError::Remote { response, .. } => response.error_type,
        }
    }

    /// A short, stable label for metrics and logs (`validation`, `too_large`, `overloaded`, …).
    pub fn kind(&self) -> &'static str {
        match self {
            EmbedError::Validation(_) => "validation",
            EmbedError::InvalidJson(_) => "invalid_json",
            EmbedError::TooLarge(_) => "too_large",
            EmbedError::UnsupportedMediaType(_) => "unsupported_media_type",
            EmbedError::Empty(_) => "empty",
            EmbedError::InvalidHeader(_) => "invalid_header",
            EmbedError::Forbidden(_) => "forbidden",
            EmbedError::Tokenizer(_) => "tokenizer",
            EmbedError::Backend(_) => "backend",
            EmbedError::Overloaded(_) => "overloaded",
            EmbedError::Unavailable(_) => "unavailable",
            EmbedError::DeadlineExceeded(_) => "deadline_exceeded",
            EmbedError::BodyTimeout(_) => "body_timeout",
            EmbedError::ModelNotFound { .. } => "model_not_found",
            EmbedError::Remote { status, response } => match (status, response.error_type) {
                (413, _) => "too_large",
                (403, _) => "forbidden",
                (_, ErrorType::Validation) => "validation",
                (_, ErrorType::Empty) => "empty",
                (_, ErrorType::Tokenizer) => "tokenizer",
                (_, ErrorType::Backend) => "backend",
                (_, ErrorType::Overloaded) => "overloaded",
                (_, ErrorType::Unhealthy) => "unavailable",
                (_, ErrorType::Timeout) => "deadline_exceeded",
            },
        }
    }

    /// TEI's error body for this error.
    pub fn to_response(&self) -> ErrorResponse {
        if let EmbedError::Remote { response, .. } = self {
            return response.clone();
        }
        ErrorResponse {
            error: self.to_string(),
            error_type: self.error_type(),
        }
    }

    /// TEI's error body, serialized: the payload of an error reply on NATS and the body of an
    /// error response over HTTP.
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing a struct of a String and a unit enum cannot fail.
        serde_json::to_vec(&self.to_response()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_mirror_tei() {
        let cases = [
            (
                EmbedError::Validation("x".into()),
                422,
                ErrorType::Validation,
            ),
            (EmbedError::TooLarge("x".into()), 413, ErrorType::Validation),
            (
                EmbedError::UnsupportedMediaType("x".into()),
                415,
                ErrorType::Validation,
            ),
            (EmbedError::Empty("x".into()), 400, ErrorType::Empty),
            (
                EmbedError::InvalidJson("x".into()),
                400,
                ErrorType::Validation,
            ),
            (EmbedError::Tokenizer("x".into()), 422, ErrorType::Tokenizer),
            (
                EmbedError::InvalidHeader("x".into()),
                400,
                ErrorType::Validation,
            ),
            (
                EmbedError::Forbidden("x".into()),
                403,
                ErrorType::Validation,
            ),
            (EmbedError::Backend("x".into()), 424, ErrorType::Backend),
            (
                EmbedError::Overloaded("x".into()),
                429,
                ErrorType::Overloaded,
            ),
            (
                EmbedError::Unavailable("x".into()),
                503,
                ErrorType::Unhealthy,
            ),
            (
                EmbedError::DeadlineExceeded("x".into()),
                504,
                ErrorType::Timeout,
            ),
            (EmbedError::BodyTimeout("x".into()), 408, ErrorType::Timeout),
            (
                EmbedError::ModelNotFound {
                    model: "x".into(),
                    served: "a, b".into(),
                },
                404,
                ErrorType::Validation,
            ),
        ];
        for (err, status, ty) in cases {
            assert_eq!(err.status(), status, "{err:?}");
            assert_eq!(err.error_type(), ty, "{err:?}");
        }
    }

    #[test]
    fn error_body_is_teis_shape() {
        let body = EmbedError::Overloaded("queue is full".into()).to_json();
        let value: serde_json::Value = serde_json::from_slice(&body).expect("valid json");
        assert_eq!(
            value,
            serde_json::json!({"error": "Model is overloaded: queue is full", "error_type": "Overloaded"})
        );
    }

    #[test]
    fn a_remote_error_is_carried_verbatim() {
        let response = ErrorResponse {
            error: "Input validation error: `inputs` cannot be empty".into(),
            error_type: ErrorType::Tokenizer,
        };
        let err = EmbedError::Remote {
            status: 422,
            response: response.clone(),
        };
        assert_eq!(err.status(), 422);
        assert_eq!(err.error_type(), ErrorType::Tokenizer);
        assert_eq!(err.to_string(), response.error);
        assert_eq!(err.to_response(), response);
        assert_eq!(err.kind(), "tokenizer");
    }
}
