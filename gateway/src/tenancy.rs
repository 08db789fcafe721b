//! Who is calling: every route but `/health`, `/metrics` and the OpenAPI document needs
//! `Authorization: Bearer <key>` when a tenants file is in force (`TENANTS_FILE`, see
//! [`embatch_runtime::tenants`]); without one the gateway is open and every caller is the
//! implicit tenant `default`.
//!
//! The key is what the `openai` SDK (`api_key`), huggingface_hub (`token`), llama-index and TEI
//! clients with a token send. A missing or unknown key gets 401 with `WWW-Authenticate: Bearer`
//! (RFC 6750): in OpenAI's shape (`invalid_api_key`) on OpenAI's routes, in TEI's
//! (`{"error", "error_type"}`) on TEI's. TEI 1.9.3 itself answers an empty 401 for a wrong
//! `--api-key` and leaves `/health` and `/metrics` open, as here.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use embatch_runtime::tenants::{Tenant, TenantsWatch};

/// The authenticated tenant of a request: a request extension set by [`authenticate`], read by
/// the routes that scope data or count usage.
#[derive(Debug, Clone)]
pub struct Caller(pub Arc<Tenant>);

impl Caller {
    /// The tenant's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }
}

/// Middleware: resolves the request's bearer key to its tenant and stores it as [`Caller`], or
/// answers 401 (see the module docs). The key is never logged.
pub async fn authenticate(
    State(tenants): State<TenantsWatch>,
    mut request: Request,
    next: Next,
) -> Response {
    let key = bearer(request.headers());
    match tenants.current().authenticate(key) {
        Some(tenant) => {
            request.extensions_mut().insert(Caller(tenant));
            next.run(request).await
        }
        None => unauthorized(request.uri().path(), key.is_some()),
    }
}

/// The key of `Authorization: Bearer <key>` (scheme case-insensitive, RFC 6750), if any.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, key) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| key.trim())
        .filter(|key| !key.is_empty())
}

/// Whether `path` is one of OpenAI's routes (its errors then take OpenAI's shape).
pub fn is_openai_path(path: &str) -> bool {
    path.starts_with("/v1/") || path == "/embeddings"
}

/// The 401 for a request to `path` with no key (`presented` false) or an unknown one.
fn unauthorized(path: &str, presented: bool) -> Response {
    let message = if presented {
        "Incorrect API key provided. Ask the embatch operator for a key of your tenant."
    } else {
        "You didn't provide an API key. Send it as `Authorization: Bearer <key>`."
    };
    let body = if is_openai_path(path) {
        serde_json::json!({"error": {
            "message": message,
            "type": "invalid_request_error",
            "param": null,
            "code": "invalid_api_key",
        }})
    } else {
        serde_json::json!({"error": message, "error_type": "unauthorized"})
    };
    let mut response = (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_takes_the_token_of_the_bearer_scheme_only() {
        let mut headers = HeaderMap::new();
        assert_eq!(bearer(&headers), None);
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer sk-1"),
        );
        assert_eq!(bearer(&headers), Some("sk-1"));
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer  sk-2 "),
        );
        assert_eq!(bearer(&headers), Some("sk-2"));
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic c2stMQ=="),
        );
        assert_eq!(bearer(&headers), None);
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer "));
        assert_eq!(bearer(&headers), None);
    }
}
