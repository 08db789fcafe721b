//! OpenAI's Batches API on the `EMBATCH_BATCHES` KV bucket: the gateway creates a batch's record
//! and its `validate` job, reads records for the status routes and turns a cancel into a
//! compare-and-set to `cancelling` plus a `finalize` job. The workers do the rest (see
//! `embatch_bulk`).

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, Query, State};
use axum::response::{IntoResponse, Response};
use embatch_protocol::bulk::{
    Batch, BatchRecord, BatchStatus, JobKind, META_PURPOSE, Progress, RequestCounts, unix_now,
};
use futures::StreamExt;
use serde::Deserialize;

use super::files::newest_page;
use super::owned::{Lookup, Owned};
use super::{ApiError, Bulk, BulkErrors, Cursor, json_ok, new_id};
use crate::tenancy::Caller;

/// Most batches in a page, and the default (OpenAI's).
pub const LIST_LIMIT: (usize, usize) = (100, 20);

/// The endpoints a batch may name: OpenAI's embeddings route, and TEI's `/embed` for lines with
/// TEI bodies (a batch of either kind may mix both kinds of line).
pub const ENDPOINTS: [&str; 2] = ["/v1/embeddings", "/embed"];

/// Most metadata pairs, and the longest key and value (OpenAI's limits).
const METADATA_LIMITS: (usize, usize, usize) = (16, 64, 512);

/// `POST /v1/batches` body.
#[derive(Debug, Deserialize)]
pub struct CreateBatch {
    /// A file uploaded with `purpose=batch`.
    pub input_file_id: String,
    /// One of [`ENDPOINTS`].
    pub endpoint: String,
    /// One of the accepted windows (`BULK_COMPLETION_WINDOWS`, OpenAI's `24h` by default).
    pub completion_window: String,
    /// Up to 16 string pairs, echoed back.
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// `POST /v1/batches`: checks the request, stores the batch as `validating` and asks a worker
/// to validate and split its input (a `validate` job). 400 names the field at fault; 404 for a
/// missing input file; 503 without JetStream.
#[utoipa::path(post, path = "/v1/batches", operation_id = "create_batch", tag = "batch",
    summary = "Create a batch (OpenAI's Batch API)",
    description = "`{input_file_id, endpoint: \"/v1/embeddings\" | \"/embed\", completion_window, metadata}`: \
                   the input file's lines are embedded by the workers in the capacity interactive \
                   requests leave.",
    request_body(content_type = "application/json", content = Object),
    responses((status = 200, description = "OpenAI's Batch object, `validating`.", body = Object), BulkErrors))]
pub async fn create(
    State(bulk): State<Bulk>,
    Extension(caller): Extension<Caller>,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let body = match body {
        Ok(body) => body,
        // Over the route's 1 MiB body limit (413), or a body that could not be read (400).
        Err(e) => {
            return ApiError {
                status: e.status().as_u16(),
                kind: "invalid_request_error",
                message: format!("cannot read the request body: {}", e.body_text()),
                param: None,
                code: None,
            }
            .into_response();
        }
    };
    match create_batch(&bulk, &caller, &body).await {
        Ok(batch) => json_ok(&batch),
        Err(err) => err.into_response(),
    }
}

/// Checks `body` as OpenAI's `POST /v1/batches` does, stores the `validating` record of
/// `caller`'s batch and publishes its validation job.
async fn create_batch(bulk: &Bulk, caller: &Caller, body: &[u8]) -> Result<Batch, ApiError> {
    let request: CreateBatch = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid("body", format!("invalid request body: {e}")))?;
    if !ENDPOINTS.contains(&request.endpoint.as_str()) {
        return Err(ApiError::invalid(
            "endpoint",
            format!(
                "`endpoint` must be one of {ENDPOINTS:?}, got {:?}",
                request.endpoint
            ),
        ));
    }
    let window = completion_window(bulk, &request.completion_window)?;
    check_metadata(request.metadata.as_ref())?;
    let input = super::files::info(bulk, &request.input_file_id, caller.name())
        .await
        .map_err(|err| match err.status {
            404 => ApiError {
                param: Some("input_file_id".into()),
                ..err
            },
            _ => err,
        })?;
    if input.metadata.get(META_PURPOSE).map(String::as_str) != Some("batch") {
        return Err(ApiError::invalid(
            "input_file_id",
            format!(
                "file {} was not uploaded with purpose `batch`",
                request.input_file_id
            ),
        ));
    }
    let record = new_record(request, window, caller);
    let store = bulk.store().await?;
    store.create_batch(&record).await?;
    if let Err(err) = store.publish_job(&record.batch.id, JobKind::Validate).await {
        // Nobody would ever act on it: take the record back.
        let _ = store.batches.delete(&record.batch.id).await;
        return Err(err.into());
    }
    Ok(record.batch)
}

/// The length of the completion window `name`, one of `BULK_COMPLETION_WINDOWS`.
fn completion_window(bulk: &Bulk, name: &str) -> Result<Duration, ApiError> {
    let windows = &bulk.limits.completion_windows;
    if let Some((_, window)) = windows.iter().find(|(n, _)| n == name) {
        return Ok(*window);
    }
    let accepted: Vec<&str> = windows.iter().map(|(n, _)| n.as_str()).collect();
    Err(ApiError::invalid(
        "completion_window",
        format!(
            "`completion_window` must be one of {accepted:?} (BULK_COMPLETION_WINDOWS), got {name:?}"
        ),
    ))
}

/// `metadata` within OpenAI's limits ([`METADATA_LIMITS`]: pairs, key and value characters).
fn check_metadata(metadata: Option<&BTreeMap<String, String>>) -> Result<(), ApiError> {
    let Some(metadata) = metadata else {
        return Ok(());
    };
    let (pairs, key_len, value_len) = METADATA_LIMITS;
    if metadata.len() > pairs
        || metadata
            .iter()
            .any(|(k, v)| k.chars().count() > key_len || v.chars().count() > value_len)
    {
        return Err(ApiError::invalid(
            "metadata",
            format!(
                "`metadata` holds at most {pairs} pairs, keys of at most {key_len} and \
                 values of at most {value_len} characters"
            ),
        ));
    }
    Ok(())
}

/// The `validating` record of `request`, expiring `window` from now, owned by `caller`.
fn new_record(request: CreateBatch, window: Duration, caller: &Caller) -> BatchRecord {
    let now = unix_now();
    BatchRecord {
        batch: Batch {
            id: new_id("batch_"),
            object: "batch".into(),
            endpoint: request.endpoint,
            errors: None,
            input_file_id: request.input_file_id,
            completion_window: request.completion_window,
            status: BatchStatus::Validating,
            output_file_id: None,
            error_file_id: None,
            created_at: now,
            in_progress_at: None,
            expires_at: Some(now + window.as_secs()),
            finalizing_at: None,
            completed_at: None,
            failed_at: None,
            expired_at: None,
            cancelling_at: None,
            cancelled_at: None,
            request_counts: RequestCounts::default(),
            metadata: request.metadata,
        },
        embatch: Progress::default(),
        tenant: Some(caller.name().to_owned()),
    }
}

/// `GET /v1/batches/{id}`: the batch as stored now (progress included), 404 when there is none
/// (also for an id no record can have, such as one with `*` or a leading `.`).
#[utoipa::path(get, path = "/v1/batches/{id}", operation_id = "retrieve_batch", tag = "batch", summary = "A batch, with its progress",
    params(("id" = String, Path, description = "The batch id, `batch_...`.")),
    responses((status = 200, description = "OpenAI's Batch object.", body = Object), BulkErrors))]
pub async fn retrieve(batch: Owned<Batch>) -> Response {
    json_ok(&batch.item)
}

/// The batch `id` if `tenant` owns it; 404 otherwise, as for a batch that does not exist (as
/// OpenAI answers another project's id).
impl Lookup for Batch {
    async fn lookup(bulk: &Bulk, id: &str, tenant: &str) -> Result<Batch, ApiError> {
        match bulk.store().await?.batch(id).await? {
            Some((record, _)) if record.owner() == tenant => Ok(record.batch),
            _ => Err(no_batch(id)),
        }
    }

    fn not_found(id: &str) -> ApiError {
        no_batch(id)
    }
}

fn no_batch(id: &str) -> ApiError {
    ApiError::not_found(format!("No such Batch object: {id}"))
}

/// `GET /v1/batches`: a cursor page of batches, newest first.
#[utoipa::path(get, path = "/v1/batches", operation_id = "list_batches", tag = "batch", summary = "List batches",
    params(("after" = Option<String>, Query, description = "The id after which the page starts."),
           ("limit" = Option<usize>, Query, description = "Most batches in the page: 1 to 100 (20); 400 otherwise.")),
    responses((status = 200, description = "`{\"object\": \"list\", \"data\": [Batch, ...], \"has_more\"}`, newest first.", body = Object), BulkErrors))]
pub async fn list(
    State(bulk): State<Bulk>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<Cursor>, QueryRejection>,
) -> Result<Response, ApiError> {
    let cursor = super::query(query)?;
    let page = cursor.page(LIST_LIMIT)?;
    let store = bulk.store().await?;
    let keys = store.batches.keys().await;
    let keys = keys.map_err(|e| ApiError::server(503, format!("cannot list batches: {e}")))?;
    let keys: Vec<String> = keys.filter_map(|k| async { k.ok() }).collect().await;
    let mut batches = Vec::with_capacity(keys.len());
    for key in keys {
        if let Some((record, _)) = store.batch(&key).await?
            && record.owner() == caller.name()
        {
            batches.push(record.batch);
        }
    }
    let page = newest_page(batches, page, |b| (b.created_at, &b.id));
    Ok(json_ok(&page))
}

/// `POST /v1/batches/{id}/cancel`: a `validating` or `in_progress` batch goes `cancelling` and a
/// `finalize` job delivers what finished (status `cancelled`); a batch already ending is
/// answered as it is; 409 for one that already ended otherwise; 404 when there is none.
#[utoipa::path(post, path = "/v1/batches/{id}/cancel", operation_id = "cancel_batch", tag = "batch", summary = "Cancel a batch",
    description = "What finished is delivered; the status goes `cancelling`, then `cancelled`.",
    params(("id" = String, Path, description = "The batch id, `batch_...`.")),
    responses((status = 200, description = "OpenAI's Batch object.", body = Object), BulkErrors))]
pub async fn cancel(batch: Owned<Batch>) -> Result<Response, ApiError> {
    // The owner never changes: checked once (by the extractor), before the update.
    let Owned { bulk, id, .. } = batch;
    let store = bulk.store().await?;
    let record = store.cancel_batch(&id).await.map_err(|err| match err {
        embatch_bulk::BulkError::NotFound(_) => no_batch(&id),
        other => other.into(),
    })?;
    let batch = match record.batch.status {
        BatchStatus::Cancelling | BatchStatus::Cancelled | BatchStatus::Finalizing => {
            Ok(record.batch)
        }
        other => Err(ApiError {
            status: 409,
            kind: "invalid_request_error",
            message: format!(
                "batch {id} cannot be cancelled: its status is {}",
                serde_json::to_value(other)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default()
            ),
            param: None,
            code: Some("batch_not_cancellable"),
        }),
    }?;
    Ok(Json(batch).into_response())
}
