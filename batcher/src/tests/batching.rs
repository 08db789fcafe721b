//! Batch formation: filling, waiting, options, splitting, shutdown.

use super::*;

#[tokio::test(start_paused = true)]
async fn concurrent_single_requests_fill_batches_and_each_gets_its_own_vector() {
    let (upstream, batcher, _task) = start(Duration::from_millis(5), config(8, 5, 2));
    let receivers = submit_each(&batcher, (0..64).map(|i| format!("text {i}")));
    for (i, rx) in receivers.into_iter().enumerate() {
        let reply = outcome(rx).await.expect("ok");
        assert_eq!(texts(&reply), vec![format!("text {i}")]);
    }
    let calls = upstream.calls();
    assert_eq!(calls.len(), 8, "64 inputs / MAX_BATCH_SIZE 8 = 8 calls");
    assert!(calls.iter().all(|(inputs, _)| inputs.len() == 8));
}

#[tokio::test(start_paused = true)]
async fn a_lone_request_leaves_after_max_wait_time() {
    let (upstream, batcher, _task) = start(Duration::ZERO, config(32, 5, 2));
    let start = Instant::now();
    let rx = submit(&batcher, &["alone"], far()).await.expect("accepted");
    tokio::time::sleep(Duration::from_millis(4)).await;
    assert!(upstream.calls().is_empty(), "sent before MAX_WAIT_TIME");
    let reply = outcome(rx).await.expect("ok");
    assert_eq!(start.elapsed(), Duration::from_millis(5));
    assert_eq!(reply.queue_time, Duration::from_millis(5));
    assert_eq!(upstream.calls().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn with_dispatch_when_idle_a_lone_request_leaves_at_once_and_later_ones_batch_behind_it() {
    let config = BatcherConfig {
        dispatch_when_idle: true,
        ..config(32, 5, 2)
    };
    let (upstream, batcher, _task) = start(Duration::from_millis(10), config);
    let start = Instant::now();
    let first = submit(&batcher, &["alone"], far()).await.expect("accepted");
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(
        upstream.calls().len(),
        1,
        "an idle upstream takes it at once"
    );
    // Three more arrive during the 10 ms call: they wait as usual (MAX_WAIT_TIME, 5 ms), then,
    // not being a full batch, keep filling until the running call ends, and leave together.
    let later = submit_each(&batcher, numbered(3));
    let reply = outcome(first).await.expect("ok");
    assert_eq!(reply.queue_time, Duration::ZERO);
    for rx in later {
        outcome(rx).await.expect("ok");
    }
    let sizes: Vec<usize> = upstream.calls().iter().map(|(i, _)| i.len()).collect();
    assert_eq!(sizes, [1, 3]);
    assert_eq!(start.elapsed(), Duration::from_millis(10 + 10));
}

#[tokio::test(start_paused = true)]
async fn while_a_call_runs_a_due_partial_batch_keeps_filling_and_a_full_one_takes_the_last_slot() {
    // MAX_BATCH_SIZE 4, MAX_WAIT_TIME 5 ms, 2 slots (the default PARTIAL_BATCH_SLOTS: 1), and
    // a 10 ms upstream call.
    let (upstream, batcher, _task) = start(Duration::from_millis(10), config(4, 5, 2));
    let start = Instant::now();
    let first = submit_each(&batcher, numbered(4));
    let x = submit(&batcher, &["x"], far()).await.expect("accepted");
    tokio::time::sleep(Duration::from_millis(6)).await;
    assert_eq!(
        upstream.calls().len(),
        1,
        "a partial batch past MAX_WAIT_TIME waits while a call runs"
    );
    let filler = submit_each(&batcher, ["a", "b", "c"].map(String::from));
    tokio::task::yield_now().await;
    assert_eq!(
        upstream.calls().len(),
        2,
        "once full it takes the second slot at once"
    );
    let y = submit(&batcher, &["y"], far()).await.expect("accepted");
    for rx in first.into_iter().chain(filler) {
        outcome(rx).await.expect("ok");
    }
    assert_eq!(
        outcome(x).await.expect("ok").queue_time,
        Duration::from_millis(6)
    );
    // y was due at 11 ms; the full batch launched at 6 ms runs until 16 ms.
    let y = outcome(y).await.expect("ok");
    assert_eq!(y.queue_time, Duration::from_millis(10));
    assert_eq!(start.elapsed(), Duration::from_millis(26));
    let sizes: Vec<usize> = upstream.calls().iter().map(|(i, _)| i.len()).collect();
    assert_eq!(sizes, [4, 4, 1]);
}

#[tokio::test(start_paused = true)]
async fn with_partial_batch_slots_equal_to_the_slots_a_due_batch_takes_any_free_slot() {
    let config = BatcherConfig {
        partial_batch_slots: Some(2),
        ..config(4, 5, 2)
    };
    let (upstream, batcher, _task) = start(Duration::from_millis(10), config);
    let first = submit_each(&batcher, numbered(4));
    let x = submit(&batcher, &["x"], far()).await.expect("accepted");
    tokio::time::sleep(Duration::from_millis(6)).await;
    assert_eq!(upstream.calls().len(), 2, "x left at MAX_WAIT_TIME");
    for rx in first {
        outcome(rx).await.expect("ok");
    }
    assert_eq!(
        outcome(x).await.expect("ok").queue_time,
        Duration::from_millis(5)
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_batch_leaves_at_once() {
    let (upstream, batcher, _task) = start(Duration::ZERO, config(4, 1000, 2));
    let start = Instant::now();
    let receivers = submit_each(&batcher, numbered(4));
    for rx in receivers {
        outcome(rx).await.expect("ok");
    }
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "a full batch does not wait for MAX_WAIT_TIME"
    );
    assert_eq!(upstream.calls().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn requests_with_different_options_never_share_a_call() {
    let (upstream, batcher, _task) = start(Duration::ZERO, config(32, 5, 2));
    let variants = [
        EmbedOptions::default(),
        EmbedOptions {
            normalize: false,
            ..EmbedOptions::default()
        },
        EmbedOptions {
            truncate: Some(true),
            ..EmbedOptions::default()
        },
        EmbedOptions {
            dimensions: Some(2),
            ..EmbedOptions::default()
        },
        EmbedOptions {
            prompt_name: Some("query".into()),
            ..EmbedOptions::default()
        },
    ];
    let mut receivers = Vec::new();
    for round in 0..3 {
        for (v, options) in variants.iter().enumerate() {
            let text = format!("v{v} r{round}");
            receivers.push((
                text.clone(),
                batcher
                    .submit(vec![Input::from(text)], vec![1], options.clone(), far())
                    .expect("accepted"),
            ));
        }
    }
    for (text, rx) in receivers {
        assert_eq!(texts(&outcome(rx).await.expect("ok")), vec![text]);
    }
    let calls = upstream.calls();
    assert_eq!(
        calls.len(),
        variants.len(),
        "one call per distinct option set"
    );
    for (inputs, options) in calls {
        let v = variants
            .iter()
            .position(|o| *o == options)
            .expect("known options");
        assert!(
            inputs.iter().all(|i| i.starts_with(&format!("v{v} "))),
            "{inputs:?} mixed options"
        );
        assert_eq!(inputs.len(), 3);
    }
}

#[tokio::test(start_paused = true)]
async fn an_oversized_request_is_split_and_reassembled_in_order() {
    let upstream = Recording::new(Duration::from_millis(1), 3);
    let (batcher, _task) = spawn(Arc::clone(&upstream), config(32, 5, 2));
    let inputs: Vec<String> = (0..10).map(|i| format!("part {i}")).collect();
    let rx = batcher
        .submit(
            inputs.iter().map(|t| Input::from(t.as_str())).collect(),
            vec![1; inputs.len()],
            EmbedOptions::default(),
            far(),
        )
        .expect("accepted");
    assert_eq!(texts(&outcome(rx).await.expect("ok")), inputs);
    let sizes: Vec<usize> = upstream.calls().iter().map(|(i, _)| i.len()).collect();
    assert_eq!(
        sizes,
        vec![3, 3, 3, 1],
        "upstream limit 3 → calls of at most 3"
    );
}

#[tokio::test(start_paused = true)]
async fn closing_the_batcher_flushes_and_answers_everything_accepted() {
    let (_upstream, batcher, task) = start(Duration::from_millis(10), config(32, 60_000, 1));
    let receivers = submit_each(&batcher, numbered(5));
    drop(batcher);
    task.await.expect("batcher ends");
    for rx in receivers {
        outcome(rx).await.expect("answered before exit");
    }
}
