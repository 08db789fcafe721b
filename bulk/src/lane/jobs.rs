//! The jobs loop: `validate` ([`super::validate`]: read, check and split a batch's input file)
//! and `finalize` ([`super::finalize`]: deliver the results), one job at a time per worker.
//!
//! Both are safe to run again after a crash, and twice at once: items and results are
//! published with deterministic `Nats-Msg-Id`s, a finalization writes files of its own claim
//! and only the latest claim sets the final status ([`super::claim`]), and every record change
//! is a compare-and-set that checks the status it expects.
//!
//! **A job that keeps failing ends its batch.** A run fails by an error, a panic, or
//! [`stall_limit`] without progress; it is retried after [`RETRY_DELAY`] (NAK). A run that fails
//! on the `BULK_MAX_DELIVER`th delivery of its message, or any delivery past it (the runs before
//! ended without an answer: their worker stopped or died), is the last: the batch becomes
//! `failed` with the reason in its `errors` (`validation_failed`, `finalization_failed`), what
//! it left in the streams is removed, and the message is terminated, never redelivered
//! ([`give_up`]). [`give_up_bound`] is how long that takes at most. A `finalize` that waits for
//! its batch's chunks is not failing: it is NAKed after [`RETRY_DELAY`] until they are done, the
//! batch is cancelled or its completion window passes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::AckKind;
use embatch_protocol::bulk::{
    BatchError, BatchErrors, BatchRecord, BatchStatus, JobKind, batch_items_filter,
    parse_job_subject, results_subject, unix_now,
};
use futures::FutureExt;
use tokio_util::sync::CancellationToken;

use super::error::{LaneError, nats};
use super::{Lane, PullConsumer, delivered, with_progress};
use crate::BulkError;

/// The NAK delay of a failed job run, and of a `finalize` waiting for its batch's chunks.
pub(super) const RETRY_DELAY: Duration = Duration::from_secs(1);

/// Which delivery of its job message a run is, against `BULK_MAX_DELIVER`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Attempt {
    /// The message's delivery count (1 on the first).
    pub delivered: i64,
    /// `BULK_MAX_DELIVER`.
    pub max: i64,
}

impl Attempt {
    /// Refuses a run past the last delivery: the runs before ended without an answer, and this
    /// one would likely end as they did.
    ///
    /// # Errors
    /// [`LaneError::Exhausted`].
    pub fn check(self) -> Result<(), LaneError> {
        if self.delivered > self.max {
            return Err(LaneError::Exhausted {
                delivered: self.delivered,
                max: self.max,
            });
        }
        Ok(())
    }

    /// Whether a failed run on this delivery ends its batch.
    fn is_last(self) -> bool {
        self.delivered >= self.max
    }
}

/// How long a job may go without progress (see [`Beat`]) before it is abandoned and given
/// back for redelivery: twice `BULK_ACK_WAIT`, at least 30 s. Every step of a job (a line read,
/// a pull of results, a file write) is bounded far below it (a pull by its expiry plus 5 s, a
/// JetStream publish by its 5 s ack timeout), so only a job stuck for good reaches it.
pub(super) fn stall_limit(ack_wait: Duration) -> Duration {
    (ack_wait * 2).max(Duration::from_secs(30))
}

/// The longest a job whose runs keep failing holds its batch before the batch is `failed`,
/// counted from the job's first delivery and beyond the time its runs spend making progress:
/// `max_deliver` deliveries, each ending at most [`stall_limit`] after its last progress and
/// delivered again at most `ack_wait` later (its worker died just before the limit; a NAK
/// after a failed run waits only [`RETRY_DELAY`]); the delivery after the last gives up at
/// once. With the defaults (`BULK_MAX_DELIVER` 5, `BULK_ACK_WAIT` 30 s): 5 × (60 s + 30 s) =
/// 450 s, as docs/bulk.md says. Time a job waits for a free worker is not counted (each
/// worker runs one job at a time).
pub(super) fn give_up_bound(max_deliver: i64, ack_wait: Duration) -> Duration {
    let deliveries = u32::try_from(max_deliver.max(1)).unwrap_or(u32::MAX);
    (stall_limit(ack_wait) + ack_wait.max(RETRY_DELAY))
        .checked_mul(deliveries)
        .unwrap_or(Duration::MAX)
}

/// When a job last made progress. The in-progress acks of [`with_progress`] keep a job from
/// being redelivered however long it runs; without this bound a job stuck on a call that never
/// returns would hold its batch (e.g. in `finalizing`) for good. [`run`] abandons a job whose
/// beat is older than [`stall_limit`] and NAKs it, so it runs again, here or on another worker.
#[derive(Clone)]
pub(super) struct Beat {
    started: tokio::time::Instant,
    /// Milliseconds after `started` of the last progress.
    last_ms: Arc<AtomicU64>,
}

impl Beat {
    pub(super) fn new() -> Beat {
        Beat {
            started: tokio::time::Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Records progress now.
    pub(super) fn beat(&self) {
        let now = self.started.elapsed().as_millis() as u64;
        self.last_ms.store(now, Ordering::Relaxed);
    }

    /// How long since the last progress (or the start).
    pub(super) fn idle(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.started.elapsed().saturating_sub(last)
    }

    /// Completes once the job has made no progress for `limit` (checked every second).
    pub(super) async fn stalled(&self, limit: Duration) {
        let every = (limit / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
        loop {
            tokio::time::sleep(every).await;
            if self.idle() >= limit {
                return;
            }
        }
    }
}

/// Why a batch is ending early (`cancelled` or `expired`, its final status), or `None`. A
/// `cancelling` record without `ending` (a client that set the status alone) is ending
/// `cancelled`, so its finalization never waits for chunks no worker will run.
pub(super) fn ending_of(record: &BatchRecord) -> Option<BatchStatus> {
    record.embatch.ending.or_else(|| {
        (record.batch.status == BatchStatus::Cancelling).then_some(BatchStatus::Cancelled)
    })
}

/// Pulls and runs job messages until `stop`.
pub(super) async fn run(lane: Arc<Lane>, consumer: PullConsumer, stop: CancellationToken) {
    loop {
        let Some(message) = super::next_message(&consumer, &stop, "bulk jobs").await else {
            return;
        };
        let ack = match handle(&lane, &message, &stop).await {
            Handled::Answer(ack) => ack,
            // Another delivery of the message holds the job: an answer to this one would
            // answer (or drop) that one.
            Handled::Superseded => continue,
            Handled::Stopped => {
                // Give it back at once instead of after the ack wait.
                let _ = message.ack_with(AckKind::Nak(None)).await;
                return;
            }
        };
        if let Err(err) = message.ack_with(ack).await {
            tracing::warn!(%err, "cannot acknowledge a bulk job; it will be redelivered");
        }
    }
}

/// What becomes of a job message once [`handle`] ran it.
enum Handled {
    /// This answer is sent.
    Answer(AckKind),
    /// None: a later delivery of the same message runs the job (a `finalize` that lost its
    /// claim), and the server would take an answer to this one as the answer to that one.
    Superseded,
    /// The worker is stopping: the message is given back.
    Stopped,
}

/// Runs one job message and says what becomes of it.
async fn handle(
    lane: &Lane,
    message: &async_nats::jetstream::Message,
    stop: &CancellationToken,
) -> Handled {
    let limit = stall_limit(lane.config.ack_wait);
    let attempt = Attempt {
        delivered: delivered(message),
        max: lane.config.max_deliver,
    };
    let beat = Beat::new();
    let job = std::panic::AssertUnwindSafe(job(lane, &message.subject, &beat, attempt))
        .catch_unwind()
        .map(|ran| ran.unwrap_or_else(|panic| Err(LaneError::Panicked(panic_message(&*panic)))));
    let ran = tokio::select! {
        ran = with_progress(message, lane.config.ack_wait, job) => ran,
        () = beat.stalled(limit) => {
            metrics::counter!(crate::names::BULK_JOBS_STALLED).increment(1);
            Err(LaneError::Stalled(limit))
        }
        () = stop.cancelled() => return Handled::Stopped,
    };
    match ran {
        Ok(Some(ack)) => Handled::Answer(ack),
        Ok(None) => Handled::Superseded,
        Err(err) => Handled::Answer(after_failure(lane, &message.subject, attempt, &err).await),
    }
}

/// What becomes of a job message whose run failed: NAKed for another run, or, on its last
/// delivery, terminated once its batch is ended ([`give_up`]).
async fn after_failure(lane: &Lane, subject: &str, attempt: Attempt, err: &LaneError) -> AckKind {
    let Some((batch_id, kind)) = parse_job_subject(subject) else {
        return AckKind::Term;
    };
    let (delivered, max) = (attempt.delivered, attempt.max);
    if !attempt.is_last() {
        tracing::warn!(%err, batch = batch_id, job = kind.as_str(), delivered, max, "bulk job failed; redelivering");
        return AckKind::Nak(Some(RETRY_DELAY));
    }
    tracing::error!(%err, batch = batch_id, job = kind.as_str(), delivered, max, "bulk job failed on its last delivery; its batch fails");
    match give_up(lane, batch_id, kind, attempt, err).await {
        Ok(()) => AckKind::Term,
        Err(again) => {
            tracing::warn!(err = %again, batch = batch_id, "cannot end the batch of a failed bulk job; redelivering");
            AckKind::Nak(Some(RETRY_DELAY))
        }
    }
}

/// Runs the job of `subject`: the answer to its message, `None` when a later delivery of the
/// message runs it.
async fn job(
    lane: &Lane,
    subject: &str,
    beat: &Beat,
    attempt: Attempt,
) -> Result<Option<AckKind>, LaneError> {
    let Some((batch_id, kind)) = parse_job_subject(subject) else {
        tracing::error!(subject, "not a bulk job subject; dropped");
        return Ok(Some(AckKind::Term));
    };
    match kind {
        JobKind::Validate => {
            attempt.check()?;
            super::validate::validate(lane, batch_id, beat)
                .await
                .map(Some)
        }
        JobKind::Finalize => super::finalize::finalize(lane, batch_id, beat, attempt).await,
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned())
}

/// Ends the batch of a job that keeps failing: `failed`, its `errors` naming the job, the
/// delivery and the last error; then removes what the batch left (its work items and results,
/// and for `finalize` the files it may have begun). A `validate` job leaves a batch that is no
/// longer `validating`, or is ending, as it is (a cancel or an expiry is finalize's to end);
/// `finalize` leaves a final batch as it is.
///
/// # Errors
/// The record could not be updated (the job is redelivered and given up again).
async fn give_up(
    lane: &Lane,
    batch_id: &str,
    kind: JobKind,
    attempt: Attempt,
    err: &LaneError,
) -> Result<(), LaneError> {
    let code = match kind {
        JobKind::Validate => "validation_failed",
        JobKind::Finalize => "finalization_failed",
    };
    let message = format!(
        "the batch's {} job failed on delivery {} of at most {} (BULK_MAX_DELIVER): {err}",
        kind.as_str(),
        attempt.delivered,
        attempt.max
    );
    let now = unix_now();
    let mut applied = false;
    let mut claims = 0;
    let updated = lane
        .store
        .update_batch(batch_id, |record| {
            claims = record.embatch.finalizer;
            applied = match kind {
                JobKind::Validate => {
                    record.batch.status == BatchStatus::Validating && ending_of(record).is_none()
                }
                JobKind::Finalize => !record.batch.status.is_final(),
            };
            if applied {
                record.batch.status = BatchStatus::Failed;
                record.batch.failed_at = Some(now);
                record.batch.errors = Some(BatchErrors {
                    object: "list".into(),
                    data: vec![BatchError {
                        code: code.to_owned(),
                        message: message.clone(),
                        param: None,
                        line: None,
                    }],
                });
            }
            applied
        })
        .await;
    match updated {
        Ok(_) if applied => {}
        Ok(_) | Err(BulkError::NotFound(_)) => return Ok(()),
        Err(err) => return Err(err.into()),
    }
    // Best effort: the batch is failed whatever of this fails.
    if let Err(err) = purge_items(lane, batch_id).await {
        tracing::warn!(%err, batch = batch_id, "cannot purge a failed batch's items");
    }
    let results = lane
        .store
        .results
        .purge()
        .filter(results_subject(batch_id))
        .await;
    if let Err(err) = results {
        tracing::warn!(%err, batch = batch_id, "cannot purge a failed batch's results");
    }
    if kind == JobKind::Finalize {
        // The files of every claim, absent unless its run began writing them.
        super::claim::delete_files(&lane.store, batch_id, 1..=claims).await;
    }
    Ok(())
}

/// Removes the batch's remaining work items from the work queue.
pub(super) async fn purge_items(lane: &Lane, batch_id: &str) -> Result<(), LaneError> {
    lane.store
        .work
        .purge()
        .filter(batch_items_filter(batch_id))
        .await
        .map_err(nats(format!("cannot purge the items of {batch_id}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stall_limit_is_twice_the_ack_wait_and_at_least_30_s() {
        assert_eq!(
            stall_limit(Duration::from_secs(30)),
            Duration::from_secs(60)
        );
        assert_eq!(stall_limit(Duration::from_secs(1)), Duration::from_secs(30));
    }

    /// The worker checks that its defaults make the bound docs/bulk.md gives
    /// (`worker/src/bulk.rs`).
    #[test]
    fn a_failing_job_ends_its_batch_within_its_deliveries_of_stall_limit_and_ack_wait() {
        assert_eq!(
            give_up_bound(5, Duration::from_secs(30)),
            Duration::from_secs(5 * (60 + 30))
        );
        // Each delivery is bounded by its stall limit plus the longer of the ack wait and the
        // NAK delay: small settings, as the tests use, still give at least 30 s a delivery.
        assert_eq!(
            give_up_bound(2, Duration::from_millis(500)),
            Duration::from_secs(62)
        );
        assert_eq!(
            give_up_bound(0, Duration::from_secs(1)),
            Duration::from_secs(31)
        );
    }

    #[test]
    fn a_failed_run_ends_the_batch_on_the_last_delivery_and_none_runs_past_it() {
        let at = |delivered| Attempt { delivered, max: 3 };
        assert!(!at(1).is_last() && at(1).check().is_ok());
        assert!(
            at(3).is_last() && at(3).check().is_ok(),
            "the last still runs"
        );
        assert!(
            matches!(
                at(4).check(),
                Err(LaneError::Exhausted {
                    delivered: 4,
                    max: 3
                })
            ),
            "past the last, no run"
        );
    }

    #[test]
    fn a_cancelling_batch_is_ending_even_without_its_bookkeeping() {
        let record: BatchRecord = serde_json::from_value(serde_json::json!({
            "id": "batch_x", "object": "batch", "endpoint": "/v1/embeddings",
            "input_file_id": "file-x", "completion_window": "24h", "status": "cancelling",
            "created_at": 0, "request_counts": {"total": 0, "completed": 0, "failed": 0}
        }))
        .expect("a record");
        assert_eq!(ending_of(&record), Some(BatchStatus::Cancelled));
        let mut expiring = record.clone();
        expiring.batch.status = BatchStatus::InProgress;
        assert_eq!(ending_of(&expiring), None);
        expiring.embatch.ending = Some(BatchStatus::Expired);
        assert_eq!(ending_of(&expiring), Some(BatchStatus::Expired));
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_is_stalled_only_once_it_went_the_limit_without_progress() {
        let limit = Duration::from_secs(30);
        let beat = Beat::new();
        let stalled = beat.stalled(limit);
        tokio::pin!(stalled);
        // Progress every 20 s keeps it going for 100 s, over three times the limit.
        for _ in 0..5 {
            tokio::select! {
                () = &mut stalled => panic!("stalled at {:?} while making progress", beat.idle()),
                () = tokio::time::sleep(Duration::from_secs(20)) => beat.beat(),
            }
        }
        let last = tokio::time::Instant::now();
        stalled.await;
        let waited = last.elapsed();
        assert!(
            waited >= limit && waited <= limit + Duration::from_secs(1),
            "stalled {waited:?} after the last progress, limit {limit:?}"
        );
    }
}
