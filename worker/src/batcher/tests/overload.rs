//! Overload: bounds, admission by deadline and queue delay, expiry, cancellation.

use super::*;
use crate::batcher::spawn;

#[tokio::test(start_paused = true)]
async fn a_request_that_expires_in_the_queue_gets_504_and_no_upstream_work() {
    let upstream = Recording::new(Duration::from_millis(100), usize::MAX);
    let (batcher, _task) = spawn(Arc::clone(&upstream), config(1, 0, 1));
    let first = batcher
        .submit(vec!["first".into()], EmbedOptions::default(), far())
        .expect("accepted");
    tokio::time::sleep(Duration::from_millis(1)).await;
    let late = batcher
        .submit(
            vec!["late".into()],
            EmbedOptions::default(),
            Instant::now() + Duration::from_millis(50),
        )
        .expect("accepted: nothing measured yet");
    assert_eq!(outcome(late).await.expect_err("expired").status(), 504);
    outcome(first).await.expect("ok");
    let calls = upstream.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].0, vec!["first".to_string()]);
}

#[tokio::test(start_paused = true)]
async fn a_request_whose_deadline_comes_before_a_call_could_finish_is_not_sent() {
    let upstream = Recording::new(Duration::from_millis(100), usize::MAX);
    let (batcher, _task) = spawn(Arc::clone(&upstream), config(1, 0, 1));
    let first = batcher
        .submit(vec!["first".into()], EmbedOptions::default(), far())
        .expect("accepted");
    tokio::time::sleep(Duration::from_millis(1)).await;
    // Still alive when `first` returns at 100 ms, but a 100 ms call would end at 200 ms.
    let doomed = batcher
        .submit(
            vec!["doomed".into()],
            EmbedOptions::default(),
            Instant::now() + Duration::from_millis(150),
        )
        .expect("accepted: nothing measured yet");
    outcome(first).await.expect("ok");
    let err = outcome(doomed).await.expect_err("cannot finish in time");
    assert_eq!(err.status(), 504);
    assert_eq!(upstream.calls().len(), 1, "no upstream time spent on it");
}

#[tokio::test(start_paused = true)]
async fn an_already_expired_request_is_refused_at_once() {
    let upstream = Recording::new(Duration::ZERO, usize::MAX);
    let (batcher, _task) = spawn(Arc::clone(&upstream), config(4, 5, 1));
    let err = batcher
        .submit(vec!["x".into()], EmbedOptions::default(), Instant::now())
        .expect_err("expired");
    assert_eq!(err.status(), 504);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(upstream.calls().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_sheds_with_429() {
    let upstream = Recording::new(Duration::from_secs(1), usize::MAX);
    let cfg = BatcherConfig {
        queue_cap: 4,
        ..config(2, 5, 1)
    };
    let (batcher, _task) = spawn(Arc::clone(&upstream), cfg);
    let accepted = batcher.submit(
        vec!["a".into(), "b".into(), "c".into()],
        EmbedOptions::default(),
        far(),
    );
    assert!(accepted.is_ok());
    let one_more = batcher.submit(vec!["d".into()], EmbedOptions::default(), far());
    assert!(one_more.is_ok(), "exactly QUEUE_CAP inputs fit");
    let err = batcher
        .submit(vec!["e".into()], EmbedOptions::default(), far())
        .expect_err("full");
    assert_eq!(err.status(), 429);
    assert!(err.to_string().contains("QUEUE_CAP = 4"), "{err}");
    // Answering frees the room again.
    outcome(accepted.expect("accepted")).await.expect("ok");
    assert!(
        batcher
            .submit(vec!["f".into()], EmbedOptions::default(), far())
            .is_ok()
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_that_cannot_finish_before_its_deadline_is_shed_at_admission() {
    // 4 inputs per 100 ms call, one call at a time: 40 inputs/s.
    let upstream = Recording::new(Duration::from_millis(100), usize::MAX);
    let (batcher, _task) = spawn(Arc::clone(&upstream), config(4, 0, 1));
    let warm = batcher
        .submit(
            (0..4).map(|i| i.to_string()).collect(),
            EmbedOptions::default(),
            far(),
        )
        .expect("accepted");
    outcome(warm).await.expect("ok");
    // 40 inputs queued ahead need ~1 s; a 200 ms deadline cannot be met.
    let _queued = batcher
        .submit(
            (0..40).map(|i| i.to_string()).collect(),
            EmbedOptions::default(),
            far(),
        )
        .expect("accepted");
    let err = batcher
        .submit(
            vec!["hurry".into()],
            EmbedOptions::default(),
            Instant::now() + Duration::from_millis(200),
        )
        .expect_err("cannot finish in time");
    assert_eq!(err.status(), 429);
    assert!(err.to_string().contains("deadline"), "{err}");
    // A patient request is still accepted.
    assert!(
        batcher
            .submit(
                vec!["patient".into()],
                EmbedOptions::default(),
                Instant::now() + Duration::from_secs(5)
            )
            .is_ok()
    );
}
