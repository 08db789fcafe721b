//! The load models: a closed loop of `--concurrency` workers ([`closed`]) and an open loop at a
//! constant `--rate` ([`open`]).
//!
//! Both take the request function as a closure (`Fn(Payload) -> impl Future<Output = Outcome>`),
//! so tests can drive them with a simulated server, and both use [`tokio::time::Instant`], so tests
//! can run them on paused time.

pub mod closed;
pub mod open;

use std::time::Duration;

use tokio::time::Instant;

use crate::stats::Recorder;

/// When a run stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Start (closed loop) or schedule (open loop) measured requests for this long after the
    /// warm-up, then wait for those in flight.
    Duration(Duration),
    /// Send exactly this many measured requests after the warm-up.
    Requests(u64),
}

/// Warm-up and stop condition of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Requests started (closed loop) or scheduled (open loop) during this time from the start
    /// are sent but not recorded.
    pub warmup: Duration,
    /// When to stop.
    pub stop: Stop,
}

impl Plan {
    /// The end of the measured window as planned (duration mode only).
    fn planned_end(&self, measure_start: Instant) -> Option<Instant> {
        match self.stop {
            Stop::Duration(d) => Some(measure_start + d),
            Stop::Requests(_) => None,
        }
    }
}

/// The measured window of a run; rates are per second of it.
///
/// - Duration mode: exactly the planned duration after the warm-up. The measured requests are
///   the ones sent (open loop: scheduled; closed loop: started) in it, so in steady state their
///   count per second of it is the rate, however long the last ones take to complete. Stretching
///   the window to the last completion instead would understate every rate by the tail latency
///   (e.g. ~15% for a 12 s overload run whose last requests wait out a 2 s timeout), because
///   the requests completing at the start of the window were sent during the warm-up and are not
///   counted.
/// - Request-count mode: from the end of the warm-up to the completion of the last measured
///   request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// End of the warm-up.
    pub start: Instant,
    /// End of the measurement.
    pub end: Instant,
}

impl Window {
    /// Length of the window.
    pub fn duration(&self) -> Duration {
        self.end.saturating_duration_since(self.start)
    }

    fn close(measure_start: Instant, plan: &Plan, recorder: &Recorder) -> Window {
        let end = match plan.planned_end(measure_start) {
            Some(planned) => planned,
            None => recorder
                .last_completion()
                .unwrap_or(measure_start)
                .max(measure_start),
        };
        Window {
            start: measure_start,
            end,
        }
    }
}
