//! Faults: bisection of rejected batches, upstream failures, crashed batch tasks.

use super::*;
use crate::batcher::spawn;

#[tokio::test(start_paused = true)]
async fn a_poisoned_request_is_isolated_and_its_batch_mates_still_succeed() {
    let upstream = Recording::new(Duration::ZERO, usize::MAX);
    let (batcher, _task) = spawn(Arc::clone(&upstream), config(8, 5, 1));
    let receivers: Vec<_> = (0..8)
        .map(|i| {
            let text = if i == 5 {
                "poison pill".to_string()
            } else {
                format!("good {i}")
            };
            (
                text.clone(),
                batcher
                    .submit(vec![text], EmbedOptions::default(), far())
                    .expect("accepted"),
            )
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
    let upstream = Recording::new(Duration::ZERO, usize::MAX);
    *upstream.fail.lock().expect("lock") = Some(UpstreamError::Unreachable("down".into()));
    let (batcher, _task) = spawn(Arc::clone(&upstream), config(4, 5, 1));
    let rx = batcher
        .submit(vec!["a".into()], EmbedOptions::default(), far())
        .expect("accepted");
    let err = outcome(rx).await.expect_err("upstream is down");
    assert_eq!(err.status(), 503);
    assert_eq!(upstream.calls().len(), 1, "no retry storm");
    *upstream.fail.lock().expect("lock") = None;
    let rx = batcher
        .submit(vec!["b".into()], EmbedOptions::default(), far())
        .expect("accepted");
    assert_eq!(
        texts(&outcome(rx).await.expect("recovered")),
        vec!["b".to_string()]
    );
}
