//! Statistics of a run: the classification of each request's outcome, latency histograms
//! (microsecond precision) and the counters the report and the progress bar are made of.
//!
//! Every target (HTTP or NATS) reduces a request to an [`Outcome`]; the [`Recorder`] is the single
//! place outcomes are counted, so numbers mean the same whichever target was measured.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::de::IgnoredAny;
use tokio::time::Instant;

/// Why a request failed. Its [`fmt::Display`] is the stable label used in reports
/// (`429`, `503 no responders`, `timeout`, `connect`, `bad_reply`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FailureKind {
    /// The server answered with this HTTP status, or a NATS error reply carried this
    /// `Nats-Service-Error-Code` (both label as the bare number, e.g. `429`).
    Status(u16),
    /// NATS answered that nobody subscribes to the subject (no worker running).
    NoResponders,
    /// No answer within `--timeout`.
    Timeout,
    /// The TCP connection to the HTTP target could not be established.
    Connect,
    /// A success reply that is not a JSON array holding one embedding per input.
    BadReply,
    /// Open loop only: the request was due but the in-flight cap was reached, so it was never sent.
    NotSent,
    /// Any other client, transport or protocol error.
    Transport,
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailureKind::Status(code) => write!(f, "{code}"),
            FailureKind::NoResponders => f.write_str("503 no responders"),
            FailureKind::Timeout => f.write_str("timeout"),
            FailureKind::Connect => f.write_str("connect"),
            FailureKind::BadReply => f.write_str("bad_reply"),
            FailureKind::NotSent => f.write_str("not_sent"),
            FailureKind::Transport => f.write_str("transport"),
        }
    }
}

/// The result of one request: success, or why it failed.
pub type Outcome = Result<(), FailureKind>;

/// Checks a success reply cheaply: it must be a JSON array of exactly `expected` elements (the
/// embeddings' contents are not inspected).
///
/// # Errors
/// [`FailureKind::BadReply`] when the body is not a JSON array or has another length.
pub fn check_embeddings(body: &[u8], expected: usize) -> Outcome {
    match serde_json::from_slice::<Vec<IgnoredAny>>(body) {
        Ok(embeddings) if embeddings.len() == expected => Ok(()),
        _ => Err(FailureKind::BadReply),
    }
}

/// Classifies an HTTP response from its status code and body.
///
/// # Errors
/// [`FailureKind::Status`] for any non-2xx status, [`FailureKind::BadReply`] for a 2xx whose body
/// does not hold `expected` embeddings.
pub fn classify_http(status: u16, body: &[u8], expected: usize) -> Outcome {
    if (200..300).contains(&status) {
        check_embeddings(body, expected)
    } else {
        Err(FailureKind::Status(status))
    }
}

/// Lowest latency the histograms hold: 1 µs.
const HIST_LOW_US: u64 = 1;
/// Highest latency the histograms hold: 1 hour in µs (larger values are clamped to it).
const HIST_HIGH_US: u64 = 3_600_000_000;
/// Significant decimal digits of the histograms (0.1% relative precision).
const HIST_SIGFIG: u8 = 3;

/// A new latency histogram in microseconds.
pub fn new_histogram() -> Histogram<u64> {
    // Constant bounds that hdrhistogram accepts (low >= 1, high >= 2 * low, sigfig <= 5): this
    // cannot fail at run time.
    Histogram::new_with_bounds(HIST_LOW_US, HIST_HIGH_US, HIST_SIGFIG)
        .expect("constant histogram bounds are valid")
}

/// A duration as whole microseconds for the histograms, at least 1.
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// Everything counted about the measured requests of a run (warm-up requests are not recorded).
#[derive(Debug, Clone)]
pub struct Stats {
    /// Requests that were sent (excludes [`FailureKind::NotSent`]).
    pub sent: u64,
    /// Requests answered with the expected embeddings.
    pub succeeded: u64,
    /// Successes whose latency was at most the timeout (the goodput's numerator).
    pub succeeded_in_time: u64,
    /// Inputs (texts) of the successful requests.
    pub inputs_succeeded: u64,
    /// Inputs of the successes within the timeout.
    pub inputs_in_time: u64,
    /// Requests that completed with any outcome, except [`FailureKind::NotSent`].
    pub completed: u64,
    /// Inputs of the completed requests.
    pub inputs_completed: u64,
    /// Failures by kind.
    pub failures: BTreeMap<FailureKind, u64>,
    /// Latency of successes, µs.
    pub success_latency: Histogram<u64>,
    /// Latency of failures that reached the target (everything but `not_sent`), µs.
    pub error_latency: Histogram<u64>,
    /// The same, per failure kind (e.g. fast `429` rejections apart from slow timeouts), µs.
    pub failure_latency: BTreeMap<FailureKind, Histogram<u64>>,
    /// When the last recorded request completed.
    pub last_completion: Option<Instant>,
    /// The timeout successes are compared with for goodput.
    pub timeout: Duration,
    /// The same counts per second of completion time.
    pub timeline: Timeline,
    /// Every recorded latency in order of completion (unit tests only).
    #[cfg(test)]
    pub samples: Vec<(Outcome, Duration)>,
}

impl Stats {
    /// Empty statistics; `timeout` separates goodput from throughput.
    pub fn new(timeout: Duration) -> Stats {
        Stats {
            sent: 0,
            succeeded: 0,
            succeeded_in_time: 0,
            inputs_succeeded: 0,
            inputs_in_time: 0,
            completed: 0,
            inputs_completed: 0,
            failures: BTreeMap::new(),
            success_latency: new_histogram(),
            error_latency: new_histogram(),
            failure_latency: BTreeMap::new(),
            last_completion: None,
            timeout,
            timeline: Timeline::default(),
            #[cfg(test)]
            samples: Vec::new(),
        }
    }

    /// Total failed requests (all kinds, including `not_sent`).
    pub fn failed(&self) -> u64 {
        self.failures.values().sum()
    }

    /// Records one completed request: its outcome, its latency (from its scheduled send time in
    /// the open loop, from its actual send time in the closed loop) and its number of inputs.
    pub fn record(&mut self, outcome: Outcome, latency: Duration, inputs: usize, at: Instant) {
        let inputs = inputs as u64;
        self.last_completion = Some(self.last_completion.map_or(at, |last| last.max(at)));
        #[cfg(test)]
        self.samples.push((outcome, latency));
        match outcome {
            Ok(()) => {
                self.succeeded += 1;
                self.inputs_succeeded += inputs;
                if latency <= self.timeout {
                    self.succeeded_in_time += 1;
                    self.inputs_in_time += inputs;
                }
                self.success_latency.saturating_record(micros(latency));
            }
            Err(kind) => {
                *self.failures.entry(kind).or_default() += 1;
                if kind != FailureKind::NotSent {
                    self.error_latency.saturating_record(micros(latency));
                    self.failure_latency
                        .entry(kind)
                        .or_insert_with(new_histogram)
                        .saturating_record(micros(latency));
                }
            }
        }
        if outcome != Err(FailureKind::NotSent) {
            self.completed += 1;
            self.inputs_completed += inputs;
            let in_time = outcome.is_ok() && latency <= self.timeout;
            self.timeline.record(at, in_time);
        }
    }

    /// Goodput over `measured`: (successful requests within the timeout per second, their inputs
    /// per second). Zero for an empty window.
    pub fn goodput(&self, measured: Duration) -> (f64, f64) {
        rates(self.succeeded_in_time, self.inputs_in_time, measured)
    }

    /// Throughput over `measured`: (completed requests of any outcome per second, their inputs
    /// per second). Zero for an empty window.
    pub fn throughput(&self, measured: Duration) -> (f64, f64) {
        rates(self.completed, self.inputs_completed, measured)
    }
}

/// Longest timeline kept, seconds (one day); later completions are left out of it.
const TIMELINE_MAX_S: u64 = 86_400;

/// Counts of the measured requests per whole second of their completion time, counted from the
/// first measured send: second `i` is `[origin + i s, origin + (i + 1) s)`. Unlike the totals,
/// it shows how goodput changes during a run (e.g. how fast it recovers when the upstream gets
/// fast again). Requests sent at the end of the window and completing after it fall into the
/// seconds after the window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Timeline {
    /// Start of second 0: when the first measured request was sent (or, for statistics fed
    /// without sends, when the first one completed); `None` before.
    pub origin: Option<Instant>,
    /// The same instant on the wall clock, milliseconds since the Unix epoch, so the seconds can
    /// be lined up with events of other processes (0 before the origin is set).
    pub origin_unix_ms: u64,
    /// `goodput[i]`: successes within the timeout that completed in second `i`.
    pub goodput: Vec<u64>,
    /// `completed[i]`: requests of any outcome (except `not_sent`) that completed in second `i`.
    pub completed: Vec<u64>,
}

impl Timeline {
    /// Sets the origin to `now` unless it is set already.
    pub fn start(&mut self, now: Instant) {
        if self.origin.is_none() {
            self.origin = Some(now);
            self.origin_unix_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        }
    }

    /// Counts one completion at `at`; `in_time` when it is a success within the timeout.
    fn record(&mut self, at: Instant, in_time: bool) {
        self.start(at);
        let Some(origin) = self.origin else {
            return;
        };
        let second = at.saturating_duration_since(origin).as_secs();
        if second >= TIMELINE_MAX_S {
            return;
        }
        let i = second as usize;
        if self.completed.len() <= i {
            self.completed.resize(i + 1, 0);
            self.goodput.resize(i + 1, 0);
        }
        self.completed[i] += 1;
        if in_time {
            self.goodput[i] += 1;
        }
    }
}

fn rates(requests: u64, inputs: u64, measured: Duration) -> (f64, f64) {
    let secs = measured.as_secs_f64();
    if secs <= 0.0 {
        return (0.0, 0.0);
    }
    (requests as f64 / secs, inputs as f64 / secs)
}

/// A point-in-time view of the live counters, for the progress bar.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LiveSnapshot {
    /// Measured requests sent so far.
    pub sent: u64,
    /// Measured requests that succeeded.
    pub succeeded: u64,
    /// Measured requests that failed (including `not_sent`).
    pub failed: u64,
    /// Requests in flight right now (measured or warm-up).
    pub in_flight: u64,
}

/// The shared, thread-safe sink of outcomes during a run: cheap atomics for the progress bar and
/// the full [`Stats`] behind a mutex (held for one histogram update per request).
#[derive(Debug)]
pub struct Recorder {
    stats: Mutex<Stats>,
    sent: AtomicU64,
    succeeded: AtomicU64,
    failed: AtomicU64,
    in_flight: AtomicU64,
}

impl Recorder {
    /// A recorder whose goodput counts successes within `timeout`.
    pub fn new(timeout: Duration) -> Recorder {
        Recorder {
            stats: Mutex::new(Stats::new(timeout)),
            sent: AtomicU64::new(0),
            succeeded: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Stats> {
        // A panic while holding the lock leaves consistent counters behind; keep going.
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A request is about to be sent; `measured` is false during warm-up.
    pub fn on_send(&self, measured: bool) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        if measured {
            self.sent.fetch_add(1, Ordering::Relaxed);
            let mut stats = self.lock();
            stats.sent += 1;
            stats.timeline.start(Instant::now());
        }
    }

    /// A sent request completed. Only measured requests are recorded into the statistics.
    pub fn on_complete(
        &self,
        measured: bool,
        outcome: Outcome,
        latency: Duration,
        inputs: usize,
        at: Instant,
    ) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        if measured {
            self.count(outcome);
            self.lock().record(outcome, latency, inputs, at);
        }
    }

    /// A due request could not be sent because the in-flight cap was reached.
    pub fn on_not_sent(&self, measured: bool, inputs: usize, at: Instant) {
        if measured {
            self.count(Err(FailureKind::NotSent));
            self.lock()
                .record(Err(FailureKind::NotSent), Duration::ZERO, inputs, at);
        }
    }

    fn count(&self, outcome: Outcome) {
        match outcome {
            Ok(()) => self.succeeded.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.failed.fetch_add(1, Ordering::Relaxed),
        };
    }

    /// The live counters.
    pub fn live(&self) -> LiveSnapshot {
        LiveSnapshot {
            sent: self.sent.load(Ordering::Relaxed),
            succeeded: self.succeeded.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
        }
    }

    /// When the last measured request completed, if any did.
    pub fn last_completion(&self) -> Option<Instant> {
        self.lock().last_completion
    }

    /// A copy of the statistics so far.
    pub fn snapshot(&self) -> Stats {
        self.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_stable() {
        let labels: Vec<String> = [
            FailureKind::Status(429),
            FailureKind::NoResponders,
            FailureKind::Timeout,
            FailureKind::Connect,
            FailureKind::BadReply,
            FailureKind::NotSent,
            FailureKind::Transport,
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        assert_eq!(
            labels,
            [
                "429",
                "503 no responders",
                "timeout",
                "connect",
                "bad_reply",
                "not_sent",
                "transport"
            ]
        );
    }

    #[test]
    fn http_classification() {
        assert_eq!(classify_http(200, b"[[0.1,0.2],[0.3]]", 2), Ok(()));
        assert_eq!(
            classify_http(200, b"[[0.1,0.2]]", 2),
            Err(FailureKind::BadReply)
        );
        assert_eq!(
            classify_http(200, b"{\"error\":1}", 1),
            Err(FailureKind::BadReply)
        );
        assert_eq!(classify_http(200, b"", 1), Err(FailureKind::BadReply));
        let tei_error = br#"{"error":"Model is overloaded","error_type":"Overloaded"}"#;
        assert_eq!(
            classify_http(429, tei_error, 1),
            Err(FailureKind::Status(429))
        );
        assert_eq!(classify_http(503, b"", 1), Err(FailureKind::Status(503)));
    }

    #[test]
    fn goodput_counts_only_successes_within_the_timeout() {
        let mut stats = Stats::new(Duration::from_millis(100));
        let now = Instant::now();
        // 4 successes within the timeout (2 inputs each), 1 late success, 2 rejections, 1 not sent.
        for _ in 0..4 {
            stats.record(Ok(()), Duration::from_millis(50), 2, now);
        }
        stats.record(Ok(()), Duration::from_millis(150), 2, now);
        stats.record(
            Err(FailureKind::Status(429)),
            Duration::from_millis(1),
            2,
            now,
        );
        stats.record(
            Err(FailureKind::Status(429)),
            Duration::from_millis(3),
            2,
            now,
        );
        stats.record(Err(FailureKind::NotSent), Duration::ZERO, 2, now);

        assert_eq!(stats.succeeded, 5);
        assert_eq!(stats.succeeded_in_time, 4);
        assert_eq!(stats.failed(), 3);
        assert_eq!(stats.failures[&FailureKind::Status(429)], 2);
        assert_eq!(stats.completed, 7);
        assert_eq!(stats.error_latency.len(), 2, "not_sent has no latency");
        assert_eq!(stats.failure_latency.len(), 1, "only 429 has latencies");
        let rejections = &stats.failure_latency[&FailureKind::Status(429)];
        assert_eq!(rejections.len(), 2);
        assert!(rejections.equivalent(rejections.max(), 3000));

        let (rps, ips) = stats.goodput(Duration::from_secs(2));
        assert!((rps - 2.0).abs() < 1e-9, "{rps}");
        assert!((ips - 4.0).abs() < 1e-9, "{ips}");
        let (rps, ips) = stats.throughput(Duration::from_millis(500));
        assert!((rps - 14.0).abs() < 1e-9, "{rps}");
        assert!((ips - 28.0).abs() < 1e-9, "{ips}");
        assert_eq!(stats.goodput(Duration::ZERO), (0.0, 0.0));
    }

    #[test]
    fn recorder_ignores_warmup_and_tracks_in_flight() {
        let recorder = Recorder::new(Duration::from_secs(1));
        let now = Instant::now();
        recorder.on_send(false);
        recorder.on_send(true);
        assert_eq!(recorder.live().in_flight, 2);
        recorder.on_complete(false, Ok(()), Duration::from_millis(1), 1, now);
        recorder.on_complete(
            true,
            Err(FailureKind::Timeout),
            Duration::from_secs(1),
            1,
            now,
        );
        recorder.on_not_sent(true, 1, now);
        recorder.on_not_sent(false, 1, now);
        let live = recorder.live();
        assert_eq!(
            live,
            LiveSnapshot {
                sent: 1,
                succeeded: 0,
                failed: 2,
                in_flight: 0
            }
        );
        let stats = recorder.snapshot();
        assert_eq!(stats.sent, 1);
        assert_eq!(stats.failures[&FailureKind::Timeout], 1);
        assert_eq!(stats.failures[&FailureKind::NotSent], 1);
        assert_eq!(stats.succeeded, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn timeline_counts_per_second_of_completion_from_the_first_measured_send() {
        let recorder = Recorder::new(Duration::from_millis(500));
        let t0 = Instant::now();
        recorder.on_send(false); // warm-up: does not start the timeline
        assert_eq!(recorder.snapshot().timeline.origin, None);
        tokio::time::advance(Duration::from_millis(300)).await;
        recorder.on_send(true);
        let origin = t0 + Duration::from_millis(300);
        let at = |ms: u64| origin + Duration::from_millis(ms);
        let ok = Duration::from_millis(100);
        recorder.on_complete(true, Ok(()), ok, 1, at(100));
        recorder.on_complete(true, Ok(()), ok, 1, at(999));
        recorder.on_complete(true, Ok(()), Duration::from_millis(600), 1, at(1000)); // late
        recorder.on_complete(true, Err(FailureKind::Status(429)), ok, 1, at(1500));
        recorder.on_complete(true, Ok(()), ok, 1, at(3200));
        recorder.on_not_sent(true, 1, at(3300));
        let timeline = recorder.snapshot().timeline;
        assert_eq!(timeline.origin, Some(origin));
        assert!(timeline.origin_unix_ms > 0);
        assert_eq!(timeline.goodput, [2, 0, 0, 1]);
        assert_eq!(
            timeline.completed,
            [2, 2, 0, 1],
            "not_sent is not a completion"
        );
    }

    #[test]
    fn micros_has_a_floor_of_one() {
        assert_eq!(micros(Duration::ZERO), 1);
        assert_eq!(micros(Duration::from_millis(3)), 3000);
    }
}
