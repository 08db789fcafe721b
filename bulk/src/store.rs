//! The JetStream set-up and the batch-record operations the gateway and the workers share for
//! bulk jobs (the names and shapes are the contract in `embatch_protocol::bulk`).
//!
//! [`BulkStore::open_with`] creates what is missing (idempotently, so any gateway or worker may
//! start first), with the configured replica count (`embatch_runtime::replicas`), and binds
//! the handles: the [`FILES_BUCKET`] object store, the [`BATCHES_BUCKET`] KV bucket, the
//! [`WORK_STREAM`] work queue and the [`RESULTS_STREAM`]. The object store's stream
//! ([`FILES_STREAM`]) has a byte budget of its own ([`BulkStore::set_files_budget`]), so that files
//! cannot take the room the cache and the other streams need on the server's store.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, kv, object_store, stream};
use bytes::Bytes;
use embatch_protocol::bulk::{
    BATCHES_BUCKET, Batch, BatchRecord, BatchStatus, FILES_BUCKET, ITEMS_FILTER, JOBS_FILTER,
    JobKind, RESULTS_FILTER, RESULTS_STREAM, WORK_STREAM, events_subject, job_msg_id, job_subject,
};
use embatch_runtime::replicas::{ReplicaTarget, Replicas, create_or_bind, ensure_stream};

/// The stream under the [`FILES_BUCKET`] object store (async-nats names it `OBJ_<bucket>`):
/// chunks on `$O.EMBATCH_FILES.C.<nuid>`, one meta record per object on
/// `$O.EMBATCH_FILES.M.<base64url(name)>`.
pub const FILES_STREAM: &str = "OBJ_EMBATCH_FILES";

/// The files' byte budget (the [`FILES_STREAM`]'s `max_bytes`) a worker or gateway sets when it
/// creates the object store: 4 GiB. The gateway then sets its own `BULK_FILES_MAX_BYTES` (this
/// value by default). With nats/nats.conf's `max_file_store` (10 GiB), it leaves room for the
/// worker's cache bucket (`CACHE_SHARED_BYTES`, 1 GiB) and for the results and work items of the
/// jobs running, which together take about as much as their input and output files
/// (docs/operations.md, "Storage budget").
pub const FILES_MAX_BYTES_DEFAULT: u64 = 4 << 30;

/// How long the work stream remembers a `Nats-Msg-Id` (jobs and items): a split resumed after a
/// crash, or a job asked for twice, within this window publishes nothing twice.
pub const WORK_DUPLICATE_WINDOW: Duration = Duration::from_secs(30 * 60);

/// How long the results stream remembers a `Nats-Msg-Id`: a chunk redelivered after its result
/// was stored (the worker died before its ack) adds no second result within it (the finalizer
/// also keeps each `custom_id` once, whatever the window).
pub const RESULTS_DUPLICATE_WINDOW: Duration = Duration::from_secs(30 * 60);

/// How long [`BulkStore::publish_job`] sends a job again while no stream answers its subject.
pub const NO_STREAM_RETRY: Duration = Duration::from_secs(5);

/// Why a bulk operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BulkError {
    /// JetStream cannot be used: not enabled on the server (`nats-server -js`), or its API did
    /// not answer (503 on the batch and file routes).
    #[error(
        "JetStream is not available on the NATS server (start nats-server with -js, or \
         `jetstream {{}}` in its config): {0}"
    )]
    Unavailable(String),
    /// A JetStream call failed after set-up (503).
    #[error("JetStream error: {0}")]
    JetStream(String),
    /// A stored record could not be read (a record written by an incompatible version).
    #[error("malformed batch record {key}: {reason}")]
    Malformed {
        /// The KV key.
        key: String,
        /// The decoder's message.
        reason: String,
    },
    /// No batch with this id.
    #[error("no batch with id {0}")]
    NotFound(String),
}

fn js_err(err: impl std::fmt::Display) -> BulkError {
    BulkError::JetStream(err.to_string())
}

/// Handles on the bulk buckets and streams.
#[derive(Clone)]
pub struct BulkStore {
    /// The JetStream context.
    pub js: jetstream::Context,
    /// [`FILES_BUCKET`].
    pub files: object_store::ObjectStore,
    /// [`FILES_STREAM`], the stream under [`BulkStore::files`].
    pub files_stream: stream::Stream,
    /// [`BATCHES_BUCKET`].
    pub batches: kv::Store,
    /// [`WORK_STREAM`].
    pub work: stream::Stream,
    /// [`RESULTS_STREAM`].
    pub results: stream::Stream,
    client: async_nats::Client,
}

impl BulkStore {
    /// Binds (creating when missing) the bulk buckets and streams on `client`'s server, with
    /// file storage and the replica count `auto` resolves to ([`BulkStore::open_with`]).
    ///
    /// # Errors
    /// [`BulkError::Unavailable`] when JetStream is off or does not answer.
    pub async fn open(client: async_nats::Client) -> Result<BulkStore, BulkError> {
        let replicas = Replicas::Auto.resolve(&client);
        BulkStore::open_with(client, replicas).await
    }

    /// Binds (creating when missing) the bulk buckets and streams on `client`'s server, with
    /// file storage and `replicas` copies; what exists with another count is brought to it
    /// ([`ReplicaTarget::apply`]).
    ///
    /// # Errors
    /// [`BulkError::Unavailable`] when JetStream is off or does not answer.
    pub async fn open_with(
        client: async_nats::Client,
        replicas: ReplicaTarget,
    ) -> Result<BulkStore, BulkError> {
        let js = jetstream::new(client.clone());
        let unavailable = |e: &dyn std::fmt::Display| BulkError::Unavailable(e.to_string());
        js.query_account().await.map_err(|e| unavailable(&e))?;
        let files = open_files(&js, replicas)
            .await
            .map_err(|e| unavailable(&e))?;
        let files_stream = js
            .get_stream(FILES_STREAM)
            .await
            .map_err(|e| unavailable(&e))?;
        let batches = open_batches(&js, replicas)
            .await
            .map_err(|e| unavailable(&e))?;
        let work = ensure_stream(
            &js,
            stream::Config {
                name: WORK_STREAM.to_owned(),
                description: Some("embatch bulk jobs and work items".into()),
                subjects: vec![JOBS_FILTER.to_owned(), ITEMS_FILTER.to_owned()],
                retention: stream::RetentionPolicy::WorkQueue,
                storage: stream::StorageType::File,
                duplicate_window: WORK_DUPLICATE_WINDOW,
                ..Default::default()
            },
            replicas,
        )
        .await
        .map_err(|e| unavailable(&e))?;
        let results = ensure_stream(
            &js,
            stream::Config {
                name: RESULTS_STREAM.to_owned(),
                description: Some("embatch bulk chunk results".into()),
                subjects: vec![RESULTS_FILTER.to_owned()],
                retention: stream::RetentionPolicy::Limits,
                storage: stream::StorageType::File,
                duplicate_window: RESULTS_DUPLICATE_WINDOW,
                ..Default::default()
            },
            replicas,
        )
        .await
        .map_err(|e| unavailable(&e))?;
        Ok(BulkStore {
            js,
            files,
            files_stream,
            batches,
            work,
            results,
            client,
        })
    }

    /// Sets the files' byte budget: the [`FILES_STREAM`]'s `max_bytes` (bytes as nats-server
    /// counts them: payload, subject and headers of every chunk and meta record), `0` for none.
    /// The stream discards new messages beyond it, so a put that does not fit fails and nothing
    /// stored is dropped; lowering the budget below what is stored drops nothing either (new
    /// files are refused until enough are deleted). Nothing is asked of the server when the
    /// budget is already `max_bytes`.
    ///
    /// # Errors
    /// [`BulkError::JetStream`] when the stream cannot be read or updated.
    pub async fn set_files_budget(&self, max_bytes: u64) -> Result<(), BulkError> {
        let info = self.files_stream.get_info().await.map_err(js_err)?;
        let want = budget_of(max_bytes);
        if info.config.max_bytes == want {
            return Ok(());
        }
        let mut config = info.config;
        config.max_bytes = want;
        self.js.update_stream(config).await.map_err(js_err)?;
        Ok(())
    }

    /// What the files take now, and their budget.
    ///
    /// # Errors
    /// [`BulkError::JetStream`] when the stream cannot be read.
    pub async fn files_usage(&self) -> Result<FilesUsage, BulkError> {
        let info = self.files_stream.get_info().await.map_err(js_err)?;
        Ok(FilesUsage {
            bytes: info.state.bytes,
            budget: u64::try_from(info.config.max_bytes).ok().filter(|b| *b > 0),
        })
    }

    /// The batch record of `id` and its KV revision; `None` when there is none.
    ///
    /// # Errors
    /// [`BulkError::JetStream`], [`BulkError::Malformed`].
    pub async fn batch(&self, id: &str) -> Result<Option<(BatchRecord, u64)>, BulkError> {
        if !is_valid_key(id) {
            // No record can have this key: no such batch (not a JetStream error).
            return Ok(None);
        }
        let Some(entry) = self.batches.entry(id).await.map_err(js_err)? else {
            return Ok(None);
        };
        if entry.operation != kv::Operation::Put {
            return Ok(None);
        }
        let record = decode(id, &entry.value)?;
        Ok(Some((record, entry.revision)))
    }

    /// Creates the record of a new batch (fails if the key exists).
    ///
    /// # Errors
    /// [`BulkError::JetStream`].
    pub async fn create_batch(&self, record: &BatchRecord) -> Result<(), BulkError> {
        let value = serde_json::to_vec(record).map_err(js_err)?;
        self.batches
            .create(&record.batch.id, Bytes::from(value))
            .await
            .map_err(js_err)?;
        Ok(())
    }

    /// Applies `change` to the record of `id` by compare-and-set on its revision, re-reading and
    /// re-applying on a conflict (another gateway or worker changed it first), so no update is
    /// lost. `change` returns `false` to leave the record as it is. Publishes the batch on
    /// [`events_subject`] when this change made its status final. Returns the record as it is
    /// now.
    ///
    /// # Errors
    /// [`BulkError::NotFound`], [`BulkError::JetStream`], [`BulkError::Malformed`].
    pub async fn update_batch(
        &self,
        id: &str,
        mut change: impl FnMut(&mut BatchRecord) -> bool,
    ) -> Result<BatchRecord, BulkError> {
        for _ in 0..1000 {
            let Some((mut record, revision)) = self.batch(id).await? else {
                return Err(BulkError::NotFound(id.to_owned()));
            };
            let was_final = record.batch.status.is_final();
            if !change(&mut record) {
                return Ok(record);
            }
            let value = serde_json::to_vec(&record).map_err(js_err)?;
            match self.batches.update(id, Bytes::from(value), revision).await {
                Ok(_) => {
                    if !was_final && record.batch.status.is_final() {
                        self.publish_event(&record.batch).await;
                    }
                    return Ok(record);
                }
                Err(err) if err.kind() == kv::UpdateErrorKind::WrongLastRevision => continue,
                Err(err) => return Err(js_err(err)),
            }
        }
        Err(BulkError::JetStream(format!(
            "batch {id}: 1000 concurrent updates in a row"
        )))
    }

    /// Cancels batch `id` as OpenAI's `POST /v1/batches/{id}/cancel` does: a `validating` or
    /// `in_progress` batch goes `cancelling` now (ending `cancelled`), and while it is
    /// `cancelling` a `finalize` job is published (deduplicated), which delivers what finished.
    /// A batch in any other status is left as it is. Returns the record as it is now.
    ///
    /// # Errors
    /// As [`BulkStore::update_batch`] and [`BulkStore::publish_job`].
    pub async fn cancel_batch(&self, id: &str) -> Result<BatchRecord, BulkError> {
        let now = embatch_protocol::bulk::unix_now();
        let record = self
            .update_batch(id, |record| match record.batch.status {
                BatchStatus::Validating | BatchStatus::InProgress => {
                    record.batch.status = BatchStatus::Cancelling;
                    record.batch.cancelling_at = Some(now);
                    record.embatch.ending = Some(BatchStatus::Cancelled);
                    true
                }
                _ => false,
            })
            .await?;
        if record.batch.status == BatchStatus::Cancelling {
            self.publish_job(id, JobKind::Finalize).await?;
        }
        Ok(record)
    }

    /// Publishes the job `kind` for `batch_id` on the work stream (deduplicated by
    /// `Nats-Msg-Id`) and waits for the stream's acknowledgement. Where no stream answers (a
    /// replicated stream just created, whose interest has not reached every node yet, or one
    /// whose leader is being elected), it is sent again every 100 ms for up to
    /// [`NO_STREAM_RETRY`]: the message id makes a repeat that did arrive count once.
    ///
    /// # Errors
    /// [`BulkError::JetStream`].
    pub async fn publish_job(&self, batch_id: &str, kind: JobKind) -> Result<(), BulkError> {
        let started = std::time::Instant::now();
        loop {
            let publish = PublishMessage::build()
                .message_id(job_msg_id(batch_id, kind))
                .payload(Bytes::new());
            let acked = match self
                .js
                .send_publish(job_subject(batch_id, kind), publish)
                .await
            {
                Ok(ack) => ack.await,
                Err(err) => Err(err),
            };
            match acked {
                Ok(_) => return Ok(()),
                Err(err)
                    if err.kind() == jetstream::context::PublishErrorKind::StreamNotFound
                        && started.elapsed() < NO_STREAM_RETRY =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(err) => return Err(js_err(err)),
            }
        }
    }

    /// Publishes `batch` on [`events_subject`] (core NATS, best effort: the KV record stays the
    /// source of truth).
    pub async fn publish_event(&self, batch: &Batch) {
        let Ok(payload) = serde_json::to_vec(batch) else {
            return;
        };
        let mut headers = HeaderMap::new();
        headers.insert("Embatch-Batch-Status", status_name(batch));
        if let Err(err) = self
            .client
            .publish_with_headers(events_subject(&batch.id), headers, Bytes::from(payload))
            .await
        {
            tracing::warn!(%err, batch = %batch.id, "cannot publish the batch event");
        }
    }
}

/// Binds the [`FILES_BUCKET`] object store, creating it with `replicas` copies and the budget
/// [`FILES_MAX_BYTES_DEFAULT`] when missing, or bringing the existing one to `replicas`.
/// nats-server reserves a stream's `max_bytes` out of its `max_file_store`: on a server with less
/// room than that, the store is created without a budget (logged), as before budgets existed,
/// rather than not at all.
async fn open_files(
    js: &jetstream::Context,
    replicas: ReplicaTarget,
) -> Result<object_store::ObjectStore, async_nats::Error> {
    if let Ok(store) = js.get_object_store(FILES_BUCKET).await {
        replicas.apply(js, FILES_STREAM).await?;
        return Ok(store);
    }
    let config = |max_bytes| object_store::Config {
        bucket: FILES_BUCKET.to_owned(),
        description: Some("embatch bulk files (inputs, outputs, errors)".into()),
        storage: stream::StorageType::File,
        max_bytes,
        num_replicas: replicas.count,
        ..Default::default()
    };
    let bind = || async { Ok(js.get_object_store(FILES_BUCKET).await?) };
    let budgeted = js.create_object_store(config(budget_of(FILES_MAX_BYTES_DEFAULT)));
    match create_or_bind(budgeted, bind).await {
        Ok(store) => Ok(store),
        Err(err) => {
            tracing::warn!(%err, budget = FILES_MAX_BYTES_DEFAULT, "cannot create the files' object store with its budget; creating it without");
            Ok(create_or_bind(js.create_object_store(config(-1)), bind).await?)
        }
    }
}

/// Binds the [`BATCHES_BUCKET`] KV bucket, creating it with `replicas` copies when missing, or
/// bringing the existing one to `replicas`.
async fn open_batches(
    js: &jetstream::Context,
    replicas: ReplicaTarget,
) -> Result<kv::Store, async_nats::Error> {
    if let Ok(store) = js.get_key_value(BATCHES_BUCKET).await {
        replicas.apply(js, &format!("KV_{BATCHES_BUCKET}")).await?;
        return Ok(store);
    }
    let created = js.create_key_value(kv::Config {
        bucket: BATCHES_BUCKET.to_owned(),
        description: "embatch bulk batch records".into(),
        history: 1,
        storage: stream::StorageType::File,
        num_replicas: replicas.count,
        ..Default::default()
    });
    let bind = || async { Ok(js.get_key_value(BATCHES_BUCKET).await?) };
    Ok(create_or_bind(created, bind).await?)
}

/// What the [`FILES_STREAM`] holds and may hold ([`BulkStore::files_usage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FilesUsage {
    /// Bytes stored, as nats-server counts them (the stream's `state.bytes`).
    pub bytes: u64,
    /// The budget (the stream's `max_bytes`); `None` when unlimited.
    pub budget: Option<u64>,
}

impl FilesUsage {
    /// Bytes the budget leaves; `None` when there is no budget.
    pub fn room(&self) -> Option<u64> {
        self.budget.map(|b| b.saturating_sub(self.bytes))
    }
}

/// A byte budget as a stream's `max_bytes`: `0` (none) is `-1`, JetStream's "unlimited".
fn budget_of(bytes: u64) -> i64 {
    match bytes {
        0 => -1,
        b => i64::try_from(b).unwrap_or(i64::MAX),
    }
}

/// Whether `key` can name a KV entry or an object: JetStream's rule, as async-nats checks it
/// before asking the server (`[-/_=.a-zA-Z0-9]+`, not starting or ending with `.`), and no empty
/// token (`a..b`: the KV subject `$KV.<bucket>.a..b` is no valid subject, and the server answers
/// no responders). A batch or file id that breaks it names nothing stored (the ids embatch
/// makes always keep it).
pub fn is_valid_key(key: &str) -> bool {
    !key.split('.').any(str::is_empty)
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'/' | b'_' | b'=' | b'.'))
}

fn status_name(batch: &Batch) -> String {
    serde_json::to_value(batch.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn decode(key: &str, value: &[u8]) -> Result<BatchRecord, BulkError> {
    serde_json::from_slice(value).map_err(|e| BulkError::Malformed {
        key: key.to_owned(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::{BulkStore, is_valid_key};
    use embatch_testkit::NatsServer;

    /// Gateways and workers start together and each creates what is missing: every one binds,
    /// whichever created the buckets and streams first. The server has room for one files'
    /// budget, not two (as a CI runner's small disk), so a late creator is refused for want of
    /// room, not for a different config.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn processes_opening_at_once_all_bind() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let conf = dir.path().join("nats.conf");
        let store_dir = dir.path().join("js");
        let text = format!(
            "jetstream {{ store_dir: {:?}, max_file_store: 6GB }}\n",
            store_dir.to_string_lossy()
        );
        std::fs::write(&conf, text).expect("writes the config");
        for _ in 0..5 {
            let _ = std::fs::remove_dir_all(&store_dir);
            let nats = NatsServer::start_with_args(&["-c", &conf.to_string_lossy()]);
            let mut opening = Vec::new();
            for _ in 0..6 {
                let client = async_nats::connect(nats.url()).await.expect("connect");
                opening.push(tokio::spawn(BulkStore::open(client)));
            }
            for open in opening {
                open.await.expect("joined").expect("bound");
            }
        }
    }

    #[test]
    fn keys_follow_jetstreams_rule() {
        for ok in ["batch_abc123", "file-x-output", "a.b", "a/b=c"] {
            assert!(is_valid_key(ok), "{ok}");
        }
        for bad in ["", ".a", "a.", "0..0", "a*b", "a>b", "a b", "é"] {
            assert!(!is_valid_key(bad), "{bad:?}");
        }
    }
}
