//! One test per transition of the delivery state machine ([`State::on`]), on plain instants:
//! each asserts the decision (which resend, after which pause, which timer, what is learnt).

use std::time::Duration;

use bytes::Bytes;
use embatch_protocol::EmbedError;
use embatch_protocol::reply::Timings;
use tokio::time::Instant;

use super::event::{Announcement, Event, Resend};
use super::state::{
    Learnt, NO_RESPONDERS_BACKOFF_MAX, NO_RESPONDERS_BACKOFF_MIN, Next, Phase, Send, State, Timer,
};
use crate::inbox::Generation;
use crate::{
    ACK_TIMEOUT_MAX, MIN_RESEND_BUDGET, NO_RESPONDERS_RETRY, RECONNECT_GRACE, Reply, RequestError,
    UNAVAILABLE_RETRIES,
};

/// The acknowledgement wait the tests start from: the workers' 20 ms delay + 100 ms.
const WAIT: Duration = Duration::from_millis(120);

/// The client's connect count when the tests' copies go out.
const CONNECTS: u64 = 1;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A request of `budget` with acknowledgement wait `ack_wait`, its first copy sent at once:
/// the state and its start.
fn started(budget: Duration, ack_wait: Option<Duration>) -> (State, Instant) {
    let t0 = Instant::now();
    let mut state = State::new(t0, budget, ack_wait);
    send(&mut state, t0);
    (state, t0)
}

/// Sends the next copy at `at` (no reconnect seen): what it carries.
fn send(state: &mut State, at: Instant) -> Send {
    let send = state.prepare(false, None, at);
    state.sent(Generation::default(), CONNECTS, at);
    send
}

fn ack(worker: &str, connects: Option<u64>) -> Event {
    Event::Acknowledged {
        worker: worker.into(),
        connects,
    }
}

fn reply() -> Reply {
    Reply {
        payload: Bytes::from_static(b"[[0.5]]"),
        timings: Timings {
            queue_time_ms: None,
            inference_time_ms: None,
        },
        tokens: None,
        cache_hits: None,
    }
}

fn success(ack_delay_ms: Option<u64>) -> Event {
    Event::Success {
        reply: reply(),
        ack_delay_ms,
    }
}

fn unavailable_error() -> RequestError {
    RequestError::Reply(EmbedError::Unavailable("upstream down".into()))
}

fn unavailable(jitter: Duration) -> Event {
    Event::Unavailable {
        error: unavailable_error(),
        ack_delay_ms: Some(20),
        jitter,
    }
}

/// An announcement with `generation` and this client still on connection [`CONNECTS`].
fn announced(generation: Generation, lost: &[&str], reconnected: &[&str]) -> Event {
    Event::Announced(Announcement {
        generation,
        connects: CONNECTS,
        lost: lost.iter().map(|w| (*w).to_owned()).collect(),
        reconnected: reconnected.iter().map(|w| (*w).to_owned()).collect(),
    })
}

/// This client reconnected (on connection `CONNECTS + 1`), counted in `generation`, with
/// `lost` holders lost.
fn client_reconnected(generation: Generation, lost: &[&str]) -> Event {
    Event::Announced(Announcement {
        generation: Generation {
            reconnects: generation.reconnects.max(1),
            ..generation
        },
        connects: CONNECTS + 1,
        lost: lost.iter().map(|w| (*w).to_owned()).collect(),
        reconnected: Vec::new(),
    })
}

/// One more worker found lost.
fn one_lost() -> Generation {
    Generation {
        lost: 1,
        ..Generation::default()
    }
}

#[track_caller]
fn resend(next: Next) -> (Resend, Duration) {
    match next {
        Next::Resend { reason, after } => (reason, after),
        other => panic!("expected a resend, got {other:?}"),
    }
}

#[track_caller]
fn answer(next: Next) -> (Result<Reply, RequestError>, Option<Learnt>, bool) {
    match next {
        Next::Answer {
            outcome,
            learnt,
            withdraw,
        } => (outcome, learnt, withdraw),
        other => panic!("expected an answer, got {other:?}"),
    }
}

#[track_caller]
fn fail(next: Next) -> RequestError {
    match next {
        Next::Fail(err) => err,
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[track_caller]
fn wait(next: Next) {
    assert!(matches!(next, Next::Wait), "expected a wait, got {next:?}");
}

#[test]
fn every_resend_reason_has_its_own_label() {
    let all = [
        Resend::NoResponders,
        Resend::Unavailable,
        Resend::NoAck,
        Resend::Reconnect,
        Resend::WorkerLost,
        Resend::WorkerReconnected,
    ];
    let mut labels: Vec<&str> = all.iter().map(|r| r.label()).collect();
    labels.sort_unstable();
    labels.dedup();
    assert_eq!(labels.len(), all.len());
}

#[test]
fn the_first_copy_carries_the_whole_budget_and_awaits_an_acknowledgement() {
    let t0 = Instant::now();
    let mut state = State::new(t0, ms(2000), Some(WAIT));
    assert_eq!(state.phase(), Phase::Sending);
    let first = send(&mut state, t0);
    assert_eq!(
        first,
        Send {
            attempt: 1,
            remaining: ms(2000)
        }
    );
    assert_eq!(state.phase(), Phase::AwaitingAck { ack_by: t0 + WAIT });
    assert_eq!(state.timer(), Timer::Ack(t0 + WAIT));
    assert!(matches!(state.timer().event(), Event::AckTimeout));
}

#[test]
fn a_resent_copy_carries_its_number_and_what_is_left() {
    let (mut state, t0) = started(ms(2000), Some(WAIT));
    resend(state.on(Event::AckTimeout, t0 + WAIT));
    assert_eq!(
        state.phase(),
        Phase::Sending,
        "no copy out until it is sent"
    );
    let second = send(&mut state, t0 + ms(150));
    assert_eq!(
        second,
        Send {
            attempt: 2,
            remaining: ms(1850)
        }
    );
}

#[test]
fn workers_that_do_not_acknowledge_leave_only_the_deadline() {
    let (state, t0) = started(ms(2000), None);
    assert_eq!(state.phase(), Phase::AwaitingReply);
    assert_eq!(state.timer(), Timer::Deadline(t0 + ms(2000)));
    assert!(matches!(state.timer().event(), Event::Deadline));
}

#[test]
fn an_acknowledgement_wait_past_the_deadline_is_not_run() {
    let (state, t0) = started(WAIT, Some(WAIT));
    assert_eq!(state.phase(), Phase::AwaitingReply, "ack_by == deadline");
    assert_eq!(state.timer(), Timer::Deadline(t0 + WAIT));
}

#[test]
fn a_copy_sent_within_the_grace_of_a_reconnect_waits_the_longest() {
    // A reconnect of this client 400 ms before the request, seen by the inbox.
    let t0 = Instant::now();
    let mut state = State::new(t0, ms(5000), Some(WAIT));
    state.prepare(false, Some(t0 - ms(400)), t0);
    state.sent(Generation::default(), CONNECTS, t0);
    assert_eq!(state.timer(), Timer::Ack(t0 + ACK_TIMEOUT_MAX));
    // Past the grace: the plain wait.
    let t1 = t0 + RECONNECT_GRACE;
    resend(state.on(Event::AckTimeout, t1));
    send(&mut state, t1);
    assert_eq!(state.timer(), Timer::Ack(t1 + WAIT * 2));
    // A request that waited for the reconnect itself.
    let mut waited = State::new(t0, ms(5000), Some(WAIT));
    waited.prepare(true, None, t0 + ms(300));
    waited.sent(Generation::default(), CONNECTS, t0 + ms(300));
    assert_eq!(waited.timer(), Timer::Ack(t0 + ms(300) + ACK_TIMEOUT_MAX));
}

#[test]
fn the_first_acknowledgement_stops_the_wait_and_watches_its_worker() {
    let (mut state, t0) = started(ms(2000), Some(WAIT));
    match state.on(ack("w1", Some(3)), t0 + ms(25)) {
        Next::Acknowledged {
            worker,
            connects,
            rtt,
        } => {
            assert_eq!(worker, "w1");
            assert_eq!(connects, Some(3));
            assert_eq!(rtt, ms(25));
        }
        other => panic!("expected an acknowledgement, got {other:?}"),
    }
    assert_eq!(state.phase(), Phase::AwaitingReply);
    assert_eq!(state.timer(), Timer::Deadline(t0 + ms(2000)));
    assert_eq!(state.holders().collect::<Vec<_>>(), [("w1", Some(3))]);
}

#[test]
fn an_acknowledgement_from_another_worker_adds_a_holder_and_a_repeat_updates_one() {
    let (mut state, t0) = started(ms(5000), Some(WAIT));
    state.on(ack("w1", Some(1)), t0 + ms(25));
    // This client reconnected: the copy is resent, and another worker takes it.
    let reconnect = client_reconnected(Generation::default(), &[]);
    assert_eq!(
        resend(state.on(reconnect, t0 + ms(100))).0,
        Resend::Reconnect
    );
    send(&mut state, t0 + ms(100));
    state.on(ack("w2", Some(1)), t0 + ms(110));
    assert_eq!(
        state.holders().collect::<Vec<_>>(),
        [("w1", Some(1)), ("w2", Some(1))]
    );
    // w1 acknowledges the resent copy on a newer connection: it holds the request now.
    state.on(ack("w1", Some(2)), t0 + ms(120));
    state.on(ack("w2", None), t0 + ms(130));
    assert_eq!(
        state.holders().collect::<Vec<_>>(),
        [("w1", Some(2)), ("w2", Some(1))]
    );
}

#[test]
fn a_success_is_the_answer_and_tells_the_acknowledgement_delay() {
    let (mut state, _) = started(ms(2000), Some(WAIT));
    let (outcome, learnt, withdraw) = answer(state.on(success(Some(20)), Instant::now()));
    assert_eq!(
        outcome.map(|r| r.payload),
        Ok(Bytes::from_static(b"[[0.5]]"))
    );
    assert_eq!(learnt, Some(Learnt::AcknowledgesAfter { ms: 20 }));
    assert!(!withdraw, "one copy sent: nothing to withdraw");
}

#[test]
fn a_success_after_a_resend_withdraws_the_other_copies() {
    let (mut state, t0) = started(ms(2000), Some(WAIT));
    resend(state.on(Event::AckTimeout, t0 + WAIT));
    send(&mut state, t0 + WAIT);
    let (outcome, _, withdraw) = answer(state.on(success(Some(20)), t0 + ms(200)));
    assert!(outcome.is_ok());
    assert!(withdraw);
}

#[test]
fn a_success_never_acknowledged_nor_announcing_a_delay_turns_waits_off() {
    let (mut state, t0) = started(ms(2000), Some(WAIT));
    let (_, learnt, _) = answer(state.on(success(None), t0 + ms(5)));
    assert_eq!(learnt, Some(Learnt::Unacknowledged));
    // An acknowledged request whose reply lacks the header says nothing of the fleet.
    let (mut acked, t0) = started(ms(2000), Some(WAIT));
    acked.on(ack("w1", None), t0 + ms(25));
    let (_, learnt, _) = answer(acked.on(success(None), t0 + ms(40)));
    assert_eq!(learnt, None);
    // Nor does an error without it.
    let (mut failed, t0) = started(ms(2000), Some(WAIT));
    let error = Event::Error {
        error: RequestError::Reply(EmbedError::Validation("empty".into())),
        ack_delay_ms: None,
    };
    let (_, learnt, _) = answer(failed.on(error, t0 + ms(5)));
    assert_eq!(learnt, None);
}

#[test]
fn an_error_other_than_503_is_the_answer_at_once() {
    let (mut state, t0) = started(ms(2000), Some(WAIT));
    let overloaded = RequestError::Reply(EmbedError::Overloaded("queue is full".into()));
    let error = Event::Error {
        error: overloaded.clone(),
        ack_delay_ms: Some(20),
    };
    let (outcome, learnt, withdraw) = answer(state.on(error, t0 + ms(5)));
    assert_eq!(outcome.map(|r| r.payload), Err(overloaded));
    assert_eq!(learnt, Some(Learnt::AcknowledgesAfter { ms: 20 }));
    assert!(!withdraw);
}

#[test]
fn a_503_is_resent_after_growing_pauses_then_answered() {
    let (mut state, t0) = started(ms(60_000), Some(WAIT));
    state.on(ack("w1", Some(1)), t0 + ms(25));
    let mut now = t0 + ms(30);
    let mut pauses = Vec::new();
    for _ in 0..UNAVAILABLE_RETRIES {
        let (reason, after) = resend(state.on(unavailable(ms(3)), now));
        assert_eq!(reason, Resend::Unavailable);
        assert_eq!(state.holders().count(), 0, "a 503 clears the holders");
        pauses.push(after);
        now += after;
        send(&mut state, now);
    }
    assert_eq!(pauses, [13, 23, 43, 83, 163, 203].map(ms));
    let (outcome, learnt, withdraw) = answer(state.on(unavailable(ms(3)), now));
    assert_eq!(outcome.map(|r| r.payload), Err(unavailable_error()));
    assert_eq!(learnt, Some(Learnt::AcknowledgesAfter { ms: 20 }));
    assert!(withdraw, "seven copies sent");
}

#[test]
fn a_503_whose_pause_leaves_too_little_budget_is_the_answer() {
    // Pause 10 + 2 ms, then MIN_RESEND_BUDGET must still be left before the deadline.
    let (mut state, t0) = started(ms(1000), Some(WAIT));
    let last_in_time = t0 + ms(1000) - ms(12) - MIN_RESEND_BUDGET - ms(1);
    let mut late = State::new(t0, ms(1000), Some(WAIT));
    send(&mut late, t0);
    assert_eq!(
        resend(state.on(unavailable(ms(2)), last_in_time)),
        (Resend::Unavailable, ms(12))
    );
    let (outcome, _, _) = answer(late.on(unavailable(ms(2)), last_in_time + ms(1)));
    assert_eq!(outcome.map(|r| r.payload), Err(unavailable_error()));
}

#[test]
fn no_responders_is_retried_with_growing_pauses_then_discovery_says_why() {
    let (mut state, t0) = started(ms(5000), Some(WAIT));
    let mut now = t0;
    let mut pauses = Vec::new();
    loop {
        match state.on(Event::NoResponders, now) {
            Next::Resend {
                reason: Resend::NoResponders,
                after,
            } => {
                pauses.push(after);
                now += after;
                send(&mut state, now);
            }
            Next::AskDiscovery => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    // 10, 20, 40 ms; the next pause (80 ms) would end at NO_RESPONDERS_RETRY: give up.
    assert_eq!(pauses, [10, 20, 40].map(ms));
    assert!(now - t0 + ms(80) >= NO_RESPONDERS_RETRY);
}

#[test]
fn no_responders_within_a_reconnect_grace_is_retried_to_its_end_at_most_100_ms_apart() {
    let t0 = Instant::now();
    let mut state = State::new(t0, ms(5000), Some(WAIT));
    state.prepare(true, None, t0);
    state.sent(Generation::default(), CONNECTS, t0);
    let mut now = t0;
    let mut pauses = Vec::new();
    while let Next::Resend { after, .. } = state.on(Event::NoResponders, now) {
        pauses.push(after);
        now += after;
        send(&mut state, now);
    }
    assert_eq!(pauses[..5], [10, 20, 40, 80, 100].map(ms));
    assert!(pauses[5..].iter().all(|p| *p == NO_RESPONDERS_BACKOFF_MAX));
    assert!(now + NO_RESPONDERS_BACKOFF_MAX >= t0 + RECONNECT_GRACE);
    assert!(now < t0 + RECONNECT_GRACE, "retried up to the grace's end");
}

#[test]
fn no_responders_gives_up_at_the_deadline() {
    let (mut state, t0) = started(ms(100), Some(WAIT));
    let (_, after) = resend(state.on(Event::NoResponders, t0 + ms(85)));
    assert_eq!(after, NO_RESPONDERS_BACKOFF_MIN);
    send(&mut state, t0 + ms(95));
    assert!(matches!(
        state.on(Event::NoResponders, t0 + ms(95)),
        Next::AskDiscovery
    ));
}

#[test]
fn no_responders_while_a_worker_holds_a_copy_waits_for_its_reply() {
    let (mut state, t0) = started(ms(5000), Some(WAIT));
    state.on(ack("w1", Some(1)), t0 + ms(25));
    let reconnect = client_reconnected(Generation::default(), &[]);
    resend(state.on(reconnect, t0 + ms(50)));
    send(&mut state, t0 + ms(50));
    wait(state.on(Event::NoResponders, t0 + ms(51)));
    assert_eq!(state.holders().count(), 1);
}

#[test]
fn a_reply_from_a_worker_restarts_the_no_responders_back_off() {
    let (mut state, t0) = started(ms(5000), Some(WAIT));
    assert_eq!(resend(state.on(Event::NoResponders, t0)).1, ms(10));
    send(&mut state, t0 + ms(10));
    assert_eq!(resend(state.on(Event::NoResponders, t0 + ms(10))).1, ms(20));
    send(&mut state, t0 + ms(30));
    // A worker subscribed and answered 503; the next "no responders" starts afresh.
    resend(state.on(unavailable(ms(0)), t0 + ms(35)));
    send(&mut state, t0 + ms(45));
    assert_eq!(
        resend(state.on(Event::NoResponders, t0 + ms(200))).1,
        ms(10)
    );
}

#[test]
fn no_acknowledgement_in_time_resends_with_a_doubled_wait_up_to_the_longest() {
    let (mut state, t0) = started(ms(60_000), Some(WAIT));
    let mut now = t0;
    let mut waits = Vec::new();
    for _ in 0..6 {
        let Timer::Ack(at) = state.timer() else {
            panic!("an acknowledgement wait runs");
        };
        waits.push(at - now);
        assert_eq!(
            resend(state.on(Event::AckTimeout, at)),
            (Resend::NoAck, Duration::ZERO)
        );
        now = at;
        send(&mut state, now);
    }
    assert_eq!(waits, [120, 240, 480, 960, 1000, 1000].map(ms));
    assert_eq!(ACK_TIMEOUT_MAX, ms(1000));
}

#[test]
fn no_acknowledgement_with_too_little_budget_left_waits_for_the_copy_out() {
    let budget = WAIT + MIN_RESEND_BUDGET;
    let (mut state, t0) = started(budget, Some(WAIT));
    assert_eq!(state.timer(), Timer::Ack(t0 + WAIT));
    wait(state.on(Event::AckTimeout, t0 + WAIT));
    assert_eq!(state.phase(), Phase::AwaitingReply);
    assert_eq!(state.timer(), Timer::Deadline(t0 + budget));
    // The doubled wait is kept for none: no resend was made.
    let (mut in_time, t0) = started(budget + ms(1), Some(WAIT));
    resend(in_time.on(Event::AckTimeout, t0 + WAIT));
}

#[test]
fn every_holder_lost_resends_as_worker_lost() {
    let (mut state, t0) = started(ms(5000), Some(WAIT));
    state.on(ack("w1", Some(1)), t0 + ms(25));
    assert_eq!(
        resend(state.on(announced(one_lost(), &["w1"], &[]), t0 + ms(600))),
        (Resend::WorkerLost, Duration::ZERO)
    );
    assert_eq!(state.holders().count(), 0);
    assert_eq!(state.phase(), Phase::Sending);
}

#[test]
fn some_holders_lost_wait_for_the_others() {
    let (mut state, t0) = started(ms(5000), Some(WAIT));
    state.on(ack("w1", Some(1)), t0 + ms(25));
    state.on(ack("w2", Some(1)), t0 + ms(26));
    wait(state.on(announced(one_lost(), &["w1"], &[]), t0 + ms(600)));
    assert_eq!(state.holders().count(), 2, "the holders are kept");
    // The other is lost too: now it is resent.
    let two_lost = Generation {
        lost: 2,
        ..Generation::default()
    };
    assert_eq!(
        resend(state.on(announced(two_lost, &["w1", "w2"], &[]), t0 + ms(700))).0,
        Resend::WorkerLost
    );
}

#[test]
fn a_loss_of_no_holder_changes_nothing() {
    let (mut state, t0) = started(ms(5000), Some(WAIT));
    // No holder yet: a loss elsewhere says nothing of this copy.
    wait(state.on(announced(one_lost(), &[], &[]), t0 + ms(50)));
    assert_eq!(state.timer(), Timer::Ack(t0 + WAIT), "the wait runs on");
    // A holder listed as lost, but the inbox's counters did not move since the copy's last
    // look: nothing new.
    state.on(ack("w1", Some(1)), t0 + ms(60));
    wait(state.on(announced(one_lost(), &["w1"], &[]), t0 + ms(70)));
    assert_eq!(state.holders().count(), 1);
}

#[test]
fn holders_gone_with_one_reconnected_resend_as_worker_reconnected() {
    let (mut state, t0) = started(ms(5000), Some(WAIT));
    state.on(ack("w1", Some(1)), t0 + ms(25));
    state.on(ack("w2", Some(1)), t0 + ms(26));
    let moved = Generation {
        worker_reconnects: 1,
        ..Generation::default()
    };
    // w1 beats from a later connection; w2 is still alive: wait.
    wait(state.on(announced(moved, &[], &["w1"]), t0 + ms(100)));
    // w2 then falls silent: every holder is gone, one of them reconnected.
    let moved_and_lost = Generation { lost: 1, ..moved };
    assert_eq!(
        resend(state.on(announced(moved_and_lost, &["w2"], &["w1"]), t0 + ms(600))),
        (Resend::WorkerReconnected, Duration::ZERO)
    );
    assert_eq!(state.holders().count(), 0);
}

#[test]
fn a_reconnect_of_this_client_resends_and_opens_a_grace() {
    let (mut state, t0) = started(ms(5000), Some(WAIT));
    state.on(ack("w1", Some(1)), t0 + ms(25));
    let at = Generation {
        reconnected_at: Some(t0 + ms(250)),
        ..Generation::default()
    };
    let reconnect = client_reconnected(at, &[]);
    let now = t0 + ms(300);
    assert_eq!(
        resend(state.on(reconnect, now)),
        (Resend::Reconnect, Duration::ZERO)
    );
    assert_eq!(state.holders().count(), 1, "its holder is not lost");
    // The next copy waits the longest acknowledgement wait.
    send(&mut state, now);
    assert_eq!(state.timer(), Timer::Ack(now + ACK_TIMEOUT_MAX));
}

#[test]
fn a_reconnect_announced_after_the_copy_went_out_on_the_new_connection_is_no_loss() {
    let (mut state, t0) = started(ms(5000), Some(WAIT));
    // The copy went out on connection CONNECTS, which the announcement reports.
    let late = announced(
        Generation {
            reconnects: 1,
            ..Generation::default()
        },
        &[],
        &[],
    );
    wait(state.on(late, t0 + ms(40)));
    assert_eq!(state.timer(), Timer::Ack(t0 + WAIT));
}

#[test]
fn a_reconnect_with_every_holder_lost_resends_once_as_reconnect() {
    let (mut state, t0) = started(ms(5000), Some(WAIT));
    state.on(ack("w1", Some(1)), t0 + ms(25));
    let both = client_reconnected(one_lost(), &["w1"]);
    assert_eq!(resend(state.on(both, t0 + ms(600))).0, Resend::Reconnect);
    assert_eq!(state.holders().count(), 0);
}

#[test]
fn a_loss_or_reconnect_with_too_little_budget_left_waits() {
    let (mut state, t0) = started(ms(1000), Some(WAIT));
    state.on(ack("w1", Some(1)), t0 + ms(25));
    let late = t0 + ms(1000) - MIN_RESEND_BUDGET;
    wait(state.on(announced(one_lost(), &["w1"], &[]), late));
    assert_eq!(state.holders().count(), 0, "the lost holder is forgotten");
    assert_eq!(state.timer(), Timer::Deadline(t0 + ms(1000)));
    let reconnect = client_reconnected(one_lost(), &[]);
    wait(state.on(reconnect, late));
}

#[test]
fn the_deadline_fails_the_request_with_its_budget() {
    let (mut state, t0) = started(ms(1500), Some(WAIT));
    state.on(ack("w1", Some(1)), t0 + ms(25));
    assert_eq!(
        fail(state.on(Event::Deadline, t0 + ms(1500))),
        RequestError::TimedOut { budget_ms: 1500 }
    );
}

#[test]
fn a_closed_inbox_fails_the_request() {
    let (mut state, t0) = started(ms(1500), Some(WAIT));
    assert_eq!(
        fail(state.on(Event::Closed, t0 + ms(1))),
        RequestError::Transport("the reply inbox closed".into())
    );
}

#[test]
fn without_a_copy_out_only_the_deadline_and_a_closed_inbox_count() {
    let t0 = Instant::now();
    let mut state = State::new(t0, ms(1000), Some(WAIT));
    wait(state.on(Event::AckTimeout, t0));
    wait(state.on(Event::NoResponders, t0));
    wait(state.on(success(Some(20)), t0));
    assert_eq!(state.phase(), Phase::Sending);
    fail(state.on(Event::Deadline, t0 + ms(1000)));
}

fn message(headers: &[(&str, &str)], status: Option<async_nats::StatusCode>) -> Event {
    let mut map = async_nats::HeaderMap::new();
    for (name, value) in headers {
        map.insert(*name, *value);
    }
    let message = async_nats::Message {
        subject: "_INBOX.x.1".into(),
        reply: None,
        payload: Bytes::from_static(b"[[0.5]]"),
        headers: Some(map),
        status,
        description: None,
        length: 0,
    };
    Event::of_message(Some(message), || ms(7))
}

#[test]
fn messages_are_read_into_events() {
    use embatch_protocol::headers;
    assert!(matches!(
        message(&[], Some(async_nats::StatusCode::NO_RESPONDERS)),
        Event::NoResponders
    ));
    match message(
        &[
            (headers::ACCEPTED_BY, "w1"),
            (headers::WORKER_CONNECTS, "2"),
        ],
        None,
    ) {
        Event::Acknowledged { worker, connects } => {
            assert_eq!((worker.as_str(), connects), ("w1", Some(2)));
        }
        other => panic!("expected an acknowledgement, got {other:?}"),
    }
    match message(&[(headers::ACK_DELAY_MS, "20")], None) {
        Event::Success {
            reply,
            ack_delay_ms,
        } => assert_eq!(
            (reply.payload, ack_delay_ms),
            (Bytes::from_static(b"[[0.5]]"), Some(20))
        ),
        other => panic!("expected a success, got {other:?}"),
    }
    match message(&[(headers::SERVICE_ERROR_CODE, "503")], None) {
        Event::Unavailable {
            jitter,
            ack_delay_ms,
            ..
        } => assert_eq!((jitter, ack_delay_ms), (ms(7), None)),
        other => panic!("expected a 503, got {other:?}"),
    }
    assert!(matches!(
        message(&[(headers::SERVICE_ERROR_CODE, "429")], None),
        Event::Error { .. }
    ));
    assert!(matches!(Event::of_message(None, || ms(0)), Event::Closed));
}
