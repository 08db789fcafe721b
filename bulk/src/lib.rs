//! The bulk lane: OpenAI-style batch jobs on NATS JetStream (files in an object store, batch
//! records in a KV bucket, jobs and work items in a work-queue stream). The wire contract (names
//! and shapes) is `embatch_protocol::bulk`; docs/design/bulk-jobs.md explains the choices.
//!
//! - [`BulkStore`]: the JetStream set-up and the batch-record operations the gateway and the
//!   workers share.

mod store;

pub use store::{
    BulkError, BulkStore, FILES_MAX_BYTES_DEFAULT, FILES_STREAM, FilesUsage, NO_STREAM_RETRY,
    RESULTS_DUPLICATE_WINDOW, WORK_DUPLICATE_WINDOW, is_valid_key,
};
