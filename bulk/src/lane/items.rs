//! The items loop: embeds work items (chunks of input lines) behind interactive traffic.
//!
//! Per item: the batch's record says whether it still runs (a cancelled, expiring or ended
//! batch's items are acked and dropped); each line goes to the batcher as a bulk request
//! ([`BulkGate::embed`]), which sends bulk inputs in the room interactive batches of the same
//! options leave, or alone while nothing interactive waits; the output lines are published to
//! the results stream (deduplicated by `Nats-Msg-Id`), the chunk is marked done in the record
//! (once, by its bit), and the message is acked. A line whose input the upstream rejects (the
//! batcher isolates it by request, as it does interactive requests) gets its error output with
//! the upstream's status and reason and the message is TERMed (never redelivered); its
//! batch-mates get their embeddings. When the upstream fails otherwise, the message is NAKed
//! with a delay doubling from 1 s (at most 30 s); at the `BULK_MAX_DELIVER`th delivery its lines
//! go to the error file as `upstream_failed` instead.
//!
//! A worker holds [`ITEMS_HELD`] items at once: their lines wait in the batcher together, so
//! an upstream call always finds bulk inputs to carry while other items publish their results,
//! update their batch's record and ack (that tail never holds up the upstream).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::AckKind;
use async_nats::jetstream::Message;
use async_nats::jetstream::message::PublishMessage;
use bytes::Bytes;
use embatch_batcher::BulkGate;
use embatch_protocol::EmbedError;
use embatch_protocol::bulk::{
    BatchRecord, BatchStatus, ChunkResult, Item, JobKind, LineResult, result_msg_id,
    results_subject, unix_now,
};
use embatch_runtime::usage::DayUsage;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::error::{LaneError, RenderError, nats};
use super::jobs::ending_of;
use super::progress::Progress;
use super::{Lane, PullConsumer, delivered, render, with_progress};
use crate::{BulkError, Owner, names};

/// Work items a worker holds at once (pulled, embedding, or finishing). An item spends several
/// NATS round trips besides its embedding (its batch's record, the results, the progress, the
/// ack): 16 keep bulk inputs waiting in the batcher for every call while the others finish.
pub const ITEMS_HELD: usize = 16;

/// What becomes of a message.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Disposition {
    Ack,
    /// Done, but an input was rejected: never redeliver.
    Term,
    Nak(Duration),
}

/// Pulls and processes work items until `stop`; holds at most [`ITEMS_HELD`] items at once, so
/// no item waits out its ack wait in this worker.
pub(super) async fn run(
    lane: Arc<Lane>,
    consumer: PullConsumer,
    gate: BulkGate,
    stop: CancellationToken,
) {
    gate.limit_calls(lane.config.calls);
    let (progress, recorder) = Progress::spawn(Arc::clone(&lane));
    let held = Arc::new(Semaphore::new(ITEMS_HELD));
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
        let gate = gate.clone();
        let progress = progress.clone();
        let stop = stop.clone();
        tasks.spawn(async move {
            tokio::select! {
                () = process(&lane, &message, &gate, &progress) => {}
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
    drop(progress);
    if let Err(err) = recorder.await {
        tracing::error!(%err, "the bulk progress recorder failed");
    }
}

async fn process(lane: &Lane, message: &Message, gate: &BulkGate, progress: &Progress) {
    let disposition = match serde_json::from_slice::<Item>(&message.payload) {
        Ok(item) => {
            let handled = with_progress(
                message,
                lane.config.ack_wait,
                handle(lane, message, &item, gate, progress),
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

async fn handle(
    lane: &Lane,
    message: &Message,
    item: &Item,
    gate: &BulkGate,
    progress: &Progress,
) -> Result<Disposition, LaneError> {
    let store = &lane.store;
    let Some((record, _)) = store.batch(&item.batch_id).await? else {
        return Ok(Disposition::Ack); // the batch is gone
    };
    if record.batch.status.is_final() || ending_of(&record).is_some() {
        return Ok(Disposition::Ack);
    }
    if record.batch.expires_at.is_some_and(|at| unix_now() >= at) {
        expire(lane, &item.batch_id).await?;
        return Ok(Disposition::Ack);
    }
    let owner = lane.owners.batch_owner(record.owner());
    let (results, rejected, used) = match embed_lines(item, lane, gate, &owner).await {
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
            (failed, false, DayUsage::default())
        }
    };
    publish(lane, item, results.as_slice()).await?;
    // Counted once the results are stored, so a redelivered item's lines count once (unless
    // the worker dies between this and the ack).
    lane.usage.record(&owner.share.tenant, used);
    let ok = results.iter().filter(|r| r.ok).count() as u64;
    let failed = results.len() as u64 - ok;
    let record = progress
        .mark(&item.batch_id, item.chunk, ok, failed)
        .await?;
    if record.embatch.all_done() && record.batch.status == BatchStatus::InProgress {
        store.publish_job(&item.batch_id, JobKind::Finalize).await?;
    }
    Ok(if rejected {
        Disposition::Term
    } else {
        Disposition::Ack
    })
}

/// Marks the batch as expiring and asks for its finalization (which delivers what finished).
pub(super) async fn expire(lane: &Lane, batch_id: &str) -> Result<(), BulkError> {
    let record = mark_expiring(lane, batch_id).await?;
    if record.embatch.ending == Some(BatchStatus::Expired) && !record.batch.status.is_final() {
        lane.store.publish_job(batch_id, JobKind::Finalize).await?;
    }
    Ok(())
}

/// Marks the batch as expiring (unless it is final or already ending); returns the record.
pub(super) async fn mark_expiring(lane: &Lane, batch_id: &str) -> Result<BatchRecord, BulkError> {
    lane.store
        .update_batch(batch_id, |record| {
            if record.batch.status.is_final() || ending_of(record).is_some() {
                return false;
            }
            record.embatch.ending = Some(BatchStatus::Expired);
            true
        })
        .await
}

/// Embeds the item's lines for the batch's `owner`, each a bulk request of the batcher (all at
/// once, so they share calls), and renders their output lines. Returns the output lines,
/// whether a line was rejected, and the owner's usage of the lines embedded.
///
/// # Errors
/// The upstream's failure when it is not an input's fault (the item is redelivered).
async fn embed_lines(
    item: &Item,
    lane: &Lane,
    gate: &BulkGate,
    owner: &Owner,
) -> Result<(Vec<LineResult>, bool, DayUsage), LaneError> {
    let embedded = futures::future::join_all(item.lines.iter().map(|line| async {
        let started = std::time::Instant::now();
        let inputs = line.request.inputs.as_slice().to_vec();
        let n = inputs.len();
        let mut tokens = None;
        let outcome = match lane
            .tokens
            .count_tokens(inputs, line.request.options())
            .await
        {
            Ok(counted) => {
                tokens = counted.tokens;
                gate.embed_as(
                    owner.share.clone(),
                    counted.inputs,
                    counted.lengths,
                    counted.options,
                )
                .await
                .map(|embeddings| (embeddings, tokens))
            }
            Err(err) => Err(err),
        };
        let label = match &outcome {
            Ok(_) => {
                metrics::counter!(names::BULK_INPUTS).increment(n as u64);
                "ok"
            }
            Err(err) if blames_input(err) => "rejected",
            Err(_) => "failed",
        };
        metrics::counter!(names::BULK_LINES, "outcome" => label).increment(1);
        let status = outcome.as_ref().map_or_else(EmbedError::status, |_| 200);
        lane.owners.count_line(owner, status, (n, tokens));
        metrics::histogram!(names::BULK_UPSTREAM_TIME).record(started.elapsed().as_secs_f64());
        outcome
    }))
    .await;
    let mut results = Vec::with_capacity(item.lines.len());
    let mut rejected = false;
    let mut used = DayUsage::default();
    for (line, outcome) in item.lines.iter().zip(embedded) {
        match outcome {
            Ok((embeddings, tokens)) => {
                results.push(render::success(line, &embeddings, tokens)?);
                used.add(&DayUsage::bulk_line(
                    embeddings.len() as u64,
                    tokens.unwrap_or(0),
                ));
            }
            Err(err) if blames_input(&err) => {
                rejected = true;
                results.push(render::refused(line, &err)?);
            }
            Err(err) => return Err(LaneError::Upstream(err)),
        }
    }
    Ok((results, rejected, used))
}

/// The upstream refused an input of the request (TEI's 400/413/422, as
/// `UpstreamError::blames_input`): the line's fault, never retried.
fn blames_input(err: &EmbedError) -> bool {
    matches!(err.status(), 400 | 413 | 422)
}

/// Publishes the chunk's results, in as many parts as `max_payload` needs, each deduplicated by
/// its `Nats-Msg-Id`, and waits for the stream's acknowledgements.
async fn publish(lane: &Lane, item: &Item, results: &[LineResult]) -> Result<(), LaneError> {
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
        .map_err(RenderError::from)?;
        let publish = PublishMessage::build()
            .message_id(result_msg_id(&item.batch_id, item.chunk, n as u32))
            .payload(Bytes::from(payload));
        lane.store
            .js
            .send_publish(subject.clone(), publish)
            .await
            .map_err(nats("cannot publish a chunk's results"))?
            .await
            .map_err(nats("no acknowledgement of a chunk's results"))?;
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
