//! Queue-group membership: a worker is a member of the NATS queue group only while it can serve
//! in time, so the server routes requests to the workers that can take them.
//!
//! A NATS queue group hands each member an equal random share, whatever it can do. With
//! `MEMBERSHIP=adaptive` (the default) a worker leaves the group:
//! - **full**: when a new request would wait more than one upstream call time plus
//!   `MAX_WAIT_TIME` before its first call (its backlog is more than the upstream can start on
//!   within about one batch time); it rejoins once that wait is down to half a call time, i.e.
//!   its queue is empty (with every upstream slot busy, the next batch leaves as a slot frees);
//! - **upstream unhealthy**: after [`FAILURES_TO_LEAVE`] failed upstream calls in a row
//!   (refused, 5xx, timeouts, malformed replies; an upstream's 429 or an input it rejects does not
//!   count) or as many failed `/health` probes in a row, or while its calls stall (in flight, and
//!   none started or ended for [`STALL_CALLS`] call times, at least [`STALL_MIN`]: a hung
//!   upstream); it rejoins when a probe succeeds and no call stalls. While out for this reason
//!   its heartbeat is silent, so clients resend what it holds (see `crate::heartbeat`).
//!   Probes run every [`PROBE_INTERVAL_UNHEALTHY`] while the worker is out for this reason, every
//!   [`PROBE_INTERVAL`] otherwise, each bounded by [`PROBE_TIMEOUT`].
//!
//! Leaving is `Subscriber::drain()`: the requests read before the subscription ends are
//! answered (by admission: admitted or shed with 429); what the client library or the server
//! drops around the unsubscribe was never acknowledged, and clients that asked for an
//! acknowledgement resend it (see `crate::group`). The discovery service stays registered and
//! reports the state (see `crate::micro`). `MEMBERSHIP=static` keeps the worker a member whatever happens (each
//! worker then gets an equal share and sheds what it cannot serve with 429).
//!
//! This module is the decision only: plain data and functions, no clock reads, no channels.
//! `crate::group` feeds it (from the intake's loop and the upstream probes) and subscribes or
//! drains accordingly.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use embatch_protocol::headers::membership as label;

/// The batcher's report of the load (`embatch_batcher::BatcherHandle::load`), and the limits it
/// finds a stalled upstream by.
pub use embatch_batcher::{Load, STALL_CALLS, STALL_MIN};

/// Failed upstream calls (or `/health` probes) in a row after which a worker leaves.
pub const FAILURES_TO_LEAVE: u32 = 2;
/// Interval of the upstream `/health` probe while the worker is a member or full.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// Interval of the probe while the worker is out because its upstream failed: it rejoins within
/// this (plus the probe's own time) of the upstream's recovery.
pub const PROBE_INTERVAL_UNHEALTHY: Duration = Duration::from_millis(250);
/// Longest a probe may take before it counts as failed: 5 s. A probe asks whether the upstream
/// is alive, not how fast it is (admission learns that from the calls): a server busy with other
/// callers' work answers `/health` late (a Python model server with 64 connections took more than
/// 1 s). A hung upstream is found sooner by the calls that stall ([`STALL_CALLS`]), and a dead
/// one refuses the probe at once. A probe that fails while the upstream answers the worker's own
/// calls does not count (see `crate::group`).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// `MEMBERSHIP`: whether a worker leaves the queue group while it cannot serve in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Leave while full or while the upstream fails; rejoin when drained or recovered.
    #[default]
    Adaptive,
    /// Always a member (until shutdown).
    Static,
}

/// `MEMBERSHIP` was neither `adaptive` nor `static` (the value given).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected `adaptive` or `static`, got `{0}`")]
pub struct UnknownMode(pub String);

impl FromStr for Mode {
    type Err = UnknownMode;

    /// `adaptive` or `static`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "adaptive" => Ok(Mode::Adaptive),
            "static" => Ok(Mode::Static),
            other => Err(UnknownMode(other.to_owned())),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Adaptive => "adaptive",
            Mode::Static => "static",
        })
    }
}

/// A worker's membership, as discovery reports it (the `membership` metadata).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    /// In the queue group.
    Joined,
    /// Out while its backlog drains.
    Full,
    /// Out while its upstream fails.
    UpstreamUnhealthy,
    /// Out for good: shutting down.
    Stopping,
}

impl MemberState {
    /// The discovery metadata value ([`embatch_protocol::headers::membership`]).
    pub fn label(self) -> &'static str {
        match self {
            MemberState::Joined => label::JOINED,
            MemberState::Full => label::FULL,
            MemberState::UpstreamUnhealthy => label::UPSTREAM_UNHEALTHY,
            MemberState::Stopping => label::STOPPING,
        }
    }

    /// Whether the worker holds a subscription in the queue group.
    pub fn is_member(self) -> bool {
        self == MemberState::Joined
    }
}

impl Membership {
    /// Whether this worker has room for a peer's share: a member whose *typical* queue wait
    /// (`load.start_wait` smoothed over recent requests by the caller) is at most half its
    /// bound, or that has measured nothing yet. While it has room it answers its peers' questions
    /// (see `crate::peers`). The instant wait would not do: a saturated worker's queue empties for a
    /// moment after every dispatch, and peers that left on that flicker pushed their share onto
    /// it (benchmark 5, measured).
    pub fn has_room(&self, smoothed: Load) -> bool {
        self.state.is_member() && self.under_low_water(smoothed)
    }

    /// Whether the decision needs to know if a peer has room (`load.peer_has_room`): a member
    /// over its bound (it leaves if one has) or a full worker (it rejoins when none has), with
    /// `MEMBERSHIP=adaptive`. Only then does a worker ask its peers (see `crate::peers`).
    pub fn asks_for_room(&self, load: Load) -> bool {
        self.mode == Mode::Adaptive
            && match self.state {
                MemberState::Joined => self.over_high_water(load),
                MemberState::Full => true,
                MemberState::UpstreamUnhealthy | MemberState::Stopping => false,
            }
    }
}

/// A change of membership: the intake subscribes (`joined`) or drains its subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// The state before.
    pub from: MemberState,
    /// The state after.
    pub to: MemberState,
}

impl Transition {
    /// `joined` or `left`, for the `event` label of the membership metric; `None` when the
    /// subscription does not change (e.g. full → upstream unhealthy).
    pub fn event(self) -> Option<&'static str> {
        match (self.from.is_member(), self.to.is_member()) {
            (false, true) => Some("joined"),
            (true, false) => Some("left"),
            _ => None,
        }
    }
}

/// The membership decision of one worker.
#[derive(Debug)]
pub struct Membership {
    mode: Mode,
    state: MemberState,
    failed_probes: u32,
}

impl Membership {
    /// A worker that starts as a member.
    pub fn new(mode: Mode) -> Membership {
        Membership {
            mode,
            state: MemberState::Joined,
            failed_probes: 0,
        }
    }

    /// The current state.
    pub fn state(&self) -> MemberState {
        self.state
    }

    /// Re-decides from the batcher's `load` (after a request was admitted, on a tick while
    /// full, after a probe).
    pub fn observe(&mut self, load: Load) -> Option<Transition> {
        if self.mode == Mode::Static || self.state == MemberState::Stopping {
            return None;
        }
        let unhealthy = load.failed_calls >= FAILURES_TO_LEAVE
            || self.failed_probes >= FAILURES_TO_LEAVE
            || load.stalled;
        let next = match self.state {
            _ if unhealthy => MemberState::UpstreamUnhealthy,
            // Only a successful probe brings an unhealthy worker back (it resets the counts).
            MemberState::UpstreamUnhealthy => MemberState::UpstreamUnhealthy,
            MemberState::Joined if self.over_high_water(load) && load.peer_has_room => {
                MemberState::Full
            }
            MemberState::Full if self.under_low_water(load) || !load.peer_has_room => {
                MemberState::Joined
            }
            state => state,
        };
        self.set(next)
    }

    /// Takes a `/health` probe's result. A success ends an unhealthy spell: the caller resets
    /// the batcher's failed-call count (`recovered` is then `true`) and the worker rejoins unless
    /// it is still full.
    pub fn probed(&mut self, ok: bool, load: Load) -> (Option<Transition>, bool) {
        if !ok {
            self.failed_probes = self.failed_probes.saturating_add(1);
            return (self.observe(load), false);
        }
        self.failed_probes = 0;
        if self.state != MemberState::UpstreamUnhealthy || self.mode == Mode::Static {
            return (self.observe(load), false);
        }
        if load.stalled {
            // `/health` answers, but the calls in flight still hang.
            return (None, false);
        }
        let next = if self.over_high_water(load) && load.peer_has_room {
            MemberState::Full
        } else {
            MemberState::Joined
        };
        (self.set(next), true)
    }

    /// Leaves for good (shutdown).
    pub fn stop(&mut self) -> Option<Transition> {
        self.set(MemberState::Stopping)
    }

    fn over_high_water(&self, load: Load) -> bool {
        match (load.start_wait, load.bound) {
            (Some(wait), Some(bound)) => wait > bound,
            _ => false,
        }
    }

    fn under_low_water(&self, load: Load) -> bool {
        match (load.start_wait, load.bound) {
            (Some(wait), Some(bound)) => wait <= bound / 2,
            _ => true,
        }
    }

    fn set(&mut self, next: MemberState) -> Option<Transition> {
        let from = std::mem::replace(&mut self.state, next);
        (from != next).then_some(Transition { from, to: next })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALL: Duration = Duration::from_millis(100);
    /// `auto`: 2 × the call + 5 ms.
    const BOUND: Duration = Duration::from_millis(205);

    fn load(start_wait_ms: u64, failed_calls: u32) -> Load {
        Load {
            start_wait: Some(Duration::from_millis(start_wait_ms)),
            call: Some(CALL),
            bound: Some(BOUND),
            failed_calls,
            peer_has_room: true,
            stalled: false,
        }
    }

    fn adaptive() -> Membership {
        Membership::new(Mode::Adaptive)
    }

    #[test]
    fn a_backlog_over_the_admission_bound_leaves_and_half_of_it_rejoins() {
        let mut m = adaptive();
        assert_eq!(m.observe(load(205, 0)), None, "at the bound: stays");
        let left = m.observe(load(206, 0)).expect("over it: leaves");
        assert_eq!((left.to, left.event()), (MemberState::Full, Some("left")));
        assert_eq!(m.observe(load(103, 0)), None, "hysteresis: still draining");
        let back = m.observe(load(102, 0)).expect("half the bound: rejoins");
        assert_eq!(
            (back.to, back.event()),
            (MemberState::Joined, Some("joined"))
        );
    }

    #[test]
    fn a_full_worker_leaves_only_for_a_peer_with_room_and_rejoins_when_none_has() {
        let mut m = adaptive();
        let alone = |wait| Load {
            peer_has_room: false,
            ..load(wait, 0)
        };
        assert_eq!(m.observe(alone(10_000)), None, "no peer with room: stays");
        assert_eq!(
            m.observe(load(10_000, 0)).map(|t| t.to),
            Some(MemberState::Full)
        );
        let back = m
            .observe(alone(10_000))
            .expect("no peer has room now: rejoins");
        assert_eq!(back.to, MemberState::Joined);
        // Upstream failures still take the last member out: it cannot serve.
        assert_eq!(
            m.observe(Load {
                failed_calls: 2,
                ..alone(0)
            })
            .map(|t| t.to),
            Some(MemberState::UpstreamUnhealthy)
        );
    }

    #[test]
    fn only_a_member_over_its_bound_or_a_full_worker_asks_for_room() {
        let mut m = adaptive();
        assert!(!m.asks_for_room(load(205, 0)), "at the bound");
        assert!(m.asks_for_room(load(206, 0)), "over it");
        m.observe(load(10_000, 0));
        assert_eq!(m.state(), MemberState::Full);
        assert!(m.asks_for_room(load(0, 0)), "out: asks until it rejoins");
        let fixed = Membership::new(Mode::Static);
        assert!(!fixed.asks_for_room(load(10_000, 0)), "static never leaves");
    }

    #[test]
    fn room_is_a_typical_wait_under_half_the_bound() {
        let mut m = adaptive();
        assert!(m.has_room(load(102, 0)));
        assert!(!m.has_room(load(103, 0)));
        m.observe(Load {
            peer_has_room: true,
            ..load(10_000, 0)
        });
        assert!(!m.has_room(load(0, 0)), "out of the group");
    }

    #[test]
    fn nothing_measured_never_leaves_for_backlog() {
        let mut m = adaptive();
        let unmeasured = Load {
            start_wait: None,
            call: None,
            bound: None,
            failed_calls: 0,
            peer_has_room: true,
            stalled: false,
        };
        assert_eq!(m.observe(unmeasured), None);
        assert_eq!(m.state(), MemberState::Joined);
    }

    #[test]
    fn a_stalled_upstream_leaves_and_a_good_probe_rejoins_only_once_calls_move() {
        let mut m = adaptive();
        let stalled = Load {
            stalled: true,
            ..load(0, 0)
        };
        let left = m.observe(stalled).expect("stalled: leaves");
        assert_eq!(left.to, MemberState::UpstreamUnhealthy);
        assert_eq!(
            m.probed(true, stalled),
            (None, false),
            "/health answers, calls still hang"
        );
        let (back, recovered) = m.probed(true, load(0, 0));
        assert_eq!(back.map(|t| t.to), Some(MemberState::Joined));
        assert!(recovered);
    }

    #[test]
    fn failed_calls_leave_and_only_a_good_probe_rejoins() {
        let mut m = adaptive();
        assert_eq!(m.observe(load(0, 1)), None, "one failure is not a pattern");
        let left = m.observe(load(0, 2)).expect("two in a row: leaves");
        assert_eq!(left.to, MemberState::UpstreamUnhealthy);
        assert_eq!(m.observe(load(0, 2)), None);
        let (none, recovered) = m.probed(false, load(0, 2));
        assert_eq!((none, recovered), (None, false));
        let (back, recovered) = m.probed(true, load(0, 2));
        assert!(recovered, "the caller resets the failed-call count");
        assert_eq!(back.map(|t| t.to), Some(MemberState::Joined));
    }

    #[test]
    fn failed_probes_leave_an_idle_worker_too() {
        let mut m = adaptive();
        assert_eq!(m.probed(false, load(0, 0)).0, None);
        let (left, _) = m.probed(false, load(0, 0));
        assert_eq!(left.map(|t| t.to), Some(MemberState::UpstreamUnhealthy));
    }

    #[test]
    fn a_recovered_worker_that_is_still_full_stays_out_as_full() {
        let mut m = adaptive();
        m.observe(load(0, 2));
        let (t, recovered) = m.probed(true, load(500, 2));
        assert!(recovered);
        let t = t.expect("a change of reason");
        assert_eq!((t.to, t.event()), (MemberState::Full, None));
    }

    #[test]
    fn static_membership_never_leaves_until_stopped() {
        let mut m = Membership::new(Mode::Static);
        assert_eq!(m.observe(load(10_000, 9)), None);
        assert_eq!(m.probed(false, load(0, 0)).0, None);
        assert_eq!(m.probed(false, load(0, 0)).0, None);
        assert_eq!(m.state(), MemberState::Joined);
        let stop = m.stop().expect("stops");
        assert_eq!(
            (stop.to, stop.event()),
            (MemberState::Stopping, Some("left"))
        );
        assert_eq!(m.observe(load(0, 0)), None, "stopping is final");
    }

    #[test]
    fn mode_parses_and_prints() {
        assert_eq!("Adaptive".parse::<Mode>(), Ok(Mode::Adaptive));
        assert_eq!("static".parse::<Mode>(), Ok(Mode::Static));
        assert!("sometimes".parse::<Mode>().is_err());
        assert_eq!(Mode::default().to_string(), "adaptive");
    }
}
