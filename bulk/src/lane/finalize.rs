//! The `finalize` job: delivers a batch. Waits (NAK, [`RETRY_DELAY`]) until every chunk is done
//! unless the batch is ending (cancelled or expired: its remaining items are purged first);
//! reads the results back, keeping each `custom_id` once; for an ending batch adds a
//! `batch_cancelled` / `batch_expired` error line for each input line never answered; writes
//! the output and error files; sets the final status with the exact counts; purges the batch's
//! items and results.

use std::collections::HashSet;
use std::time::Duration;

use async_nats::jetstream::AckKind;
use async_nats::jetstream::consumer;
use async_nats::jetstream::object_store::{GetErrorKind, ObjectMetadata};
use embatch_protocol::bulk::{
    BatchRecord, BatchStatus, ChunkResult, META_CREATED_AT, META_FILENAME, META_PURPOSE,
    META_TENANT, results_subject, unix_now,
};
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use super::error::{LaneError, nats};
use super::input::{LineReader, max_line_bytes};
use super::jobs::{Attempt, Beat, RETRY_DELAY, ending_of, purge_items};
use super::lines::custom_id_of;
use super::{Lane, PullConsumer, claim, render};

/// Results pulled per request while finalizing (each at most `max_payload`, 1 MB by default):
/// a batch of many megabytes of results then arrives at the pace the finalizer reads it, and
/// never makes the server drop the worker's connection as a slow consumer (an ordered consumer
/// pushing 80 MB did, in a measurement of a 16,000-input job). A byte bound (`max_bytes`) is not
/// used: the server ends such a pull with a 409 when the next message does not fit.
const READ_MESSAGES: usize = 8;

/// Bytes buffered between the results being read and the files being stored: the files are
/// streamed into the object store, never held whole in memory.
const PIPE_BYTES: usize = 1 << 20;

/// Delivers the batch `batch_id` (see the module's doc). `attempt` refuses a run past the
/// last delivery, but never a wait. `None`: a later run claimed the batch ([`claim`]) and its
/// delivery of the job is the one to answer.
pub(super) async fn finalize(
    lane: &Lane,
    batch_id: &str,
    beat: &Beat,
    attempt: Attempt,
) -> Result<Option<AckKind>, LaneError> {
    let store = &lane.store;
    let Some((record, _)) = store.batch(batch_id).await? else {
        return Ok(Some(AckKind::Ack));
    };
    if record.batch.status.is_final() {
        return Ok(Some(AckKind::Ack));
    }
    let mut ending = ending_of(&record);
    if ending.is_none() && record.batch.expires_at.is_some_and(|at| unix_now() >= at) {
        // This job finalizes it: no other `finalize` is asked for.
        let marked = super::items::mark_expiring(lane, batch_id).await?;
        if marked.batch.status.is_final() {
            return Ok(Some(AckKind::Ack));
        }
        // A cancel may have come first.
        ending = ending_of(&marked);
    }
    if ending.is_none() && !record.embatch.all_done() {
        return Ok(Some(AckKind::Nak(Some(RETRY_DELAY))));
    }
    attempt.check()?;
    let Some(claim) = claim::claim(store, batch_id, ending.is_some()).await? else {
        return Ok(Some(AckKind::Ack));
    };
    if ending.is_some() {
        purge_items(lane, batch_id).await?;
    }
    tracing::debug!(
        batch = batch_id,
        ?ending,
        claim,
        "finalizing: reading the results"
    );
    let delivered = deliver(lane, &record, ending, beat, claim).await?;
    let final_status = ending.unwrap_or(BatchStatus::Completed);
    let outcome = (final_status, ending.is_some(), claim);
    if !claim::set_final(store, batch_id, outcome, &delivered).await? {
        tracing::warn!(
            batch = batch_id,
            claim,
            "a later finalization run claimed the batch, or it ended; this run's files are deleted"
        );
        claim::delete_files(store, batch_id, [claim]).await;
        return Ok(None);
    }
    purge_items(lane, batch_id).await?;
    store
        .results
        .purge()
        .filter(results_subject(batch_id))
        .await
        .map_err(nats(format!("cannot purge the results of {batch_id}")))?;
    tracing::info!(batch = batch_id, completed = delivered.completed, failed = delivered.failed, status = ?final_status, "bulk batch finalized");
    Ok(Some(AckKind::Ack))
}

/// Writes the output and error files of `record`'s batch, streaming them into the object
/// store as the results are read; a file that would be empty is deleted (OpenAI names none).
async fn deliver(
    lane: &Lane,
    record: &BatchRecord,
    ending: Option<BatchStatus>,
    beat: &Beat,
    claim: u32,
) -> Result<claim::Delivered, LaneError> {
    let batch_id = record.batch.id.as_str();
    let (output_id, error_id) = claim::file_ids(batch_id, claim);
    let (output_pipe, output_reader) = tokio::io::duplex(PIPE_BYTES);
    let (error_pipe, error_reader) = tokio::io::duplex(PIPE_BYTES);
    let write = write_files(
        lane,
        batch_id,
        ending,
        &record.batch.input_file_id,
        (output_pipe, error_pipe),
        beat,
    );
    let (output_name, error_name) = (
        format!("{batch_id}_output.jsonl"),
        format!("{batch_id}_error.jsonl"),
    );
    let (written, output_stored, errors_stored) = tokio::join!(
        write,
        put_file(
            lane,
            &output_id,
            (&output_name, record.owner()),
            output_reader
        ),
        put_file(lane, &error_id, (&error_name, record.owner()), error_reader),
    );
    let (completed, failed) = written?;
    output_stored?;
    errors_stored?;
    Ok(claim::Delivered {
        completed,
        failed,
        output_file_id: keep_if(lane, output_id, completed > 0).await?,
        error_file_id: keep_if(lane, error_id, failed > 0).await?,
    })
}

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
) -> Result<(u64, u64), LaneError> {
    let io = |source| LaneError::Output {
        batch: batch_id.to_owned(),
        source,
    };
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
            let mut text = line.output.get().as_bytes().to_vec();
            text.push(b'\n');
            errors.write_all(&text).await.map_err(io)?;
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
    async fn open(lane: &Lane, batch_id: &str) -> Result<Results, LaneError> {
        let subject = results_subject(batch_id);
        let what = format!("cannot count the results of {batch_id}");
        let mut info = lane
            .store
            .results
            .info_with_subjects(&subject)
            .await
            .map_err(nats(&what))?;
        let mut stored = 0u64;
        while let Some(entry) = info.next().await {
            let (_, count) = entry.map_err(nats(&what))?;
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
                        // An ephemeral consumer is kept once unless told (JetStream's rule): as
                        // many copies as the results, so losing a node does not end the read.
                        num_replicas: lane.store.results.cached_info().config.num_replicas,
                        ..Default::default()
                    })
                    .await
                    .map_err(nats(format!("cannot read the results of {batch_id}")))?,
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
    async fn next(&mut self) -> Result<Option<Vec<ChunkResult>>, LaneError> {
        let Some(consumer) = &self.consumer else {
            return Ok(None);
        };
        if self.read >= self.stored {
            return Ok(None);
        }
        let what = format!("cannot pull the results of {}", self.batch_id);
        // No more than are left: a pull waits for all it asks for (or its expiry).
        let left = usize::try_from(self.stored - self.read).unwrap_or(READ_MESSAGES);
        let mut batch = consumer
            .batch()
            .max_messages(READ_MESSAGES.min(left))
            .expires(Duration::from_secs(2))
            .messages()
            .await
            .map_err(nats(&what))?;
        let before = self.read;
        let mut pulled = Vec::new();
        while let Some(message) = batch.next().await {
            let message = message.map_err(|source| LaneError::Nats {
                what: what.clone(),
                source,
            })?;
            self.read += 1;
            match serde_json::from_slice::<ChunkResult>(&message.payload) {
                Ok(result) => pulled.push(result),
                Err(err) => {
                    tracing::error!(%err, batch = %self.batch_id, "malformed chunk result; skipped")
                }
            }
        }
        if self.read == before {
            return Err(LaneError::ResultsDry {
                batch: self.batch_id.clone(),
                read: self.read,
                stored: self.stored,
            });
        }
        Ok(Some(pulled))
    }
}

/// The `custom_id`s of the input file's lines that have no result in `seen`, each once. A line
/// whose `custom_id` cannot be read is skipped: one that is not UTF-8, longer than a line may
/// be, not JSON, or without a string `custom_id` (validation refuses each of them, so such a
/// line is only met in a batch cancelled or expired while validating). None is listed when the
/// input file was deleted: what finished is delivered all the same.
async fn never_answered(
    lane: &Lane,
    input_file_id: &str,
    seen: &HashSet<String>,
    beat: &Beat,
) -> Result<Vec<String>, LaneError> {
    let unreadable = |source| LaneError::Input {
        file: input_file_id.to_owned(),
        source,
    };
    let object = match lane.store.files.get(input_file_id).await {
        Ok(object) => object,
        Err(err)
            if matches!(
                err.kind(),
                GetErrorKind::NotFound | GetErrorKind::InvalidName
            ) =>
        {
            // Deleted after the batch was created: what finished is still delivered.
            tracing::warn!(
                input_file_id,
                answered = seen.len(),
                "the input file of an ending batch is gone; its lines never run are not listed"
            );
            return Ok(Vec::new());
        }
        Err(err) => return Err(unreadable(std::io::Error::other(err))),
    };
    let cap = max_line_bytes(lane.max_payload);
    let mut lines = LineReader::new(tokio::io::BufReader::new(object), cap);
    let mut missing = Vec::new();
    let mut listed = HashSet::new();
    while let Some(line) = lines.next().await.map_err(unreadable)? {
        beat.beat();
        if line.len > cap {
            continue;
        }
        if let Ok(text) = std::str::from_utf8(line.bytes)
            && let Some(id) = custom_id_of(text)
            && !seen.contains(&id)
            && listed.insert(id.clone())
        {
            missing.push(id);
        }
    }
    Ok(missing)
}

/// Stores what `reader` yields as the output file `id` (`purpose: batch_output`) named
/// `filename`, owned by the batch's `tenant` (the id is this run's claim's alone).
async fn put_file(
    lane: &Lane,
    id: &str,
    (filename, tenant): (&str, &str),
    mut reader: tokio::io::DuplexStream,
) -> Result<(), LaneError> {
    let meta = ObjectMetadata {
        name: id.to_owned(),
        metadata: [
            (META_PURPOSE.to_owned(), "batch_output".to_owned()),
            (META_FILENAME.to_owned(), filename.to_owned()),
            (META_CREATED_AT.to_owned(), unix_now().to_string()),
            (META_TENANT.to_owned(), tenant.to_owned()),
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
        .map_err(nats(format!("cannot store {id}")))?;
    tracing::debug!(id, bytes = info.size, elapsed = ?started.elapsed(), "output file stored");
    Ok(())
}

/// `Some(id)` when `keep`; otherwise deletes the (empty) file `id` and returns `None`.
async fn keep_if(lane: &Lane, id: String, keep: bool) -> Result<Option<String>, LaneError> {
    if keep {
        return Ok(Some(id));
    }
    lane.store
        .files
        .delete(&id)
        .await
        .map_err(nats(format!("cannot delete the empty file {id}")))?;
    Ok(None)
}
