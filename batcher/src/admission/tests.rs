//! Admission decisions on explicit instants: no runtime, no clock.

use super::*;

fn limits() -> Limits {
    Limits {
        queue_cap: 1_000,
        max_queue_bytes: 1 << 20,
        max_queue_delay: QueueDelay::Auto,
        max_wait: Duration::from_millis(5),
        dispatch_when_idle: false,
        slots: 1,
        partial_slots: 1,
        batch_limit: 4,
        budget: TokenBudget::default(),
    }
}

/// [`limits`] with the bound `auto` has for 100 ms calls without its floor (205 ms).
fn two_calls() -> Limits {
    Limits {
        max_queue_delay: QueueDelay::Fixed(Duration::from_millis(205)),
        ..limits()
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn ask(inputs: usize, deadline: Instant) -> Ask {
    Ask {
        inputs,
        tokens: inputs as u64,
        bytes: inputs * 10,
        deadline,
        ahead: None,
    }
}

/// A ledger whose estimate learnt `calls` back-to-back calls of `each`, ending at the returned
/// instant.
fn after_calls(ledger: &mut Ledger, mut now: Instant, calls: usize, each: Duration) -> Instant {
    for _ in 0..calls {
        ledger.last_launch = Some(now);
        now += each;
        ledger.estimate.record(each, now, false);
    }
    now
}

/// A one-input request due 1 s after `at`.
fn within_a_second(at: Instant) -> Ask {
    ask(1, at + Duration::from_secs(1))
}

/// A ledger that learnt `calls` back-to-back calls of 4 s, with one call running and 8 inputs
/// (two batches) queued; and the instant the last learnt call ended.
fn busy_after_slow_calls(calls: usize) -> (Ledger, Instant) {
    let mut ledger = Ledger::default();
    let now = after_calls(&mut ledger, Instant::now(), calls, Duration::from_secs(4));
    ledger.queued_inputs = 8;
    ledger.in_flight = 1;
    (ledger, now)
}

/// Asserts that `shed` is a 429 for `reason` whose message contains `needle`.
fn assert_shed(shed: &Shed, reason: ShedReason, needle: &str) {
    assert_eq!(shed.reason, reason);
    assert_eq!(shed.error.status(), 429);
    assert!(
        shed.error.to_string().contains(needle),
        "{} lacks {needle:?}",
        shed.error
    );
}

#[test]
fn queue_delay_parses_auto_and_durations() {
    assert_eq!("auto".parse::<QueueDelay>(), Ok(QueueDelay::Auto));
    assert_eq!(" AUTO ".parse::<QueueDelay>(), Ok(QueueDelay::Auto));
    assert_eq!(
        "250ms".parse::<QueueDelay>(),
        Ok(QueueDelay::Fixed(ms(250)))
    );
    assert!("soon".parse::<QueueDelay>().is_err());
    assert_eq!(QueueDelay::Fixed(ms(250)).to_string(), "250ms");
}

#[test]
fn an_idle_worker_admits_even_right_after_a_slow_call() {
    let limits = limits();
    let mut ledger = Ledger::default();
    let now = after_calls(&mut ledger, Instant::now(), 1, Duration::from_millis(4_500));
    // Nothing queued, a free slot: admitted although the estimate says 4.5 s > the 1 s deadline.
    ledger
        .admit(&limits, within_a_second(now), now)
        .expect("idle worker admits");
    assert_eq!(ledger.queued_inputs, 1);
}

#[test]
fn a_slow_phase_then_a_fast_phase_recovers_within_a_few_calls() {
    let limits = limits();
    // Slow phase: 8 inputs queued ahead (2 calls of 4 s), a 1 s deadline cannot be met.
    let (mut ledger, now) = busy_after_slow_calls(5);
    let err = ledger
        .admit(&limits, within_a_second(now), now)
        .expect_err("slow upstream: shed");
    assert_eq!(err.reason, ShedReason::Deadline);
    // Fast phase: 10 ms calls, one batch queued ahead. The 1 s deadline needs the estimate 16x
    // lower (3 calls within 750 ms): each faster sample halves the distance.
    ledger.queued_inputs = 4;
    let mut now = now;
    let mut admitted_after = None;
    for call in 1..=10 {
        now = after_calls(&mut ledger, now, 1, ms(10));
        if ledger
            .clone()
            .admit(&limits, within_a_second(now), now)
            .is_ok()
        {
            admitted_after = Some(call);
            break;
        }
    }
    let calls = admitted_after.expect("recovers");
    assert!(calls <= 5, "recovered only after {calls} fast calls");
}

#[test]
fn a_stale_estimate_is_discounted_and_a_fresh_sample_after_a_gap_dominates() {
    let mut estimate = Estimate::default();
    let start = Instant::now();
    estimate.record(Duration::from_secs(4), start, false);
    assert_eq!(
        estimate.call_at(start + Duration::from_secs(8)),
        Some(Duration::from_secs(4))
    );
    assert!(estimate.is_fresh(start + Duration::from_secs(8)));
    let later = start + Duration::from_secs(16);
    assert!(!estimate.is_fresh(later));
    assert_eq!(
        estimate.call_at(later),
        Some(Duration::from_secs(2)),
        "halved at twice the age"
    );
    // A fast call 16 s after the slow one weighs e^-4 ≈ 98 %.
    estimate.record(ms(10), later, false);
    let now = estimate.call_at(later).expect("measured");
    assert!(now < ms(100), "{now:?}");
}

#[test]
fn a_slower_sample_is_learnt_at_a_normal_pace() {
    let mut estimate = Estimate::default();
    let start = Instant::now();
    estimate.record(ms(100), start, false);
    estimate.record(ms(200), start + ms(1), false);
    assert_eq!(estimate.call_at(start + ms(1)), Some(ms(125)));
    // A probe's sample replaces it.
    estimate.record(ms(20), start + ms(2), true);
    assert_eq!(estimate.call_at(start + ms(2)), Some(ms(20)));
}

#[test]
fn the_queue_delay_bound_sheds_without_a_client_deadline() {
    let limits = limits();
    let mut ledger = Ledger::default();
    let now = after_calls(&mut ledger, Instant::now(), 3, ms(300));
    let far = now + Duration::from_secs(3_600);
    // Auto bound: 2 × 300 ms + 5 ms. 8 inputs ahead = 2 batches + the running one = 900 ms.
    ledger.in_flight = 1;
    ledger.queued_inputs = 8;
    let err = ledger
        .admit(&limits, ask(1, far), now)
        .expect_err("too deep");
    assert_shed(&err, ShedReason::QueueDelay, "MAX_QUEUE_DELAY = 605 ms");
    assert_eq!(
        err.retry_after,
        Some(ms(300)),
        "over by 295 ms, at least one call"
    );
    // 4 inputs ahead: 1 batch + the running one = 600 ms, within the bound.
    ledger.queued_inputs = 4;
    ledger.admit(&limits, ask(1, far), now).expect("fits");
    // A fixed bound replaces auto.
    let fixed = Limits {
        max_queue_delay: QueueDelay::Fixed(ms(450)),
        ..limits
    };
    let err = ledger
        .admit(&fixed, ask(1, far), now)
        .expect_err("fixed bound");
    assert!(
        err.error
            .to_string()
            .contains("MAX_QUEUE_DELAY = 450 ms (fixed)"),
        "{}",
        err.error
    );
}

#[test]
fn auto_sheds_no_queue_shorter_than_its_floor() {
    // 10 ms calls: 2 calls + MAX_WAIT_TIME is 25 ms, but 48 batches queued behind the running call
    // (490 ms, a closed loop of a few hundred callers) is no overload: admitted up to AUTO_FLOOR.
    let limits = limits();
    let mut ledger = Ledger::default();
    let now = after_calls(&mut ledger, Instant::now(), 3, ms(10));
    let far = now + Duration::from_secs(30);
    ledger.in_flight = 1;
    ledger.queued_inputs = 4 * 48;
    ledger
        .admit(&limits, ask(1, far), now)
        .expect("480 ms < 500 ms");
    assert_eq!(steer_bound(&limits, ms(10)), ms(25), "steers away at 25 ms");
    ledger.queued_inputs = 4 * 51;
    let err = ledger
        .admit(&limits, ask(1, far), now)
        .expect_err("510 ms > 500 ms");
    assert_shed(
        &err,
        ShedReason::QueueDelay,
        "MAX_QUEUE_DELAY = 500 ms (auto: 2 x the 10 ms",
    );
}

#[test]
fn auto_is_back_to_its_call_time_bound_once_many_requests_are_held() {
    // 64 inputs per call, 2 slots, 8 ms calls: the call-time bound is 2 x 8 + 5 = 21 ms.
    let limits = Limits {
        batch_limit: 64,
        slots: 2,
        queue_cap: 10_000,
        ..limits()
    };
    let mut ledger = Ledger::default();
    let now = after_calls(&mut ledger, Instant::now(), 3, ms(8));
    let far = now + Duration::from_secs(30);
    ledger.in_flight = 2;
    // 511 requests of one input = 8 batches ahead: 36 ms, over 21 ms but few requests: admitted.
    ledger.queued_inputs = AUTO_FLOOR_REQUESTS - 1;
    ledger.held_requests = AUTO_FLOOR_REQUESTS - 1;
    ledger
        .admit(&limits, ask(1, far), now)
        .expect("under AUTO_FLOOR");
    // 512 requests held (the admitted one included): the same wait, shed (an open loop over
    // capacity fills the queue; its successes keep the call-time latency).
    assert_eq!(ledger.held_requests, AUTO_FLOOR_REQUESTS);
    let err = ledger
        .admit(&limits, ask(1, far), now)
        .expect_err("many requests");
    assert_shed(&err, ShedReason::QueueDelay, "MAX_QUEUE_DELAY = 21 ms");
    // Answering one brings it back under the count.
    ledger.release(1, 10);
    ledger
        .admit(&limits, ask(1, far), now)
        .expect("511 held again");
}

#[test]
fn a_closed_loop_of_multi_input_requests_is_held_to_the_floor_not_shed() {
    // 64 callers of 20 inputs in front of 32-input calls of 5.6 ms, one at a time: 1,260 inputs
    // queued (40 calls, 225 ms) is a closed loop's standing queue, not overload. Counted in
    // inputs it was over 512 and shed at 2 calls + MAX_WAIT_TIME (16 ms).
    let limits = Limits {
        batch_limit: 32,
        slots: 1,
        queue_cap: 10_000,
        ..limits()
    };
    let mut ledger = Ledger::default();
    let now = after_calls(&mut ledger, Instant::now(), 3, Duration::from_micros(5_640));
    let far = now + Duration::from_secs(30);
    ledger.in_flight = 1;
    ledger.queued_inputs = 63 * 20;
    ledger.queued_tokens = 63 * 20;
    ledger.held_requests = 63;
    ledger
        .admit(&limits, ask(20, far), now)
        .expect("63 requests held, 0.23 s < 500 ms");
}

#[test]
fn a_request_of_several_calls_is_bounded_by_its_deadline_not_by_the_queue_delay() {
    let limits = limits();
    let mut ledger = Ledger::default();
    let now = after_calls(&mut ledger, Instant::now(), 3, ms(100));
    // 28 inputs ahead (7 batches) + the running call: 800 ms, 4x the auto bound (205 ms).
    ledger.in_flight = 1;
    ledger.queued_inputs = 28;
    let err = ledger
        .clone()
        .admit(&limits, ask(4, now + Duration::from_secs(30)), now)
        .expect_err("one call's worth: the bound applies");
    assert_eq!(err.reason, ShedReason::QueueDelay);
    // 5 inputs need two calls: admitted by the 30 s deadline (800 + 200 ms of work).
    ledger
        .clone()
        .admit(&limits, ask(5, now + Duration::from_secs(30)), now)
        .expect("bulk: the deadline decides");
    // The deadline still applies: 1 s of work does not fit 75 % of 1.2 s.
    let err = ledger
        .admit(&limits, ask(5, now + ms(1_200)), now)
        .expect_err("cannot finish in time");
    assert_eq!(err.reason, ShedReason::Deadline);
}

#[test]
fn the_byte_bound_sheds_429_and_a_request_larger_than_it_is_413() {
    let limits = Limits {
        max_queue_bytes: 100,
        ..limits()
    };
    let mut ledger = Ledger::default();
    let now = Instant::now();
    let far = now + Duration::from_secs(60);
    let big = Ask {
        inputs: 1,
        tokens: 1,
        bytes: 101,
        deadline: far,
        ahead: None,
    };
    let err = ledger
        .admit(&limits, big, now)
        .expect_err("alone over the bound");
    assert_eq!(err.error.status(), 413);
    assert!(
        err.error.to_string().contains("MAX_QUEUE_BYTES"),
        "{}",
        err.error
    );
    let sixty = Ask { bytes: 60, ..big };
    ledger.admit(&limits, sixty, now).expect("fits");
    let err = ledger
        .admit(&limits, sixty, now)
        .expect_err("120 > 100 bytes");
    assert_shed(&err, ShedReason::QueueBytes, "MAX_QUEUE_BYTES = 100");
    ledger.release(1, 60);
    ledger.admit(&limits, sixty, now).expect("room again");
}

#[test]
fn a_worker_that_sheds_everything_admits_one_probe_per_call_time() {
    let limits = limits();
    let (mut ledger, now) = busy_after_slow_calls(1);
    assert!(
        ledger.admit(&limits, within_a_second(now), now).is_err(),
        "fresh estimate sheds"
    );
    // No call started or ended for a call time: one probe gets in, the next is shed again.
    let quiet = now + Duration::from_secs(4);
    ledger
        .admit(&limits, within_a_second(quiet), quiet)
        .expect("probe");
    assert!(
        ledger
            .admit(&limits, within_a_second(quiet), quiet)
            .is_err(),
        "one probe at a time"
    );
}

#[test]
fn retry_after_is_at_least_a_call_and_covers_the_excess_queue() {
    let limits = limits();
    let mut ledger = Ledger::default();
    let now = Instant::now();
    assert_eq!(ledger.retry_after(&limits, now), UNMEASURED_RETRY);
    let now = after_calls(&mut ledger, now, 3, ms(100));
    assert_eq!(ledger.retry_after(&limits, now), ms(100));
    ledger.in_flight = 1;
    ledger.queued_inputs = 40; // 10 batches + the running one: 1.1 s, bound AUTO_FLOOR
    assert_eq!(ledger.retry_after(&limits, now), ms(600));
}

#[test]
fn resent_copies_are_admitted_by_deadline_for_their_own_inputs_only() {
    let limits = two_calls();
    let mut ledger = Ledger::default();
    let now = after_calls(&mut ledger, Instant::now(), 3, ms(100));
    let far = now + Duration::from_secs(3_600);
    // Bound: 205 ms. 4 inputs ahead = 1 batch + the running one = 200 ms.
    ledger.in_flight = 1;
    ledger.queued_inputs = 4;
    ledger.queued_tokens = 4;
    // A burst of resent copies, 8 inputs in all: admitted although the queue ahead of the
    // second one needs 300 ms.
    ledger.excuse_resent(8, now, Duration::from_secs(1));
    ledger
        .admit(&limits, ask(4, far), now)
        .expect("first resent copy");
    ledger
        .admit(&limits, ask(4, far), now)
        .expect("second resent copy");
    assert_eq!(ledger.queued_inputs, 12);
    // A fresh request right behind the burst is checked against the queue without it: 4
    // inputs ahead, 200 ms.
    ledger
        .admit(&limits, ask(1, far), now)
        .expect("fresh request behind the burst");
    // The credit is used up: shedding is on again for the rest (5 inputs ahead besides the
    // burst = 2 batches + the running one = 300 ms).
    let err = ledger
        .admit(&limits, ask(1, far), now)
        .expect_err("no credit left");
    assert_shed(&err, ShedReason::QueueDelay, "needs ~300 ms");
    // The deadline still bounds a resent copy: the 13 inputs ahead need 4 batches after the
    // running call, 500 ms, before its own call, and its deadline is 300 ms away.
    ledger.excuse_resent(1, now, Duration::from_secs(1));
    let err = ledger
        .admit(&limits, ask(1, now + ms(300)), now)
        .expect_err("past its deadline");
    assert_eq!(err.reason, ShedReason::Deadline);
}

#[test]
fn resent_credit_lapses_and_excused_inputs_leave_with_the_queue() {
    let limits = two_calls();
    let mut ledger = Ledger::default();
    let now = after_calls(&mut ledger, Instant::now(), 3, ms(100));
    let far = now + Duration::from_secs(3_600);
    ledger.in_flight = 1;
    ledger.queued_inputs = 8;
    ledger.queued_tokens = 8;
    // Credit not used within its window lapses (here a window that ends at once).
    ledger.excuse_resent(4, now, Duration::ZERO);
    let err = ledger
        .admit(&limits, ask(1, far), now)
        .expect_err("the credit lapsed");
    assert_eq!(err.reason, ShedReason::QueueDelay);
    // Admitted on credit, then sent upstream: the inputs no longer count as excused.
    ledger.queued_inputs = 0;
    ledger.queued_tokens = 0;
    ledger.excuse_resent(8, now, Duration::from_secs(1));
    ledger
        .admit(&limits, ask(8, far), now)
        .expect("resent copy");
    assert_eq!(ledger.excused_queued, 8);
    ledger.unqueue(4, 4);
    assert_eq!((ledger.queued_inputs, ledger.excused_queued), (4, 4));
    ledger.unqueue(4, 4);
    assert_eq!((ledger.queued_inputs, ledger.excused_queued), (0, 0));
}

#[test]
fn a_call_is_stalled_only_past_ten_of_the_slow_calls_seen_lately_and_the_floor() {
    let floor = Duration::from_secs(1);
    let mut ledger = Ledger::default();
    // One slow call (a large batch: 400 ms), then many fast ones (10 ms).
    let now = after_calls(&mut ledger, Instant::now(), 1, ms(400));
    let now = after_calls(&mut ledger, now, 50, ms(10));
    ledger.in_flight = 1;
    ledger.last_launch = Some(now);
    // Quiet for 2 s: over the floor and over 10 fast calls, but not 10 of the slow one.
    assert!(!ledger.stalled(now + Duration::from_secs(2), 10, floor));
    // Quiet for 4.5 s: past 10 x 400 ms.
    assert!(ledger.stalled(now + ms(4_500), 10, floor));

    // Only fast calls seen: the floor decides.
    let mut fast = Ledger::default();
    let now = after_calls(&mut fast, Instant::now(), 50, ms(10));
    fast.in_flight = 1;
    fast.last_launch = Some(now);
    assert!(!fast.stalled(now + ms(900), 10, floor));
    assert!(fast.stalled(now + ms(1_100), 10, floor));
    // Nothing in flight: never stalled.
    fast.in_flight = 0;
    assert!(!fast.stalled(now + Duration::from_secs(10), 10, floor));
}

#[test]
fn the_longest_call_is_forgotten_with_a_half_life() {
    let mut ledger = Ledger::default();
    let start = Instant::now();
    let now = after_calls(&mut ledger, start, 1, ms(400));
    let longest = |at| ledger.estimate.longest_at(at).expect("sampled");
    assert_eq!(longest(now), ms(400));
    let halved = longest(now + Duration::from_secs(60));
    assert!(halved > ms(199) && halved < ms(201), "{halved:?}");
}

#[test]
fn a_stalled_call_is_not_remembered_as_the_longest() {
    let floor = ms(500);
    let mut ledger = Ledger::default();
    let mut now = after_calls(&mut ledger, Instant::now(), 50, ms(6));
    // The upstream was stopped for 1.5 s under a call: past the bound in effect (500 ms).
    now += ms(1_500);
    ledger.record_call(ms(1_500), now, false, 10, floor);
    // The second call in flight ends with it (launched 60 ms into the stop).
    now += ms(1);
    ledger.record_call(ms(1_441), now, false, 10, floor);
    // Then fast calls again, one of them a slower batch (40 ms), under the bound.
    for i in 0..20 {
        let call = if i == 10 { ms(40) } else { ms(6) };
        now += call;
        ledger.record_call(call, now, false, 10, floor);
    }
    let longest = ledger.estimate.longest_at(now).expect("sampled");
    assert!(
        longest >= ms(39) && longest <= ms(40),
        "the 40 ms batch is the longest remembered, not the stall: {longest:?}"
    );
    ledger.in_flight = 1;
    ledger.last_launch = Some(now);
    assert!(
        ledger.stalled(now + ms(600), 10, floor),
        "the next stop is seen past the floor, not 10 x 1.5 s"
    );
    // Remembered as before, the stall would hide the next one for 15 s.
    let mut unbounded = Ledger::default();
    let mut now = after_calls(&mut unbounded, Instant::now(), 50, ms(6));
    now += ms(1_500);
    unbounded.estimate.record(ms(1_500), now, false);
    let now = after_calls(&mut unbounded, now, 20, ms(6));
    unbounded.in_flight = 1;
    unbounded.last_launch = Some(now);
    assert!(!unbounded.stalled(now + ms(600), 10, floor));
}

#[test]
fn an_idle_worker_refuses_a_deadline_shorter_than_its_fastest_call_of_that_size() {
    let mut ledger = Ledger::default();
    let t0 = Instant::now();
    // One 22 ms call of one input, then a long idle spell: the moving estimate has faded.
    ledger.estimate.record(ms(22), t0, false);
    ledger.fastest.record(ms(22), 1, 1, t0);
    ledger.fastest.record(ms(24), 1, 1, t0);
    let now = t0 + Duration::from_secs(60);
    assert!(ledger.estimate.call_at(now).expect("measured") < ms(1));
    for due in [1, 2, 5, 10, 15, 21] {
        let shed = ledger
            .admit(&limits(), ask(1, now + ms(due)), now)
            .expect_err("no call of this size ends in time");
        assert_shed(&shed, ShedReason::Deadline, "fastest upstream call");
    }
    assert_eq!(ledger.held_inputs, 0, "nothing refused is held");
    ledger
        .admit(&limits(), ask(1, now + ms(22)), now)
        .expect("a deadline the fastest call can meet is admitted");
    // A larger request: the one-input call is still a floor for it.
    ledger
        .admit(&limits(), ask(3, now + ms(5)), now)
        .expect_err("three inputs take no less than one");
}

#[test]
fn a_call_larger_than_the_request_sets_no_floor_for_it() {
    let mut ledger = Ledger::default();
    let now = Instant::now();
    ledger.fastest.record(ms(500), 32, 32, now);
    ledger.fastest.record(ms(500), 32, 32, now);
    ledger
        .admit(&limits(), ask(1, now + ms(5)), now)
        .expect("no one-input call was measured: nothing says it cannot be done");
}
