//! The bulk lane's one error type: what failed, and the source it failed with.

use std::time::Duration;

use embatch_protocol::EmbedError;

pub(super) use super::render::RenderError;
use crate::BulkError;

/// Why a step of the bulk lane failed: a job run (retried up to `BULK_MAX_DELIVER` deliveries,
/// then its batch fails with this as the reason), a work item (NAKed, redelivered) or a sweep.
#[derive(Debug, thiserror::Error)]
pub(super) enum LaneError {
    /// The batch record could not be read or written.
    #[error(transparent)]
    Store(#[from] BulkError),
    /// A JetStream or object-store call failed (`what` says which).
    #[error("{what}: {source}")]
    Nats {
        /// What was being done.
        what: String,
        /// The client's error.
        #[source]
        source: async_nats::Error,
    },
    /// The input file could not be read (its store, not its content).
    #[error("cannot read input file {file}: {source}")]
    Input {
        /// The input file's id.
        file: String,
        /// The reader's error.
        #[source]
        source: std::io::Error,
    },
    /// The output or error file could not be written.
    #[error("cannot write the files of {batch}: {source}")]
    Output {
        /// The batch.
        batch: String,
        /// The pipe's error.
        #[source]
        source: std::io::Error,
    },
    /// A pull of the batch's results brought nothing before all were read.
    #[error("read {read} of the {stored} results of {batch}, then none came")]
    ResultsDry {
        /// The batch.
        batch: String,
        /// Results read.
        read: u64,
        /// Results stored when the reading began.
        stored: u64,
    },
    /// An output line, a work item or a chunk's results could not be encoded.
    #[error(transparent)]
    Render(#[from] RenderError),
    /// The upstream failed on a work item's lines, not for an input's fault.
    #[error("the upstream failed: {0}")]
    Upstream(EmbedError),
    /// The task that records the chunks done stopped (the worker is stopping).
    #[error("the progress recorder stopped")]
    RecorderStopped,
    /// The run made no progress for this long and was abandoned.
    #[error("no progress for {0:?}; abandoned")]
    Stalled(Duration),
    /// The run panicked.
    #[error("the job panicked: {0}")]
    Panicked(String),
    /// The message came more than `max` times: the runs before ended without an answer.
    #[error(
        "delivered {delivered} times, more than BULK_MAX_DELIVER ({max}): the runs before ended \
         without an answer (their worker stopped or died)"
    )]
    Exhausted {
        /// This delivery.
        delivered: i64,
        /// `BULK_MAX_DELIVER`.
        max: i64,
    },
}

/// `map_err` for a JetStream call: [`LaneError::Nats`] saying `what` failed.
pub(super) fn nats<E>(what: impl std::fmt::Display) -> impl FnOnce(E) -> LaneError
where
    E: std::error::Error + Send + Sync + 'static,
{
    move |source| LaneError::Nats {
        what: what.to_string(),
        source: Box::new(source),
    }
}
