//! OpenAI's Files API on the `EMBATCH_FILES` object store: one object per file, named by its id,
//! with its purpose, filename and creation time in the object's metadata.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_nats::jetstream::object_store::{InfoErrorKind, ObjectInfo, ObjectMetadata};
use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequest, Multipart, Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use embatch_protocol::bulk::{FileObject, META_CREATED_AT, META_FILENAME, META_PURPOSE, unix_now};
use futures::StreamExt;
use serde::Deserialize;

use super::{ApiError, Bulk, BulkErrors, json_ok, new_id, parse_limit, path_id};

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

/// The stored object `id`, or 404 (also for an id no object can have, such as one with `*` or a
/// leading `.`).
pub async fn info(bulk: &Bulk, id: &str) -> Result<ObjectInfo, ApiError> {
    let store = bulk.store().await?;
    if !embatch_runtime::bulk::is_valid_key(id) {
        return Err(no_file(id));
    }
    match store.files.info(id).await {
        Ok(info) if !info.deleted => Ok(info),
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

/// `POST /v1/files`: a multipart form with `purpose` (`batch`) and `file`; the file is streamed
/// into the object store (never held whole in memory). 400 for another purpose or a missing
/// field, 413 beyond `BULK_MAX_FILE_BYTES`, 503 without JetStream.
#[utoipa::path(post, path = "/v1/files", operation_id = "create_file", tag = "batch",
    summary = "Upload a file (OpenAI's Files API)",
    description = "A `multipart/form-data` form with `purpose` (`batch`) and `file` (JSONL, one \
                   batch request per line), stored in the NATS object store.",
    request_body(content_type = "multipart/form-data", content = Object),
    responses((status = 200, description = "OpenAI's File object.", body = Object), BulkErrors))]
pub async fn upload(State(bulk): State<Bulk>, request: axum::extract::Request) -> Response {
    let uploaded = async {
        // JetStream first: without it the answer is 503 whatever the form.
        bulk.store().await?;
        let mut form = Multipart::from_request(request, &()).await.map_err(|e| {
            ApiError::invalid(
                "file",
                format!("expected a multipart/form-data body: {}", e.body_text()),
            )
        })?;
        upload_form(&bulk, &mut form).await
    };
    match uploaded.await {
        Ok(file) => json_ok(&file),
        Err(err) => err.into_response(),
    }
}

async fn upload_form(bulk: &Bulk, form: &mut Multipart) -> Result<FileObject, ApiError> {
    let multipart = |e: axum::extract::multipart::MultipartError| ApiError {
        status: e.status().as_u16(),
        kind: "invalid_request_error",
        message: format!("cannot read the multipart form: {}", e.body_text()),
        param: None,
        code: None,
    };
    let store = bulk.store().await?;
    let mut purpose = None;
    let mut stored: Option<ObjectInfo> = None;
    while let Some(field) = form.next_field().await.map_err(multipart)? {
        match field.name() {
            Some("purpose") => purpose = Some(field.text().await.map_err(multipart)?),
            Some("file") if stored.is_none() => {
                let id = new_id("file-");
                let filename = field.file_name().unwrap_or("upload.jsonl").to_owned();
                let max = bulk.limits.max_file_bytes;
                let too_large = Arc::new(AtomicBool::new(false));
                let flag = Arc::clone(&too_large);
                let mut seen = 0usize;
                let bytes = field.map(move |chunk| {
                    let chunk = chunk.map_err(|e| {
                        // The route's body limit (the file limit plus the form's overhead).
                        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                            flag.store(true, Ordering::Relaxed);
                        }
                        std::io::Error::other(e)
                    })?;
                    seen += chunk.len();
                    if seen > max {
                        flag.store(true, Ordering::Relaxed);
                        return Err(std::io::Error::other("file too large"));
                    }
                    Ok(chunk)
                });
                let mut reader = tokio_util::io::StreamReader::new(bytes);
                let mut metadata = HashMap::from([
                    (META_FILENAME.to_owned(), filename),
                    (META_CREATED_AT.to_owned(), unix_now().to_string()),
                ]);
                if let Some(purpose) = &purpose {
                    // The usual order (the `openai` SDK sends `purpose` first): no second write.
                    metadata.insert(META_PURPOSE.to_owned(), purpose.clone());
                }
                let meta = ObjectMetadata {
                    name: id.clone(),
                    metadata,
                    ..Default::default()
                };
                match store.files.put(meta, &mut reader).await {
                    Ok(info) => stored = Some(info),
                    Err(_) if too_large.load(Ordering::Relaxed) => {
                        let _ = store.files.delete(&id).await;
                        return Err(ApiError {
                            status: 413,
                            kind: "invalid_request_error",
                            message: format!(
                                "`file` is larger than the limit of {max} bytes \
                                 (BULK_MAX_FILE_BYTES)"
                            ),
                            param: Some("file".into()),
                            code: Some("file_too_large"),
                        });
                    }
                    Err(err) => {
                        let _ = store.files.delete(&id).await;
                        return Err(ApiError::server(
                            503,
                            format!("cannot store the file: {err}"),
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    let Some(info) = stored else {
        return Err(ApiError::invalid("file", "the form has no `file` field"));
    };
    let purpose = purpose.unwrap_or_default();
    if !UPLOAD_PURPOSES.contains(&purpose.as_str()) {
        let _ = store.files.delete(&info.name).await;
        return Err(ApiError::invalid(
            "purpose",
            format!("`purpose` must be one of {UPLOAD_PURPOSES:?}, got {purpose:?}"),
        ));
    }
    if info.metadata.get(META_PURPOSE) == Some(&purpose) {
        return file_object(&info).ok_or_else(|| no_file(&info.name));
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
    let info = self::info(bulk, &info.name).await?;
    file_object(&info).ok_or_else(|| no_file(&info.name))
}

/// `GET /v1/files` query: OpenAI's `purpose`, `after`, `limit`.
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    /// Only files of this purpose.
    pub purpose: Option<String>,
    /// The id after which the page starts (files are listed newest first).
    pub after: Option<String>,
    /// Most files in the page: an integer from 1 to 10,000 (the default; checked by
    /// [`parse_limit`], so that a bad value is answered in OpenAI's shape).
    pub limit: Option<String>,
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
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let listed = async {
        let query = super::query(query)?;
        let (max, default) = LIST_LIMIT;
        let limit = parse_limit(query.limit.as_deref(), default, max)?;
        let store = bulk.store().await?;
        let mut objects = store
            .files
            .list()
            .await
            .map_err(|e| ApiError::server(503, format!("cannot list files: {e}")))?;
        let mut files = Vec::new();
        while let Some(info) = objects.next().await {
            let info =
                info.map_err(|e| ApiError::server(503, format!("cannot list files: {e}")))?;
            if let Some(file) = file_object(&info)
                && query.purpose.as_ref().is_none_or(|p| *p == file.purpose)
            {
                files.push(file);
            }
        }
        files.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.id.cmp(&a.id)));
        Ok::<_, ApiError>(page(files, query.after.as_deref(), Some(limit), |f| &f.id))
    };
    match listed.await {
        Ok(page) => json_ok(&page),
        Err(err) => err.into_response(),
    }
}

/// OpenAI's cursor page of `items` (sorted): those after the id `after`, at most `limit`
/// (default and most 10,000).
pub fn page<T: serde::Serialize>(
    items: Vec<T>,
    after: Option<&str>,
    limit: Option<usize>,
    id: impl Fn(&T) -> &String,
) -> serde_json::Value {
    let start = after
        .and_then(|a| items.iter().position(|i| id(i) == a).map(|p| p + 1))
        .unwrap_or(0);
    let limit = limit.unwrap_or(10_000).clamp(1, 10_000);
    let has_more = items.len() > start + limit;
    let data: Vec<&T> = items.iter().skip(start).take(limit).collect();
    serde_json::json!({
        "object": "list",
        "first_id": data.first().map(|i| id(i)),
        "last_id": data.last().map(|i| id(i)),
        "has_more": has_more,
        "data": data,
    })
}

/// `GET /v1/files/{id}`: the File object, 404 when there is none.
#[utoipa::path(get, path = "/v1/files/{id}", operation_id = "retrieve_file", tag = "batch", summary = "A file's File object",
    params(("id" = String, Path, description = "The file id, `file-...`.")),
    responses((status = 200, description = "OpenAI's File object.", body = Object), BulkErrors))]
pub async fn retrieve(
    State(bulk): State<Bulk>,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    let Some(id) = path_id(id) else {
        return no_file("?").into_response();
    };
    match info(&bulk, &id).await {
        Ok(info) => match file_object(&info) {
            Some(file) => json_ok(&file),
            None => no_file(&id).into_response(),
        },
        Err(err) => err.into_response(),
    }
}

/// `GET /v1/files/{id}/content`: the file's bytes, streamed from the object store
/// (`application/jsonl` for `.jsonl` files, else `application/octet-stream`).
#[utoipa::path(get, path = "/v1/files/{id}/content", operation_id = "retrieve_file_content", tag = "batch", summary = "A file's content",
    params(("id" = String, Path, description = "The file id, `file-...`.")),
    responses((status = 200, description = "The file's bytes (`application/jsonl` for `.jsonl` files).",
        content((String = "application/jsonl"), (String = "application/octet-stream"))), BulkErrors))]
pub async fn content(
    State(bulk): State<Bulk>,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    let Some(id) = path_id(id) else {
        return no_file("?").into_response();
    };
    let opened = async {
        let info = info(&bulk, &id).await?;
        let store = bulk.store().await?;
        let object = store
            .files
            .get(&id)
            .await
            .map_err(|e| ApiError::server(503, format!("cannot read file {id}: {e}")))?;
        Ok::<_, ApiError>((info, object))
    };
    match opened.await {
        Ok((info, object)) => {
            let jsonl = info
                .metadata
                .get(META_FILENAME)
                .is_some_and(|f| f.ends_with(".jsonl"));
            let kind = if jsonl {
                "application/jsonl"
            } else {
                "application/octet-stream"
            };
            (
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, HeaderValue::from_static(kind)),
                    (header::CONTENT_LENGTH, HeaderValue::from(info.size)),
                ],
                Body::from_stream(tokio_util::io::ReaderStream::new(object)),
            )
                .into_response()
        }
        Err(err) => err.into_response(),
    }
}

/// `DELETE /v1/files/{id}`: `{"id", "object": "file", "deleted": true}`, 404 when there is none.
#[utoipa::path(delete, path = "/v1/files/{id}", operation_id = "delete_file", tag = "batch", summary = "Delete a file",
    params(("id" = String, Path, description = "The file id, `file-...`.")),
    responses((status = 200, description = "`{\"id\", \"object\": \"file\", \"deleted\": true}`.", body = Object), BulkErrors))]
pub async fn delete(State(bulk): State<Bulk>, id: Result<Path<String>, PathRejection>) -> Response {
    let Some(id) = path_id(id) else {
        return no_file("?").into_response();
    };
    let deleted = async {
        info(&bulk, &id).await?;
        bulk.store()
            .await?
            .files
            .delete(&id)
            .await
            .map_err(|e| ApiError::server(503, format!("cannot delete file {id}: {e}")))?;
        Ok::<_, ApiError>(())
    };
    match deleted.await {
        Ok(()) => json_ok(&serde_json::json!({"id": id, "object": "file", "deleted": true})),
        Err(err) => err.into_response(),
    }
}
