//! The tracing hooks ([`crate::Traces`]): where the batcher calls them, as it called the worker's
//! OpenTelemetry functions before they were hooks.

use std::cell::RefCell;

use super::*;
use crate::{Traces, spawn_traced};

thread_local! {
    /// What the hooks saw on this test's thread (paused-time tests run the actor and its batch
    /// tasks on the test's own thread): `set_parent` calls, and each `queue_waited` interval.
    static SEEN: RefCell<(usize, Vec<(Instant, Instant)>)> = const { RefCell::new((0, Vec::new())) };
}

fn parent_set(_: &tracing::Span, _: &tracing::Span) {
    SEEN.with(|seen| seen.borrow_mut().0 += 1);
}

fn queue_waited(_: &tracing::Span, accepted: Instant, first_call: Instant) {
    SEEN.with(|seen| seen.borrow_mut().1.push((accepted, first_call)));
}

/// Three single-input requests in one batch of a batcher with `enabled` as its hook; what the
/// hooks saw.
async fn one_batch_of_three(enabled: fn() -> bool) -> (usize, Vec<(Instant, Instant)>) {
    SEEN.with(|seen| *seen.borrow_mut() = (0, Vec::new()));
    let upstream = Recording::new(Duration::from_millis(10), usize::MAX);
    let traces = Traces {
        enabled,
        set_parent: parent_set,
        queue_waited,
    };
    let (batcher, _task) = spawn_traced(Arc::clone(&upstream), config(4, 5, 1), traces);
    for rx in submit_each(&batcher, numbered(3)) {
        outcome(rx).await.expect("served");
    }
    assert_eq!(upstream.calls().len(), 1, "one batch");
    SEEN.with(|seen| seen.borrow().clone())
}

#[tokio::test(start_paused = true)]
async fn a_batch_gets_one_parent_and_each_request_its_queue_wait() {
    let (parents, waits) = one_batch_of_three(|| true).await;
    assert_eq!(
        parents, 1,
        "the batch's span is a child of its oldest request's"
    );
    assert_eq!(waits.len(), 3, "one queue_wait per request");
    let first_call = waits[0].1;
    for (accepted, call) in waits {
        assert_eq!(call, first_call, "all three went in the same call");
        assert!(
            call - accepted >= Duration::from_millis(5),
            "a partial batch waits max_wait"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn with_tracing_off_no_parent_is_looked_for() {
    let (parents, waits) = one_batch_of_three(|| false).await;
    assert_eq!(parents, 0);
    // The hook itself returns at once when nothing is exported (the worker's does).
    assert_eq!(waits.len(), 3);
}
