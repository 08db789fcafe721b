//! Progress: the chunks a worker finished, recorded in their batch's record in few
//! compare-and-set rounds.
//!
//! Every finished work item must mark its chunk done in the batch's KV record (by its bit, so a
//! redelivered chunk counts once) before it is acked. Done item by item, the worker's items of
//! one batch race each other on the same key: each mark costs a read and a write, and every
//! concurrent one a retry. Here one task owns the writes of this worker: marks that arrive
//! while a round is under way are applied together in the next round, one read and one write
//! per batch however many chunks it carries (another worker's write still costs a retry, as
//! before). Each item gets the record as its round left it, and acks only then.

use std::collections::HashMap;
use std::sync::Arc;

use embatch_protocol::bulk::BatchRecord;
use tokio::sync::{mpsc, oneshot};

use super::Lane;
use super::error::LaneError;

/// One finished chunk: its output lines that succeeded and failed.
struct Mark {
    batch_id: String,
    chunk: u32,
    ok: u64,
    failed: u64,
    done: oneshot::Sender<Result<BatchRecord, LaneError>>,
}

/// The sending side: cloned into each item's task. The recording task ends once every clone
/// is dropped and the marks sent are recorded.
#[derive(Clone)]
pub(super) struct Progress {
    tx: mpsc::UnboundedSender<Mark>,
}

impl Progress {
    /// Starts the recording task on `lane`'s store.
    pub fn spawn(lane: Arc<Lane>) -> (Progress, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Progress { tx }, tokio::spawn(record(lane, rx)))
    }

    /// Marks `chunk` of `batch_id` done with `ok` and `failed` output lines (counted once per
    /// chunk, and not at all once the batch is final) and waits until the record holds it.
    /// Returns the record as it is then.
    ///
    /// # Errors
    /// The store's error (the item is then redelivered), or the recorder stopped.
    pub async fn mark(
        &self,
        batch_id: &str,
        chunk: u32,
        ok: u64,
        failed: u64,
    ) -> Result<BatchRecord, LaneError> {
        let (done, answer) = oneshot::channel();
        self.tx
            .send(Mark {
                batch_id: batch_id.to_owned(),
                chunk,
                ok,
                failed,
                done,
            })
            .map_err(|_| LaneError::RecorderStopped)?;
        answer.await.map_err(|_| LaneError::RecorderStopped)?
    }
}

/// Records marks until every sender is gone: each round takes every mark waiting, and writes
/// each batch's marks in one compare-and-set.
async fn record(lane: Arc<Lane>, mut rx: mpsc::UnboundedReceiver<Mark>) {
    let mut waiting = Vec::new();
    while rx.recv_many(&mut waiting, usize::MAX).await > 0 {
        let mut by_batch: HashMap<String, Vec<Mark>> = HashMap::new();
        for mark in waiting.drain(..) {
            by_batch
                .entry(mark.batch_id.clone())
                .or_default()
                .push(mark);
        }
        let rounds = by_batch.into_iter().map(|(batch_id, marks)| {
            let lane = &lane;
            async move {
                let written = lane
                    .store
                    .update_batch(&batch_id, |record| {
                        if record.batch.status.is_final() {
                            return false;
                        }
                        let mut changed = false;
                        for mark in &marks {
                            if record.embatch.mark_done(mark.chunk) {
                                record.batch.request_counts.completed += mark.ok;
                                record.batch.request_counts.failed += mark.failed;
                                changed = true;
                            }
                        }
                        changed
                    })
                    .await;
                for mark in marks {
                    let _ = mark.done.send(written.clone().map_err(LaneError::from));
                }
            }
        });
        futures::future::join_all(rounds).await;
    }
}
