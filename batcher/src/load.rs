//! What the batcher says about the worker's load and its upstream, for the worker's queue-group
//! membership (which decides from it whether the worker stays in the group).

use std::time::Duration;

/// An upstream with calls in flight that started or finished none for this many of its
/// measured call times (the longer of the usual and the longest seen lately) is stalled
/// ([`Load::stalled`]).
pub const STALL_CALLS: u32 = 10;
/// ... and for at least this long: 500 ms. Shorter pauses happen to healthy workers: a CPU
/// quota's throttling (100 ms periods), a loaded host (a 260 ms pause of every process was seen
/// on a 2-core machine at load 12). With 1 s, an upstream stopped for 1.5 s held its requests
/// until it continued (the stall was seen, and the heartbeat silent, only 1.5 s in).
pub const STALL_MIN: Duration = Duration::from_millis(500);

/// What the batcher says about the worker's load and its upstream (see
/// [`crate::BatcherHandle::load`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Load {
    /// Expected time until a request queued now gets its first upstream call; `None` before
    /// the first call was measured.
    pub start_wait: Option<Duration>,
    /// The estimated upstream call time; `None` before the first measurement.
    pub call: Option<Duration>,
    /// The queue wait the worker is meant to keep below with that call time (`MAX_QUEUE_DELAY`;
    /// `auto` = 2 × the call time + `MAX_WAIT_TIME`, where admission sheds only beyond 500 ms
    /// while the queue is short in inputs); `None` before the first measurement.
    pub bound: Option<Duration>,
    /// Upstream calls that failed in a row (refused, 5xx, timeout), since the last success.
    pub failed_calls: u32,
    /// Whether another worker is a member of the queue group now *and has room* (its typical
    /// queue wait under half its bound), as the last answer to its question says: the worker's
    /// queue group sets it (the batcher knows no peers and leaves it `false`); a full worker
    /// leaves only then, and rejoins when it is no longer so.
    pub peer_has_room: bool,
    /// Upstream calls are in flight and none started or ended for [`STALL_CALLS`] call times
    /// (at least [`STALL_MIN`]): the upstream hangs.
    pub stalled: bool,
}
