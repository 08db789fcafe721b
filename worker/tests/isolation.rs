//! An input the upstream's model fails on (TEI's 424 `Backend`), over a real nats-server and the
//! TEI double: its batch-mates are served and only its request fails; an upstream answering 424
//! to everything gets no bisection storm.

mod common;

use std::collections::HashMap;

use embatch_testkit::{Faults, POISON, Stack, TeiConfig, double_vector};

/// Batches form only when full or after 250 ms: requests sent together share one batch.
const WORKER: &[&str] = &common::SHARED_BATCHES;

/// A [`Stack`] on an instant TEI double with `faults`, the worker started with [`WORKER`].
async fn stack_with(faults: Faults) -> Stack {
    let stack = Stack::start(TeiConfig::instant(), WORKER).await;
    stack.tei.set_faults(faults);
    stack
}

/// Sends one single-input request per text at once; each reply's status and body.
async fn send_all(stack: &Stack, texts: &[String]) -> Vec<(u16, serde_json::Value)> {
    common::send_texts(&stack.nats.url(), texts).await
}

/// How many upstream calls carried each input.
fn sends(stack: &Stack) -> HashMap<String, usize> {
    let mut sends = HashMap::new();
    for call in stack.tei.calls() {
        for input in call.inputs {
            let text = input.as_text().unwrap_or_default().to_owned();
            *sends.entry(text).or_default() += 1;
        }
    }
    sends
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_input_the_model_fails_on_fails_alone_and_its_20_batch_mates_are_served() {
    let stack = stack_with(Faults::poisoned_with(424)).await;
    let mut texts: Vec<String> = (0..20).map(|i| format!("good {i}")).collect();
    texts.insert(9, format!("bad {POISON}"));
    let replies = send_all(&stack, &texts).await;
    for (text, (status, body)) in texts.iter().zip(&replies) {
        if text.contains(POISON) {
            assert_eq!(*status, 424, "{body}");
            assert_eq!(body["error_type"], "Backend", "TEI's error, passed through");
        } else {
            assert_eq!(*status, 200, "{text}: {body}");
            let vectors: Vec<Vec<f32>> = serde_json::from_value(body.clone()).expect("vectors");
            assert_eq!(vectors, vec![double_vector(text)], "{text}");
        }
    }
    let calls = stack.tei.calls();
    println!(
        "upstream calls (inputs each): {:?}",
        stack.tei.calls.batch_sizes()
    );
    assert_eq!(
        calls[0].inputs.len(),
        21,
        "one batch of all 21 requests first"
    );
    // Bisection: 1 + 2 calls per level, ⌈log2 21⌉ = 5 levels at most.
    assert!(calls.len() <= 11, "{} calls", calls.len());
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_failing_every_call_with_424_gets_no_bisection_storm() {
    let stack = stack_with(Faults::failing_with(424)).await;
    let texts: Vec<String> = (0..20).map(|i| format!("doomed {i}")).collect();
    let replies = send_all(&stack, &texts).await;
    assert!(
        replies.iter().all(|(status, _)| *status == 424),
        "{replies:?}"
    );
    let sends = sends(&stack);
    println!(
        "upstream calls (inputs each): {:?}",
        stack.tei.calls.batch_sizes()
    );
    assert_eq!(sends.len(), 20, "every input was tried");
    // Each input goes upstream in its batch and once more in one half of it, never deeper
    // (unbounded bisection would send each about 1 + log2(20) ≈ 5 times).
    assert!(
        sends.values().all(|&n| n <= 2),
        "sends per input: {sends:?}"
    );
    stack.worker.stop().await;
}
