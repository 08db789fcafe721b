//! The items loop: embeds work items (chunks of input lines) behind interactive traffic.
//!
//! Per item: the batch's record says whether it still runs (a cancelled, expiring or ended
//! batch's items are acked and dropped); the lines are embedded, grouped by options, in calls of
//! at most the batch limit, each call waiting for the [`BulkGate`] and a `BULK_CALLS` permit;
//! the output lines are published to the results stream (deduplicated by `Nats-Msg-Id`), the
//! chunk is marked done in the record (once, by its bit), and the message is acked. When the
//! upstream blames an input, the lines are retried one by one: the line it rejects gets its
//! error output with the upstream's status and reason and the message is TERMed (never
//! redelivered); its batch-mates get their embeddings. When the upstream fails otherwise, the
//! message is NAKed with a delay doubling from 1 s (at most 30 s); at the `BULK_MAX_DELIVER`th
//! delivery its lines go to the error file as `upstream_failed` instead.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::AckKind;
use async_nats::jetstream::Message;
use async_nats::jetstream::message::PublishMessage;
use bytes::Bytes;
use embatch_protocol::bulk::{
    BatchStatus, ChunkResult, Item, JobKind, LineResult, result_msg_id, results_subject, unix_now,
};
use embatch_protocol::{EmbedError, EmbedOptions, Input};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Lane, PullConsumer, delivered, render, with_progress};
use crate::batcher::BulkGate;
use crate::telemetry::names;
use crate::upstream::{Embedding, Upstream, UpstreamError};

/// Items a worker holds beyond its `BULK_CALLS` calls: pulled and checked while the calls run,
/// and finishing (results published, progress recorded, acked) after theirs ended, so the next
/// call starts as soon as the previous one ends.
const PREFETCH: usize = 3;

/// What becomes of a message.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Disposition {
    Ack,
    /// Done, but an input was rejected: never redeliver.
    Term,
    Nak(Duration),
}

/// The calls a worker may have in flight, and the gate that puts interactive requests first.
struct Calls<U> {
    upstream: Arc<U>,
    gate: BulkGate,
    permits: Arc<Semaphore>,
    max_batch_size: usize,
}

impl<U> Clone for Calls<U> {
    fn clone(&self) -> Self {
        Calls {
            upstream: Arc::clone(&self.upstream),
            gate: self.gate.clone(),
            permits: Arc::clone(&self.permits),
            max_batch_size: self.max_batch_size,
        }
    }
}

impl<U: Upstream> Calls<U> {
    /// Embeds `inputs` in calls of at most the batch limit, each started under a permit once
    /// the gate is open.
    async fn embed(
        &self,
        inputs: &[Input],
        options: &EmbedOptions,
    ) -> Result<Vec<Embedding>, UpstreamError> {
        let mut out = Vec::with_capacity(inputs.len());
        for part in inputs.chunks(self.max_batch_size.max(1)) {
            let _permit = self
                .permits
                .acquire()
                .await
                .map_err(|_| UpstreamError::Crashed("the bulk lane stopped".into()))?;
            self.gate.opened().await;
            let started = std::time::Instant::now();
            let called = self.upstream.embed(part, options).await;
            let outcome = match &called {
                Ok(_) => {
                    metrics::counter!(names::BULK_INPUTS).increment(part.len() as u64);
                    "ok"
                }
                Err(err) if err.blames_input() => "rejected",
                Err(_) => "failed",
            };
            metrics::counter!(names::BULK_CALLS, "outcome" => outcome).increment(1);
            metrics::histogram!(names::BULK_UPSTREAM_TIME).record(started.elapsed().as_secs_f64());
            out.extend(called?);
        }
        Ok(out)
    }
}

/// Pulls and processes work items until `stop`; holds at most `BULK_CALLS` + [`PREFETCH`] items at
/// once, so no item waits out its ack wait in this worker.
pub(super) async fn run<U: Upstream>(
    lane: Arc<Lane>,
    consumer: PullConsumer,
    upstream: Arc<U>,
    gate: BulkGate,
    stop: CancellationToken,
) {
    let calls = Calls {
        upstream,
        gate,
        permits: Arc::new(Semaphore::new(lane.config.calls.max(1))),
        max_batch_size: lane.config.max_batch_size,
    };
    let held = Arc::new(Semaphore::new(lane.config.calls.max(1) + PREFETCH));
    let tasks = TaskTracker::new();
    loop {
        let permit = tokio::select! {
            () = stop.cancelled() => break,
            permit = Arc::clone(&held).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let Some(message) = super::next_message(&consumer, &stop, "bulk items").await else {
            break;
        };
        let lane = Arc::clone(&lane);
        let calls = calls.clone();
        let stop = stop.clone();
        tasks.spawn(async move {
            tokio::select! {
                () = process(&lane, &message, &calls) => {}
                () = stop.cancelled() => {
                    // Give it back at once instead of after the ack wait.
                    let _ = message.ack_with(AckKind::Nak(None)).await;
                }
            }
            drop(permit);
        });
    }
    tasks.close();
    tasks.wait().await;
}

async fn process<U: Upstream>(lane: &Lane, message: &Message, calls: &Calls<U>) {
    let disposition = match serde_json::from_slice::<Item>(&message.payload) {
        Ok(item) => {
            let handled = with_progress(
                message,
                lane.config.ack_wait,
                handle(lane, message, &item, calls),
            );
            match handled.await {
                Ok(disposition) => disposition,
                Err(err) => {
                    tracing::warn!(%err, batch = %item.batch_id, chunk = item.chunk, "bulk item failed; redelivering");
                    Disposition::Nak(backoff(delivered(message)))
                }
            }
        }
        Err(err) => {
            tracing::error!(%err, subject = %message.subject, "malformed bulk item; dropped");
            Disposition::Term
        }
    };
    let (kind, outcome) = match disposition {
        Disposition::Ack => (AckKind::Ack, "ack"),
        Disposition::Term => (AckKind::Term, "term"),
        Disposition::Nak(delay) => (AckKind::Nak(Some(delay)), "nak"),
    };
    metrics::counter!(names::BULK_ITEMS, "outcome" => outcome).increment(1);
    if let Err(err) = message.ack_with(kind).await {
        tracing::warn!(%err, "cannot acknowledge a bulk item; it will be redelivered");
    }
}

/// NAK delay after the `delivered`th delivery failed: 1 s, 2 s, 4 s, ... at most 30 s.
fn backoff(delivered: i64) -> Duration {
    let exp = u32::try_from(delivered.clamp(1, 6) - 1).unwrap_or(0);
    Duration::from_secs(2u64.pow(exp)).min(Duration::from_secs(30))
}

async fn handle<U: Upstream>(
    lane: &Lane,
    message: &Message,
    item: &Item,
    calls: &Calls<U>,
) -> Result<Disposition, String> {
    let store = &lane.store;
    let Some((record, _)) = store
        .batch(&item.batch_id)
        .await
        .map_err(|e| e.to_string())?
    else {
        return Ok(Disposition::Ack); // the batch is gone
    };
    if record.batch.status.is_final() || record.embatch.ending.is_some() {
        return Ok(Disposition::Ack);
    }
    if record.batch.expires_at.is_some_and(|at| unix_now() >= at) {
        expire(lane, &item.batch_id).await?;
        return Ok(Disposition::Ack);
    }
    let (results, rejected) = match embed_lines(item, calls).await {
        Ok(done) => done,
        Err(err) => {
            if delivered(message) < lane.config.max_deliver {
                tracing::warn!(%err, batch = %item.batch_id, chunk = item.chunk, "bulk upstream call failed; NAK");
                return Ok(Disposition::Nak(backoff(delivered(message))));
            }
            let message = format!(
                "the upstream failed {} times (BULK_MAX_DELIVER): {err}",
                lane.config.max_deliver
            );
            let failed = item
                .lines
                .iter()
                .map(|l| render::unanswered(&l.custom_id, "upstream_failed", &message))
                .collect::<Result<Vec<_>, _>>()?;
            (failed, false)
        }
    };
    publish(lane, item, results.as_slice()).await?;
    let ok = results.iter().filter(|r| r.ok).count() as u64;
    let failed = results.len() as u64 - ok;
    let record = store
        .update_batch(&item.batch_id, |record| {
            if record.batch.status.is_final() || !record.embatch.mark_done(item.chunk) {
                return false;
            }
            record.batch.request_counts.completed += ok;
            record.batch.request_counts.failed += failed;
            true
        })
        .await
        .map_err(|e| e.to_string())?;
    if record.embatch.all_done() && record.batch.status == BatchStatus::InProgress {
        store
            .publish_job(&item.batch_id, JobKind::Finalize)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(if rejected {
        Disposition::Term
    } else {
        Disposition::Ack
    })
}

/// Marks the batch as expiring and asks for its finalization (which delivers what finished).
pub(super) async fn expire(lane: &Lane, batch_id: &str) -> Result<(), String> {
    let record = lane
        .store
        .update_batch(batch_id, |record| {
            if record.batch.status.is_final() || record.embatch.ending.is_some() {
                return false;
            }
            record.embatch.ending = Some(BatchStatus::Expired);
            true
        })
        .await
        .map_err(|e| e.to_string())?;
    if record.embatch.ending == Some(BatchStatus::Expired) && !record.batch.status.is_final() {
        lane.store
            .publish_job(batch_id, JobKind::Finalize)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Embeds the item's lines: one call per group of equal options (split at the batch limit);
/// when the upstream blames an input, each line of the group alone. Returns the output lines
/// and whether a line was rejected.
///
/// # Errors
/// The upstream's failure when it is not an input's fault (the item is redelivered).
async fn embed_lines<U: Upstream>(
    item: &Item,
    calls: &Calls<U>,
) -> Result<(Vec<LineResult>, bool), String> {
    let mut groups: Vec<(EmbedOptions, Vec<usize>)> = Vec::new();
    for (i, line) in item.lines.iter().enumerate() {
        let options = line.request.options();
        match groups.iter_mut().find(|(o, _)| *o == options) {
            Some((_, members)) => members.push(i),
            None => groups.push((options, vec![i])),
        }
    }
    let mut results: Vec<Option<LineResult>> = vec![None; item.lines.len()];
    let mut rejected = false;
    for (options, members) in groups {
        let inputs: Vec<Input> = members
            .iter()
            .flat_map(|&i| item.lines[i].request.inputs.as_slice().iter().cloned())
            .collect();
        match calls.embed(&inputs, &options).await {
            Ok(embeddings) => {
                let mut at = 0;
                for &i in &members {
                    let line = &item.lines[i];
                    let n = line.request.inputs.len();
                    let slice = embeddings.get(at..at + n).ok_or("too few embeddings")?;
                    results[i] = Some(render::success(line, slice)?);
                    at += n;
                }
            }
            Err(err) if err.blames_input() => {
                for &i in &members {
                    let line = &item.lines[i];
                    match calls.embed(line.request.inputs.as_slice(), &options).await {
                        Ok(embeddings) => results[i] = Some(render::success(line, &embeddings)?),
                        Err(err) if err.blames_input() => {
                            rejected = true;
                            results[i] = Some(render::refused(line, &EmbedError::from(err))?);
                        }
                        Err(err) => return Err(err.to_string()),
                    }
                }
            }
            Err(err) => return Err(err.to_string()),
        }
    }
    Ok((results.into_iter().flatten().collect(), rejected))
}

/// Publishes the chunk's results, in as many parts as `max_payload` needs, each deduplicated by
/// its `Nats-Msg-Id`, and waits for the stream's acknowledgements.
async fn publish(lane: &Lane, item: &Item, results: &[LineResult]) -> Result<(), String> {
    let budget = lane.max_payload.saturating_sub(4096).max(1024);
    let mut parts: Vec<Vec<LineResult>> = vec![Vec::new()];
    let mut size = 0;
    for result in results {
        let mut result = result.clone();
        let mut len = result.output.get().len() + result.custom_id.len() + 32;
        if len > budget {
            result = render::unanswered(
                &result.custom_id,
                "result_too_large",
                &format!(
                    "the line's result of {len} bytes exceeds the NATS server's max_payload of \
                     {} bytes: send fewer inputs per line",
                    lane.max_payload
                ),
            )?;
            len = result.output.get().len() + result.custom_id.len() + 32;
        }
        if size + len > budget && parts.last().is_some_and(|p| !p.is_empty()) {
            parts.push(Vec::new());
            size = 0;
        }
        size += len;
        if let Some(part) = parts.last_mut() {
            part.push(result);
        }
    }
    let subject = results_subject(&item.batch_id);
    for (n, lines) in parts.into_iter().enumerate() {
        let payload = serde_json::to_vec(&ChunkResult {
            chunk: item.chunk,
            lines,
        })
        .map_err(|e| e.to_string())?;
        let publish = PublishMessage::build()
            .message_id(result_msg_id(&item.batch_id, item.chunk, n as u32))
            .payload(Bytes::from(payload));
        lane.store
            .js
            .send_publish(subject.clone(), publish)
            .await
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_thirty_seconds() {
        let delays: Vec<u64> = (1..=8).map(|d| backoff(d).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30, 30]);
    }
}
