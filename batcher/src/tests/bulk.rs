//! Bulk requests ([`super::super::BulkGate`]): they fill what interactive batches leave, go
//! alone only behind no interactive input, and never take a share of the admission bounds.

use super::*;

/// Spawns a bulk request of `texts` (1 token each, default options) on `batcher`'s gate.
fn bulk(batcher: &BatcherHandle, texts: Vec<String>) -> JoinHandle<super::super::BulkOutcome> {
    let gate = batcher.bulk_gate();
    tokio::spawn(async move {
        let inputs: Vec<Input> = texts.into_iter().map(Input::from).collect();
        gate.embed(inputs, Vec::new(), EmbedOptions::default())
            .await
    })
}

fn prefixed(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// The texts a bulk outcome's embeddings carry (the double answers `["<input>"]`).
fn bulk_texts(outcome: super::super::BulkOutcome) -> Vec<String> {
    outcome
        .expect("embedded")
        .iter()
        .map(|e| {
            let mut v: Vec<String> = serde_json::from_slice(e.json()).expect("JSON");
            v.remove(0)
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn bulk_inputs_fill_the_room_an_interactive_batch_leaves_and_wait_behind_it() {
    let (upstream, batcher, _task) = start(Duration::from_millis(10), config(8, 5, 2));
    batcher.bulk_gate().limit_calls(1);
    // A full interactive batch leaves at once; bulk inputs and a partial interactive batch
    // arrive while it runs.
    let first = submit_each(&batcher, prefixed("a", 8));
    tokio::task::yield_now().await;
    let backlog = bulk(&batcher, prefixed("b", 10));
    tokio::task::yield_now().await;
    let partial = submit_each(&batcher, prefixed("i", 3));
    for rx in first.into_iter().chain(partial) {
        outcome(rx).await.expect("ok");
    }
    assert_eq!(
        bulk_texts(backlog.await.expect("joined")),
        prefixed("b", 10),
        "each bulk input gets its own vector, in order"
    );
    let calls: Vec<Vec<String>> = upstream.calls().into_iter().map(|(i, _)| i).collect();
    let mut second = prefixed("i", 3);
    second.extend(prefixed("b", 5));
    assert_eq!(
        calls,
        [prefixed("a", 8), second, prefixed("b", 10)[5..].to_vec()],
        "the interactive batch goes first, filled with bulk inputs; the rest of the bulk \
         request goes alone once nothing interactive waits"
    );
}

/// A batcher (batches of 8, 5 ms wait, 2 slots) on a 100 ms upstream after one full call, so
/// its call-time estimate is 100 ms.
async fn measured_at_100_ms() -> (Arc<Recording>, BatcherHandle, JoinHandle<()>) {
    let (upstream, batcher, task) = start(Duration::from_millis(100), config(8, 5, 2));
    for rx in submit_each(&batcher, prefixed("w", 8)) {
        outcome(rx).await.expect("ok");
    }
    (upstream, batcher, task)
}

#[tokio::test(start_paused = true)]
async fn with_bulk_waiting_the_next_batch_leaves_a_quarter_call_before_the_running_one_ends() {
    let (upstream, batcher, _task) = measured_at_100_ms().await;
    batcher.bulk_gate().limit_calls(1);
    // A full interactive batch runs; a backlog and a partial interactive group arrive behind it.
    let started = tokio::time::Instant::now();
    let full = submit_each(&batcher, prefixed("a", 8));
    tokio::task::yield_now().await;
    let backlog = bulk(&batcher, prefixed("b", 5));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let partial = submit_each(&batcher, prefixed("i", 3));
    tokio::time::sleep_until(started + Duration::from_millis(70)).await;
    assert_eq!(
        upstream.calls().len(),
        2,
        "nothing more sent before the handoff"
    );
    tokio::time::sleep_until(started + Duration::from_millis(80)).await;
    let calls: Vec<Vec<String>> = upstream.calls().into_iter().map(|(i, _)| i).collect();
    let mut next = prefixed("i", 3);
    next.extend(prefixed("b", 5));
    assert_eq!(
        calls[1..],
        [prefixed("a", 8), next],
        "at 75 ms the partial group leaves, filled with the backlog, while the first call runs"
    );
    for rx in full.into_iter().chain(partial) {
        outcome(rx).await.expect("ok");
    }
    assert_eq!(bulk_texts(backlog.await.expect("joined")), prefixed("b", 5));
}

#[tokio::test(start_paused = true)]
async fn without_bulk_waiting_a_partial_group_waits_for_the_running_call_to_end() {
    let (upstream, batcher, _task) = measured_at_100_ms().await;
    let started = tokio::time::Instant::now();
    let full = submit_each(&batcher, prefixed("a", 8));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let partial = submit_each(&batcher, prefixed("i", 3));
    tokio::time::sleep_until(started + Duration::from_millis(95)).await;
    assert_eq!(upstream.calls().len(), 2, "no handoff without a backlog");
    for rx in full.into_iter().chain(partial) {
        outcome(rx).await.expect("ok");
    }
    assert_eq!(upstream.calls().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn bulk_requests_hold_no_share_of_the_bounds_so_interactive_ones_are_still_admitted() {
    let (_upstream, batcher, _task) =
        start(Duration::from_millis(10), config(4, 5, 2).with_queue_cap(4));
    // More bulk inputs than QUEUE_CAP: no 413, no 429.
    let backlog = bulk(&batcher, prefixed("b", 12));
    tokio::task::yield_now().await;
    let rx = submit(&batcher, &prefixed("i", 4), far())
        .await
        .expect("admitted despite the bulk backlog");
    assert_eq!(texts(&outcome(rx).await.expect("ok")), prefixed("i", 4));
    assert_eq!(
        bulk_texts(backlog.await.expect("joined")),
        prefixed("b", 12)
    );
}

#[tokio::test(start_paused = true)]
async fn a_rejected_bulk_input_fails_only_its_own_request() {
    let (_upstream, batcher, _task) = start(Duration::from_millis(1), config(8, 5, 2));
    let good = bulk(&batcher, vec!["fine".into()]);
    let bad = bulk(&batcher, vec!["poison".into()]);
    assert_eq!(bulk_texts(good.await.expect("joined")), ["fine"]);
    let err = bad.await.expect("joined").expect_err("rejected");
    assert_eq!(err.status(), 422);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_bulk_request_costs_no_upstream_call() {
    let (upstream, batcher, _task) = start(Duration::from_millis(10), config(4, 5, 2));
    batcher.bulk_gate().limit_calls(1);
    let running = submit_each(&batcher, prefixed("a", 4));
    tokio::task::yield_now().await;
    let backlog = bulk(&batcher, prefixed("b", 4));
    tokio::task::yield_now().await;
    backlog.abort();
    for rx in running {
        outcome(rx).await.expect("ok");
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let calls: Vec<Vec<String>> = upstream.calls().into_iter().map(|(i, _)| i).collect();
    assert_eq!(
        calls,
        [prefixed("a", 4)],
        "the cancelled bulk inputs were never sent"
    );
}
