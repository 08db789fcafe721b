//! `MAX_QUEUE_DELAY`: how long a request that fits one upstream call may expect to wait in the
//! queue, whatever its deadline, and the two bounds derived from it: the one admission sheds at
//! and the lower one at which a worker steers new work to its peers (queue-group membership).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::Limits;

/// Bound on the time a request may expect to wait in the queue before its first upstream call
/// (`MAX_QUEUE_DELAY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueDelay {
    /// The larger of [`AUTO_FLOOR`] and [`AUTO_CALLS`] × the measured upstream call time +
    /// `MAX_WAIT_TIME` (see the crate docs). No bound until the first
    /// call was measured.
    #[default]
    Auto,
    /// A fixed bound.
    Fixed(Duration),
}

/// Upstream call times [`QueueDelay::Auto`] allows as queue wait (plus `MAX_WAIT_TIME`): the
/// queue a busy upstream needs to never idle, plus as much again as slack. A worker whose
/// backlog is longer steers new work to its peers (it leaves the queue group when another
/// member has room), but sheds only beyond [`AUTO_FLOOR`].
pub const AUTO_CALLS: u32 = 2;

/// Queue wait [`QueueDelay::Auto`] admits while fewer than [`AUTO_FLOOR_REQUESTS`] requests are
/// held: 500 ms. A closed loop of a few hundred callers in front of a fast upstream keeps a
/// standing queue of many calls without any overload, and a 429 only makes each caller resend
/// (or fail, if it does not retry); such a queue is short in time and in requests.
pub const AUTO_FLOOR: Duration = Duration::from_millis(500);

/// Requests held (accepted and not yet answered) from which [`QueueDelay::Auto`] is back to its
/// call-time bound: 512, TEI's `--max-concurrent-requests` default, which counts requests too. A
/// closed loop holds at most one request per caller whatever their size, so no closed loop of up
/// to 511 callers reaches it (64 callers of 20 inputs included), while an open loop over
/// capacity does within a second, and its successes then wait about the call-time bound, not
/// [`AUTO_FLOOR`] (a client with its own timeout of 1-2 s and no deadline header keeps its
/// goodput). Counted in inputs, this bound shed closed loops of multi-input requests
/// (docs/design/queue-delay-floor.md).
pub const AUTO_FLOOR_REQUESTS: usize = 512;

/// `MAX_QUEUE_DELAY` is neither `auto` nor a duration.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("expected `auto` or a duration such as `500ms`: {0}")]
pub struct QueueDelayError(#[from] humantime::DurationError);

impl FromStr for QueueDelay {
    type Err = QueueDelayError;

    /// `auto`, or a duration with unit (`250ms`, `2s`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("auto") {
            return Ok(QueueDelay::Auto);
        }
        Ok(QueueDelay::Fixed(humantime::parse_duration(s)?))
    }
}

impl fmt::Display for QueueDelay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueDelay::Auto => f.write_str("auto"),
            QueueDelay::Fixed(d) => write!(f, "{}", humantime::format_duration(*d)),
        }
    }
}

/// The queue wait a worker is meant to keep below with the upstream call time `call`:
/// [`AUTO_CALLS`] × `call` + `MAX_WAIT_TIME` for `auto`, else the fixed bound. Membership steers
/// new work away beyond it.
pub(crate) fn steer_bound(limits: &Limits, call: Duration) -> Duration {
    match limits.max_queue_delay {
        QueueDelay::Fixed(bound) => bound,
        QueueDelay::Auto => call
            .saturating_mul(AUTO_CALLS)
            .saturating_add(limits.max_wait),
    }
}

/// `MAX_QUEUE_DELAY` in effect with the upstream call time `call` and `held` requests accepted
/// and not yet answered: the expected queue wait beyond which admission answers 429. For
/// `auto`, [`steer_bound`], but at least [`AUTO_FLOOR`] while fewer than
/// [`AUTO_FLOOR_REQUESTS`] are held.
pub(crate) fn shed_bound(limits: &Limits, call: Duration, held: usize) -> Duration {
    match limits.max_queue_delay {
        QueueDelay::Fixed(bound) => bound,
        QueueDelay::Auto if held < AUTO_FLOOR_REQUESTS => steer_bound(limits, call).max(AUTO_FLOOR),
        QueueDelay::Auto => steer_bound(limits, call),
    }
}

/// How admission's 429 names the bound: `auto: …` with its terms, or `fixed`.
pub(crate) fn describe(limits: &Limits, call: Duration) -> String {
    match limits.max_queue_delay {
        QueueDelay::Auto => format!(
            "auto: {AUTO_CALLS} x the {} ms upstream call + MAX_WAIT_TIME, at least {} ms while \
             fewer than {AUTO_FLOOR_REQUESTS} requests are held",
            call.as_millis(),
            AUTO_FLOOR.as_millis()
        ),
        QueueDelay::Fixed(_) => "fixed".into(),
    }
}
