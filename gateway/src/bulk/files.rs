//! OpenAI's Files API on the `EMBATCH_FILES` object store: one object per file, named by its id,
//! with its purpose, filename and creation time in the object's metadata.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use async_nats::jetstream::object_store::{InfoErrorKind, ObjectInfo, ObjectMetadata, PutError};
use axum::body::Body;
use axum::extract::multipart::{Field, MultipartError};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, FromRequest, Multipart, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use embatch_bulk::BulkStore;
use embatch_protocol::bulk::{
    FileObject, META_CREATED_AT, META_FILENAME, META_PURPOSE, META_TENANT, unix_now,
};
use embatch_protocol::headers::DEFAULT_TENANT;
use futures::StreamExt;
use serde::Deserialize;
use tokio::sync::oneshot;

use super::owned::{Lookup, Owned};
use super::sweep::discard;
use super::upload::{
    CHUNK_OVERHEAD, Capped, Caps, FORM_ALLOWANCE, LINGER_TIMEOUT, RECORD_RESERVE, linger, no_room,
};
use super::{ApiError, Bulk, BulkErrors, Cursor, json_ok, new_id};
use crate::tenancy::Caller;

/// Most files in a page, and the default (OpenAI's).
pub const LIST_LIMIT: (usize, usize) = (10_000, 10_000);

/// The purposes a file may be uploaded with (OpenAI's `batch`; outputs are `batch_output`).
pub const UPLOAD_PURPOSES: [&str; 1] = ["batch"];

/// The File object of a stored object; `None` for a deleted one.
pub fn file_object(info: &ObjectInfo) -> Option<FileObject> {
    if info.deleted {
        return None;
    }
    let meta = |key: &str| info.metadata.get(key).cloned().unwrap_or_default();
    Some(FileObject {
        id: info.name.clone(),
        object: "file".into(),
        bytes: info.size as u64,
        created_at: meta(META_CREATED_AT).parse().unwrap_or(0),
        filename: meta(META_FILENAME),
        purpose: meta(META_PURPOSE),
        status: "processed".into(),
        expires_at: None,
    })
}

/// The tenant that owns a stored file ([`META_TENANT`]; `default` for files stored before
/// tenants existed).
pub fn owner(info: &ObjectInfo) -> &str {
    info.metadata
        .get(META_TENANT)
        .map_or(DEFAULT_TENANT, String::as_str)
}

/// The stored object `id` when `tenant` owns it, or 404 (also for another tenant's file, as
/// OpenAI answers another project's id, and for an id no object can have, such as one with `*`
/// or a leading `.`).
pub async fn info(bulk: &Bulk, id: &str, tenant: &str) -> Result<ObjectInfo, ApiError> {
    let store = bulk.store().await?;
    if !embatch_bulk::is_valid_key(id) {
        return Err(no_file(id));
    }
    match store.files.info(id).await {
        Ok(info) if !info.deleted && owner(&info) == tenant => Ok(info),
        Ok(_) => Err(no_file(id)),
        Err(err)
            if matches!(
                err.kind(),
                InfoErrorKind::NotFound | InfoErrorKind::InvalidName
            ) =>
        {
            Err(no_file(id))
        }
        Err(err) => Err(ApiError::server(
            503,
            format!("cannot read file {id}: {err}"),
        )),
    }
}

fn no_file(id: &str) -> ApiError {
    ApiError::not_found(format!("No such File object: {id}"))
}

impl Lookup for ObjectInfo {
    fn lookup(
        bulk: &Bulk,
        id: &str,
        tenant: &str,
    ) -> impl Future<Output = Result<ObjectInfo, ApiError>> + Send {
        info(bulk, id, tenant)
    }

    fn not_found(id: &str) -> ApiError {
        no_file(id)
    }
}

/// `POST /v1/files`: a multipart form with `purpose` (`batch`) and `file`; the file is streamed
/// into the object store (never held whole in memory). 400 for another purpose or a missing
/// field, 413 beyond `BULK_MAX_FILE_BYTES` or the whole `BULK_FILES_MAX_BYTES`, 507 when the
/// files stored leave too little of the latter, 503 without JetStream. A `Content-Length` that
/// cannot fit is refused before the body is read, a chunked body once it passes the limit; a
/// refusal is answered at once and the rest of the body read and dropped for at most
/// [`LINGER_TIMEOUT`]. A refused, failed or abandoned upload leaves nothing in the store (see
/// [`super::upload`]).
#[utoipa::path(post, path = "/v1/files", operation_id = "create_file", tag = "batch",
    summary = "Upload a file (OpenAI's Files API)",
    description = "A `multipart/form-data` form with `purpose` (`batch`) and `file` (JSONL, one \
                   batch request per line), stored in the NATS object store.",
    request_body(content_type = "multipart/form-data", content = Object),
    responses((status = 200, description = "OpenAI's File object.", body = Object), BulkErrors))]
pub async fn upload(State(bulk): State<Bulk>, request: axum::extract::Request) -> Response {
    let (parts, body) = request.into_parts();
    let Some(Caller(tenant)) = parts.extensions.get::<Caller>().cloned() else {
        return ApiError::server(500, "the request has no authenticated tenant").into_response();
    };
    let checked = async {
        // JetStream first: without it the answer is 503 whatever the form.
        let store = bulk.store().await?;
        let caps = Caps::new(&bulk.limits, store.files_usage().await?);
        if let Some(length) = content_length(&parts.headers) {
            caps.declared(length)?;
        }
        Ok::<_, ApiError>(caps)
    };
    let caps = match checked.await {
        Ok(caps) => caps,
        Err(err) => {
            // Answered at once; what the client still sends is read and dropped meanwhile.
            let limit = (bulk.limits.max_file_bytes as u64).saturating_add(FORM_ALLOWANCE);
            tokio::spawn(linger(body, limit));
            return err.into_response();
        }
    };
    let request = axum::extract::Request::from_parts(parts, body);
    let form = match Multipart::from_request(request, &()).await {
        Ok(form) => form,
        Err(e) => {
            let message = format!("expected a multipart/form-data body: {}", e.body_text());
            return ApiError::invalid("file", message).into_response();
        }
    };
    // A task of its own: a client that goes away drops this handler, not the upload, which
    // then sees its body fail and discards what it stored. It answers through `answer`, then
    // reads what is left of a refused form.
    let (answer, answered) = tokio::sync::oneshot::channel();
    tokio::spawn(upload_form(
        bulk.clone(),
        form,
        (caps, tenant.name.clone()),
        answer,
    ));
    match answered.await {
        Ok(Ok(file)) => json_ok(&file),
        Ok(Err(err)) => err.into_response(),
        Err(_) => ApiError::server(500, "the upload task ended without an answer").into_response(),
    }
}

/// The request's `Content-Length`, when it has a valid one.
fn content_length(headers: &axum::http::HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

fn multipart_error(e: MultipartError) -> ApiError {
    ApiError {
        status: e.status().as_u16(),
        kind: "invalid_request_error",
        message: format!("cannot read the multipart form: {}", e.body_text()),
        param: None,
        code: None,
    }
}

/// Reads the form, stores its file, and sends the answer on `answer`; after a refusal of the
/// file's size, reads and drops the rest of the form for at most [`LINGER_TIMEOUT`].
async fn upload_form(
    bulk: Bulk,
    mut form: Multipart,
    (caps, tenant): (Caps, Arc<str>),
    answer: oneshot::Sender<Result<FileObject, ApiError>>,
) {
    match read_form(&bulk, &mut form, caps, &tenant).await {
        Ok(file) => {
            let _ = answer.send(Ok(file));
        }
        Err(Refusal { error, lingers }) => {
            let _ = answer.send(Err(error));
            if lingers {
                let _ = tokio::time::timeout(LINGER_TIMEOUT, drain_form(&mut form)).await;
            }
        }
    }
}

/// A refused upload: the answer, and whether the rest of the form is read before the
/// connection is let go (see [`LINGER_TIMEOUT`]).
struct Refusal {
    error: ApiError,
    lingers: bool,
}

impl From<ApiError> for Refusal {
    fn from(error: ApiError) -> Refusal {
        Refusal {
            error,
            lingers: false,
        }
    }
}

/// Reads the form and stores its file as `tenant`'s.
async fn read_form(
    bulk: &Bulk,
    form: &mut Multipart,
    caps: Caps,
    tenant: &str,
) -> Result<FileObject, Refusal> {
    let store = bulk.store().await?;
    let mut purpose = None;
    let mut stored: Option<ObjectInfo> = None;
    while let Some(field) = form.next_field().await.map_err(multipart_error)? {
        match field.name() {
            Some("purpose") => purpose = Some(field.text().await.map_err(multipart_error)?),
            Some("file") if stored.is_none() => {
                let meta = file_metadata(&field, purpose.as_deref(), tenant);
                stored = Some(store_file(store, field, caps, meta).await?);
            }
            _ => {}
        }
    }
    let Some(info) = stored else {
        return Err(ApiError::invalid("file", "the form has no `file` field").into());
    };
    let purpose = purpose.unwrap_or_default();
    if !UPLOAD_PURPOSES.contains(&purpose.as_str()) {
        if let Err(err) = discard(store, &info.name).await {
            tracing::warn!(%err, "cannot discard an upload of another purpose");
        }
        let message = format!("`purpose` must be one of {UPLOAD_PURPOSES:?}, got {purpose:?}");
        return Err(ApiError::invalid("purpose", message).into());
    }
    if info.metadata.get(META_PURPOSE) == Some(&purpose) {
        return file_object(&info).ok_or_else(|| no_file(&info.name).into());
    }
    let mut metadata = info.metadata.clone();
    metadata.insert(META_PURPOSE.to_owned(), purpose);
    store
        .files
        .update_metadata(
            &info.name,
            async_nats::jetstream::object_store::UpdateMetadata {
                name: info.name.clone(),
                description: None,
                metadata,
                headers: None,
            },
        )
        .await
        .map_err(|e| ApiError::server(503, format!("cannot store the file's purpose: {e}")))?;
    let info = self::info(bulk, &info.name, tenant).await?;
    file_object(&info).ok_or_else(|| no_file(&info.name).into())
}

/// The metadata of a new file `file-<nuid>` of `tenant`, uploaded as `field` with `purpose`
/// (when the form named it first).
fn file_metadata(field: &Field<'_>, purpose: Option<&str>, tenant: &str) -> ObjectMetadata {
    let filename = field.file_name().unwrap_or("upload.jsonl").to_owned();
    let mut metadata = HashMap::from([
        (META_FILENAME.to_owned(), filename),
        (META_CREATED_AT.to_owned(), unix_now().to_string()),
        (META_TENANT.to_owned(), tenant.to_owned()),
    ]);
    if let Some(purpose) = purpose {
        // The usual order (the `openai` SDK sends `purpose` first): no second write.
        metadata.insert(META_PURPOSE.to_owned(), purpose.to_owned());
    }
    ObjectMetadata {
        name: new_id("file-"),
        metadata,
        ..Default::default()
    }
}

/// Stores the file part as the object `meta` names; a part cut short by a limit, a body error
/// or an idle client is discarded whole.
async fn store_file(
    store: &BulkStore,
    field: Field<'_>,
    caps: Caps,
    meta: ObjectMetadata,
) -> Result<ObjectInfo, Refusal> {
    let mut reader = Capped::new(field, caps);
    match (store.files.put(meta, &mut reader).await, reader.stop()) {
        (Ok(info), None) => Ok(info),
        (Ok(info), Some(stop)) => {
            if let Err(err) = discard(store, &info.name).await {
                tracing::warn!(%err, "cannot discard a refused upload; the sweeper will");
            }
            Err(Refusal {
                error: caps.error(stop),
                lingers: stop.lingers(),
            })
        }
        (Err(err), _) => Err(Refusal {
            error: store_failure(store, &err).await,
            lingers: true,
        }),
    }
}

/// The answer to a `put` the store failed (its chunks, of a nuid only `put` knew, stay until
/// the sweeper removes them): 507 when the files' budget is (nearly) full, else 503.
async fn store_failure(store: &BulkStore, err: &PutError) -> ApiError {
    tracing::warn!(%err, "storing an upload failed; the sweeper removes what it stored");
    // A chunk is at most 128 KiB (async-nats's default chunk size).
    let chunk = 128 * 1024 + CHUNK_OVERHEAD + RECORD_RESERVE;
    match store.files_usage().await {
        Ok(usage) if usage.room().is_some_and(|room| room < chunk) => {
            no_room(usage.bytes, usage.budget.unwrap_or(0))
        }
        _ => ApiError::server(503, format!("cannot store the file: {err}")),
    }
}

/// Reads and drops the rest of a refused form (the route's body limit bounds it).
async fn drain_form(form: &mut Multipart) {
    while let Ok(Some(mut field)) = form.next_field().await {
        while let Ok(Some(_)) = field.chunk().await {}
    }
}

/// `GET /v1/files` query: OpenAI's `purpose`, `after`, `limit`.
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    /// Only files of this purpose.
    pub purpose: Option<String>,
    /// `after` and `limit`: most files in the page, 1 to 10,000 (the default).
    #[serde(flatten)]
    pub cursor: Cursor,
}

/// `GET /v1/files`: `{"object": "list", "data": [File, ...], "has_more": false, "first_id",
/// "last_id"}`, newest first.
#[utoipa::path(get, path = "/v1/files", operation_id = "list_files", tag = "batch", summary = "List files",
    params(("purpose" = Option<String>, Query, description = "Only files of this purpose."),
           ("after" = Option<String>, Query, description = "The id after which the page starts."),
           ("limit" = Option<usize>, Query, description = "Most files in the page: 1 to 10,000 (10,000); 400 otherwise.")),
    responses((status = 200, description = "`{\"object\": \"list\", \"data\": [File, ...], \"has_more\"}`, newest first.", body = Object), BulkErrors))]
pub async fn list(
    State(bulk): State<Bulk>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let query = super::query(query)?;
    let page = query.cursor.page(LIST_LIMIT)?;
    fn listing(e: impl std::fmt::Display) -> ApiError {
        ApiError::server(503, format!("cannot list files: {e}"))
    }
    let mut objects = bulk.store().await?.files.list().await.map_err(listing)?;
    let mut files = Vec::new();
    while let Some(info) = objects.next().await {
        let info = info.map_err(listing)?;
        if owner(&info) == caller.name()
            && let Some(file) = file_object(&info)
            && query.purpose.as_ref().is_none_or(|p| *p == file.purpose)
        {
            files.push(file);
        }
    }
    let page = newest_page(files, page, |f| (f.created_at, &f.id));
    Ok(json_ok(&page))
}

/// OpenAI's cursor page of `items`, newest first (by creation time, then id): those after the
/// id `after`, at most `limit` (1 to 10,000).
pub fn newest_page<T: serde::Serialize>(
    mut items: Vec<T>,
    (after, limit): (Option<&str>, usize),
    key: fn(&T) -> (u64, &String),
) -> serde_json::Value {
    items.sort_by(|a, b| key(b).cmp(&key(a)));
    let start = after
        .and_then(|a| items.iter().position(|i| key(i).1 == a).map(|p| p + 1))
        .unwrap_or(0);
    let limit = limit.clamp(1, 10_000);
    let has_more = items.len() > start + limit;
    let data: Vec<&T> = items.iter().skip(start).take(limit).collect();
    serde_json::json!({
        "object": "list",
        "first_id": data.first().map(|i| key(i).1),
        "last_id": data.last().map(|i| key(i).1),
        "has_more": has_more,
        "data": data,
    })
}

/// `GET /v1/files/{id}`: the File object, 404 when there is none.
#[utoipa::path(get, path = "/v1/files/{id}", operation_id = "retrieve_file", tag = "batch", summary = "A file's File object",
    params(("id" = String, Path, description = "The file id, `file-...`.")),
    responses((status = 200, description = "OpenAI's File object.", body = Object), BulkErrors))]
pub async fn retrieve(file: Owned<ObjectInfo>) -> Result<Response, ApiError> {
    let object = file_object(&file.item).ok_or_else(|| no_file(&file.id))?;
    Ok(json_ok(&object))
}

/// `GET /v1/files/{id}/content`: the file's bytes, streamed from the object store
/// (`application/jsonl` for `.jsonl` files, else `application/octet-stream`).
#[utoipa::path(get, path = "/v1/files/{id}/content", operation_id = "retrieve_file_content", tag = "batch", summary = "A file's content",
    params(("id" = String, Path, description = "The file id, `file-...`.")),
    responses((status = 200, description = "The file's bytes (`application/jsonl` for `.jsonl` files).",
        content((String = "application/jsonl"), (String = "application/octet-stream"))), BulkErrors))]
pub async fn content(file: Owned<ObjectInfo>) -> Result<Response, ApiError> {
    let Owned {
        bulk,
        id,
        item: info,
    } = file;
    let object = bulk.store().await?.files.get(&id).await;
    let object =
        object.map_err(|e| ApiError::server(503, format!("cannot read file {id}: {e}")))?;
    let jsonl = info
        .metadata
        .get(META_FILENAME)
        .is_some_and(|f| f.ends_with(".jsonl"));
    let kind = if jsonl {
        "application/jsonl"
    } else {
        "application/octet-stream"
    };
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static(kind)),
        (header::CONTENT_LENGTH, HeaderValue::from(info.size)),
    ];
    let body = Body::from_stream(tokio_util::io::ReaderStream::new(object));
    Ok((StatusCode::OK, headers, body).into_response())
}

/// `DELETE /v1/files/{id}`: `{"id", "object": "file", "deleted": true}`, 404 when there is none.
#[utoipa::path(delete, path = "/v1/files/{id}", operation_id = "delete_file", tag = "batch", summary = "Delete a file",
    params(("id" = String, Path, description = "The file id, `file-...`.")),
    responses((status = 200, description = "`{\"id\", \"object\": \"file\", \"deleted\": true}`.", body = Object), BulkErrors))]
pub async fn delete(file: Owned<ObjectInfo>) -> Result<Response, ApiError> {
    let Owned { bulk, id, .. } = file;
    let deleted = bulk.store().await?.files.delete(&id).await;
    deleted.map_err(|e| ApiError::server(503, format!("cannot delete file {id}: {e}")))?;
    Ok(json_ok(
        &serde_json::json!({"id": id, "object": "file", "deleted": true}),
    ))
}
