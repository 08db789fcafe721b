//! The bulk contract's subjects and message ids: job messages, work items, chunk results and
//! batch events (all under [`SUBJECT_PREFIX`]).

use super::{ITEMS_CONSUMER, SUBJECT_PREFIX};

/// What a job message asks a worker to do (the last token of [`job_subject`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    /// Read the input file, validate every line, publish the work items, set `in_progress` (or
    /// `failed` with the `errors` list).
    Validate,
    /// Read the results back, write the output and error files, set the final status, purge the
    /// batch's items and results.
    Finalize,
}

impl JobKind {
    /// The subject token: `validate` or `finalize`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Validate => "validate",
            JobKind::Finalize => "finalize",
        }
    }

    /// The kind of a subject token.
    pub fn parse(token: &str) -> Option<JobKind> {
        match token {
            "validate" => Some(JobKind::Validate),
            "finalize" => Some(JobKind::Finalize),
            _ => None,
        }
    }
}

/// `embatch.bulk.v1.jobs.<batch_id>.<kind>`: a job message (empty payload). Published with
/// `Nats-Msg-Id` = [`job_msg_id`], so a job asked for twice (two gateways, a retried cancel) runs
/// once within the stream's duplicate window.
pub fn job_subject(batch_id: &str, kind: JobKind) -> String {
    format!("{SUBJECT_PREFIX}.jobs.{batch_id}.{}", kind.as_str())
}

/// `Nats-Msg-Id` of a job message: `<batch_id>.<kind>`.
pub fn job_msg_id(batch_id: &str, kind: JobKind) -> String {
    format!("{batch_id}.{}", kind.as_str())
}

/// The batch id and kind of a job subject, `None` for another subject.
pub fn parse_job_subject(subject: &str) -> Option<(&str, JobKind)> {
    let rest = subject
        .strip_prefix(SUBJECT_PREFIX)?
        .strip_prefix(".jobs.")?;
    let (batch_id, kind) = rest.rsplit_once('.')?;
    Some((batch_id, JobKind::parse(kind)?))
}

/// `embatch.bulk.v1.items.<model token>.<batch_id>`: the work items of a batch for `model`
/// (payload: [`Item`](super::Item) JSON). A batch uses one model, and each model's items have their own
/// subject, read by that model's workers only ([`items_consumer`]); the token is the model
/// subject's ([`crate::model::model_token`]).
pub fn items_subject(model: &str, batch_id: &str) -> String {
    format!(
        "{SUBJECT_PREFIX}.items.{}.{batch_id}",
        crate::model::model_token(model)
    )
}

/// `embatch.bulk.v1.items.<model token>.>`: the filter of `model`'s [`items_consumer`].
pub fn items_filter(model: &str) -> String {
    format!(
        "{SUBJECT_PREFIX}.items.{}.>",
        crate::model::model_token(model)
    )
}

/// `embatch.bulk.v1.items.*.<batch_id>`: every work item of a batch, whatever its model (to
/// purge them).
pub fn batch_items_filter(batch_id: &str) -> String {
    format!("{SUBJECT_PREFIX}.items.*.{batch_id}")
}

/// The durable pull consumer of `model`'s work items, shared by that model's workers:
/// `bulk-items-<name>`, the model name with every byte other than an ASCII letter, digit or `-`
/// written `_XX` (uppercase hex; JetStream keeps a consumer in a directory of its name, so only
/// characters safe in file names are used), e.g. `bulk-items-BAAI_2Fbge-small-en-v1_2E5`.
/// Filter: [`items_filter`].
pub fn items_consumer(model: &str) -> String {
    let mut name = format!("{ITEMS_CONSUMER}-");
    for byte in model.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'-' {
            name.push(char::from(byte));
        } else {
            name.push_str(&format!("_{byte:02X}"));
        }
    }
    name
}

/// `Nats-Msg-Id` of a work item: `<batch_id>.<chunk>`, so a split resumed after a crash
/// publishes no chunk twice.
pub fn item_msg_id(batch_id: &str, chunk: u32) -> String {
    format!("{batch_id}.{chunk}")
}

/// `embatch.bulk.v1.results.<batch_id>`: the chunk results of a batch (payload:
/// [`ChunkResult`](super::ChunkResult) JSON).
pub fn results_subject(batch_id: &str) -> String {
    format!("{SUBJECT_PREFIX}.results.{batch_id}")
}

/// `Nats-Msg-Id` of a chunk result: `<batch_id>.<chunk>.<part>` (a chunk's result larger than
/// the server's `max_payload` is published in parts).
pub fn result_msg_id(batch_id: &str, chunk: u32, part: u32) -> String {
    format!("{batch_id}.{chunk}.{part}")
}

/// `embatch.bulk.v1.events.<batch_id>`: a core NATS message with the [`Batch`](super::Batch) JSON, published
/// when the batch reaches a final status. Subscribe before creating the batch (or check the
/// batch's status after subscribing) to miss nothing.
pub fn events_subject(batch_id: &str) -> String {
    format!("{SUBJECT_PREFIX}.events.{batch_id}")
}
