//! The jobs loop: `validate` (read, check and split a batch's input file) and `finalize`
//! (deliver the results), one job at a time per worker.
//!
//! Both are safe to run again after a crash: items and results are published with
//! deterministic `Nats-Msg-Id`s, output files have deterministic ids (a rerun overwrites them),
//! and every record change is a compare-and-set that checks the status it expects.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::consumer;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::object_store::ObjectMetadata;
use async_nats::jetstream::{AckKind, Message};
use bytes::Bytes;
use embatch_protocol::bulk::{
    BatchErrors, BatchStatus, ChunkResult, Item, ItemLine, JobKind, META_CREATED_AT, META_FILENAME,
    META_PURPOSE, batch_items_filter, item_msg_id, items_subject, parse_job_subject,
    results_subject, unix_now,
};
use futures::StreamExt;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::lines::{FileCheck, custom_id_of};
use super::{Lane, PullConsumer, render, with_progress};

/// Most entries of a failed batch's `errors` list (the KV value must stay under `max_payload`).
const MAX_ERRORS: usize = 1000;

/// Item publishes awaited together during a split.
const PUBLISH_WINDOW: usize = 256;

/// How long a job may go without progress (see [`Beat`]) before it is abandoned and given
/// back for redelivery: twice `BULK_ACK_WAIT`, at least 30 s. Every step of a job (a line read,
/// a pull of results, a file write) is bounded far below it (a pull by its expiry plus 5 s, a
/// JetStream publish by its 5 s ack timeout), so only a job stuck for good reaches it.
pub(super) fn stall_limit(ack_wait: Duration) -> Duration {
    (ack_wait * 2).max(Duration::from_secs(30))
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

/// Pulls and runs job messages until `stop`.
pub(super) async fn run(lane: Arc<Lane>, consumer: PullConsumer, stop: CancellationToken) {
    let limit = stall_limit(lane.config.ack_wait);
    loop {
        let Some(message) = super::next_message(&consumer, &stop, "bulk jobs").await else {
            return;
        };
        let beat = Beat::new();
        let kind = tokio::select! {
            kind = with_progress(&message, lane.config.ack_wait, job(&lane, &message, &beat)) => kind,
            () = beat.stalled(limit) => {
                metrics::counter!(crate::telemetry::names::BULK_JOBS_STALLED).increment(1);
                Err(format!("no progress for {limit:?}; abandoned"))
            }
            () = stop.cancelled() => {
                let _ = message.ack_with(AckKind::Nak(None)).await;
                return;
            }
        };
        let ack = match kind {
            Ok(kind) => kind,
            Err(err) => {
                tracing::warn!(%err, subject = %message.subject, "bulk job failed; redelivering");
                AckKind::Nak(Some(Duration::from_secs(1)))
            }
        };
        if let Err(err) = message.ack_with(ack).await {
            tracing::warn!(%err, "cannot acknowledge a bulk job; it will be redelivered");
        }
    }
}

async fn job(lane: &Lane, message: &Message, beat: &Beat) -> Result<AckKind, String> {
    let Some((batch_id, kind)) = parse_job_subject(&message.subject) else {
        tracing::error!(subject = %message.subject, "not a bulk job subject; dropped");
        return Ok(AckKind::Term);
    };
    match kind {
        JobKind::Validate => validate(lane, batch_id, beat).await,
        JobKind::Finalize => finalize(lane, batch_id, beat).await,
    }
}

/// The models served now, by service discovery under `EMBATCH_SUBJECT` (100 ms), this
/// worker's own always among them.
async fn served_models(lane: &Lane) -> Vec<String> {
    let found = embatch_client::models::discover(
        &lane.client,
        embatch_protocol::SERVICE_NAME,
        &lane.config.subject,
        std::time::Duration::from_millis(100),
    )
    .await
    .unwrap_or_else(|err| {
        tracing::debug!(%err, "model discovery failed; only this worker's model is known");
        Vec::new()
    });
    let mut served: Vec<String> = found.into_iter().filter_map(|w| w.model).collect();
    served.push(lane.config.model.clone());
    served.sort();
    served.dedup();
    served
}

/// Reads the input file line by line, checks each line (each must name a model served, one per
/// file), and publishes the work items on that model's items subject as it goes; then sets `in_progress` (with the line and chunk counts) or, when a line was refused,
/// `failed` with OpenAI's `errors` list (and purges what it published).
async fn validate(lane: &Lane, batch_id: &str, beat: &Beat) -> Result<AckKind, String> {
    let store = &lane.store;
    let Some((record, _)) = store.batch(batch_id).await.map_err(|e| e.to_string())? else {
        return Ok(AckKind::Ack);
    };
    if record.batch.status != BatchStatus::Validating || record.embatch.ending.is_some() {
        return Ok(AckKind::Ack); // split already done, or cancelled: finalize takes it
    }
    let object = match store.files.get(&record.batch.input_file_id).await {
        Ok(object) => object,
        Err(err) => {
            let error = embatch_protocol::bulk::BatchError {
                code: "invalid_input_file".into(),
                message: format!(
                    "cannot read input file {}: {err}",
                    record.batch.input_file_id
                ),
                param: Some("input_file_id".into()),
                line: None,
            };
            fail(lane, batch_id, vec![error]).await?;
            return Ok(AckKind::Ack);
        }
    };
    let mut reader = tokio::io::BufReader::new(object);
    let mut check =
        FileCheck::for_models(served_models(lane).await, lane.config.default_model.clone());
    let mut errors = Vec::new();
    let mut chunk: Vec<ItemLine> = Vec::new();
    let (mut chunk_inputs, mut chunk_bytes) = (0usize, 0usize);
    let mut chunks = 0u32;
    let mut pending = Vec::new();
    let mut text = String::new();
    let mut line = 0u64;
    loop {
        text.clear();
        let read = reader
            .read_line(&mut text)
            .await
            .map_err(|e| format!("cannot read the input file: {e}"))?;
        if read == 0 {
            break;
        }
        beat.beat();
        line += 1;
        let trimmed = text.trim_end_matches(['\n', '\r']);
        if trimmed.trim().is_empty() {
            continue;
        }
        match check.line(line, trimmed, lane.config.limits) {
            Ok(item_line) => {
                if !errors.is_empty() {
                    continue; // the batch fails: only the errors matter now
                }
                chunk_inputs += item_line.request.inputs.len();
                chunk_bytes += trimmed.len();
                chunk.push(item_line);
                if chunk_inputs >= lane.config.chunk_inputs
                    || chunk_bytes >= lane.config.chunk_bytes
                {
                    let model = check.model().unwrap_or(&lane.config.model).to_owned();
                    pending.push(
                        publish_item(lane, &model, batch_id, chunks, std::mem::take(&mut chunk))
                            .await?,
                    );
                    chunks += 1;
                    (chunk_inputs, chunk_bytes) = (0, 0);
                    if pending.len() >= PUBLISH_WINDOW {
                        settle(&mut pending).await?;
                    }
                }
            }
            Err(error) => {
                let stop = error.code == "too_many_requests";
                if errors.len() < MAX_ERRORS {
                    errors.push(error);
                }
                if stop {
                    break;
                }
            }
        }
    }
    if errors.is_empty() && !chunk.is_empty() {
        let model = check.model().unwrap_or(&lane.config.model).to_owned();
        pending.push(publish_item(lane, &model, batch_id, chunks, chunk).await?);
        chunks += 1;
    }
    settle(&mut pending).await?;
    if !errors.is_empty() {
        purge(lane, batch_id).await?;
        fail(lane, batch_id, errors).await?;
        return Ok(AckKind::Ack);
    }
    let now = unix_now();
    let total = check.requests;
    let record = store
        .update_batch(batch_id, |record| {
            if record.batch.status != BatchStatus::Validating {
                return false;
            }
            if record.embatch.ending.is_none() {
                record.batch.status = BatchStatus::InProgress;
                record.batch.in_progress_at = Some(now);
            }
            record.batch.request_counts.total = total;
            record.embatch.chunks = Some(chunks);
            true
        })
        .await
        .map_err(|e| e.to_string())?;
    tracing::info!(batch = batch_id, lines = total, chunks, "bulk batch split");
    if record.embatch.all_done() && record.batch.status == BatchStatus::InProgress {
        store
            .publish_job(batch_id, JobKind::Finalize)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(AckKind::Ack)
}

type PublishAck = async_nats::jetstream::context::PublishAckFuture;

/// Publishes one work item on the items subject of `model` (its workers take it).
async fn publish_item(
    lane: &Lane,
    model: &str,
    batch_id: &str,
    chunk: u32,
    lines: Vec<ItemLine>,
) -> Result<PublishAck, String> {
    let item = Item {
        batch_id: batch_id.to_owned(),
        chunk,
        lines,
    };
    let payload = serde_json::to_vec(&item).map_err(|e| e.to_string())?;
    let publish = PublishMessage::build()
        .message_id(item_msg_id(batch_id, chunk))
        .payload(Bytes::from(payload));
    lane.store
        .js
        .send_publish(items_subject(model, batch_id), publish)
        .await
        .map_err(|e| e.to_string())
}

async fn settle(pending: &mut Vec<PublishAck>) -> Result<(), String> {
    for ack in pending.drain(..) {
        ack.await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

async fn fail(
    lane: &Lane,
    batch_id: &str,
    errors: Vec<embatch_protocol::bulk::BatchError>,
) -> Result<(), String> {
    let now = unix_now();
    lane.store
        .update_batch(batch_id, |record| {
            if record.batch.status != BatchStatus::Validating {
                return false;
            }
            record.batch.status = BatchStatus::Failed;
            record.batch.failed_at = Some(now);
            record.batch.errors = Some(BatchErrors {
                object: "list".into(),
                data: errors.clone(),
            });
            true
        })
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Removes the batch's remaining work items from the work queue.
async fn purge(lane: &Lane, batch_id: &str) -> Result<(), String> {
    lane.store
        .work
        .purge()
        .filter(batch_items_filter(batch_id))
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Delivers a batch: waits (NAK, 1 s) until every chunk is done unless the batch is ending
/// (cancelled or expired: its remaining items are purged first); reads the results back,
/// keeping each `custom_id` once; for an ending batch adds a `batch_cancelled` /
/// `batch_expired` error line for each input line never answered; writes the output and error
/// files; sets the final status with the exact counts; purges the batch's results.
async fn finalize(lane: &Lane, batch_id: &str, beat: &Beat) -> Result<AckKind, String> {
    let store = &lane.store;
    let Some((record, _)) = store.batch(batch_id).await.map_err(|e| e.to_string())? else {
        return Ok(AckKind::Ack);
    };
    if record.batch.status.is_final() {
        return Ok(AckKind::Ack);
    }
    let mut ending = record.embatch.ending;
    if ending.is_none() && record.batch.expires_at.is_some_and(|at| unix_now() >= at) {
        super::items::expire(lane, batch_id).await?;
        ending = Some(BatchStatus::Expired);
    }
    if ending.is_none() && !record.embatch.all_done() {
        return Ok(AckKind::Nak(Some(Duration::from_secs(1))));
    }
    if ending.is_some() {
        purge(lane, batch_id).await?;
    } else {
        let now = unix_now();
        store
            .update_batch(batch_id, |record| {
                if record.batch.status != BatchStatus::InProgress {
                    return false;
                }
                record.batch.status = BatchStatus::Finalizing;
                record.batch.finalizing_at = Some(now);
                true
            })
            .await
            .map_err(|e| e.to_string())?;
    }

    tracing::debug!(batch = batch_id, ?ending, "finalizing: reading the results");
    let suffix = batch_id.strip_prefix("batch_").unwrap_or(batch_id);
    let output_id = format!("file-{suffix}-output");
    let error_id = format!("file-{suffix}-errors");
    let (output_pipe, output_reader) = tokio::io::duplex(PIPE_BYTES);
    let (error_pipe, error_reader) = tokio::io::duplex(PIPE_BYTES);
    let input_file_id = record.batch.input_file_id.clone();
    let write = write_files(
        lane,
        batch_id,
        ending,
        &input_file_id,
        (output_pipe, error_pipe),
        beat,
    );
    let (output_name, error_name) = (
        format!("{batch_id}_output.jsonl"),
        format!("{batch_id}_error.jsonl"),
    );
    let (written, output_stored, errors_stored) = tokio::join!(
        write,
        put_file(lane, &output_id, &output_name, output_reader),
        put_file(lane, &error_id, &error_name, error_reader),
    );
    let (completed, failed) = written?;
    output_stored?;
    errors_stored?;
    // OpenAI names no file that would be empty.
    let output_file_id = keep_if(lane, output_id, completed > 0).await?;
    let error_file_id = keep_if(lane, error_id, failed > 0).await?;
    let now = unix_now();
    let final_status = ending.unwrap_or(BatchStatus::Completed);
    store
        .update_batch(batch_id, |record| {
            if record.batch.status.is_final() {
                return false;
            }
            record.batch.status = final_status;
            match final_status {
                BatchStatus::Expired => record.batch.expired_at = Some(now),
                BatchStatus::Cancelled => record.batch.cancelled_at = Some(now),
                _ => record.batch.completed_at = Some(now),
            }
            record.batch.output_file_id = output_file_id.clone();
            record.batch.error_file_id = error_file_id.clone();
            record.batch.request_counts.completed = completed;
            record.batch.request_counts.failed = failed;
            if ending.is_some() && record.batch.request_counts.total == 0 {
                record.batch.request_counts.total = completed + failed;
            }
            true
        })
        .await
        .map_err(|e| e.to_string())?;
    purge(lane, batch_id).await?;
    store
        .results
        .purge()
        .filter(results_subject(batch_id))
        .await
        .map_err(|e| e.to_string())?;
    tracing::info!(batch = batch_id, completed, failed, status = ?final_status, "bulk batch finalized");
    Ok(AckKind::Ack)
}

/// Results pulled per request while finalizing (each at most `max_payload`, 1 MB by default):
/// a batch of many megabytes of results then arrives at the pace the finalizer reads it, and
/// never makes the server drop the worker's connection as a slow consumer (an ordered consumer
/// pushing 80 MB did, in a measurement of a 16,000-input job). A byte bound (`max_bytes`) is not
/// used: the server ends such a pull with a 409 when the next message does not fit.
const READ_MESSAGES: usize = 8;

/// Bytes buffered between the results being read and the files being stored: the files are
/// streamed into the object store, never held whole in memory.
const PIPE_BYTES: usize = 1 << 20;

/// Reads the batch's results and writes the output and error files' lines into the two pipes
/// (each `custom_id` once, its first result); for an ending batch, adds the error line of every
/// input line never answered. Closes both pipes; returns the lines written to each.
async fn write_files(
    lane: &Lane,
    batch_id: &str,
    ending: Option<BatchStatus>,
    input_file_id: &str,
    (mut output, mut errors): (tokio::io::DuplexStream, tokio::io::DuplexStream),
    beat: &Beat,
) -> Result<(u64, u64), String> {
    let io = |e: std::io::Error| format!("cannot write the files of {batch_id}: {e}");
    let mut seen = HashSet::new();
    let (mut completed, mut failed) = (0u64, 0u64);
    let mut results = Results::open(lane, batch_id).await?;
    while let Some(pulled) = results.next().await? {
        let (mut ok_lines, mut failed_lines) = (Vec::new(), Vec::new());
        for result in pulled {
            for line in result.lines {
                if !seen.insert(line.custom_id) {
                    continue;
                }
                let file = if line.ok {
                    completed += 1;
                    &mut ok_lines
                } else {
                    failed += 1;
                    &mut failed_lines
                };
                file.extend_from_slice(line.output.get().as_bytes());
                file.push(b'\n');
            }
        }
        output.write_all(&ok_lines).await.map_err(io)?;
        errors.write_all(&failed_lines).await.map_err(io)?;
        // Written means the files' store took them: the pipes hold at most PIPE_BYTES.
        beat.beat();
    }
    if let Some(ending) = ending {
        let (code, message) = match ending {
            BatchStatus::Expired => (
                "batch_expired",
                "This request could not be executed before the completion window expired.",
            ),
            _ => (
                "batch_cancelled",
                "This request was not executed because the batch was cancelled.",
            ),
        };
        for custom_id in never_answered(lane, input_file_id, &seen, beat).await? {
            let line = render::unanswered(&custom_id, code, message)?;
            failed += 1;
            errors
                .write_all(line.output.get().as_bytes())
                .await
                .map_err(io)?;
            errors.write_all(b"\n").await.map_err(io)?;
        }
    }
    output.shutdown().await.map_err(io)?;
    errors.shutdown().await.map_err(io)?;
    Ok((completed, failed))
}

/// The stored results of a batch, read through an ephemeral pull consumer of its results
/// subject in pulls of [`READ_MESSAGES`].
struct Results {
    consumer: Option<PullConsumer>,
    stored: u64,
    read: u64,
    batch_id: String,
}

impl Results {
    async fn open(lane: &Lane, batch_id: &str) -> Result<Results, String> {
        let subject = results_subject(batch_id);
        let mut info = lane
            .store
            .results
            .info_with_subjects(&subject)
            .await
            .map_err(|e| e.to_string())?;
        let mut stored = 0u64;
        while let Some(entry) = info.next().await {
            let (_, count) = entry.map_err(|e| e.to_string())?;
            stored += count as u64;
        }
        let consumer = match stored {
            0 => None,
            _ => Some(
                lane.store
                    .results
                    .create_consumer(consumer::pull::Config {
                        filter_subject: subject,
                        ack_policy: consumer::AckPolicy::None,
                        inactive_threshold: Duration::from_secs(60),
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| e.to_string())?,
            ),
        };
        Ok(Results {
            consumer,
            stored,
            read: 0,
            batch_id: batch_id.to_owned(),
        })
    }

    /// The next pull's results; `None` once all stored when opened were read.
    async fn next(&mut self) -> Result<Option<Vec<ChunkResult>>, String> {
        let Some(consumer) = &self.consumer else {
            return Ok(None);
        };
        if self.read >= self.stored {
            return Ok(None);
        }
        // No more than are left: a pull waits for all it asks for (or its expiry).
        let left = usize::try_from(self.stored - self.read).unwrap_or(READ_MESSAGES);
        let mut batch = consumer
            .batch()
            .max_messages(READ_MESSAGES.min(left))
            .expires(Duration::from_secs(2))
            .messages()
            .await
            .map_err(|e| e.to_string())?;
        let before = self.read;
        let mut pulled = Vec::new();
        while let Some(message) = batch.next().await {
            let message = message.map_err(|e| e.to_string())?;
            self.read += 1;
            match serde_json::from_slice::<ChunkResult>(&message.payload) {
                Ok(result) => pulled.push(result),
                Err(err) => {
                    tracing::error!(%err, batch = %self.batch_id, "malformed chunk result; skipped")
                }
            }
        }
        if self.read == before {
            return Err(format!(
                "read {} of the {} results of {}, then none came",
                self.read, self.stored, self.batch_id
            ));
        }
        Ok(Some(pulled))
    }
}

/// The `custom_id`s of the input file's lines that have no result in `seen`.
async fn never_answered(
    lane: &Lane,
    input_file_id: &str,
    seen: &HashSet<String>,
    beat: &Beat,
) -> Result<Vec<String>, String> {
    let object = lane
        .store
        .files
        .get(input_file_id)
        .await
        .map_err(|e| format!("cannot read input file {input_file_id}: {e}"))?;
    let mut lines = tokio::io::BufReader::new(object).lines();
    let mut missing = Vec::new();
    let mut listed = HashSet::new();
    while let Some(text) = lines
        .next_line()
        .await
        .map_err(|e| format!("cannot read input file {input_file_id}: {e}"))?
    {
        beat.beat();
        if let Some(id) = custom_id_of(&text)
            && !seen.contains(&id)
            && listed.insert(id.clone())
        {
            missing.push(id);
        }
    }
    Ok(missing)
}

/// Stores what `reader` yields as the output file `id` (`purpose: batch_output`); a rerun
/// overwrites it.
async fn put_file(
    lane: &Lane,
    id: &str,
    filename: &str,
    mut reader: tokio::io::DuplexStream,
) -> Result<(), String> {
    let meta = ObjectMetadata {
        name: id.to_owned(),
        metadata: [
            (META_PURPOSE.to_owned(), "batch_output".to_owned()),
            (META_FILENAME.to_owned(), filename.to_owned()),
            (META_CREATED_AT.to_owned(), unix_now().to_string()),
        ]
        .into_iter()
        .collect(),
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let info = lane
        .store
        .files
        .put(meta, &mut reader)
        .await
        .map_err(|e| format!("cannot store {id}: {e}"))?;
    tracing::debug!(id, bytes = info.size, elapsed = ?started.elapsed(), "output file stored");
    Ok(())
}

/// `Some(id)` when `keep`; otherwise deletes the (empty) file `id` and returns `None`.
async fn keep_if(lane: &Lane, id: String, keep: bool) -> Result<Option<String>, String> {
    if keep {
        return Ok(Some(id));
    }
    lane.store
        .files
        .delete(&id)
        .await
        .map_err(|e| format!("cannot delete the empty file {id}: {e}"))?;
    Ok(None)
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
