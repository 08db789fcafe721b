//! The sweep: gives back work-stream messages that no consumer will ever deliver again.
//!
//! In a WorkQueue stream an acked message is removed, so every message still stored on a
//! consumer's filter should lie above that consumer's ack floor (waiting, or delivered and not
//! yet acked). After a worker is killed (`kill -9`) while nats-server restarts, a message was
//! seen left behind *below* the `bulk-items` ack floor: nothing pending, nothing redelivered,
//! its chunk never done, the batch `in_progress` forever. The consumer's state (ack floor,
//! pending set) is written apart from the stream's messages; what was seen fits a restart that
//! restored a state in which a delivered, never acked message counts as acknowledged. Whatever
//! the server's cause, a message stored below the floor is one nobody will deliver.
//!
//! Every `BULK_ACK_WAIT` each worker looks, for the `bulk-jobs` and `bulk-items` consumers, at
//! the stored messages of the consumer's filter at or below its ack floor. One seen there on two
//! sweeps in a row (so a message whose ack is being applied right now is left alone) is
//! re-published on its subject with the `Nats-Msg-Id` `swept-<stream sequence>` (so workers
//! sweeping at once publish it once) and the stranded copy is deleted. Processing it again is
//! safe: results are deduplicated by their `Nats-Msg-Id` and a chunk is counted once (by its
//! bit in the batch record); a job re-checks the batch's status.

use std::collections::HashSet;
use std::sync::Arc;

use async_nats::jetstream::message::PublishMessage;
use embatch_protocol::bulk::{JOBS_FILTER, items_filter};
use tokio_util::sync::CancellationToken;

use super::error::{LaneError, nats};
use super::{Lane, PullConsumer};

/// Most stored messages looked at per consumer and sweep (the rest wait for the next sweep).
const MAX_PER_SWEEP: usize = 1000;

/// Sweeps every `BULK_ACK_WAIT` until `stop`.
pub(super) async fn run(
    lane: Arc<Lane>,
    jobs: PullConsumer,
    items: PullConsumer,
    stop: CancellationToken,
) {
    let every = lane
        .config
        .ack_wait
        .max(std::time::Duration::from_millis(100));
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut suspects = [HashSet::new(), HashSet::new()];
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let items_filter = items_filter(&lane.config.model);
        for ((consumer, filter), seen) in [(&jobs, JOBS_FILTER), (&items, items_filter.as_str())]
            .into_iter()
            .zip(suspects.iter_mut())
        {
            match sweep(&lane, consumer, filter, seen).await {
                Ok(0) => {}
                Ok(swept) => {
                    metrics::counter!(crate::names::BULK_SWEPT).increment(swept as u64);
                    tracing::warn!(
                        filter,
                        swept,
                        "gave back work messages stranded below the consumer's ack floor"
                    );
                }
                Err(err) => tracing::debug!(%err, filter, "bulk sweep failed; next time"),
            }
        }
    }
}

/// One sweep of `consumer`: returns how many messages it gave back. `seen` holds the stranded
/// stream sequences of the previous sweep and is replaced by this sweep's.
async fn sweep(
    lane: &Lane,
    consumer: &PullConsumer,
    filter: &str,
    seen: &mut HashSet<u64>,
) -> Result<usize, LaneError> {
    let mut consumer = consumer.clone();
    let floor = consumer
        .info()
        .await
        .map_err(nats("cannot read the consumer's info"))?
        .ack_floor
        .stream_sequence;
    let mut stranded = HashSet::new();
    let mut swept = 0;
    let mut next = 1;
    for _ in 0..MAX_PER_SWEEP {
        if next > floor {
            break;
        }
        let message = match lane
            .store
            .work
            .get_first_raw_message_by_subject(filter, next)
            .await
        {
            Ok(message) => message,
            // None left on the filter at or after `next` ("no message found").
            Err(_) => break,
        };
        if message.sequence > floor {
            break;
        }
        next = message.sequence + 1;
        stranded.insert(message.sequence);
        if !seen.contains(&message.sequence) {
            continue;
        }
        let publish = PublishMessage::build()
            .message_id(format!("swept-{}", message.sequence))
            .payload(message.payload.clone());
        lane.store
            .js
            .send_publish(message.subject.to_string(), publish)
            .await
            .map_err(nats("cannot give back a stranded message"))?
            .await
            .map_err(nats("no acknowledgement of a message given back"))?;
        // Another worker may have deleted it first.
        let _ = lane.store.work.delete_message(message.sequence).await;
        stranded.remove(&message.sequence);
        swept += 1;
    }
    *seen = stranded;
    Ok(swept)
}
