//! The bulk lane: OpenAI-style batch jobs on NATS JetStream (files in an object store, batch
//! records in a KV bucket, jobs and work items in a work-queue stream, results in a stream).
//! The wire contract (names and shapes) is `embatch_protocol::bulk`; docs/design/bulk-jobs.md
//! explains the choices.
//!
//! - [`BulkStore`] (`store`): the JetStream set-up and the batch-record operations the gateway
//!   and the workers share.
//! - [`run`] (`lane`): the workers' side: validates a batch's input file into work items, embeds
//!   them through the batcher's [`embatch_batcher::BulkGate`] in the capacity interactive
//!   traffic leaves, and finalizes the batch's output and error files.
//! - [`Host`] (`host`): what the lane takes from the worker that runs it (a batch's owner, a
//!   line's token count), as traits the worker implements, so this crate does not depend on it.
//! - [`names`]: the lane's metric names, which the worker exports among its own.
//!
//! The gateway's HTTP routes stay in the gateway (`gateway/src/bulk/`).

mod host;
mod lane;
pub mod names;
mod store;

pub use host::{Counted, Host, Owner, Owners, TokenCounter};
pub use lane::{BulkConfig, LineLimits, RETRY, run};
pub use store::{
    BulkError, BulkStore, FILES_MAX_BYTES_DEFAULT, FILES_STREAM, FilesUsage, NO_STREAM_RETRY,
    RESULTS_DUPLICATE_WINDOW, WORK_DUPLICATE_WINDOW, is_valid_key,
};
