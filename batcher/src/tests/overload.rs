//! Overload: bounds, admission by deadline and queue delay, expiry, cancellation.

use super::*;

/// One slot, 100 ms calls: `first` goes upstream, and 1 ms later `text` is submitted with a
/// deadline `deadline_ms` after that. The upstream double and `text`'s outcome, once `first` was
/// answered.
async fn behind_a_100_ms_call(text: &str, deadline_ms: u64) -> (Arc<Recording>, Outcome) {
    let (upstream, batcher, _task) = start(Duration::from_millis(100), config(1, 0, 1));
    let first = submit(&batcher, &["first"], far()).await.expect("accepted");
    tokio::time::sleep(Duration::from_millis(1)).await;
    let second = submit(&batcher, &[text], in_ms(deadline_ms))
        .await
        .expect("accepted: nothing measured yet");
    outcome(first).await.expect("ok");
    (upstream, outcome(second).await)
}

#[tokio::test(start_paused = true)]
async fn a_request_that_expires_in_the_queue_gets_504_and_no_upstream_work() {
    let (upstream, late) = behind_a_100_ms_call("late", 50).await;
    assert_eq!(late.expect_err("expired").status(), 504);
    let calls = upstream.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].0, vec!["first".to_string()]);
}

#[tokio::test(start_paused = true)]
async fn a_request_whose_deadline_comes_before_a_call_could_finish_is_not_sent() {
    // One slot, 100 ms calls. `doomed` is still alive when `first` returns at 100 ms, but a
    // 100 ms call would end at 200 ms; `patient` waits behind it, so sending `doomed` anyway
    // would cost the upstream a call that `patient` needs (alone it would go as a probe).
    let (upstream, batcher, _task) = start(Duration::from_millis(100), config(1, 0, 1));
    let first = submit(&batcher, &["first"], far()).await.expect("accepted");
    tokio::time::sleep(Duration::from_millis(1)).await;
    let doomed = submit(&batcher, &["doomed"], in_ms(150))
        .await
        .expect("accepted: nothing measured");
    let patient = submit(&batcher, &["patient"], far())
        .await
        .expect("accepted");
    outcome(first).await.expect("ok");
    let err = outcome(doomed).await.expect_err("cannot finish in time");
    assert_eq!(err.status(), 504);
    outcome(patient).await.expect("ok");
    let sent: Vec<Vec<String>> = upstream.calls().into_iter().map(|(i, _)| i).collect();
    assert_eq!(
        sent,
        [vec!["first".to_string()], vec!["patient".to_string()]],
        "no upstream time spent on it"
    );
}

#[tokio::test(start_paused = true)]
async fn an_already_expired_request_is_refused_at_once() {
    let (upstream, batcher, _task) = start(Duration::ZERO, config(4, 5, 1));
    let err = submit(&batcher, &["x"], Instant::now())
        .await
        .expect_err("expired");
    assert_eq!(err.status(), 504);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(upstream.calls().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_sheds_with_429() {
    let cfg = config(2, 5, 1).with_queue_cap(4);
    let (_upstream, batcher, _task) = start(Duration::from_secs(1), cfg);
    let accepted = submit(&batcher, &["a", "b", "c"], far()).await;
    assert!(accepted.is_ok());
    let one_more = submit(&batcher, &["d"], far()).await;
    assert!(one_more.is_ok(), "exactly QUEUE_CAP inputs fit");
    let err = submit(&batcher, &["e"], far()).await.expect_err("full");
    assert_eq!(err.status(), 429);
    assert!(err.to_string().contains("QUEUE_CAP = 4"), "{err}");
    // Answering frees the room again.
    outcome(accepted.expect("accepted")).await.expect("ok");
    assert!(submit(&batcher, &["f"], far()).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_request_that_cannot_finish_before_its_deadline_is_shed_at_admission() {
    // 4 inputs per 100 ms call, one call at a time: 40 inputs/s.
    let (_upstream, batcher, _task) = start(Duration::from_millis(100), config(4, 0, 1));
    let warm = submit(&batcher, &numbered(4), far())
        .await
        .expect("accepted");
    outcome(warm).await.expect("ok");
    // 40 inputs queued ahead need ~1 s; a 200 ms deadline cannot be met.
    let _queued = submit(&batcher, &numbered(40), far())
        .await
        .expect("accepted");
    let err = submit(&batcher, &["hurry"], in_ms(200))
        .await
        .expect_err("cannot finish in time");
    assert_eq!(err.status(), 429);
    assert!(err.to_string().contains("deadline"), "{err}");
    // A patient request is still accepted.
    assert!(submit(&batcher, &["patient"], in_ms(5_000)).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_request_leaves_the_queue_at_once_and_costs_no_upstream_call() {
    let cfg = config(8, 1_000, 1).with_queue_cap(2);
    let (upstream, batcher, _task) = start(Duration::from_millis(1), cfg);
    let gone = submit(&batcher, &["gone 1", "gone 2"], far())
        .await
        .expect("accepted");
    let err = submit(&batcher, &["wait"], far())
        .await
        .expect_err("queue full");
    assert_eq!(err.status(), 429);
    drop(gone); // the caller went away
    tokio::time::sleep(Duration::from_millis(1)).await;
    // Long before its group was due (MAX_WAIT_TIME = 1 s), its share of QUEUE_CAP is free again.
    let kept = submit(&batcher, &["kept 1", "kept 2"], far())
        .await
        .expect("room freed by the cancellation");
    let reply = outcome(kept).await.expect("ok");
    assert_eq!(texts(&reply), ["kept 1", "kept 2"]);
    let calls = upstream.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].0,
        ["kept 1", "kept 2"],
        "no upstream work for the cancelled request"
    );
}

#[tokio::test(start_paused = true)]
async fn without_client_deadlines_the_queue_is_bounded_by_max_queue_delay() {
    // One input per 300 ms call, one call at a time; auto bound = 2 × 300 ms + 0 (over
    // AUTO_FLOOR).
    let cfg = config(1, 0, 1).with_max_queue_delay(QueueDelay::Auto);
    let (_upstream, batcher, _task) = start(Duration::from_millis(300), cfg);
    outcome(submit(&batcher, &["warm"], far()).await.expect("accepted"))
        .await
        .expect("ok");
    let mut accepted = Vec::new();
    let refused = loop {
        match batcher
            .try_submit(vec!["x".into()], vec![1], EmbedOptions::default(), far())
            .await
        {
            Ok(rx) => accepted.push(rx),
            Err(refused) => break refused,
        }
        assert!(accepted.len() < 10, "the queue grows without bound");
    };
    // 1 in flight + 2 queued (the 3rd would wait 900 ms > 600 ms); the 1st is admitted
    // as the worker is idle.
    assert_eq!(accepted.len(), 3);
    assert_eq!(refused.error.status(), 429);
    assert!(
        refused
            .error
            .to_string()
            .contains("MAX_QUEUE_DELAY = 600 ms"),
        "{}",
        refused.error
    );
    let retry = refused.retry_after.expect("a retry-after estimate");
    assert!(retry >= Duration::from_millis(300), "{retry:?}");
    assert!(batcher.retry_after_hint() >= Duration::from_millis(300));
    for rx in accepted {
        outcome(rx).await.expect("every admitted request is served");
    }
}

#[tokio::test(start_paused = true)]
async fn the_byte_bound_sheds_429_and_a_request_larger_than_it_gets_413() {
    let cfg = config(8, 5, 1).with_max_queue_bytes(10);
    let (_upstream, batcher, _task) = start(Duration::from_millis(10), cfg);
    let err = submit(&batcher, &["eleven char"], far())
        .await
        .expect_err("alone larger than the bound");
    assert_eq!(err.status(), 413);
    assert!(err.to_string().contains("MAX_QUEUE_BYTES"), "{err}");
    let first = submit(&batcher, &["six 01"], far())
        .await
        .expect("6 bytes fit");
    let err = submit(&batcher, &["six 02"], far())
        .await
        .expect_err("12 > 10 bytes");
    assert_eq!(err.status(), 429);
    assert!(err.to_string().contains("MAX_QUEUE_BYTES = 10"), "{err}");
    outcome(first).await.expect("ok");
    assert!(
        submit(&batcher, &["six 03"], far()).await.is_ok(),
        "answering frees the bytes"
    );
}

#[tokio::test(start_paused = true)]
async fn one_slow_call_does_not_lock_out_short_deadlines() {
    let (upstream, batcher, _task) = start(Duration::from_millis(4_500), config(4, 5, 1));
    outcome(submit(&batcher, &["slow"], far()).await.expect("accepted"))
        .await
        .expect("ok");
    upstream.set_delay(Duration::from_millis(10));
    // Requests with 2 s deadlines every 100 ms for 10 s, right after the 4.5 s call: the first
    // is sent as a probe (nothing else waits), its 10 ms replaces the estimate.
    let mut answers = Vec::new();
    for i in 0..100 {
        let rx = batcher
            .submit(
                vec![Input::from(format!("r{i}"))],
                vec![1],
                EmbedOptions::default(),
                Instant::now() + Duration::from_secs(2),
            )
            .expect("an idle worker admits, whatever the estimate");
        answers.push(tokio::spawn(outcome(rx)));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (i, answer) in answers.into_iter().enumerate() {
        let reply = answer
            .await
            .expect("task")
            .unwrap_or_else(|err| panic!("request {i} failed: {err}"));
        assert!(reply.queue_time <= Duration::from_millis(5), "{reply:?}");
    }
    assert_eq!(upstream.calls().len(), 101, "one call each, none expired");
}

#[tokio::test(start_paused = true)]
async fn a_request_held_behind_a_running_call_expires_at_its_deadline_and_frees_the_queue() {
    // One slot, 1 s calls, room for 2 inputs: `first` runs, `held` waits behind it.
    let cfg = config(32, 5, 1).with_queue_cap(2);
    let (upstream, batcher, _task) = start(Duration::from_secs(1), cfg);
    let start = Instant::now();
    let first = submit(&batcher, &["first"], far()).await.expect("accepted");
    tokio::time::sleep(Duration::from_millis(10)).await;
    let held = submit(&batcher, &["held"], in_ms(100))
        .await
        .expect("accepted: nothing measured");
    let err = submit(&batcher, &["third"], far())
        .await
        .expect_err("QUEUE_CAP reached");
    assert_eq!(err.status(), 429);
    let err = outcome(held).await.expect_err("expired");
    assert_eq!(err.status(), 504, "{err}");
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(110),
        "answered at its deadline, not when the running call ends"
    );
    // Its share of QUEUE_CAP is free at once.
    let next = submit(&batcher, &["next"], far())
        .await
        .expect("room freed by the expiry");
    outcome(first).await.expect("ok");
    outcome(next).await.expect("ok");
    let sent: Vec<Vec<String>> = upstream.calls().into_iter().map(|(i, _)| i).collect();
    assert_eq!(sent, [vec!["first".to_string()], vec!["next".to_string()]]);
}

#[tokio::test(start_paused = true)]
async fn eight_concurrent_512_input_requests_with_30_s_deadlines_are_all_served() {
    // The worker's defaults (MAX_QUEUE_DELAY auto, QUEUE_CAP 4,096) and 10 ms calls: a closed
    // loop of 8 requests of 512 inputs (16 calls each) keeps ~56 calls queued, far beyond the
    // auto bound (2 x 10 ms + 5 ms), and well within the 30 s deadline.
    let (upstream, batcher, _task) = start(Duration::from_millis(10), BatcherConfig::default());
    let clients: Vec<_> = (0..8)
        .map(|client| {
            let batcher = batcher.clone();
            tokio::spawn(async move {
                for round in 0..5 {
                    let sent_texts: Vec<String> =
                        (0..512).map(|i| format!("{client}-{round}-{i}")).collect();
                    let sent = Instant::now();
                    let deadline = sent + Duration::from_secs(30);
                    let rx = submit(&batcher, &sent_texts, deadline)
                        .await
                        .unwrap_or_else(|err| panic!("client {client} round {round}: {err}"));
                    let reply = outcome(rx).await.expect("served");
                    assert_eq!(texts(&reply), sent_texts);
                    assert!(Instant::now() <= deadline);
                }
            })
        })
        .collect();
    for client in clients {
        client.await.expect("every request admitted and served");
    }
    let calls = upstream.calls();
    assert_eq!(calls.len(), 8 * 5 * 16, "full batches of 32");
}

/// Offers `per_tick` requests of `inputs` inputs every `tick_ms` for `for_ms`, each with a
/// deadline `deadline` after it is sent, to a batcher on the defaults with 10 ms calls
/// (capacity: 2 calls of 32 inputs per 10 ms, 6,400 inputs/s). Returns (429s, inputs served);
/// panics if an admitted request fails or is answered after its deadline.
async fn offer(
    tick_ms: u64,
    per_tick: usize,
    inputs: usize,
    for_ms: u64,
    deadline: Duration,
) -> (usize, usize) {
    let (_upstream, batcher, _task) = start(Duration::from_millis(10), BatcherConfig::default());
    let mut shed = 0;
    let mut admitted = Vec::new();
    for tick in 0..for_ms / tick_ms {
        for n in 0..per_tick {
            let sent: Vec<String> = (0..inputs).map(|i| format!("{tick}-{n}-{i}")).collect();
            let due = Instant::now() + deadline;
            match submit(&batcher, &sent, due).await {
                Ok(rx) => admitted.push(tokio::spawn(async move {
                    let result = outcome(rx).await;
                    (result, Instant::now(), due)
                })),
                Err(err) => {
                    assert_eq!(err.status(), 429, "{err}");
                    shed += 1;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(tick_ms)).await;
    }
    let mut served = 0;
    for answer in admitted {
        let (result, at, due) = answer.await.expect("task");
        let reply = result.expect("an admitted request is served");
        assert!(at <= due, "answered {:?} after its deadline", at - due);
        served += texts(&reply).len();
    }
    (shed, served)
}

#[tokio::test(start_paused = true)]
async fn a_sustained_2x_overload_of_single_inputs_is_shed_and_the_admitted_meet_deadlines() {
    // 13 requests of 1 input per ms: 13,000 inputs/s, 2x the upstream, with 1 s deadlines.
    let (shed, served) = offer(1, 13, 1, 2_000, Duration::from_secs(1)).await;
    assert!(shed > 10_000, "about half of 26,000 shed, not {shed}");
    assert!(
        served >= 12_000,
        "goodput near the 12,800 inputs the upstream can do in 2 s, not {served}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_sustained_2x_overload_of_big_requests_is_shed_and_the_admitted_meet_deadlines() {
    // One 512-input request every 40 ms is 12,800 inputs/s: 2x, with 30 s deadlines.
    let (shed, served) = offer(40, 1, 512, 3_000, Duration::from_secs(30)).await;
    assert!(shed >= 20, "about half of 75 shed (QUEUE_CAP), not {shed}");
    assert!(
        served >= 15_000,
        "goodput near 19,200 inputs in 3 s, not {served}"
    );
}

#[tokio::test(start_paused = true)]
async fn submit_without_waiting_gets_a_refusal_as_its_outcome_at_once() {
    let cfg = config(2, 5, 1).with_queue_cap(1);
    let (upstream, batcher, _task) = start(Duration::from_secs(1), cfg);
    let first = submit_text(&batcher, "first");
    let second = submit_text(&batcher, "second");
    let start = Instant::now();
    let err = outcome(second).await.expect_err("QUEUE_CAP = 1");
    assert_eq!(err.status(), 429);
    assert!(err.to_string().contains("QUEUE_CAP = 1"), "{err}");
    assert_eq!(start.elapsed(), Duration::ZERO, "answered at once");
    assert_eq!(texts(&outcome(first).await.expect("ok")), ["first"]);
    assert_eq!(upstream.calls().len(), 1);
}
