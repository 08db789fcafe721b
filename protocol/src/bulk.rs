//! The bulk (batch) contract: OpenAI's Files and Batches objects, and the JetStream subjects,
//! streams and buckets through which the gateway, the workers and any NATS client run bulk
//! embedding jobs.
//!
//! Version [`BULK_VERSION`] of this contract; docs/nats-contract.md ("Bulk jobs") documents it for
//! non-Rust clients and docs/design/bulk-jobs.md explains the choices.
//!
//! # Where things live (all on the NATS server's JetStream)
//! - [`FILES_BUCKET`] (Object Store): every file (input, output, error), object name = file id
//!   (`file-<nuid>`); its purpose, filename and creation time are the object's metadata
//!   ([`META_PURPOSE`], [`META_FILENAME`], [`META_CREATED_AT`]).
//! - [`BATCHES_BUCKET`] (KV): key = batch id (`batch_<nuid>`), value = a [`BatchRecord`]: the
//!   [`Batch`] in OpenAI's shape plus the `embatch` bookkeeping ([`Progress`]). Every change is a
//!   compare-and-set on the key's revision.
//! - [`WORK_STREAM`] (WorkQueue retention): the job messages ([`job_subject`]) and the work items
//!   ([`items_subject`], one [`Item`] per chunk of input lines, on the subject of the batch's
//!   model), read by the durable pull consumers [`JOBS_CONSUMER`], which all workers share, and
//!   [`items_consumer`], which the workers of one model share.
//! - [`RESULTS_STREAM`] (limits retention, file storage): one [`ChunkResult`] per processed
//!   chunk ([`results_subject`]), deduplicated by `Nats-Msg-Id` ([`result_msg_id`]).
//! - [`events_subject`]: a core NATS message with the [`Batch`] whenever a batch reaches a final
//!   status (`completed`, `failed`, `expired`, `cancelled`), so a service is told instead of
//!   polling.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::EmbedRequest;

mod subjects;

pub use subjects::*;

/// Version of the bulk contract: the `v1` in every subject below.
pub const BULK_VERSION: &str = "1";

/// The Object Store bucket of all files.
pub const FILES_BUCKET: &str = "EMBATCH_FILES";
/// The KV bucket of batch records.
pub const BATCHES_BUCKET: &str = "EMBATCH_BATCHES";
/// The WorkQueue stream of job messages and work items.
pub const WORK_STREAM: &str = "EMBATCH_BULK";
/// The stream of chunk results (limits retention, file storage).
pub const RESULTS_STREAM: &str = "EMBATCH_BULK_RESULTS";
/// The durable pull consumer of job messages (filter [`JOBS_FILTER`]), shared by all workers.
pub const JOBS_CONSUMER: &str = "bulk-jobs";
/// The prefix of the durable pull consumers of work items, one per model ([`items_consumer`]).
/// (Before contract v1.1 one consumer of this name read every item; a WorkQueue stream refuses
/// overlapping consumers, so delete it when upgrading: `nats consumer rm EMBATCH_BULK
/// bulk-items`.)
pub const ITEMS_CONSUMER: &str = "bulk-items";

/// Prefix of every bulk subject.
pub const SUBJECT_PREFIX: &str = "embatch.bulk.v1";
/// Filter of [`JOBS_CONSUMER`]: every job message.
pub const JOBS_FILTER: &str = "embatch.bulk.v1.jobs.>";
/// Every work item, of every model (a subject of [`WORK_STREAM`]).
pub const ITEMS_FILTER: &str = "embatch.bulk.v1.items.>";
/// The subjects of [`RESULTS_STREAM`].
pub const RESULTS_FILTER: &str = "embatch.bulk.v1.results.>";

/// Object metadata key: the file's purpose (`batch`, `batch_output`).
pub const META_PURPOSE: &str = "purpose";
/// Object metadata key: the file name the client uploaded (or the one the worker gave).
pub const META_FILENAME: &str = "filename";
/// Object metadata key: creation time, Unix seconds.
pub const META_CREATED_AT: &str = "created_at";
/// Object metadata key: the tenant that owns the file (the uploader's, or its batch's for an
/// output or error file). Absent on files stored before tenants existed: those are
/// [`DEFAULT_TENANT`](crate::headers::DEFAULT_TENANT)'s.
pub const META_TENANT: &str = "tenant";

/// OpenAI's batch statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchStatus {
    /// The input file is being validated and split.
    Validating,
    /// Validation failed: `errors` says why; nothing was embedded.
    Failed,
    /// Work items are being embedded.
    InProgress,
    /// The output and error files are being written.
    Finalizing,
    /// Done: `output_file_id` / `error_file_id` hold the results.
    Completed,
    /// The completion window passed; what finished is delivered.
    Expired,
    /// A cancel was asked for; what finished is being delivered.
    Cancelling,
    /// Cancelled; what finished is delivered.
    Cancelled,
}

impl BatchStatus {
    /// `true` for a status no later change leaves: failed, completed, expired, cancelled.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            BatchStatus::Failed
                | BatchStatus::Completed
                | BatchStatus::Expired
                | BatchStatus::Cancelled
        )
    }

    /// OpenAI's name of the status, as serialized: `validating`, `in_progress`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            BatchStatus::Validating => "validating",
            BatchStatus::Failed => "failed",
            BatchStatus::InProgress => "in_progress",
            BatchStatus::Finalizing => "finalizing",
            BatchStatus::Completed => "completed",
            BatchStatus::Expired => "expired",
            BatchStatus::Cancelling => "cancelling",
            BatchStatus::Cancelled => "cancelled",
        }
    }
}

/// OpenAI's `request_counts`: requests (input lines), not inputs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestCounts {
    /// Lines in the input file (known once validated).
    pub total: u64,
    /// Lines embedded successfully so far.
    pub completed: u64,
    /// Lines that failed so far (they go to the error file).
    pub failed: u64,
}

/// One entry of a failed batch's `errors` list (OpenAI's `BatchError`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchError {
    /// Machine-readable code, e.g. `invalid_json`, `missing_custom_id`, `duplicate_custom_id`,
    /// `invalid_url`, `model_mismatch`, `too_many_inputs`, `too_many_requests`.
    pub code: String,
    /// What is wrong, naming the field, the line and the limit.
    pub message: String,
    /// The field at fault, e.g. `custom_id`, `body.input`.
    #[serde(default)]
    pub param: Option<String>,
    /// 1-based line of the input file.
    #[serde(default)]
    pub line: Option<u64>,
}

/// OpenAI's `errors`: `{"object": "list", "data": [...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchErrors {
    /// Always `"list"`.
    pub object: String,
    /// The errors, in line order.
    pub data: Vec<BatchError>,
}

/// OpenAI's Batch object, as `GET /v1/batches/{id}` answers it (the `openai` SDK's
/// `types/batch.py`). Times are Unix seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    /// `batch_<nuid>`.
    pub id: String,
    /// Always `"batch"`.
    pub object: String,
    /// `/v1/embeddings` (or `/embed` for TEI-shaped lines).
    pub endpoint: String,
    /// The validation errors of a `failed` batch.
    #[serde(default)]
    pub errors: Option<BatchErrors>,
    /// The input file's id.
    pub input_file_id: String,
    /// As asked, e.g. `24h`.
    pub completion_window: String,
    /// The status.
    pub status: BatchStatus,
    /// The output file (successful lines), once finalized and when any line succeeded.
    #[serde(default)]
    pub output_file_id: Option<String>,
    /// The error file (failed lines), once finalized and when any line failed.
    #[serde(default)]
    pub error_file_id: Option<String>,
    /// Creation time.
    pub created_at: u64,
    /// When validation ended and embedding began.
    #[serde(default)]
    pub in_progress_at: Option<u64>,
    /// `created_at` + the completion window.
    #[serde(default)]
    pub expires_at: Option<u64>,
    /// When finalization began.
    #[serde(default)]
    pub finalizing_at: Option<u64>,
    /// When it completed.
    #[serde(default)]
    pub completed_at: Option<u64>,
    /// When validation failed.
    #[serde(default)]
    pub failed_at: Option<u64>,
    /// When it expired.
    #[serde(default)]
    pub expired_at: Option<u64>,
    /// When a cancel was asked for.
    #[serde(default)]
    pub cancelling_at: Option<u64>,
    /// When it was cancelled.
    #[serde(default)]
    pub cancelled_at: Option<u64>,
    /// Progress, visible while in progress.
    pub request_counts: RequestCounts,
    /// The caller's metadata (at most 16 pairs, as OpenAI).
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// The value of a [`BATCHES_BUCKET`] key: the [`Batch`] and the workers' bookkeeping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchRecord {
    /// The batch as served.
    #[serde(flatten)]
    pub batch: Batch,
    /// Bookkeeping, never served over HTTP.
    #[serde(default)]
    pub embatch: Progress,
    /// The tenant that created the batch: only it may read or cancel it, and its output and
    /// error files are its own. `None` on records written before tenants existed: those are
    /// [`DEFAULT_TENANT`](crate::headers::DEFAULT_TENANT)'s ([`BatchRecord::owner`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

impl BatchRecord {
    /// The tenant that owns the batch.
    pub fn owner(&self) -> &str {
        self.tenant
            .as_deref()
            .unwrap_or(crate::headers::DEFAULT_TENANT)
    }
}

/// A batch's bookkeeping in its [`BatchRecord`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// Chunks the input was split into; `None` until the split is done.
    #[serde(default)]
    pub chunks: Option<u32>,
    /// Which chunks are done: bit `i` of byte `i / 8` (lowest bit first), as lowercase hex.
    /// Counting a redelivered chunk twice is impossible: its bit is already set.
    #[serde(default)]
    pub done: String,
    /// Why the batch is ending early: `expired` or `cancelled` (the final status).
    #[serde(default)]
    pub ending: Option<BatchStatus>,
    /// How many finalization runs have claimed the batch (0 before the first). JetStream
    /// delivers a job at least once, so two runs may overlap; only the latest claim may set
    /// the final status, and each claim writes files of its own.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub finalizer: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Progress {
    /// Whether chunk `chunk` is done.
    pub fn is_done(&self, chunk: u32) -> bool {
        let byte = (chunk / 8) as usize;
        let bits = u8::from_str_radix(self.done.get(byte * 2..byte * 2 + 2).unwrap_or("00"), 16)
            .unwrap_or(0);
        bits & (1 << (chunk % 8)) != 0
    }

    /// Marks chunk `chunk` done; `false` when it already was.
    pub fn mark_done(&mut self, chunk: u32) -> bool {
        if self.is_done(chunk) {
            return false;
        }
        let byte = (chunk / 8) as usize;
        while self.done.len() < byte * 2 + 2 {
            self.done.push_str("00");
        }
        let bits = u8::from_str_radix(&self.done[byte * 2..byte * 2 + 2], 16).unwrap_or(0)
            | (1 << (chunk % 8));
        self.done
            .replace_range(byte * 2..byte * 2 + 2, &format!("{bits:02x}"));
        true
    }

    /// Chunks done.
    pub fn done_count(&self) -> u32 {
        (0..self.done.len() / 2)
            .filter_map(|i| u8::from_str_radix(&self.done[i * 2..i * 2 + 2], 16).ok())
            .map(u8::count_ones)
            .sum()
    }

    /// `true` once the split is done and every chunk is.
    pub fn all_done(&self) -> bool {
        self.chunks.is_some_and(|n| self.done_count() >= n)
    }
}

/// Which route a line's body and its output follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LineRoute {
    /// `/v1/embeddings`: OpenAI's request body and response shape.
    OpenAi,
    /// `/embed`: TEI's request body and response shape.
    Tei,
}

/// OpenAI's `encoding_format` of a `/v1/embeddings` line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    /// JSON numbers.
    #[default]
    Float,
    /// Base64 of the little-endian f32 values.
    Base64,
}

/// One validated input line inside an [`Item`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemLine {
    /// 1-based line of the input file.
    pub line: u64,
    /// The caller's `custom_id`.
    pub custom_id: String,
    /// The line's route.
    pub route: LineRoute,
    /// The request, in TEI's `/embed` shape (an OpenAI body is translated as
    /// `POST /v1/embeddings` translates it: `normalize: true`, `dimensions` kept).
    pub request: EmbedRequest,
    /// OpenAI's `model`, echoed in the response body (`/v1/embeddings` lines).
    #[serde(default)]
    pub model: Option<String>,
    /// OpenAI's `encoding_format` (`/v1/embeddings` lines).
    #[serde(default)]
    pub encoding_format: EncodingFormat,
}

/// A work item: a chunk of consecutive input lines, embedded by one worker (one upstream call
/// when their options agree). Published on [`items_subject`] with `Nats-Msg-Id` =
/// [`item_msg_id`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Item {
    /// The batch.
    pub batch_id: String,
    /// 0-based chunk index.
    pub chunk: u32,
    /// The lines, in file order.
    pub lines: Vec<ItemLine>,
}

/// The result of one line, inside a [`ChunkResult`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LineResult {
    /// The caller's `custom_id` (the finalizer keeps the first result of each).
    pub custom_id: String,
    /// `false`: the line goes to the error file.
    pub ok: bool,
    /// The output line, an [`OutputLine`] as JSON.
    pub output: Box<RawValue>,
}

/// The results of one chunk (or one part of them), published on [`results_subject`] with
/// `Nats-Msg-Id` = [`result_msg_id`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChunkResult {
    /// The chunk index.
    pub chunk: u32,
    /// One per line of the part.
    pub lines: Vec<LineResult>,
}

/// One line of an output or error file, OpenAI's batch output shape:
/// `{"id": "batch_req_...", "custom_id": "...", "response": {"status_code": 200, "request_id":
/// "...", "body": {...}}, "error": null}`. A line the model refused has the route's error body
/// and status (TEI's 413/422...) in `response`; a line never answered (upstream failing past
/// the redelivery limit, the batch cancelled or expired first) has `response: null` and `error`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OutputLine<'a> {
    /// `batch_req_<nuid>`.
    pub id: String,
    /// The caller's `custom_id`.
    pub custom_id: String,
    /// The route's response, when there was one.
    #[serde(borrow)]
    pub response: Option<OutputResponse<'a>>,
    /// Why there is no response.
    pub error: Option<OutputError>,
}

/// `response` of an [`OutputLine`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OutputResponse<'a> {
    /// The HTTP status the route would have answered.
    pub status_code: u16,
    /// An id of the request, `req_<nuid>`.
    pub request_id: String,
    /// The route's response body: OpenAI's embeddings response, TEI's array of vectors, or
    /// the route's error body.
    #[serde(borrow)]
    pub body: &'a RawValue,
}

/// `error` of an [`OutputLine`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputError {
    /// `batch_expired`, `batch_cancelled` or `upstream_failed`.
    pub code: String,
    /// What happened.
    pub message: String,
}

/// OpenAI's File object (the `openai` SDK's `types/file_object.py`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileObject {
    /// `file-<nuid>`.
    pub id: String,
    /// Always `"file"`.
    pub object: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Unix seconds.
    pub created_at: u64,
    /// The uploaded file's name.
    pub filename: String,
    /// `batch` (inputs), `batch_output` (outputs and errors).
    pub purpose: String,
    /// Always `"processed"` once stored.
    pub status: String,
    /// Never set: files live until deleted.
    #[serde(default)]
    pub expires_at: Option<u64>,
}

/// The current time in Unix seconds.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn done_bits_count_each_chunk_once() {
        let mut p = Progress {
            chunks: Some(10),
            ..Progress::default()
        };
        assert!(p.mark_done(0));
        assert!(p.mark_done(9));
        assert!(!p.mark_done(9));
        assert!(p.is_done(9) && !p.is_done(8));
        assert_eq!(p.done_count(), 2);
        for c in 0..10 {
            p.mark_done(c);
        }
        assert!(p.all_done());
    }

    #[test]
    fn item_subjects_and_consumers_are_per_model() {
        let model = "BAAI/bge-small-en-v1.5";
        assert_eq!(
            items_subject(model, "batch_X"),
            "embatch.bulk.v1.items.BAAI/bge-small-en-v1%2E5.batch_X"
        );
        assert_eq!(
            items_filter(model),
            "embatch.bulk.v1.items.BAAI/bge-small-en-v1%2E5.>"
        );
        assert_eq!(
            items_consumer(model),
            "bulk-items-BAAI_2Fbge-small-en-v1_2E5"
        );
        assert_eq!(
            batch_items_filter("batch_X"),
            "embatch.bulk.v1.items.*.batch_X"
        );
    }

    #[test]
    fn job_subjects_round_trip() {
        let s = job_subject("batch_X1", JobKind::Finalize);
        assert_eq!(s, "embatch.bulk.v1.jobs.batch_X1.finalize");
        assert_eq!(parse_job_subject(&s), Some(("batch_X1", JobKind::Finalize)));
        assert_eq!(parse_job_subject("embatch.bulk.v1.items.b"), None);
    }
}
