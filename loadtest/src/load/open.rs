//! Open loop: requests are due at a constant rate, request `i` at `start + i / rate`, whatever
//! the server does. Sends never wait for earlier responses, and each request's latency is measured
//! from its *scheduled* time, not from when it was actually sent: a stall of the server (or of this
//! client) shows up in the latency of every request due during it. This is wrk2's correction for
//! coordinated omission.
//!
//! In-flight requests are capped (`max_in_flight`, generous) so a dead server cannot exhaust
//! memory; a due request that finds the cap reached is not sent and counted as
//! [`FailureKind::NotSent`](crate::stats::FailureKind::NotSent), never silently dropped.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::{Plan, SendFn, Stop, Window, record_completion};
use crate::corpus::PayloadFactory;
use crate::stats::Recorder;

/// The scheduled offset of request `i` from the start at `rate` requests per second, rounded to
/// the nanosecond (computed from `i`, so errors do not accumulate).
pub fn scheduled_offset(i: u64, rate: f64) -> Duration {
    Duration::from_nanos((i as f64 * 1e9 / rate).round() as u64)
}

/// Runs the open loop at `rate` requests per second (> 0) with at most `max_in_flight` requests
/// in flight, until `plan` stops; then waits for all requests in flight.
pub async fn run(
    rate: f64,
    max_in_flight: usize,
    plan: Plan,
    mut factory: PayloadFactory,
    recorder: Arc<Recorder>,
    send: impl SendFn,
) -> Window {
    let send = Arc::new(send);
    let max_in_flight = max_in_flight.clamp(1, u32::MAX as usize);
    let permits = Arc::new(Semaphore::new(max_in_flight));
    let clock = plan.start_clock();
    let mut measured_due = 0u64;
    for i in 0u64.. {
        let scheduled = clock.start + scheduled_offset(i, rate);
        if clock.is_over(scheduled) {
            break;
        }
        let measured = clock.is_measured(scheduled);
        if measured && let Stop::Requests(n) = plan.stop {
            if measured_due >= n {
                break;
            }
            measured_due += 1;
        }
        let payload = factory.next_payload();
        let inputs = payload.inputs;
        if scheduled > Instant::now() {
            tokio::time::sleep_until(scheduled).await;
        } else {
            // Behind schedule: catch up without sleeping, but let other tasks run.
            tokio::task::consume_budget().await;
        }
        match permits.clone().try_acquire_owned() {
            Ok(permit) => {
                recorder.on_send(measured);
                let send = send.clone();
                let recorder = recorder.clone();
                tokio::spawn(async move {
                    let outcome = send(payload).await;
                    record_completion(&recorder, measured, outcome, scheduled, inputs);
                    drop(permit);
                });
            }
            Err(_) => recorder.on_not_sent(measured, inputs, Instant::now()),
        }
    }
    // Wait for every request in flight: all permits back. The semaphore is never closed.
    let _all = permits.acquire_many(max_in_flight as u32).await;
    Window::close(clock.measure_start, &plan, &recorder)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::corpus::Corpus;
    use crate::stats::FailureKind;

    fn factory() -> PayloadFactory {
        PayloadFactory::new(Arc::new(Corpus::Generated { words: 3 }), 1, 7)
    }

    /// `n` requests, no warm-up.
    fn requests(n: u64) -> Plan {
        Plan {
            warmup: Duration::ZERO,
            stop: Stop::Requests(n),
        }
    }

    /// When the simulated server was called, as offsets from the log's creation.
    #[derive(Clone)]
    struct SendLog {
        start: Instant,
        sent_at: Arc<Mutex<Vec<Instant>>>,
    }

    impl SendLog {
        fn new() -> SendLog {
            SendLog {
                start: Instant::now(),
                sent_at: Arc::default(),
            }
        }

        fn record(&self) {
            self.sent_at.lock().expect("lock").push(Instant::now());
        }

        fn offsets(&self) -> Vec<Duration> {
            let sent_at = self.sent_at.lock().expect("lock");
            sent_at.iter().map(|t| *t - self.start).collect()
        }
    }

    /// `0, 10, 20, …` ms: `n` requests due at 100/s.
    fn every_10_ms(n: u64) -> Vec<Duration> {
        (0..n).map(|i| Duration::from_millis(10 * i)).collect()
    }

    #[test]
    fn offsets_are_exact_multiples() {
        assert_eq!(scheduled_offset(0, 150.0), Duration::ZERO);
        assert_eq!(scheduled_offset(3, 100.0), Duration::from_millis(30));
        assert_eq!(scheduled_offset(150, 150.0), Duration::from_secs(1));
        assert_eq!(scheduled_offset(1, 3.0), Duration::from_nanos(333_333_333));
        assert_eq!(scheduled_offset(2, 0.5), Duration::from_secs(4));
    }

    #[tokio::test(start_paused = true)]
    async fn sends_at_exact_intervals() {
        let recorder = Arc::new(Recorder::new(Duration::from_secs(1)));
        let log = SendLog::new();
        let server_log = log.clone();
        let plan = requests(20);
        let window = run(100.0, 1000, plan, factory(), recorder.clone(), move |_| {
            server_log.record();
            async {
                tokio::time::sleep(Duration::from_millis(3)).await;
                Ok(())
            }
        })
        .await;
        assert_eq!(log.offsets(), every_10_ms(20));
        let stats = recorder.snapshot();
        assert_eq!(stats.sent, 20);
        assert_eq!(stats.succeeded, 20);
        assert!(
            stats
                .samples
                .iter()
                .all(|(o, l)| o.is_ok() && *l == Duration::from_millis(3))
        );
        // Last request due at 190 ms, completes at 193 ms.
        assert_eq!(window.duration(), Duration::from_millis(193));
    }

    #[tokio::test(start_paused = true)]
    async fn latency_counts_from_the_schedule_when_the_server_stalls() {
        // One-at-a-time server: 1 ms per request, but the first request stalls it for 100 ms.
        let recorder = Arc::new(Recorder::new(Duration::from_secs(1)));
        let server = Arc::new(tokio::sync::Mutex::new(0u32));
        let log = SendLog::new();
        let server_log = log.clone();
        let plan = requests(10);
        run(100.0, 1000, plan, factory(), recorder.clone(), move |_| {
            server_log.record();
            let server = server.clone();
            async move {
                let mut served = server.lock().await;
                let cost = if *served == 0 { 100 } else { 1 };
                *served += 1;
                tokio::time::sleep(Duration::from_millis(cost)).await;
                Ok(())
            }
        })
        .await;
        // Sends did not wait for the stalled request.
        assert_eq!(log.offsets(), every_10_ms(10));
        // Request 0 completes at 100 ms; request i (due at 10·i ms) queues behind it and completes
        // at 100 + i ms, so its latency from the schedule is 100 + i - 10·i ms.
        let mut latencies: Vec<Duration> = recorder
            .snapshot()
            .samples
            .iter()
            .map(|(_, l)| *l)
            .collect();
        latencies.sort();
        let mut expected: Vec<Duration> = (0..10u64)
            .map(|i| Duration::from_millis(100 + i - 10 * i))
            .collect();
        expected.sort();
        assert_eq!(latencies, expected);
        let stats = recorder.snapshot();
        assert_eq!(
            stats.success_latency.max(),
            stats.success_latency.highest_equivalent(100_000)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn requests_over_the_in_flight_cap_are_failures_not_drops() {
        let recorder = Arc::new(Recorder::new(Duration::from_secs(1)));
        // Server never answers within the run: 2 in flight, the other 8 cannot be sent.
        let plan = requests(10);
        run(1000.0, 2, plan, factory(), recorder.clone(), |_| async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Err(FailureKind::Timeout)
        })
        .await;
        let stats = recorder.snapshot();
        assert_eq!(stats.sent, 2);
        assert_eq!(stats.failures[&FailureKind::Timeout], 2);
        assert_eq!(stats.failures[&FailureKind::NotSent], 8);
        assert_eq!(stats.failed(), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn warmup_and_duration_bound_the_measured_requests() {
        let recorder = Arc::new(Recorder::new(Duration::from_secs(1)));
        let plan = Plan {
            warmup: Duration::from_millis(50),
            stop: Stop::Duration(Duration::from_millis(100)),
        };
        let window = run(100.0, 100, plan, factory(), recorder.clone(), |_| async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            Ok(())
        })
        .await;
        let stats = recorder.snapshot();
        // Due at 50, 60, …, 140 ms: 10 measured requests (0–40 ms were warm-up).
        assert_eq!(stats.sent, 10);
        assert_eq!(window.duration(), Duration::from_millis(100));
        let (rps, _) = stats.goodput(window.duration());
        assert!((rps - 100.0).abs() < 1e-9, "{rps}");
    }
}
