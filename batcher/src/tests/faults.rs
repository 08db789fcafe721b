//! Faults: bisection of rejected batches, upstream failures, crashed batch tasks.

use super::*;
use tokio::sync::oneshot;

#[tokio::test(start_paused = true)]
async fn a_poisoned_request_is_isolated_and_its_batch_mates_still_succeed() {
    let (upstream, batcher, _task) = start(Duration::ZERO, config(8, 5, 1));
    let receivers: Vec<_> = (0..8)
        .map(|i| {
            let text = if i == 5 {
                "poison pill".to_string()
            } else {
                format!("good {i}")
            };
            (text.clone(), submit_text(&batcher, text))
        })
        .collect();
    for (text, rx) in receivers {
        match outcome(rx).await {
            Ok(reply) => assert_eq!(texts(&reply), vec![text]),
            Err(err) => {
                assert_eq!(text, "poison pill");
                assert_eq!(err.status(), 422);
            }
        }
    }
    let calls = upstream.calls();
    assert_eq!(calls[0].0.len(), 8, "first the whole batch");
    assert!(
        calls.len() <= 1 + 2 * 3,
        "bisection, not one call per request: {}",
        calls.len()
    );
}

#[tokio::test(start_paused = true)]
async fn an_upstream_failure_fails_only_its_batch_and_the_worker_keeps_serving() {
    let (upstream, batcher, _task) = start(Duration::ZERO, config(4, 5, 1));
    *upstream.fail.lock().expect("lock") = Some(UpstreamError::Unreachable("down".into()));
    let rx = submit(&batcher, &["a"], far()).await.expect("accepted");
    let err = outcome(rx).await.expect_err("upstream is down");
    assert_eq!(err.status(), 503);
    assert_eq!(upstream.calls().len(), 1, "no retry storm");
    *upstream.fail.lock().expect("lock") = None;
    let rx = submit(&batcher, &["b"], far()).await.expect("accepted");
    assert_eq!(
        texts(&outcome(rx).await.expect("recovered")),
        vec!["b".to_string()]
    );
}

/// Waits for an outcome, failing (not hanging) if the batcher never answers: on paused time the
/// timeout elapses as soon as every task is idle.
async fn answered(rx: oneshot::Receiver<Outcome>) -> Outcome {
    tokio::time::timeout(Duration::from_secs(600), outcome(rx))
        .await
        .expect("answered, not stuck")
}

#[tokio::test(start_paused = true)]
async fn a_panicking_batch_fails_exactly_its_requests_and_frees_its_slot() {
    // One call slot: a slot the crash did not free would leave every later request unanswered.
    let (upstream, batcher, _task) = start(Duration::from_millis(10), config(2, 5, 1));
    let other = EmbedOptions {
        normalize: false,
        ..EmbedOptions::default()
    };
    let submit = |text: &str, options: &EmbedOptions| {
        batcher
            .submit(vec![Input::from(text)], vec![1], options.clone(), far())
            .expect("accepted")
    };
    let crashing = [
        submit("panic 1", &EmbedOptions::default()),
        submit("batch-mate", &EmbedOptions::default()),
    ];
    let elsewhere = submit("other options", &other);
    for rx in crashing {
        let err = answered(rx).await.expect_err("its call crashed");
        assert_eq!(err.status(), 424, "{err}");
        assert!(matches!(err, EmbedError::Backend(_)), "{err:?}");
        assert!(err.to_string().contains("upstream call crashed"), "{err}");
    }
    assert_eq!(
        texts(
            &answered(elsewhere)
                .await
                .expect("another batch is unaffected")
        ),
        ["other options"]
    );
    // A 2nd and a 3rd crash do not lock the worker either.
    for round in 2..=3 {
        let err = answered(submit(&format!("panic {round}"), &EmbedOptions::default()))
            .await
            .expect_err("crashed");
        assert_eq!(err.status(), 424);
        let reply = answered(submit(&format!("after {round}"), &EmbedOptions::default()))
            .await
            .expect("the next request succeeds");
        assert_eq!(texts(&reply), [format!("after {round}")]);
    }
    assert_eq!(upstream.calls().len(), 6, "3 crashed calls, 3 good ones");
}
