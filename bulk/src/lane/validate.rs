//! The `validate` job: reads a batch's input file line by line (as bytes, [`LineReader`]),
//! checks each line (each must be UTF-8, fit a work item, and name a model served, one per
//! file), and publishes the work items on that model's items subject as it goes; then sets
//! `in_progress` (with the line and chunk counts) or, when a line was refused, `failed` with
//! OpenAI's `errors` list (and purges what it published).

use async_nats::jetstream::AckKind;
use async_nats::jetstream::message::PublishMessage;
use bytes::Bytes;
use embatch_protocol::bulk::{
    BatchError, BatchErrors, BatchStatus, Item, ItemLine, JobKind, item_msg_id, items_subject,
    unix_now,
};

use super::Lane;
use super::error::{LaneError, RenderError, nats};
use super::input::{Line, LineReader, decode, max_line_bytes};
use super::jobs::{Beat, ending_of, purge_items};
use super::lines::FileCheck;

/// Most entries of a failed batch's `errors` list (the KV value must stay under `max_payload`).
const MAX_ERRORS: usize = 1000;

/// Item publishes awaited together during a split.
const PUBLISH_WINDOW: usize = 256;

/// Bytes counted for a line in its work item's message besides its text. A line's entry in the
/// item (an `ItemLine` as JSON) is never longer than the line's text plus this: the text's
/// strings and numbers are written back no longer than they were read, and the entry's field
/// names and defaults the text may lack (`line`, `route`, `normalize`, `model`,
/// `encoding_format`) take under 150 bytes.
const LINE_OVERHEAD: usize = 256;

type PublishAck = async_nats::jetstream::context::PublishAckFuture;

/// Reads, checks and splits the input file of `batch_id` (see the module's doc).
pub(super) async fn validate(
    lane: &Lane,
    batch_id: &str,
    beat: &Beat,
) -> Result<AckKind, LaneError> {
    let store = &lane.store;
    let Some((record, _)) = store.batch(batch_id).await? else {
        return Ok(AckKind::Ack);
    };
    if record.batch.status != BatchStatus::Validating || ending_of(&record).is_some() {
        return Ok(AckKind::Ack); // split already done, or cancelled: finalize takes it
    }
    let file = record.batch.input_file_id;
    let object = match store.files.get(&file).await {
        Ok(object) => object,
        Err(err) => {
            let error = BatchError {
                code: "invalid_input_file".into(),
                message: format!("cannot read input file {file}: {err}"),
                param: Some("input_file_id".into()),
                line: None,
            };
            fail(lane, batch_id, vec![error]).await?;
            return Ok(AckKind::Ack);
        }
    };
    let cap = max_line_bytes(lane.max_payload);
    let mut reader = LineReader::new(tokio::io::BufReader::new(object), cap);
    let check = FileCheck::for_models(served_models(lane).await, lane.config.default_model.clone());
    let mut split = Split::new(lane, batch_id, check);
    while let Some(line) = reader.next().await.map_err(|source| LaneError::Input {
        file: file.clone(),
        source,
    })? {
        beat.beat();
        if split.line(&line, cap).await? {
            break;
        }
    }
    split.finish().await
}

/// A split under way: the checks across lines, the refused lines, the chunk being filled and
/// the item publishes not yet acknowledged.
struct Split<'a> {
    lane: &'a Lane,
    batch_id: &'a str,
    check: FileCheck,
    errors: Vec<BatchError>,
    chunk: Vec<ItemLine>,
    /// Inputs in `chunk` (against `BULK_CHUNK_INPUTS`).
    chunk_inputs: usize,
    /// Bytes of line text in `chunk` (against `BULK_CHUNK_BYTES`).
    chunk_bytes: usize,
    /// Bytes `chunk`'s lines may take in its item's message (against `max_payload`).
    item_bytes: usize,
    chunks: u32,
    pending: Vec<PublishAck>,
}

impl<'a> Split<'a> {
    fn new(lane: &'a Lane, batch_id: &'a str, check: FileCheck) -> Split<'a> {
        Split {
            lane,
            batch_id,
            check,
            errors: Vec::new(),
            chunk: Vec::new(),
            chunk_inputs: 0,
            chunk_bytes: 0,
            item_bytes: 0,
            chunks: 0,
            pending: Vec::new(),
        }
    }

    /// Checks one line (a blank one is skipped) and adds it to the chunk, or records why it is
    /// refused. Returns `true` when the file must not be read further (too many requests).
    async fn line(&mut self, line: &Line<'_>, cap: usize) -> Result<bool, LaneError> {
        let limits = self.lane.config.limits;
        let checked = decode(line, cap, self.lane.max_payload).and_then(|text| {
            if text.trim().is_empty() {
                return Ok(None);
            }
            let item_line = self.check.line(line.number, text, limits)?;
            Ok(Some((item_line, text.len())))
        });
        match checked {
            Ok(None) => Ok(false),
            Ok(Some((item_line, len))) => {
                if self.errors.is_empty() {
                    self.add(item_line, len).await?;
                } // else the batch fails: only the errors matter now
                Ok(false)
            }
            Err(error) => {
                let stop = error.code == "too_many_requests";
                if self.errors.len() < MAX_ERRORS {
                    self.errors.push(error);
                }
                Ok(stop)
            }
        }
    }

    /// Adds a checked line of `len` bytes to the chunk: first publishes the chunk when the
    /// line would take its item's message past `max_payload`, then when the chunk is full.
    async fn add(&mut self, line: ItemLine, len: usize) -> Result<(), LaneError> {
        let bytes = len + LINE_OVERHEAD;
        // A line alone always fits: it is at most max_line_bytes long.
        let budget = max_line_bytes(self.lane.max_payload) + LINE_OVERHEAD;
        if !self.chunk.is_empty() && self.item_bytes + bytes > budget {
            self.publish().await?;
        }
        self.chunk_inputs += line.request.inputs.len();
        self.chunk_bytes += len;
        self.item_bytes += bytes;
        self.chunk.push(line);
        let config = &self.lane.config;
        if self.chunk_inputs >= config.chunk_inputs || self.chunk_bytes >= config.chunk_bytes {
            self.publish().await?;
        }
        Ok(())
    }

    /// Publishes the chunk as a work item on the items subject of the batch's model (its
    /// workers take it); its acknowledgement is awaited with [`PUBLISH_WINDOW`] others.
    async fn publish(&mut self) -> Result<(), LaneError> {
        if self.chunk.is_empty() {
            return Ok(());
        }
        let model = self.check.model().unwrap_or(&self.lane.config.model);
        let subject = items_subject(model, self.batch_id);
        let item = Item {
            batch_id: self.batch_id.to_owned(),
            chunk: self.chunks,
            lines: std::mem::take(&mut self.chunk),
        };
        let payload = serde_json::to_vec(&item).map_err(RenderError::from)?;
        let publish = PublishMessage::build()
            .message_id(item_msg_id(self.batch_id, self.chunks))
            .payload(Bytes::from(payload));
        let ack = self
            .lane
            .store
            .js
            .send_publish(subject, publish)
            .await
            .map_err(nats(format!("cannot publish item {}", self.chunks)))?;
        self.pending.push(ack);
        self.chunks += 1;
        (self.chunk_inputs, self.chunk_bytes, self.item_bytes) = (0, 0, 0);
        if self.pending.len() >= PUBLISH_WINDOW {
            self.settle().await?;
        }
        Ok(())
    }

    async fn settle(&mut self) -> Result<(), LaneError> {
        for ack in self.pending.drain(..) {
            ack.await
                .map_err(nats("an item's publish was not acknowledged"))?;
        }
        Ok(())
    }

    /// Ends the split: `failed` with the errors (and the published items purged), or
    /// `in_progress` with the counts (and the `finalize` job when there is nothing to embed).
    async fn finish(mut self) -> Result<AckKind, LaneError> {
        let (lane, batch_id) = (self.lane, self.batch_id);
        if self.errors.is_empty() {
            self.publish().await?;
        }
        self.settle().await?;
        if !self.errors.is_empty() {
            purge_items(lane, batch_id).await?;
            fail(lane, batch_id, self.errors).await?;
            return Ok(AckKind::Ack);
        }
        let now = unix_now();
        let (total, chunks) = (self.check.requests, self.chunks);
        let record = lane
            .store
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
            .await?;
        tracing::info!(batch = batch_id, lines = total, chunks, "bulk batch split");
        if record.embatch.all_done() && record.batch.status == BatchStatus::InProgress {
            lane.store.publish_job(batch_id, JobKind::Finalize).await?;
        }
        Ok(AckKind::Ack)
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

/// Fails a `validating` batch with `errors` (a batch in any other status is left as it is).
async fn fail(lane: &Lane, batch_id: &str, errors: Vec<BatchError>) -> Result<(), LaneError> {
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
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::LineLimits;
    use super::super::input::ITEM_ENVELOPE;
    use super::*;

    /// A line's entry in its work item is never longer than its text plus [`LINE_OVERHEAD`],
    /// so the budget [`Split::add`] keeps holds, and an item of one line at the limit fits one
    /// message.
    #[test]
    fn an_item_line_takes_no_more_than_its_text_and_the_overhead() {
        let limits = LineLimits {
            max_requests: 100,
            max_line_inputs: 100,
        };
        let lines = [
            // Shortest: every field the entry adds and the text lacks.
            r#"{"custom_id":"a","url":"/embed","body":{"inputs":"x"}}"#,
            r#"{"custom_id":"b","url":"/embed","body":{"inputs":[1,2,3]}}"#,
            r#"{"custom_id":"c","url":"/v1/embeddings","body":{"input":"y"}}"#,
            r#"{"custom_id":"d","url":"/v1/embeddings","body":{"input":[[7,8],"z"],"model":"m","encoding_format":"base64","dimensions":8}}"#,
            r#"{"custom_id":"e","url":"/embed","body":{"inputs":["p","q"],"normalize":false,"truncate":true,"truncation_direction":"left","prompt_name":"query","dimensions":4}}"#,
            // Escapes are written back no longer than read.
            r#"{"custom_id":"f\u0001\"\\","url":"/embed","body":{"inputs":"\u00e9\u0000\t\n\ud83e\udd80\/"}}"#,
            r#"{ "custom_id" : "g" , "url" : "/embed" , "body" : { "inputs" : [ "a" , "b" ] } }"#,
        ];
        let mut check = FileCheck::default();
        for (n, text) in lines.iter().enumerate() {
            let line = check
                .line(n as u64 + 1, text, limits)
                .unwrap_or_else(|e| panic!("{text}: {e:?}"));
            let mut line = line;
            line.line = u64::MAX; // the longest line number
            let entry = serde_json::to_vec(&line).expect("an entry").len();
            assert!(
                entry <= text.len() + LINE_OVERHEAD,
                "{text}: {entry} bytes as an entry, {} as text",
                text.len()
            );
        }
        // An item of one line at the limit, with the longest batch id and chunk index, the
        // `Nats-Msg-Id` header and its framing, fits `max_payload`.
        let item = Item {
            batch_id: format!("batch_{}", "X".repeat(22)),
            chunk: u32::MAX,
            lines: Vec::new(),
        };
        let envelope = serde_json::to_vec(&item).expect("an item").len() + 128;
        let max_payload = 1 << 20;
        assert!(max_line_bytes(max_payload) + LINE_OVERHEAD + envelope <= max_payload);
        assert!(LINE_OVERHEAD + envelope <= ITEM_ENVELOPE);
    }
}
