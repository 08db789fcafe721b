//! OpenAI's Files and Batches APIs for bulk embedding jobs, on NATS JetStream.
//!
//! - [`files`]: `POST /v1/files` (multipart, `purpose=batch`), `GET /v1/files`,
//!   `GET /v1/files/{id}`, `GET /v1/files/{id}/content`, `DELETE /v1/files/{id}`: objects of
//!   the `EMBATCH_FILES` object store.
//! - [`batches`]: `POST /v1/batches`, `GET /v1/batches`, `GET /v1/batches/{id}`,
//!   `POST /v1/batches/{id}/cancel`: records of the `EMBATCH_BATCHES` KV bucket, and the job
//!   messages the workers act on.
//!
//! - [`upload`]: the body of `POST /v1/files` read against the file limit and the files' budget.
//! - [`owned`]: the file or batch a route's `{id}` names, checked to be the caller's.
//! - [`sweep`]: removes what failed uploads left in the object store's stream, at start and
//!   every hour.
//!
//! The gateway holds no bulk state: every answer is read from JetStream, so any gateway answers
//! for any batch and a restart loses nothing. The store is bound at start (by the sweeper), on
//! first use and again after a failure, so a gateway started before JetStream was enabled serves
//! these routes once it is; until then they answer 503 and the embedding routes are unaffected.
//! Binding sets the files' budget (`BULK_FILES_MAX_BYTES`). The contract (names, shapes) is
//! `embatch_protocol::bulk`; docs/design/bulk-jobs.md explains it.

pub mod batches;
pub mod files;
pub mod owned;
pub mod sweep;
pub mod upload;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use embatch_bulk::{BulkError, BulkStore};
use tokio::sync::OnceCell;
use tokio_util::sync::{CancellationToken, DropGuard};

/// The bulk routes' settings (see [`crate::Config`]).
#[derive(Debug, Clone)]
pub struct BulkLimits {
    /// Largest input file in bytes (`BULK_MAX_FILE_BYTES`, OpenAI's 200 MB by default).
    pub max_file_bytes: usize,
    /// Most bytes all files may take in NATS, set as the object store stream's `max_bytes` when
    /// the store is bound (`BULK_FILES_MAX_BYTES`; 0: none).
    pub files_max_bytes: u64,
    /// The `completion_window` values accepted, with their length (`BULK_COMPLETION_WINDOWS`,
    /// OpenAI's `24h` by default).
    pub completion_windows: Vec<(String, Duration)>,
    /// Replicas of the bulk streams, buckets and object store (`JETSTREAM_REPLICAS`), resolved
    /// against the cluster when the store is bound.
    pub replicas: embatch_runtime::Replicas,
}

/// The bulk routes' shared state: the NATS connection and the store, bound on first use, and
/// the sweeper's lifetime.
#[derive(Clone)]
pub struct Bulk {
    binding: Binding,
    /// The limits.
    pub limits: Arc<BulkLimits>,
    /// Stops the sweeper when the last clone is dropped.
    _sweeper: Arc<DropGuard>,
}

/// What binds the store: shared by the routes and the sweeper (which must not hold the
/// [`Bulk`] whose drop stops it).
#[derive(Clone)]
pub(crate) struct Binding {
    client: async_nats::Client,
    store: Arc<OnceCell<BulkStore>>,
    files_max_bytes: u64,
    replicas: embatch_runtime::Replicas,
}

impl Binding {
    /// The store, binding it (creating its buckets and streams, and setting the files' budget)
    /// when not yet bound.
    pub(crate) async fn store(&self) -> Result<&BulkStore, BulkError> {
        self.store
            .get_or_try_init(|| async {
                let replicas = self.replicas.resolve(&self.client);
                let store = BulkStore::open_with(self.client.clone(), replicas).await?;
                if let Err(err) = store.set_files_budget(self.files_max_bytes).await {
                    // nats-server refuses a budget its `max_file_store` cannot reserve: the
                    // routes still serve, under the budget the stream has.
                    tracing::warn!(%err, budget = self.files_max_bytes, "cannot set the files' budget (BULK_FILES_MAX_BYTES)");
                }
                Ok::<_, BulkError>(store)
            })
            .await
    }
}

impl Bulk {
    /// The state on `client`, and the sweeper ([`sweep::run`]), which binds the store at once
    /// and stops when the last clone of the state is dropped. Needs a tokio runtime.
    pub fn new(client: async_nats::Client, limits: BulkLimits) -> Bulk {
        let binding = Binding {
            client,
            store: Arc::new(OnceCell::new()),
            files_max_bytes: limits.files_max_bytes,
            replicas: limits.replicas,
        };
        let stop = CancellationToken::new();
        tokio::spawn(sweep::run(binding.clone(), stop.clone()));
        Bulk {
            binding,
            limits: Arc::new(limits),
            _sweeper: Arc::new(stop.drop_guard()),
        }
    }

    /// The store, binding it (creating its buckets and streams, and setting the files' budget)
    /// when not yet bound.
    ///
    /// # Errors
    /// [`ApiError`] 503 when JetStream is not available.
    pub async fn store(&self) -> Result<&BulkStore, ApiError> {
        self.binding.store().await.map_err(ApiError::from)
    }
}

/// Every bulk route, as `(method, path)`: exactly what [`router`] registers (the OpenAPI document
/// describes each; `tests/openapi.rs` checks both).
pub const SERVED: [(&str, &str); 9] = [
    ("POST", "/v1/files"),
    ("GET", "/v1/files"),
    ("GET", "/v1/files/{id}"),
    ("DELETE", "/v1/files/{id}"),
    ("GET", "/v1/files/{id}/content"),
    ("POST", "/v1/batches"),
    ("GET", "/v1/batches"),
    ("GET", "/v1/batches/{id}"),
    ("POST", "/v1/batches/{id}/cancel"),
];

/// The error statuses of the bulk routes, each with OpenAI's error body: a declaration for the
/// OpenAPI document, never built (the handlers answer [`ApiError`]s).
#[derive(utoipa::IntoResponses)]
pub enum BulkErrors {
    /// `invalid_request_error`: a malformed body or form, a field with a value not accepted
    /// (`param` names it), a file uploaded with another purpose than `batch`.
    #[response(status = 400)]
    Invalid(crate::openai::ErrorResponse),
    /// `invalid_request_error`: no file or batch with this id.
    #[response(status = 404)]
    NotFound(crate::openai::ErrorResponse),
    /// `invalid_request_error`: an upload's body stalled (nothing arrived for 5 minutes).
    #[response(status = 408)]
    Timeout(crate::openai::ErrorResponse),
    /// `invalid_request_error`: the batch already ended and cannot be cancelled.
    #[response(status = 409)]
    Conflict(crate::openai::ErrorResponse),
    /// `invalid_request_error`: the file is over `BULK_MAX_FILE_BYTES`, or larger than all files
    /// may take (`BULK_FILES_MAX_BYTES`).
    #[response(status = 413)]
    TooLarge(crate::openai::ErrorResponse),
    /// `server_error`: a stored record could not be read.
    #[response(status = 500)]
    Internal(crate::openai::ErrorResponse),
    /// `server_error`: JetStream is not enabled on the NATS server, or did not answer.
    #[response(status = 503)]
    Unavailable(crate::openai::ErrorResponse),
    /// `server_error` (`insufficient_storage`): the files stored leave too little of
    /// `BULK_FILES_MAX_BYTES` for this upload; deleting files makes room.
    #[response(status = 507)]
    InsufficientStorage(crate::openai::ErrorResponse),
}

/// The bulk routes, with their own body limits (an input file may be far larger than an
/// embedding request's `MAX_BODY_BYTES`).
pub fn router<S>(bulk: Bulk) -> Router<S> {
    let allowance = usize::try_from(upload::FORM_ALLOWANCE).unwrap_or(usize::MAX);
    let file_limit = bulk.limits.max_file_bytes.saturating_add(allowance);
    Router::new()
        .route(
            "/v1/files",
            post(files::upload)
                .layer(DefaultBodyLimit::max(file_limit))
                .get(files::list),
        )
        .route("/v1/files/{id}", get(files::retrieve).delete(files::delete))
        .route("/v1/files/{id}/content", get(files::content))
        .route("/v1/batches", post(batches::create).get(batches::list))
        .route("/v1/batches/{id}", get(batches::retrieve))
        .route("/v1/batches/{id}/cancel", post(batches::cancel))
        .layer(DefaultBodyLimit::max(1 << 20))
        .with_state(bulk)
}

/// An error of the bulk routes, answered in OpenAI's shape:
/// `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: u16,
    /// OpenAI's `type`: `invalid_request_error`, `not_found_error`, `server_error`.
    pub kind: &'static str,
    /// What is wrong.
    pub message: String,
    /// The request field at fault.
    pub param: Option<String>,
    /// A machine-readable code.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400 `invalid_request_error` about `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            kind: "invalid_request_error",
            message: message.into(),
            param: Some(param.to_owned()),
            code: None,
        }
    }

    /// 404 for a missing file or batch.
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError {
            status: 404,
            kind: "invalid_request_error",
            message: message.into(),
            param: None,
            code: Some("not_found"),
        }
    }

    /// 500-class `server_error` with `status`.
    pub fn server(status: u16, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind: "server_error",
            message: message.into(),
            param: None,
            code: None,
        }
    }
}

impl From<BulkError> for ApiError {
    fn from(err: BulkError) -> ApiError {
        match err {
            BulkError::NotFound(_) => ApiError::not_found(err.to_string()),
            BulkError::Unavailable(_) | BulkError::JetStream(_) => {
                ApiError::server(503, err.to_string())
            }
            BulkError::Malformed { .. } => ApiError::server(500, err.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        });
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(body)).into_response()
    }
}

/// The `limit` query parameter of a list route: an integer from 1 to `max`, `default` when
/// absent (OpenAI's ranges: 1 to 100 batches, 1 to 10,000 files).
///
/// # Errors
/// 400 `invalid_request_error` with `param: "limit"`, naming the range.
pub fn parse_limit(raw: Option<&str>, default: usize, max: usize) -> Result<usize, ApiError> {
    let Some(raw) = raw else {
        return Ok(default);
    };
    match raw.trim().parse::<usize>() {
        Ok(limit) if (1..=max).contains(&limit) => Ok(limit),
        _ => Err(ApiError::invalid(
            "limit",
            format!("`limit` must be an integer from 1 to {max}, got {raw:?}"),
        )),
    }
}

/// OpenAI's cursor in a list route's query string: the id `after` which the page starts
/// (newest first) and the page's `limit` (checked by [`Cursor::page`], so that a bad value is
/// answered in OpenAI's shape).
#[derive(Debug, serde::Deserialize)]
pub struct Cursor {
    /// The id after which the page starts.
    pub after: Option<String>,
    /// Most items in the page, as sent.
    pub limit: Option<String>,
}

impl Cursor {
    /// `after` and the `limit` checked against the route's `(max, default)` ([`parse_limit`]):
    /// what [`files::newest_page`] takes.
    ///
    /// # Errors
    /// [`parse_limit`]'s 400.
    pub fn page(&self, (max, default): (usize, usize)) -> Result<(Option<&str>, usize), ApiError> {
        let limit = parse_limit(self.limit.as_deref(), default, max)?;
        Ok((self.after.as_deref(), limit))
    }
}

/// A list route's query string, or 400 in OpenAI's shape (axum's own rejection is plain text,
/// which the OpenAPI document does not promise).
pub fn query<T>(
    query: Result<axum::extract::Query<T>, axum::extract::rejection::QueryRejection>,
) -> Result<T, ApiError> {
    query
        .map(|axum::extract::Query(q)| q)
        .map_err(|e| ApiError::invalid("query", format!("invalid query string: {}", e.body_text())))
}

/// A 200 JSON response of `value`.
fn json_ok(value: &impl serde::Serialize) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response(),
        Err(err) => {
            ApiError::server(500, format!("cannot encode the response: {err}")).into_response()
        }
    }
}

/// A new id `<prefix><nuid>` (`file-`, `batch_`, `batch_req_`), as OpenAI's ids look.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}{}", nuid::next())
}

/// Parses `BULK_COMPLETION_WINDOWS`: comma-separated durations as humantime writes them
/// (`24h`, `10s`).
///
/// # Errors
/// [`WindowError`], naming the value that is not a duration.
pub fn parse_windows(s: &str) -> Result<Vec<(String, Duration)>, WindowError> {
    s.split(',')
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .map(|w| {
            humantime::parse_duration(w)
                .map(|d| (w.to_owned(), d))
                .map_err(|source| WindowError {
                    value: w.to_owned(),
                    source,
                })
        })
        .collect()
}

/// A `BULK_COMPLETION_WINDOWS` entry that is not a duration (clap prints it at start).
#[derive(Debug, thiserror::Error)]
#[error("{value:?} is not a duration: {source}")]
pub struct WindowError {
    /// The entry as written.
    pub value: String,
    /// Why humantime refused it.
    pub source: humantime::DurationError,
}

#[cfg(test)]
mod tests {
    use super::{files, parse_limit};
    use axum::extract::Query;
    use axum::http::Uri;

    #[test]
    fn a_limit_is_an_integer_in_its_range() {
        assert_eq!(parse_limit(None, 20, 100), Ok(20));
        assert_eq!(parse_limit(Some("1"), 20, 100), Ok(1));
        assert_eq!(parse_limit(Some("100"), 20, 100), Ok(100));
        for bad in ["0", "-1", "101", "abc", ""] {
            let err = parse_limit(Some(bad), 20, 100).expect_err(bad);
            assert_eq!((err.status, err.param.as_deref()), (400, Some("limit")));
            assert!(err.message.contains("100"), "{}", err.message);
        }
    }

    #[test]
    fn a_files_query_reads_its_purpose_beside_the_cursor() {
        let uri = Uri::from_static("/v1/files?purpose=batch&after=file-1&limit=5");
        let Query(query) = Query::<files::ListQuery>::try_from_uri(&uri).expect("a query");
        assert_eq!(query.purpose.as_deref(), Some("batch"));
        assert_eq!(
            query.cursor.page(files::LIST_LIMIT),
            Ok((Some("file-1"), 5))
        );
        let uri = Uri::from_static("/v1/files");
        let Query(query) = Query::<files::ListQuery>::try_from_uri(&uri).expect("a query");
        assert_eq!(query.cursor.page(files::LIST_LIMIT), Ok((None, 10_000)));
    }
}
