//! A batch submitted the way any NATS client can, by the documented contract: the input file
//! into `EMBATCH_FILES`, the record into `EMBATCH_BATCHES` (as the JSON another language would
//! write), and the job on the jobs stream.
#![allow(dead_code)] // not every test binary uses every helper

use std::time::{Duration, Instant};

use async_nats::jetstream::object_store::ObjectMetadata;
use embatch_bulk::BulkStore;
use embatch_protocol::bulk::{
    Batch, BatchRecord, BatchStatus, JobKind, META_CREATED_AT, META_FILENAME, META_PURPOSE,
    RequestCounts, unix_now,
};

/// Stores `bytes` as an input file `in.jsonl` (`purpose: batch`); returns its id, `file-<nuid>`.
///
/// # Panics
/// When the store does not take it.
pub async fn put_file(store: &BulkStore, bytes: &[u8]) -> String {
    let id = format!("file-{}", nuid::next());
    let meta = ObjectMetadata {
        name: id.clone(),
        metadata: [
            (META_PURPOSE.to_owned(), "batch".to_owned()),
            (META_FILENAME.to_owned(), "in.jsonl".to_owned()),
            (META_CREATED_AT.to_owned(), unix_now().to_string()),
        ]
        .into_iter()
        .collect(),
        ..Default::default()
    };
    let mut reader = bytes;
    store
        .files
        .put(meta, &mut reader)
        .await
        .expect("file stored");
    id
}

/// Creates the record of a `/v1/embeddings` batch of `file_id` in `status` (a 24 h window;
/// `cancelling_at` and `ending` set when cancelling) and publishes `job`; returns the batch id,
/// `batch_<nuid>`.
///
/// # Panics
/// When the store does not take the record or the job.
pub async fn create(store: &BulkStore, file_id: &str, status: BatchStatus, job: JobKind) -> String {
    let now = unix_now();
    let cancelling = status == BatchStatus::Cancelling;
    let record = serde_json::json!({
        "id": format!("batch_{}", nuid::next()),
        "object": "batch",
        "endpoint": "/v1/embeddings",
        "input_file_id": file_id,
        "completion_window": "24h",
        "status": status,
        "created_at": now,
        "expires_at": now + 86_400,
        "cancelling_at": cancelling.then_some(now),
        "request_counts": RequestCounts::default(),
        "embatch": {"ending": cancelling.then_some(BatchStatus::Cancelled)},
    });
    let record: BatchRecord = serde_json::from_value(record).expect("a batch record");
    store.create_batch(&record).await.expect("record created");
    store
        .publish_job(&record.batch.id, job)
        .await
        .expect("job published");
    record.batch.id
}

/// Polls the batch record (through reconnects) until `done`, at most `limit`.
///
/// # Panics
/// Past `limit`, naming `what` and the record as it is then.
pub async fn wait(
    store: &BulkStore,
    id: &str,
    (limit, what): (Duration, &str),
    done: impl Fn(&Batch) -> bool,
) -> Batch {
    let started = Instant::now();
    loop {
        if let Ok(Some((record, _))) = store.batch(id).await
            && done(&record.batch)
        {
            return record.batch;
        }
        assert!(
            started.elapsed() < limit,
            "{what}: batch {id} never got there: {:?}",
            store.batch(id).await.ok().flatten().map(|(r, _)| r.batch)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The text of a stored file.
///
/// # Panics
/// When the file cannot be read or is not UTF-8.
pub async fn read_file(store: &BulkStore, id: &str) -> String {
    let mut object = store.files.get(id).await.expect("file");
    let mut text = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut object, &mut text)
        .await
        .expect("a UTF-8 file");
    text
}
