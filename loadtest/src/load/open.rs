//! Open loop: requests are due at a constant rate, request `i` at `start + i / rate`, whatever
//! the server does. Sends never wait for earlier responses, and each request's latency is measured
//! from its *scheduled* time, not from when it was actually sent: a stall of the server (or of this
//! client) shows up in the latency of every request due during it. This is wrk2's correction for
//! coordinated omission.
//!
//! In-flight requests are capped (`max_in_flight`, generous) so a dead server cannot exhaust
//! memory; a due request that finds the cap reached is not sent and counted as
//! [`FailureKind::NotSent`](crate::stats::FailureKind::NotSent), never silently dropped.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::{Plan, Stop, Window};
use crate::corpus::{Payload, PayloadFactory};
use crate::stats::{Outcome, Recorder};

/// The scheduled offset of request `i` from the start at `rate` requests per second, rounded to
/// the nanosecond (computed from `i`, so errors do not accumulate).
pub fn scheduled_offset(i: u64, rate: f64) -> Duration {
    Duration::from_nanos((i as f64 * 1e9 / rate).round() as u64)
}

/// Runs the open loop at `rate` requests per second (> 0) with at most `max_in_flight` requests
/// in flight, until `plan` stops; then waits for all requests in flight.
pub async fn run<F, Fut>(
    rate: f64,
    max_in_flight: usize,
    plan: Plan,
    mut factory: PayloadFactory,
    recorder: Arc<Recorder>,
    send: F,
) -> Window
where
    F: Fn(Payload) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    let send = Arc::new(send);
    let max_in_flight = max_in_flight.clamp(1, u32::MAX as usize);
    let permits = Arc::new(Semaphore::new(max_in_flight));
    let start = Instant::now();
    let measure_start = start + plan.warmup;
    let planned_end = plan.planned_end(measure_start);
    let mut measured_due = 0u64;
    for i in 0u64.. {
        let scheduled = start + scheduled_offset(i, rate);
        if planned_end.is_some_and(|end| scheduled >= end) {
            break;
        }
        let measured = scheduled >= measure_start;
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
                    let done = Instant::now();
                    recorder.on_complete(
                        measured,
                        outcome,
                        done.saturating_duration_since(scheduled),
                        inputs,
                        done,
                    );
                    drop(permit);
                });
            }
            Err(_) => recorder.on_not_sent(measured, inputs, Instant::now()),
        }
    }
    // Wait for every request in flight: all permits back. The semaphore is never closed.
    let _all = permits.acquire_many(max_in_flight as u32).await;
    Window::close(measure_start, &plan, &recorder)
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
        let sent_at = Arc::new(Mutex::new(Vec::new()));
        let log = sent_at.clone();
        let start = Instant::now();
        let plan = Plan {
            warmup: Duration::ZERO,
            stop: Stop::Requests(20),
        };
        let window = run(100.0, 1000, plan, factory(), recorder.clone(), move |_| {
            log.lock().expect("lock").push(Instant::now());
            async {
                tokio::time::sleep(Duration::from_millis(3)).await;
                Ok(())
            }
        })
        .await;
        let sent_at = sent_at.lock().expect("lock").clone();
        let offsets: Vec<Duration> = sent_at.iter().map(|t| *t - start).collect();
        let expected: Vec<Duration> = (0..20).map(|i| Duration::from_millis(10 * i)).collect();
        assert_eq!(offsets, expected);
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
        let sent_at = Arc::new(Mutex::new(Vec::new()));
        let log = sent_at.clone();
        let start = Instant::now();
        let plan = Plan {
            warmup: Duration::ZERO,
            stop: Stop::Requests(10),
        };
        run(100.0, 1000, plan, factory(), recorder.clone(), move |_| {
            log.lock().expect("lock").push(Instant::now());
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
        let offsets: Vec<Duration> = sent_at
            .lock()
            .expect("lock")
            .iter()
            .map(|t| *t - start)
            .collect();
        assert_eq!(
            offsets,
            (0..10)
                .map(|i| Duration::from_millis(10 * i))
                .collect::<Vec<_>>()
        );
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
        let plan = Plan {
            warmup: Duration::ZERO,
            stop: Stop::Requests(10),
        };
        // Server never answers within the run: 2 in flight, the other 8 cannot be sent.
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
