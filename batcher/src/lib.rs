//! The batcher: an actor that turns many small requests into few full upstream calls to one
//! [`Backend`]. Pure: no NATS, no HTTP; the worker wires it to its intake, its upstream (TEI or
//! the built-in model, each a [`Backend`]) and its traces.
//!
//! [`spawn`] starts one task, the actor, that owns all queue and admission state; callers send
//! it their request through a cloneable [`BatcherHandle`] and get the admit/refuse answer and
//! then the outcome on `oneshot` channels. The handle shares no lock with the actor: it runs
//! only the checks that need no state (400, 413, 504) and reads a copy of the admission ledger
//! the actor publishes after each step (for the queue-group membership's load).
//!
//! - `admission`: the queue bounds, the call-time estimate and the admit decision;
//! - `fair`: the upstream shared between tenants by weight ([`Share`]);
//! - `queue`: groups by options, due times, batch formation;
//! - `shape`: the token budget, the cost model and the length shaping of a batch;
//! - `actor`: the select loop, the supervised batch tasks, and every metric ([`names`]);
//! - `isolate`: one batch's upstream calls, and the bisection of a batch that failed because of an
//!   input;
//! - `unique`: each distinct input of a call sent once, its embedding fanned out to every
//!   position holding it.
//!
//! # How a batch forms
//! Requests are grouped by their [`EmbedOptions`] (requests whose options differ never share an
//! upstream call). At most `max_concurrent_batches` calls are in flight. Whenever a call slot is
//! free, the oldest group that is due leaves as one call of up to the batch limit (the smaller of
//! `max_batch_size` and the upstream's own limit) costing at most `max_batch_tokens` (see
//! `shape`: `longest × inputs` on a padded upstream, the sum of tokens on an unpadded one; an
//! input over the whole budget leaves alone). Every input carries its token count (see
//! [`BatcherHandle::submit`]). The batch is shaped by length: it holds the group's oldest waiting
//! input and, among the group's first 4 × batch-limit waiting inputs, those of the nearest
//! lengths (padded upstream; inputs of equal length in arrival order) or the oldest that fit the
//! budget (unpadded). So the oldest waiting input of a group is never passed over: it is in the
//! next batch of its group, and an input with `k` older inputs waiting in its group leaves with
//! one of the next `k + 1` batches of that group. Inside each call to a padded upstream the inputs
//! are sent shortest first (one grouping them in arrival order pads little); each request
//! still gets exactly its own embeddings, in its order. A group is due when:
//! - it holds a full batch (`max_batch_size` inputs, or tokens enough to fill
//!   `max_batch_tokens`): any free slot takes it;
//! - no call is in flight and `dispatch_when_idle` is on (the default): an idle upstream takes
//!   any waiting group at once, full or not;
//! - its oldest request has waited `max_wait` and fewer than `partial_batch_slots` calls are in
//!   flight (by default `max_concurrent_batches - 1`, at least 1): the slots beyond those take
//!   full batches only, so while the upstream is busy a batch that is not full keeps filling
//!   here rather than queueing inside the upstream;
//! - the batcher is shutting down: everything leaves.
//!
//! With the defaults (2 slots, 1 for partial batches, dispatch when idle) a batch that is not
//! full therefore leaves only when the upstream is idle, and `max_wait` never sends one (it still
//! enters the `auto` queue-delay bound below); it bounds the wait of a partial batch when
//! `dispatch_when_idle` is off or `partial_batch_slots` is above 1. A request with more inputs
//! than the batch limit is split over several calls and reassembled in order.
//!
//! # Overload
//! The actor decides admission when the request reaches it, before queueing it, and never
//! queues a request it expects to fail ([`BatcherHandle::submit`] delivers a refusal as the
//! outcome; [`BatcherHandle::try_submit`] waits for the answer):
//! - Bounds: at most `queue_cap` inputs and `max_queue_bytes` bytes of input text are accepted
//!   and not yet answered; beyond them a request gets 429 ([`EmbedError::Overloaded`]), and a
//!   request larger than a whole bound gets 413.
//! - A worker with nothing queued and a free upstream slot admits any request: the estimate
//!   below cannot lock it out.
//! - Otherwise the upstream call time, measured from completed calls, says when the request
//!   would start (the batches queued ahead, assumed full, pass `max_concurrent_batches` at a
//!   time; counted by inputs or by tokens, whichever needs more calls) and finish. It is
//!   admitted only if it would finish within 75 % of its deadline
//!   budget and, when it fits one upstream call, start within `max_queue_delay`; else 429, with
//!   a retry-after estimate ([`BatcherHandle::try_submit`], [`BatcherHandle::retry_after_hint`]).
//!   A request of several calls waits longer than the bound for its own work alone: its
//!   deadline, `queue_cap` and `max_queue_bytes` bound it (a closed-loop indexing client with
//!   8 requests of 512 inputs in flight is served, not shed).
//! - `max_queue_delay` defaults to `auto`: 2 × the measured call time + `max_wait`, but at
//!   least [`AUTO_FLOOR`] (500 ms) while fewer than [`AUTO_FLOOR_REQUESTS`] (512) requests are
//!   held (accepted and not answered, as TEI counts `--max-concurrent-requests`). A queue longer than what keeps the upstream busy adds latency, never throughput: with every
//!   slot busy, the next batch of each slot must be ready when it frees, which is one call time
//!   of queued work; 2 calls allow as much again as slack for bursts and for the estimate's
//!   error (it assumes full batches), plus the `max_wait` a forming batch may spend. Beyond that
//!   a worker steers new work to peers with room (membership); it sheds there only once the
//!   queue is also long in requests or in time: in front of a fast upstream, a closed loop of a
//!   few hundred callers keeps a standing queue of many calls with no overload, and a 429 only
//!   makes them resend, while an open loop over capacity holds 512 requests within a second
//!   (docs/design/queue-delay-floor.md). For a request that fits one call, a client's deadline
//!   can only tighten the bound.
//! - The call-time estimate is a moving average that leans to fresh news: a sample's weight
//!   grows with the time since the previous one, a faster sample weighs at least 1/2 (a slower
//!   one 1/4: an estimate too high sheds the calls that would correct it, one too low corrects
//!   itself), and an estimate older than two call times shrinks with its age. When no call has
//!   started or ended for a call time, one request the estimate would refuse is let through as a
//!   probe, at admission and at dispatch (at most one probe call in flight).
//! - A request whose deadline passes while inputs of it wait in the queue gets 504
//!   ([`EmbedError::DeadlineExceeded`]) at its deadline, and its share of the bounds is free at
//!   once (a timer on the earliest deadline, no scan). One whose deadline comes before a call
//!   started now could finish (by a fresh estimate) gets 504 when its batch forms, and causes no
//!   upstream work, unless everything queued fits that one call: then it goes as a probe (a
//!   stale estimate costs a probe, not a failure).
//! - A request whose receiver is dropped (the caller went away) is removed from the queue at
//!   once, freeing its share of the bounds; its queued inputs cause no upstream work.
//!
//! # Faults
//! Batch tasks are supervised: a batch task that panics fails exactly its requests with 424
//! ([`EmbedError::Backend`], "upstream call crashed") and frees its upstream slot. When the
//! upstream blames an input of a batch of several requests, the batch is bisected by request and
//! retried until the offending request(s) are isolated; the others still get their embeddings.
//! A 424 (the model failed on the batch) is bisected too, within bounds that spare an upstream
//! failing for everyone (see `isolate`). Upstream failures (refused, 5xx, timeout) fail only the
//! requests of that call.
//!
//! # Tracing
//! Each accepted request has a span (`embed_request`: inputs, bytes, then outcome) from submit to
//! answer, a child of the submitter's current span; each batch task runs in a span
//! (`upstream_batch`: inputs, requests, probe) that follows from the spans of its requests, so
//! the upstream call's events carry it. Request spans are at `debug` level
//! (`RUST_LOG=embatch_batcher=debug` turns them on), so the default `info` records none per
//! request; batch spans are at `info`.
//!
//! # Shutdown
//! When every [`BatcherHandle`] is dropped, the actor stops waiting for `max_wait`, sends all it
//! holds upstream, answers every accepted request and exits.
//!
//! [`EmbedOptions`]: embatch_protocol::EmbedOptions
//! [`EmbedError::Overloaded`]: embatch_protocol::EmbedError::Overloaded
//! [`EmbedError::DeadlineExceeded`]: embatch_protocol::EmbedError::DeadlineExceeded
//! [`EmbedError::Backend`]: embatch_protocol::EmbedError::Backend

mod actor;
mod admission;
mod backend;
mod bulk;
mod embedding;
mod fair;
mod fastest;
mod handle;
mod isolate;
mod load;
pub mod names;
mod queue;
mod shape;
#[cfg(test)]
mod tests;
mod traces;
mod unique;

pub use admission::{AUTO_CALLS, AUTO_FLOOR, AUTO_FLOOR_REQUESTS, QueueDelay, QueueDelayError};
pub use backend::{Backend, UpstreamError};
pub use bulk::{BulkGate, BulkOutcome};
pub use embedding::{Embedding, ShapeError};
pub use fair::Share;
pub use handle::{
    BatcherConfig, BatcherHandle, Outcome, Refused, Reply, SHED_REASONS, spawn, spawn_traced,
};
pub use load::{Load, STALL_CALLS, STALL_MIN};
pub use shape::{
    BUILTIN_MAX_BATCH_TOKENS, BatchCost, TEI_DEFAULT_MAX_BATCH_TOKENS, TokenBudget,
    estimate_lengths,
};
pub use traces::Traces;

// What the handles and the actor share, for the modules below the crate root.
use handle::{BulkJob, Job, Sent, Shared, stopped};
