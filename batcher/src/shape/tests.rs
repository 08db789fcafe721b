//! Batch shapes over token counts: the budget, the head, the order of a call.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::*;

fn padded(max_batch_tokens: u64) -> TokenBudget {
    TokenBudget {
        max_batch_tokens,
        cost: BatchCost::Padded,
    }
}

fn unpadded(max_batch_tokens: u64) -> TokenBudget {
    TokenBudget {
        max_batch_tokens,
        cost: BatchCost::Unpadded,
    }
}

/// The cost of the picked candidates under `budget`'s cost model.
fn cost(tokens: &[u32], picked: &[usize], budget: TokenBudget) -> u64 {
    let lengths: Vec<u32> = picked.iter().map(|&i| tokens[i]).collect();
    let (sum, _) = totals(&lengths);
    let longest = lengths.iter().copied().max().unwrap_or(0);
    budget.cost.of(lengths.len(), longest, sum)
}

#[test]
fn a_batch_never_exceeds_the_budget_or_the_input_limit_over_random_lengths() {
    let mut rng = StdRng::seed_from_u64(0x70_6b_6e);
    for round in 0..5_000 {
        let n = rng.random_range(1..=300usize);
        // Mostly short inputs, some paragraphs, a few over any budget below.
        let tokens: Vec<u32> = (0..n)
            .map(|_| match rng.random_range(0..100) {
                0..=84 => rng.random_range(3..=30),
                85..=97 => rng.random_range(40..=256),
                _ => rng.random_range(257..=5_000),
            })
            .collect();
        let limit = rng.random_range(1..=64usize);
        let max = rng.random_range(1..=20_000u64);
        for budget in [padded(max), unpadded(max)] {
            let picked = select(&tokens, limit, budget);
            assert!(!picked.is_empty(), "round {round}: nothing picked");
            assert_eq!(
                picked[0], 0,
                "round {round}: the oldest input is always picked"
            );
            assert!(picked.is_sorted(), "round {round}: indices ascending");
            assert!(
                picked.windows(2).all(|w| w[0] < w[1]),
                "round {round}: no index twice"
            );
            assert!(
                picked.len() <= limit,
                "round {round}: {} > {limit} inputs",
                picked.len()
            );
            let spent = cost(&tokens, &picked, budget);
            if picked.len() > 1 {
                assert!(
                    spent <= max,
                    "round {round}: {budget:?} spent {spent} tokens on {} inputs",
                    picked.len()
                );
            } else {
                // Alone: either it fits, or it costs more than the whole budget by itself.
                assert_eq!(spent, u64::from(tokens[0]));
            }
        }
    }
}

#[test]
fn an_input_over_the_whole_budget_goes_alone_and_does_not_stall_the_rest() {
    let tokens = [900, 10, 10, 10];
    assert_eq!(select(&tokens, 32, padded(512)), [0]);
    assert_eq!(select(&tokens, 32, unpadded(512)), [0]);
    // Behind it, the rest forms a batch as usual.
    assert_eq!(select(&tokens[1..], 32, padded(512)), [0, 1, 2]);
}

#[test]
fn equal_lengths_give_the_oldest_inputs_in_arrival_order_as_count_batching_does() {
    let tokens = [1; 100];
    let expected: Vec<usize> = (0..32).collect();
    assert_eq!(select(&tokens, 32, padded(16_384)), expected);
    assert_eq!(select(&tokens, 32, unpadded(16_384)), expected);
}

#[test]
fn a_padded_batch_groups_inputs_of_similar_length_around_the_oldest() {
    // A paragraph first, then short queries, then another paragraph.
    let mut tokens = vec![200];
    tokens.extend([12, 14, 11, 13, 12, 15]);
    tokens.push(190);
    tokens.extend([12, 13]);
    assert_eq!(
        select(&tokens, 32, padded(16_384)),
        [0, 7],
        "the paragraphs"
    );
    let shorts: Vec<u32> = tokens[1..7].to_vec();
    assert_eq!(
        select(&shorts, 32, padded(16_384)),
        [0, 1, 2, 3, 4, 5],
        "short queries within the slack join"
    );
    // Unpadded: lengths cost nothing extra; everything fits.
    assert_eq!(select(&tokens, 32, unpadded(16_384)).len(), tokens.len());
}

#[test]
fn a_padded_batch_stays_within_the_slack_or_the_fill_ratio() {
    // A short head and one long neighbour: 4 + 100 tokens padded to 200 (fill 0.52).
    assert_eq!(select(&[4, 100], 32, padded(16_384)), [0]);
    // Small batches at low load join within the slack: [5, 9, 14] pads 42 tokens for 28.
    assert_eq!(select(&[5, 9, 14], 32, padded(16_384)), [0, 1, 2]);
}

#[test]
fn counting_inputs_ignores_lengths_and_the_budget() {
    let inputs = TokenBudget {
        max_batch_tokens: 1,
        cost: BatchCost::Inputs,
    };
    assert_eq!(select(&[200, 5, 300, 7], 3, inputs), [0, 1, 2]);
    assert!(!BatchCost::Inputs.orders_calls());
    assert!(!BatchCost::Unpadded.orders_calls());
    assert!(BatchCost::Padded.orders_calls());
}

#[test]
fn the_unpadded_model_fills_the_budget_in_arrival_order() {
    assert_eq!(select(&[10, 300, 20, 30], 32, unpadded(64)), [0, 2, 3]);
    assert_eq!(select(&[10, 20, 30], 2, unpadded(1_000)), [0, 1]);
}

#[test]
fn a_call_is_ordered_shortest_first_ties_in_batch_order() {
    assert_eq!(order_by_length(&[1, 2, 2, 5]), None, "already in order");
    assert_eq!(order_by_length(&[30, 4, 30, 4]), Some(vec![1, 3, 0, 2]));
}

#[test]
fn estimates_count_bytes_for_text_and_ids_exactly() {
    let inputs = [
        Input::from("abcd"),
        Input::from("abcde"),
        Input::Ids(vec![101, 7592, 102]),
    ];
    assert_eq!(estimate_lengths(&inputs), [3, 4, 3]);
}
