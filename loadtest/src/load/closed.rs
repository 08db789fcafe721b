//! Closed loop: `concurrency` workers, each sending its next request as soon as the previous one
//! completed. Latency is measured from each request's actual send time. Note that a closed loop
//! slows down with the server (coordinated omission); use the open loop to measure latency under
//! a given arrival rate.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{Plan, SendFn, Stop, Window, record_completion};
use crate::corpus::PayloadFactory;
use crate::stats::Recorder;

/// Runs `concurrency` workers (at least 1) against `send` until `plan` stops, recording measured
/// requests into `recorder`. Worker `i` draws its bodies from `factory.fork(i)`.
pub async fn run(
    concurrency: usize,
    plan: Plan,
    factory: &PayloadFactory,
    recorder: Arc<Recorder>,
    send: impl SendFn,
) -> Window {
    let send = Arc::new(send);
    let clock = plan.start_clock();
    let tickets = Arc::new(AtomicU64::new(0));
    let mut workers = JoinSet::new();
    for i in 0..concurrency.max(1) {
        let mut factory = factory.fork(i as u64);
        let send = send.clone();
        let recorder = recorder.clone();
        let tickets = tickets.clone();
        workers.spawn(async move {
            loop {
                let now = Instant::now();
                if clock.is_over(now) {
                    break;
                }
                let measured = clock.is_measured(now);
                if measured
                    && let Stop::Requests(n) = plan.stop
                    && tickets.fetch_add(1, Ordering::Relaxed) >= n
                {
                    break;
                }
                let payload = factory.next_payload();
                let inputs = payload.inputs;
                recorder.on_send(measured);
                let sent_at = Instant::now();
                let outcome = send(payload).await;
                record_completion(&recorder, measured, outcome, sent_at, inputs);
            }
        });
    }
    while workers.join_next().await.is_some() {}
    Window::close(clock.measure_start, &plan, &recorder)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::corpus::Corpus;
    use crate::stats::FailureKind;

    fn factory() -> PayloadFactory {
        PayloadFactory::new(Arc::new(Corpus::Generated { words: 3 }), 2, 7)
    }

    #[tokio::test(start_paused = true)]
    async fn sends_exactly_n_measured_requests_after_warmup() {
        let recorder = Arc::new(Recorder::new(Duration::from_secs(1)));
        let calls = Arc::new(AtomicU64::new(0));
        let c = calls.clone();
        let plan = Plan {
            warmup: Duration::from_millis(100),
            stop: Stop::Requests(50),
        };
        let window = run(4, plan, &factory(), recorder.clone(), move |p| {
            c.fetch_add(1, Ordering::Relaxed);
            async move {
                assert_eq!(p.inputs, 2);
                tokio::time::sleep(Duration::from_millis(10)).await;
                Ok(())
            }
        })
        .await;
        let stats = recorder.snapshot();
        assert_eq!(stats.sent, 50);
        assert_eq!(stats.succeeded, 50);
        assert_eq!(stats.inputs_succeeded, 100);
        // 4 workers x 10 warm-up rounds of 10 ms, then 50 measured.
        assert_eq!(calls.load(Ordering::Relaxed), 40 + 50);
        // 50 requests / 4 workers = 13 rounds of 10 ms.
        assert_eq!(window.duration(), Duration::from_millis(130));
        assert_eq!(
            stats.success_latency.value_at_quantile(1.0),
            stats.success_latency.highest_equivalent(10_000)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn duration_mode_stops_starting_at_the_end_and_counts_failures() {
        let recorder = Arc::new(Recorder::new(Duration::from_secs(1)));
        let start = tokio::time::Instant::now();
        let plan = Plan {
            warmup: Duration::ZERO,
            stop: Stop::Duration(Duration::from_millis(95)),
        };
        let window = run(1, plan, &factory(), recorder.clone(), |_| async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Err(FailureKind::Status(429))
        })
        .await;
        let stats = recorder.snapshot();
        // Starts at 0, 10, …, 90 ms: 10 requests; the last completes at 100 ms, after the
        // planned end, which still closes the window (rates are per planned second).
        assert_eq!(stats.sent, 10);
        assert_eq!(stats.failures[&FailureKind::Status(429)], 10);
        assert_eq!(
            stats.last_completion.map(|t| t - start),
            Some(Duration::from_millis(100))
        );
        assert_eq!(window.duration(), Duration::from_millis(95));
    }
}
