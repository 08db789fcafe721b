//! The load models: a closed loop of `--concurrency` workers ([`closed`]) and an open loop at a
//! constant `--rate` ([`open`]).
//!
//! Both take the request function as a closure (`Fn(Payload) -> impl Future<Output = Outcome>`),
//! so tests can drive them with a simulated server, and both use [`tokio::time::Instant`], so tests
//! can run them on paused time.

pub mod closed;
pub mod open;

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::corpus::Payload;
use crate::stats::{Outcome, Recorder};

/// The request function of a run: sends one payload and resolves to its outcome.
pub trait SendFn: Fn(Payload) -> Self::Sent + Send + Sync + 'static {
    /// The future of one request.
    type Sent: Future<Output = Outcome> + Send + 'static;
}

impl<F, Fut> SendFn for F
where
    F: Fn(Payload) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    type Sent = Fut;
}

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

    /// Starts the run's clock now.
    fn start_clock(&self) -> Clock {
        let start = Instant::now();
        let measure_start = start + self.warmup;
        Clock {
            start,
            measure_start,
            planned_end: self.planned_end(measure_start),
        }
    }
}

/// The instants of a run, fixed when it starts.
#[derive(Debug, Clone, Copy)]
struct Clock {
    /// The start of the run.
    start: Instant,
    /// The end of the warm-up.
    measure_start: Instant,
    /// The end of the measured window as planned (duration mode only).
    planned_end: Option<Instant>,
}

impl Clock {
    /// Whether a request started (closed loop) or scheduled (open loop) at `at` is past the
    /// planned end: the run stops.
    fn is_over(&self, at: Instant) -> bool {
        self.planned_end.is_some_and(|end| at >= end)
    }

    /// Whether a request started or scheduled at `at` is measured (after the warm-up).
    fn is_measured(&self, at: Instant) -> bool {
        at >= self.measure_start
    }
}

/// Records a request of `inputs` inputs that completed now with `outcome`, its latency counted
/// from `since` (its send time in the closed loop, its scheduled time in the open loop).
fn record_completion(
    recorder: &Recorder,
    measured: bool,
    outcome: Outcome,
    since: Instant,
    inputs: usize,
) {
    let done = Instant::now();
    recorder.on_complete(
        measured,
        outcome,
        done.saturating_duration_since(since),
        inputs,
        done,
    );
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
