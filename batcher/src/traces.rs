//! How the batcher's spans join the process's distributed traces. The batcher records spans
//! through `tracing` only; the process that exports them (the worker, over OpenTelemetry) hands
//! it these hooks ([`crate::spawn_traced`]).

use tokio::time::Instant;

/// The hooks through which the batcher's spans join distributed traces; the default (nothing
/// exported) does nothing.
#[derive(Debug, Clone, Copy)]
pub struct Traces {
    /// Whether spans are exported now: when not, a batch's span gets no parent (the batcher
    /// does not look for its oldest request).
    pub enabled: fn() -> bool,
    /// Makes `span` (a batch's `upstream_batch`) a child of `parent` (the `embed_request` of the
    /// batch's oldest request), before `span` is first entered.
    pub set_parent: fn(span: &tracing::Span, parent: &tracing::Span),
    /// Records the `queue_wait` interval of a request whose `embed_request` span is `span`: from
    /// `accepted` to its `first_call`.
    pub queue_waited: fn(span: &tracing::Span, accepted: Instant, first_call: Instant),
}

impl Default for Traces {
    fn default() -> Traces {
        Traces {
            enabled: || false,
            set_parent: |_, _| {},
            queue_waited: |_, _, _| {},
        }
    }
}
