//! OpenAI's Files and Batches API as the gateway serves it: a small reqwest client. The `Batch`
//! and `File` objects are the workspace's wire types ([`embatch_protocol::bulk`]); only the list
//! pages, which the protocol crate does not define, are declared here.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use reqwest::{StatusCode, Url};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;

pub use embatch_protocol::bulk::{
    Batch, BatchError, BatchErrors, BatchStatus, FileObject, RequestCounts,
};

use crate::error::CliError;

/// Timeout of one small call (everything but the file upload and download).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Timeout of connecting to the gateway.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A page of `GET /v1/batches`.
#[derive(Debug, Clone, Deserialize)]
pub struct BatchList {
    /// Newest first.
    pub data: Vec<Batch>,
    /// Whether `after=<last id>` gives more.
    #[serde(default)]
    pub has_more: bool,
}

/// A page of `GET /v1/files`.
#[derive(Debug, Clone, Deserialize)]
pub struct FileList {
    /// The files.
    pub data: Vec<FileObject>,
    /// Whether `after=<last id>` gives more.
    #[serde(default)]
    pub has_more: bool,
}

/// A client of one gateway.
#[derive(Debug, Clone)]
pub struct Api {
    http: reqwest::Client,
    base: Url,
}

impl Api {
    /// A client of the gateway at `base` (e.g. `http://127.0.0.1:8080`; routes are under `/v1`).
    ///
    /// # Errors
    /// [`CliError::Config`] when `base` is not an `http`/`https` URL.
    pub fn new(base: &str) -> Result<Api, CliError> {
        let mut base = Url::parse(base)
            .map_err(|e| CliError::Config(format!("--url {base:?} is not a URL: {e}")))?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(CliError::Config(format!(
                "--url {base} must be http:// or https://"
            )));
        }
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| CliError::Config(format!("HTTP client: {e}")))?;
        Ok(Api { http, base })
    }

    /// This client, sending `key` as `Authorization: Bearer <key>` on every call (a gateway
    /// with a tenants file needs it; the calls then see only the key's tenant's files and
    /// batches). `None`: no key, as for an open gateway.
    ///
    /// # Errors
    /// [`CliError::Config`] when the key cannot be a header value.
    pub fn with_key(mut self, key: Option<&str>) -> Result<Api, CliError> {
        let Some(key) = key else {
            return Ok(self);
        };
        let mut value = reqwest::header::HeaderValue::try_from(format!("Bearer {key}"))
            .map_err(|_| CliError::Config("--api-key holds characters a header cannot".into()))?;
        value.set_sensitive(true);
        let headers =
            reqwest::header::HeaderMap::from_iter([(reqwest::header::AUTHORIZATION, value)]);
        self.http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .default_headers(headers)
            .build()
            .map_err(|e| CliError::Config(format!("HTTP client: {e}")))?;
        Ok(self)
    }

    /// `GET /v1/usage?date=DATE` (today when `None`): the key's tenant's usage of that day (UTC)
    /// as the gateway answers it (`{"tenant", "date", "requests", "inputs", "tokens", "shed",
    /// "failed"}`).
    ///
    /// # Errors
    /// Network, API and decode errors.
    pub async fn usage(&self, date: Option<&str>) -> Result<serde_json::Value, CliError> {
        let mut url = self.url("v1/usage")?;
        if let Some(date) = date {
            url.query_pairs_mut().append_pair("date", date);
        }
        self.json("GET /v1/usage", self.http.get(url)).await
    }

    fn url(&self, path: &str) -> Result<Url, CliError> {
        self.base
            .join(path)
            .map_err(|e| CliError::Config(format!("{path}: {e}")))
    }

    async fn send(
        &self,
        what: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, CliError> {
        let response = request.send().await.map_err(|source| CliError::Network {
            what: what.to_owned(),
            source,
        })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        Err(CliError::Api {
            what: what.to_owned(),
            status: status.as_u16(),
            message: error_message(&body),
        })
    }

    async fn json<T: DeserializeOwned>(
        &self,
        what: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<T, CliError> {
        let response = self.send(what, request.timeout(CALL_TIMEOUT)).await?;
        decode(what, response).await
    }

    /// `GET /info`: the served model's `model_id` (the default `model` of converted text lines).
    ///
    /// # Errors
    /// Network, API and decode errors.
    pub async fn model_id(&self) -> Result<String, CliError> {
        #[derive(Deserialize)]
        struct Info {
            model_id: String,
        }
        let info: Info = self
            .json("GET /info", self.http.get(self.url("info")?))
            .await?;
        Ok(info.model_id)
    }

    /// `POST /v1/files` (multipart, `purpose=batch`): uploads `jsonl` as `filename`.
    ///
    /// # Errors
    /// Network and API errors (e.g. 413 over the gateway's file size limit, 503 without
    /// JetStream).
    pub async fn upload(&self, filename: &str, jsonl: Vec<u8>) -> Result<FileObject, CliError> {
        let what = "POST /v1/files";
        let part = reqwest::multipart::Part::bytes(jsonl)
            .file_name(filename.to_owned())
            .mime_str("application/jsonl")
            .map_err(|source| CliError::Network {
                what: what.to_owned(),
                source,
            })?;
        let form = reqwest::multipart::Form::new()
            .text("purpose", "batch")
            .part("file", part);
        let response = self
            .send(what, self.http.post(self.url("v1/files")?).multipart(form))
            .await?;
        decode(what, response).await
    }

    /// `GET /v1/files?purpose=batch` (all pages): the uploaded input files.
    ///
    /// # Errors
    /// Network, API and decode errors.
    pub async fn files(&self) -> Result<Vec<FileObject>, CliError> {
        let mut all = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut url = self.url("v1/files")?;
            url.query_pairs_mut()
                .append_pair("purpose", "batch")
                .append_pair("limit", "100");
            if let Some(after) = &after {
                url.query_pairs_mut().append_pair("after", after);
            }
            let page: FileList = self.json("GET /v1/files", self.http.get(url)).await?;
            after = page.data.last().map(|f| f.id.clone());
            let more = page.has_more && after.is_some();
            all.extend(page.data);
            if !more {
                return Ok(all);
            }
        }
    }

    /// `POST /v1/batches` for `/v1/embeddings` with `metadata`.
    ///
    /// # Errors
    /// Network, API and decode errors.
    pub async fn create_batch(
        &self,
        input_file_id: &str,
        completion_window: &str,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Batch, CliError> {
        let body = json!({
            "input_file_id": input_file_id,
            "endpoint": "/v1/embeddings",
            "completion_window": completion_window,
            "metadata": metadata,
        });
        self.json(
            "POST /v1/batches",
            self.http.post(self.url("v1/batches")?).json(&body),
        )
        .await
    }

    /// `GET /v1/batches/{id}`.
    ///
    /// # Errors
    /// Network, API and decode errors.
    pub async fn batch(&self, id: &str) -> Result<Batch, CliError> {
        let url = self.url(&format!("v1/batches/{id}"))?;
        self.json("GET /v1/batches/{id}", self.http.get(url)).await
    }

    /// One page of `GET /v1/batches?limit=&after=` (newest first).
    ///
    /// # Errors
    /// Network, API and decode errors.
    pub async fn batches(&self, after: Option<&str>, limit: u32) -> Result<BatchList, CliError> {
        let mut url = self.url("v1/batches")?;
        url.query_pairs_mut()
            .append_pair("limit", &limit.to_string());
        if let Some(after) = after {
            url.query_pairs_mut().append_pair("after", after);
        }
        self.json("GET /v1/batches", self.http.get(url)).await
    }

    /// `POST /v1/batches/{id}/cancel`.
    ///
    /// # Errors
    /// Network, API and decode errors.
    pub async fn cancel(&self, id: &str) -> Result<Batch, CliError> {
        let url = self.url(&format!("v1/batches/{id}/cancel"))?;
        // No body, but a Content-Length (0): some proxies answer 411 to a POST without one.
        self.json(
            "POST /v1/batches/{id}/cancel",
            self.http
                .post(url)
                .header(reqwest::header::CONTENT_LENGTH, "0"),
        )
        .await
    }

    /// `GET /v1/files/{id}/content`, streamed into `path` (replaced whole: written to a `.part`
    /// file first, then renamed). Returns the lines written.
    ///
    /// # Errors
    /// Network and API errors, [`CliError::Io`] writing the file.
    pub async fn download(&self, file_id: &str, path: &Path) -> Result<u64, CliError> {
        let what = "GET /v1/files/{id}/content";
        let url = self.url(&format!("v1/files/{file_id}/content"))?;
        let mut response = self.send(what, self.http.get(url)).await?;
        let part = path.with_extension(match path.extension() {
            Some(ext) => format!("{}.part", ext.to_string_lossy()),
            None => "part".to_owned(),
        });
        let io = |source| CliError::Io {
            path: part.clone(),
            source,
        };
        let mut file = std::io::BufWriter::new(std::fs::File::create(&part).map_err(io)?);
        let (mut lines, mut last) = (0u64, b'\n');
        while let Some(chunk) = response.chunk().await.map_err(|source| CliError::Network {
            what: what.to_owned(),
            source,
        })? {
            lines += chunk.iter().filter(|&&b| b == b'\n').count() as u64;
            if let Some(&b) = chunk.last() {
                last = b;
            }
            file.write_all(&chunk).map_err(io)?;
        }
        if last != b'\n' {
            // A last line without its newline is still a line.
            file.write_all(b"\n").map_err(io)?;
            lines += 1;
        }
        file.into_inner()
            .map_err(|e| io(e.into_error()))?
            .sync_all()
            .map_err(io)?;
        std::fs::rename(&part, path).map_err(|source| CliError::Io {
            path: path.to_owned(),
            source,
        })?;
        Ok(lines)
    }
}

/// Reads a successful response's body as JSON `T`.
async fn decode<T: DeserializeOwned>(
    what: &str,
    response: reqwest::Response,
) -> Result<T, CliError> {
    let bytes = response.bytes().await.map_err(|source| CliError::Network {
        what: what.to_owned(),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|e| CliError::Decode {
        what: what.to_owned(),
        detail: e.to_string(),
    })
}

/// A batch with `id` and `status` and only the required fields besides, for unit tests.
#[cfg(test)]
pub(crate) fn test_batch(id: &str, status: BatchStatus) -> Batch {
    serde_json::from_value(json!({
        "id": id, "object": "batch", "endpoint": "/v1/embeddings", "input_file_id": "file-in",
        "completion_window": "24h", "status": status, "created_at": 0,
        "request_counts": RequestCounts::default(),
    }))
    .expect("a batch")
}

/// OpenAI's `{"error": {"message": ...}}`, TEI's `{"error": "..."}`, or the body's start.
fn error_message(body: &str) -> String {
    let value: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    let message = value
        .pointer("/error/message")
        .or_else(|| value.get("error"))
        .and_then(serde_json::Value::as_str);
    match message {
        Some(m) => m.to_owned(),
        None => body.chars().take(300).collect(),
    }
}

/// Whether an error is worth retrying while following a batch: the gateway is restarting or
/// briefly unreachable (connection errors, timeouts, 502/503/504).
pub fn is_transient(error: &CliError) -> bool {
    match error {
        CliError::Network { .. } => true,
        CliError::Api { status, .. } => matches!(
            StatusCode::from_u16(*status),
            Ok(StatusCode::BAD_GATEWAY
                | StatusCode::SERVICE_UNAVAILABLE
                | StatusCode::GATEWAY_TIMEOUT)
        ),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_object_from_openais_reference_decodes() {
        // The example of OpenAI's "The batch object".
        let batch: Batch = serde_json::from_str(
            r#"{"id": "batch_abc123", "object": "batch", "endpoint": "/v1/embeddings",
                "errors": null, "input_file_id": "file-abc123", "completion_window": "24h",
                "status": "completed", "output_file_id": "file-cvaTdG",
                "error_file_id": "file-HOWS94", "created_at": 1711471533,
                "in_progress_at": 1711471538, "expires_at": 1711557933,
                "finalizing_at": 1711493133, "completed_at": 1711493163, "failed_at": null,
                "expired_at": null, "cancelling_at": null, "cancelled_at": null,
                "request_counts": {"total": 100, "completed": 95, "failed": 5},
                "metadata": {"customer_id": "user_123456789"}}"#,
        )
        .expect("decodes");
        assert_eq!(batch.status, BatchStatus::Completed);
        assert_eq!(
            batch.request_counts,
            RequestCounts {
                total: 100,
                completed: 95,
                failed: 5
            }
        );
        assert_eq!(batch.error_file_id.as_deref(), Some("file-HOWS94"));
        assert!(batch.status.is_final());
    }

    #[test]
    fn failed_batch_errors_decode() {
        let batch: Batch = serde_json::from_str(
            r#"{"id": "b", "object": "batch", "endpoint": "/v1/embeddings",
                "input_file_id": "f", "completion_window": "24h", "created_at": 1,
                "request_counts": {"total": 0, "completed": 0, "failed": 0},
                "status": "failed", "errors": {"object": "list", "data": [
                {"code": "invalid_json_line", "message": "not JSON", "param": null, "line": 3}]}}"#,
        )
        .expect("decodes");
        let errors = batch.errors.expect("errors").data;
        assert_eq!(errors[0].line, Some(3));
        assert_eq!(errors[0].code, "invalid_json_line");
    }

    #[test]
    fn error_messages_come_from_either_shape() {
        assert_eq!(
            error_message(r#"{"error": {"message": "no JetStream", "type": "x"}}"#),
            "no JetStream"
        );
        assert_eq!(error_message(r#"{"error": "tei says no"}"#), "tei says no");
        assert_eq!(error_message("plain"), "plain");
    }

    #[test]
    fn only_gateway_unavailability_is_transient() {
        let api = |status| CliError::Api {
            what: "x".into(),
            status,
            message: String::new(),
        };
        assert!(is_transient(&api(503)));
        assert!(is_transient(&api(502)));
        assert!(!is_transient(&api(404)));
        assert!(!is_transient(&api(400)));
    }

    #[test]
    fn base_urls_are_checked_and_joined() {
        assert!(matches!(
            Api::new("ftp://x").map(|_| ()),
            Err(CliError::Config(_))
        ));
        assert!(matches!(Api::new("not a url"), Err(CliError::Config(_))));
        let api = Api::new("http://127.0.0.1:9/prefix").expect("valid");
        assert_eq!(
            api.url("v1/files").expect("joins").as_str(),
            "http://127.0.0.1:9/prefix/v1/files"
        );
    }
}
