//! Batches by tokens through the actor: the budget, the shape by length, the oldest input's
//! wait bound, and replies after the inputs of a call were reordered.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::*;
use crate::BatchCost;

/// `config` with a token budget, dispatching when idle (the default).
fn by_tokens(config: BatcherConfig, max_batch_tokens: u64, cost: BatchCost) -> BatcherConfig {
    BatcherConfig {
        dispatch_when_idle: true,
        tokens: TokenBudget {
            max_batch_tokens,
            cost,
        },
        ..config
    }
}

/// A text that names its request, its index and its token count: `r3.1:120`.
fn text(request: usize, index: usize, tokens: u32) -> String {
    format!("r{request}.{index}:{tokens}")
}

/// The token count a [`text`] names.
fn tokens_of(text: &str) -> u32 {
    text.rsplit(':')
        .next()
        .and_then(|t| t.parse().ok())
        .expect("a text made by `text`")
}

/// Submits one request of inputs with the given token counts; returns its texts and receiver.
fn submit_lengths(
    batcher: &BatcherHandle,
    request: usize,
    lengths: &[u32],
) -> (Vec<String>, oneshot::Receiver<Outcome>) {
    let texts: Vec<String> = lengths
        .iter()
        .enumerate()
        .map(|(i, &t)| text(request, i, t))
        .collect();
    let inputs = texts.iter().map(|t| Input::from(t.as_str())).collect();
    let rx = batcher
        .submit(inputs, lengths.to_vec(), EmbedOptions::default(), far())
        .expect("accepted");
    (texts, rx)
}

/// Tokens and padded tokens of one recorded call.
fn call_totals(inputs: &[String]) -> (u64, u64) {
    let lengths: Vec<u32> = inputs.iter().map(|t| tokens_of(t)).collect();
    crate::shape::totals(&lengths)
}

#[tokio::test(start_paused = true)]
async fn over_random_lengths_no_call_exceeds_the_budget_and_every_reply_keeps_its_order() {
    let mut rng = StdRng::seed_from_u64(21);
    for cost in [BatchCost::Padded, BatchCost::Unpadded] {
        let config = by_tokens(config(16, 5, 2), 2_048, cost);
        let (upstream, batcher, _task) = start(Duration::from_millis(3), config);
        let mut pending = Vec::new();
        for request in 0..120 {
            // Mostly single short queries, some multi-input requests, a few over the budget.
            let n = if rng.random_range(0..4) == 0 {
                rng.random_range(2..=40)
            } else {
                1
            };
            let lengths: Vec<u32> = (0..n)
                .map(|_| match rng.random_range(0..100) {
                    0..=84 => rng.random_range(4..=30),
                    85..=97 => rng.random_range(60..=256),
                    _ => rng.random_range(2_049..=4_000),
                })
                .collect();
            pending.push(submit_lengths(&batcher, request, &lengths));
            if rng.random_range(0..3) == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        for (sent, rx) in pending {
            let reply = outcome(rx).await.expect("ok");
            assert_eq!(
                texts(&reply),
                sent,
                "{cost}: a reply holds its own inputs in order"
            );
        }
        for (inputs, _) in upstream.calls() {
            assert!(inputs.len() <= 16, "{cost}: {} inputs", inputs.len());
            let lengths: Vec<u32> = inputs.iter().map(|t| tokens_of(t)).collect();
            assert!(
                cost != BatchCost::Padded || lengths.is_sorted(),
                "{cost}: a padded call is sent shortest first: {lengths:?}"
            );
            let (sum, padded) = call_totals(&inputs);
            let spent = match cost {
                BatchCost::Padded => padded,
                BatchCost::Unpadded | BatchCost::Inputs => sum,
            };
            assert!(
                spent <= 2_048 || inputs.len() == 1,
                "{cost}: {spent} tokens in {} inputs",
                inputs.len()
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_padded_batch_groups_lengths_and_an_over_budget_input_leaves_alone() {
    // One call at a time, so that the queue holds a mix when the first call ends.
    let config = by_tokens(config(8, 5, 1), 1_024, BatchCost::Padded);
    let (upstream, batcher, _task) = start(Duration::from_millis(10), config);
    let (_, first) = submit_lengths(&batcher, 0, &[10]);
    tokio::time::sleep(Duration::from_millis(1)).await;
    // While it runs: shorts and paragraphs interleaved, and one input over the whole budget.
    let mut pending = Vec::new();
    for request in 1..=12 {
        let tokens = match request {
            5 => 3_000,
            r if r % 3 == 0 => 200,
            _ => 12,
        };
        pending.push(submit_lengths(&batcher, request, &[tokens]));
    }
    outcome(first).await.expect("ok");
    for (sent, rx) in pending {
        assert_eq!(texts(&outcome(rx).await.expect("ok")), sent);
    }
    let calls = upstream.calls();
    for (inputs, _) in &calls[1..] {
        let lengths: Vec<u32> = inputs.iter().map(|t| tokens_of(t)).collect();
        let (sum, padded) = call_totals(inputs);
        assert!(
            lengths.iter().all(|&t| t == lengths[0]),
            "shorts and paragraphs never share a call: {lengths:?}"
        );
        assert!(padded <= 1_024 || inputs.len() == 1, "{lengths:?}");
        assert_eq!(sum, padded, "no padding at all here: {lengths:?}");
    }
    assert!(
        calls
            .iter()
            .any(|(inputs, _)| inputs.len() == 1 && tokens_of(&inputs[0]) == 3_000),
        "the input over the budget went alone"
    );
}

#[tokio::test(start_paused = true)]
async fn the_oldest_waiting_input_is_in_the_next_batch_however_long_it_is() {
    // One call slot, 8 inputs per call, calls of 20 ms.
    let config = by_tokens(config(8, 5, 1), 16_384, BatchCost::Padded);
    let (upstream, batcher, _task) = start(Duration::from_millis(20), config);
    let (_, busy) = submit_lengths(&batcher, 0, &[10]);
    tokio::time::sleep(Duration::from_millis(1)).await;
    // A paragraph, then a stream of short queries that would fill batch after batch without it.
    let (long, long_rx) = submit_lengths(&batcher, 1, &[250]);
    let mut shorts = Vec::new();
    for request in 2..42 {
        shorts.push(submit_lengths(&batcher, request, &[10]));
        tokio::time::sleep(Duration::from_micros(100)).await;
    }
    outcome(busy).await.expect("ok");
    let reply = outcome(long_rx).await.expect("ok");
    assert_eq!(texts(&reply), long);
    // It waited only for the call in flight when it arrived (19 ms left), then left at once:
    // never passed over by the 40 shorter inputs behind it.
    assert!(
        reply.queue_time <= Duration::from_millis(19) + Duration::from_millis(1),
        "queued {:?}",
        reply.queue_time
    );
    let calls = upstream.calls();
    assert!(
        calls[1].0.contains(&long[0]),
        "the second call carries the oldest input"
    );
    for (_, rx) in shorts {
        outcome(rx).await.expect("ok");
    }
    // Each short input left within (older inputs waiting + 1) batches: arrival order holds
    // among inputs of one length.
    let order: Vec<String> = upstream
        .calls()
        .into_iter()
        .skip(2)
        .flat_map(|(inputs, _)| inputs)
        .collect();
    let expected: Vec<String> = (2..42)
        .map(|r| text(r, 0, 10))
        .filter(|t| order.contains(t))
        .collect();
    assert_eq!(
        order, expected,
        "inputs of equal length leave in arrival order"
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_of_mixed_lengths_is_split_by_length_and_reassembled_in_order() {
    let config = by_tokens(config(4, 5, 1), 16_384, BatchCost::Padded);
    let (upstream, batcher, _task) = start(Duration::from_millis(5), config);
    let (_, busy) = submit_lengths(&batcher, 0, &[10]);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let lengths = [200, 8, 190, 9, 8, 210, 7, 10];
    let (sent, rx) = submit_lengths(&batcher, 1, &lengths);
    outcome(busy).await.expect("ok");
    let reply = outcome(rx).await.expect("ok");
    assert_eq!(
        texts(&reply),
        sent,
        "every input back in the request's order"
    );
    let shapes: Vec<Vec<u32>> = upstream.calls()[1..]
        .iter()
        .map(|(inputs, _)| inputs.iter().map(|t| tokens_of(t)).collect())
        .collect();
    assert_eq!(
        shapes,
        [vec![190, 200, 210], vec![7, 8, 8, 9], vec![10]],
        "the paragraphs (with the oldest input) first, then the shortest queries"
    );
}
