//! Removes what failed uploads left in the `EMBATCH_FILES` object store's stream, and discards
//! refused uploads whole.
//!
//! async-nats's `ObjectStore::put` publishes an object's chunks on `$O.EMBATCH_FILES.C.<nuid>`
//! as it reads them and writes the object's meta record (which names the nuid) only at the end:
//! when the store fails in between (the budget filled by another upload, nats-server gone), the
//! chunks stay and no record owns them, so no `DELETE` can reach them. [`sweep`] finds chunk
//! subjects that no object names and whose newest message is older than a cutoff, and purges
//! them. The gateway runs it at start and every [`SWEEP_INTERVAL`] with the cutoff
//! [`SWEEP_GRACE`] ago ([`run`]).
//!
//! An upload in progress (on this gateway or another) has chunks and no record yet: the grace
//! keeps it. A chunk arrives at least every [`super::upload::UPLOAD_IDLE_TIMEOUT`] (an upload
//! idle longer is refused and discarded), far less than the grace, so an upload in progress never
//! looks abandoned; the grace also absorbs clock skew between the gateway (its clock sets the
//! cutoff) and nats-server (its clock stamps the messages). Several gateways may sweep at once:
//! each one purges only subjects that no object owns, and purging a subject twice is harmless.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use async_nats::jetstream::stream::LastRawMessageErrorKind;
use base64::Engine;
use embatch_bulk::{BulkError, BulkStore};
use embatch_protocol::bulk::FILES_BUCKET;
use futures::{StreamExt, TryStreamExt};
use tokio_util::sync::CancellationToken;

use super::Binding;

/// How old the newest chunk of an unowned chunk subject must be before [`run`] purges it: an
/// hour, far above [`super::upload::UPLOAD_IDLE_TIMEOUT`] and any plausible clock skew.
pub const SWEEP_GRACE: Duration = Duration::from_secs(60 * 60);

/// How often [`run`] sweeps after the sweep at start: hourly. A failed upload's chunks stay at
/// most [`SWEEP_GRACE`] plus this long.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(60 * 60);

/// What one [`sweep`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Chunk subjects purged (one per abandoned upload).
    pub subjects: usize,
    /// Messages purged (the chunks).
    pub messages: u64,
}

/// Why a sweep stopped (nothing is purged after a failed listing).
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// The store could not be bound.
    #[error(transparent)]
    Store(#[from] BulkError),
    /// The objects could not be listed.
    #[error("cannot list the files: {0}")]
    List(String),
    /// The chunk subjects or their newest message could not be read.
    #[error("cannot read the files' chunk subjects: {0}")]
    Chunks(String),
    /// A purge failed.
    #[error("cannot purge {subject}: {reason}")]
    Purge {
        /// The chunk subject.
        subject: String,
        /// The server's answer.
        reason: String,
    },
}

/// The sweeper: binds the store (which sets the files' budget), sweeps with the cutoff
/// [`SWEEP_GRACE`] ago, then again every [`SWEEP_INTERVAL`], until `stop` is cancelled. A sweep
/// that fails (JetStream not available yet) is logged and tried again at the next interval.
pub(crate) async fn run(binding: Binding, stop: CancellationToken) {
    loop {
        let swept = async {
            let store = binding.store().await?;
            let cutoff = SystemTime::now()
                .checked_sub(SWEEP_GRACE)
                .unwrap_or(SystemTime::UNIX_EPOCH);
            sweep(store, cutoff).await
        };
        tokio::select! {
            () = stop.cancelled() => return,
            swept = swept => match swept {
                Ok(swept) if swept.subjects > 0 => tracing::info!(
                    subjects = swept.subjects,
                    messages = swept.messages,
                    "removed the chunks of abandoned uploads"
                ),
                Ok(_) => {}
                Err(SweepError::Store(err)) => {
                    tracing::debug!(%err, "bulk store not available; no sweep");
                }
                Err(err) => tracing::warn!(%err, "sweeping the files' stream failed"),
            },
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(SWEEP_INTERVAL) => {}
        }
    }
}

/// Purges every chunk subject of the files' stream that no object names and whose newest message
/// is older than `cutoff` (nats-server's timestamp).
///
/// The objects are listed first: an upload whose record is written after that has published a
/// chunk just before, so its newest chunk is younger than any sensible cutoff. Only unowned
/// subjects have their newest message read.
///
/// # Errors
/// [`SweepError`]; nothing more is purged after the first error.
pub async fn sweep(store: &BulkStore, cutoff: SystemTime) -> Result<Swept, SweepError> {
    let owned = owned_nuids(store).await?;
    let prefix = chunk_prefix();
    let subjects: Vec<(String, usize)> = store
        .files_stream
        .info_with_subjects(format!("{prefix}>"))
        .await
        .map_err(|e| SweepError::Chunks(e.to_string()))?
        .try_collect()
        .await
        .map_err(|e| SweepError::Chunks(e.to_string()))?;
    let mut swept = Swept::default();
    for (subject, count) in subjects {
        let nuid = subject.strip_prefix(&prefix).unwrap_or(&subject);
        if owned.contains(nuid) || !older_than(store, &subject, cutoff).await? {
            continue;
        }
        store
            .files_stream
            .purge()
            .filter(&subject)
            .await
            .map_err(|e| SweepError::Purge {
                subject: subject.clone(),
                reason: e.to_string(),
            })?;
        swept.subjects += 1;
        swept.messages += count as u64;
    }
    Ok(swept)
}

/// The nuids of every object stored (deleted ones excluded: their chunks are purged by the
/// delete, or by this sweep when that purge failed).
async fn owned_nuids(store: &BulkStore) -> Result<HashSet<String>, SweepError> {
    let list = |e: &dyn std::fmt::Display| SweepError::List(e.to_string());
    let mut objects = store.files.list().await.map_err(|e| list(&e))?;
    let mut owned = HashSet::new();
    while let Some(info) = objects.next().await {
        owned.insert(info.map_err(|e| list(&e))?.nuid);
    }
    Ok(owned)
}

/// Whether the newest message on `subject` is older than `cutoff` (`false` when it has none
/// left: someone purged it meanwhile).
async fn older_than(
    store: &BulkStore,
    subject: &str,
    cutoff: SystemTime,
) -> Result<bool, SweepError> {
    match store
        .files_stream
        .get_last_raw_message_by_subject(subject)
        .await
    {
        Ok(message) => Ok(SystemTime::from(message.time) < cutoff),
        Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(false),
        Err(err) => Err(SweepError::Chunks(err.to_string())),
    }
}

/// `$O.EMBATCH_FILES.C.`: the chunk subjects' prefix (async-nats's layout).
pub fn chunk_prefix() -> String {
    format!("$O.{FILES_BUCKET}.C.")
}

/// `$O.EMBATCH_FILES.M.<name, base64url>`: the subject of object `name`'s meta record
/// (async-nats's layout; its `delete` leaves a record there marked deleted).
pub fn meta_subject(name: &str) -> String {
    let encoded = base64::engine::general_purpose::URL_SAFE.encode(name);
    format!("$O.{FILES_BUCKET}.M.{encoded}")
}

/// Why [`discard`] stopped, naming the step that failed and the server's reason.
#[derive(Debug, thiserror::Error)]
pub enum DiscardError {
    /// async-nats's `delete` (its chunks and the record marked deleted) failed.
    #[error("cannot delete {name}: {source}")]
    Delete {
        /// The object.
        name: String,
        /// The server's answer.
        source: async_nats::jetstream::object_store::DeleteError,
    },
    /// The purge of the object's meta record failed.
    #[error("cannot purge the record of {name}: {source}")]
    PurgeRecord {
        /// The object.
        name: String,
        /// The server's answer.
        source: async_nats::jetstream::stream::PurgeError,
    },
}

/// Removes object `name` entirely: its chunks (async-nats's `delete`) and then its meta record,
/// so that no message of it stays in the stream. Used for uploads refused after `put` stored
/// them.
///
/// # Errors
/// [`DiscardError`] when either step fails (the sweeper removes chunks left by a failed delete;
/// a meta record left marked deleted is a few hundred bytes).
pub async fn discard(store: &BulkStore, name: &str) -> Result<(), DiscardError> {
    store
        .files
        .delete(name)
        .await
        .map_err(|source| DiscardError::Delete {
            name: name.to_owned(),
            source,
        })?;
    store
        .files_stream
        .purge()
        .filter(meta_subject(name))
        .await
        .map_err(|source| DiscardError::PurgeRecord {
            name: name.to_owned(),
            source,
        })?;
    Ok(())
}
