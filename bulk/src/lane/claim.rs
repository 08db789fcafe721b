//! Claims of a batch's finalization. JetStream delivers a `finalize` job at least once: after a
//! consumer leader changes (a node killed), a job still running may be delivered again to
//! another worker, so two runs overlap. Were both to write the same files, the later one could
//! read what the earlier one had already purged and overwrite a complete output file with an
//! empty one. So each run first claims the batch (a compare-and-set of the record's
//! `finalizer` count), writes files named after its claim, and may set the final status only
//! while its claim is still the latest; a run that lost its claim deletes its own files and
//! leaves the job to the run that holds it.

use crate::store::BulkStore;
use async_nats::jetstream::object_store::DeleteErrorKind;
use embatch_protocol::bulk::{BatchStatus, unix_now};

use super::error::LaneError;

/// What a finalization run wrote: the line counts and the files kept (a file that would be
/// empty is not kept).
pub(super) struct Delivered {
    pub completed: u64,
    pub failed: u64,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
}

/// The ids of the output and error files of claim `claim` of `batch_id`: `file-<batch
/// nuid>-output` and `-errors` for the first claim, with `-<claim>` after them for a later one.
pub(super) fn file_ids(batch_id: &str, claim: u32) -> (String, String) {
    let suffix = batch_id.strip_prefix("batch_").unwrap_or(batch_id);
    let run = if claim <= 1 {
        String::new()
    } else {
        format!("-{claim}")
    };
    (
        format!("file-{suffix}-output{run}"),
        format!("file-{suffix}-errors{run}"),
    )
}

/// Claims the finalization of `batch_id`: counts one more claim and, for an `in_progress`
/// batch that is not `ending` early (cancelled or expired: it keeps its status until final),
/// sets it `finalizing`. Returns the claim, or `None` when the batch is final already
/// (nothing is left to do). Then deletes the files of every earlier claim: a run that died
/// after writing them left them behind.
///
/// # Errors
/// The record cannot be read or updated.
pub(super) async fn claim(
    store: &BulkStore,
    batch_id: &str,
    ending: bool,
) -> Result<Option<u32>, LaneError> {
    let now = unix_now();
    let mut claim = None;
    store
        .update_batch(batch_id, |record| {
            claim = None;
            if record.batch.status.is_final() {
                return false;
            }
            if !ending && record.batch.status == BatchStatus::InProgress {
                record.batch.status = BatchStatus::Finalizing;
                record.batch.finalizing_at = Some(now);
            }
            record.embatch.finalizer = record.embatch.finalizer.saturating_add(1);
            claim = Some(record.embatch.finalizer);
            true
        })
        .await?;
    if let Some(claim) = claim {
        delete_files(store, batch_id, 1..claim).await;
    }
    Ok(claim)
}

/// Sets the final status with the exact counts and the files of claim `claim`, unless the
/// batch is final already or a later run claimed it: `(final status, whether the batch is
/// ending early, the claim)`. Returns whether it set them.
///
/// # Errors
/// The record cannot be read or updated.
pub(super) async fn set_final(
    store: &BulkStore,
    batch_id: &str,
    (final_status, ending, claim): (BatchStatus, bool, u32),
    delivered: &Delivered,
) -> Result<bool, LaneError> {
    let now = unix_now();
    let mut applied = false;
    store
        .update_batch(batch_id, |record| {
            applied = record.embatch.finalizer == claim && !record.batch.status.is_final();
            if !applied {
                return false;
            }
            record.batch.status = final_status;
            match final_status {
                BatchStatus::Expired => record.batch.expired_at = Some(now),
                BatchStatus::Cancelled => record.batch.cancelled_at = Some(now),
                _ => record.batch.completed_at = Some(now),
            }
            record.batch.output_file_id = delivered.output_file_id.clone();
            record.batch.error_file_id = delivered.error_file_id.clone();
            record.batch.request_counts.completed = delivered.completed;
            record.batch.request_counts.failed = delivered.failed;
            if ending && record.batch.request_counts.total == 0 {
                record.batch.request_counts.total = delivered.completed + delivered.failed;
            }
            true
        })
        .await?;
    Ok(applied)
}

/// Deletes the output and error files of the claims `claims` of `batch_id`, if they exist
/// (best effort: a file that cannot be deleted now is logged).
pub(super) async fn delete_files(
    store: &BulkStore,
    batch_id: &str,
    claims: impl IntoIterator<Item = u32>,
) {
    for claim in claims {
        let (output, errors) = file_ids(batch_id, claim);
        for id in [output, errors] {
            match store.files.delete(&id).await {
                Ok(()) => tracing::debug!(batch = batch_id, id, "deleted a superseded file"),
                Err(err) if err.kind() == DeleteErrorKind::NotFound => {}
                Err(err) => {
                    tracing::warn!(%err, batch = batch_id, id, "cannot delete a superseded file")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use embatch_protocol::bulk::BatchRecord;
    use embatch_testkit::NatsServer;

    #[test]
    fn the_first_claim_keeps_the_plain_ids_and_a_later_one_is_numbered() {
        assert_eq!(
            file_ids("batch_abc", 1),
            ("file-abc-output".to_owned(), "file-abc-errors".to_owned())
        );
        assert_eq!(
            file_ids("batch_abc", 3),
            (
                "file-abc-output-3".to_owned(),
                "file-abc-errors-3".to_owned()
            )
        );
    }

    /// A record `in_progress` with its one chunk done, as a `finalize` job finds it.
    async fn batch(store: &BulkStore) -> String {
        let record = serde_json::json!({
            "id": format!("batch_{}", nuid::next()),
            "object": "batch",
            "endpoint": "/v1/embeddings",
            "input_file_id": "file-input",
            "completion_window": "24h",
            "status": "in_progress",
            "created_at": unix_now(),
            "request_counts": {"total": 2, "completed": 2, "failed": 0},
            "embatch": {"chunks": 1, "done": "01"},
        });
        let record: BatchRecord = serde_json::from_value(record).expect("a batch record");
        store.create_batch(&record).await.expect("record created");
        record.batch.id
    }

    async fn put(store: &BulkStore, id: &str) {
        let mut bytes: &[u8] = b"{\"custom_id\":\"a\"}\n";
        store.files.put(id, &mut bytes).await.expect("file stored");
    }

    async fn exists(store: &BulkStore, id: &str) -> bool {
        store.files.info(id).await.is_ok_and(|info| !info.deleted)
    }

    fn delivered(output_file_id: &str) -> Delivered {
        Delivered {
            completed: 2,
            failed: 0,
            output_file_id: Some(output_file_id.to_owned()),
            error_file_id: None,
        }
    }

    /// Two runs overlap (a job delivered again while its first run still holds it): the later
    /// claim wins, the earlier one can no longer set the final status, the files the earlier
    /// one wrote are deleted by the later claim, and no run claims a final batch.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn of_overlapping_runs_only_the_latest_claim_ends_the_batch() {
        let nats = NatsServer::start_jetstream();
        let client = async_nats::connect(nats.url()).await.expect("connect");
        let store = BulkStore::open(client).await.expect("JetStream");
        let id = batch(&store).await;

        let first = claim(&store, &id, false).await.expect("claimed");
        assert_eq!(first, Some(1));
        let (record, _) = store.batch(&id).await.expect("read").expect("a record");
        assert_eq!(record.batch.status, BatchStatus::Finalizing);
        assert!(record.batch.finalizing_at.is_some());
        let (first_output, _) = file_ids(&id, 1);
        put(&store, &first_output).await;

        let second = claim(&store, &id, false).await.expect("claimed");
        assert_eq!(second, Some(2));
        assert!(
            !exists(&store, &first_output).await,
            "the earlier claim's file is deleted"
        );

        let ending = (BatchStatus::Completed, false, 1);
        let set = set_final(&store, &id, ending, &delivered(&first_output)).await;
        assert!(!set.expect("record read"), "the earlier claim lost");
        let (record, _) = store.batch(&id).await.expect("read").expect("a record");
        assert_eq!(record.batch.status, BatchStatus::Finalizing);

        let (second_output, _) = file_ids(&id, 2);
        put(&store, &second_output).await;
        let ending = (BatchStatus::Completed, false, 2);
        let set = set_final(&store, &id, ending, &delivered(&second_output)).await;
        assert!(set.expect("record read"), "the latest claim ends the batch");
        let (record, _) = store.batch(&id).await.expect("read").expect("a record");
        assert_eq!(record.batch.status, BatchStatus::Completed);
        assert_eq!(
            record.batch.output_file_id.as_deref(),
            Some(second_output.as_str())
        );
        assert_eq!(record.batch.request_counts.completed, 2);

        // A run that passed its status check before the batch ended finds nothing to claim,
        // and so never touches the files delivered.
        assert_eq!(claim(&store, &id, false).await.expect("read"), None);
        assert!(exists(&store, &second_output).await);

        // A batch ending early (cancelled or expired) keeps its status until it is final.
        let ending = batch(&store).await;
        assert_eq!(claim(&store, &ending, true).await.expect("read"), Some(1));
        let (record, _) = store.batch(&ending).await.expect("read").expect("a record");
        assert_eq!(record.batch.status, BatchStatus::InProgress);
    }
}
