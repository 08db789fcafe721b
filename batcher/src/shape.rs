//! Token budgets and batch shapes: what a batch costs the upstream, which waiting inputs share
//! a batch, and the order of the inputs inside one upstream call.
//!
//! Plain functions over token counts (no queue, no clock).
//!
//! # Cost model
//! Mirrors TEI's router: a batch's cost is `longest × inputs` on a padded backend (every input is
//! padded to the longest of its batch: TEI's candle backend on CPU, BERT-family models without
//! flash attention, the built-in model) and the sum of its tokens on an unpadded one (TEI's
//! flash-attention backends pack inputs without padding). A batch's cost never exceeds
//! `MAX_BATCH_TOKENS`, except for a single input that alone costs more: it leaves alone, in its
//! own batch, and never stalls the queue (TEI 1.8 loops forever on such an input).
//!
//! # Shape
//! [`select`] picks a batch among the waiting inputs of one group (the candidates, in arrival
//! order, the oldest first). The oldest candidate is always in the batch. On a padded backend the
//! batch grows around it by length, one neighbour at a time in length order (the shorter or the
//! longer neighbour, whichever wastes fewer padded tokens), while the batch fits the budget and
//! `MAX_BATCH_SIZE` and the neighbour wastes at most [`JOIN_SLACK_TOKENS`] padded tokens or
//! keeps the batch's padding ratio (tokens / padded tokens) at [`MIN_FILL`] or above while being
//! itself at least [`MIN_FILL`] of the batch's longest input. Inputs of
//! equal length join in arrival order, so with equal counts (no tokenizer: every input counts
//! the same) a batch is exactly the first `MAX_BATCH_SIZE` waiting inputs, as count batching
//! sends. On an unpadded backend lengths do not change the cost: inputs join in arrival order
//! while they fit the budget.

use std::fmt;

use embatch_protocol::Input;

/// `MAX_BATCH_TOKENS` when the upstream says nothing of its own: TEI's default
/// `--max-batch-tokens`.
pub const TEI_DEFAULT_MAX_BATCH_TOKENS: usize = 16_384;

/// `MAX_BATCH_TOKENS` of the built-in model: the default `MAX_BATCH_SIZE` (32) × its
/// all-MiniLM-L6-v2 input limit (256 tokens), so the budget never cuts a batch of the default
/// size of inputs the model accepts, and caps a call at what 32 of its longest inputs cost.
pub const BUILTIN_MAX_BATCH_TOKENS: usize = 8_192;

/// A neighbour joins a padded batch when it wastes at most this many padded tokens, whatever the
/// batch's padding ratio: a few padded tokens cost less than another upstream call, so small
/// batches at low load are not split.
pub const JOIN_SLACK_TOKENS: u64 = 32;

/// A neighbour that wastes more than [`JOIN_SLACK_TOKENS`] joins a padded batch only if the
/// batch's padding ratio (tokens / padded tokens) stays at least this, and the neighbour itself
/// is at least this share of the batch's longest input (a short query never pads to a
/// paragraph's length only because the paragraphs around it are well filled).
pub const MIN_FILL: f64 = 0.8;

/// The candidates [`select`] looks at, in batches: the first `WINDOW_BATCHES × MAX_BATCH_SIZE`
/// waiting inputs of a group (at most [`MAX_WINDOW`]). An input further back waits for its turn
/// in arrival order.
pub const WINDOW_BATCHES: usize = 4;

/// The most candidates [`select`] looks at.
pub const MAX_WINDOW: usize = 4096;

/// How the upstream's work on a batch grows with its inputs' lengths (`BATCH_COST`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BatchCost {
    /// `longest × inputs`: every input is padded to the longest of its batch (TEI's candle CPU
    /// backend, the built-in model).
    #[default]
    Padded,
    /// The sum of the inputs' tokens (TEI's flash-attention GPU backends).
    Unpadded,
    /// Lengths are ignored: a batch is the oldest `MAX_BATCH_SIZE` waiting inputs, sent in their
    /// order, with no token budget (batching by input counts only, as before token budgets).
    Inputs,
}

impl fmt::Display for BatchCost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BatchCost::Padded => "padded",
            BatchCost::Unpadded => "unpadded",
            BatchCost::Inputs => "inputs",
        })
    }
}

impl BatchCost {
    /// The cost, in tokens, of a batch of `inputs` inputs whose longest has `longest` tokens and
    /// which hold `sum` tokens in all (0 for [`BatchCost::Inputs`], which has no budget).
    pub fn of(self, inputs: usize, longest: u32, sum: u64) -> u64 {
        match self {
            BatchCost::Padded => inputs as u64 * u64::from(longest),
            BatchCost::Unpadded => sum,
            BatchCost::Inputs => 0,
        }
    }

    /// Whether the inputs of a call are sent ordered by length: on a padded upstream only (the
    /// order of an unpadded call costs nothing, and counting inputs keeps arrival order).
    pub fn orders_calls(self) -> bool {
        self == BatchCost::Padded
    }
}

/// The token side of a batch's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBudget {
    /// Most tokens one upstream call may cost (`MAX_BATCH_TOKENS`, by [`BatchCost`]).
    pub max_batch_tokens: u64,
    /// How a batch's cost is counted.
    pub cost: BatchCost,
}

impl Default for TokenBudget {
    /// TEI's default budget (16,384 tokens), padded.
    fn default() -> Self {
        TokenBudget {
            max_batch_tokens: TEI_DEFAULT_MAX_BATCH_TOKENS as u64,
            cost: BatchCost::Padded,
        }
    }
}

/// An estimate of each input's token count, special tokens included, until the worker's
/// tokenizer counts them: a text counts one token per 4 bytes (rounded up) plus 2 (`[CLS]` and
/// `[SEP]`); token ids count exactly. Only the batch's shape and budget use it; a caller with
/// real counts passes those to [`crate::BatcherHandle::submit`] instead.
pub fn estimate_lengths(inputs: &[Input]) -> Vec<u32> {
    inputs
        .iter()
        .map(|input| match input {
            Input::Text(text) => u32::try_from(text.len().div_ceil(4) + 2).unwrap_or(u32::MAX),
            Input::Ids(ids) => u32::try_from(ids.len()).unwrap_or(u32::MAX),
            // Both sequences and the pair template's 3 special tokens.
            Input::Pair(query, text) => {
                u32::try_from((query.len() + text.len()).div_ceil(4) + 3).unwrap_or(u32::MAX)
            }
        })
        .collect()
}

/// Picks the next batch among `tokens`, the token counts of the candidates in arrival order
/// (the oldest first), with at most `limit` inputs and a cost within `budget` (see the module
/// docs). Returns the indices picked, ascending; the first candidate is always picked, alone
/// when it alone costs more than the budget. Empty only when `tokens` is.
pub fn select(tokens: &[u32], limit: usize, budget: TokenBudget) -> Vec<usize> {
    let Some(&head) = tokens.first() else {
        return Vec::new();
    };
    let limit = limit.max(1);
    let max = budget.max_batch_tokens;
    match budget.cost {
        BatchCost::Inputs => (0..tokens.len().min(limit)).collect(),
        BatchCost::Unpadded => {
            let mut sum = u64::from(head);
            let mut picked = vec![0];
            for (i, &t) in tokens.iter().enumerate().skip(1) {
                if picked.len() >= limit {
                    break;
                }
                if sum + u64::from(t) <= max {
                    sum += u64::from(t);
                    picked.push(i);
                }
            }
            picked
        }
        BatchCost::Padded => {
            // Candidates by length, ties in arrival order: the head is the first of its length.
            let mut order: Vec<usize> = (0..tokens.len()).collect();
            order.sort_by_key(|&i| (tokens[i], i));
            let start = order.iter().position(|&i| i == 0).unwrap_or(0);
            let (mut lo, mut hi) = (start, start + 1);
            let mut longest = head;
            let mut sum = u64::from(head);
            let mut count = 1usize;
            while count < limit {
                // (waste, age, index in `order`, grows the batch to the right)
                let mut best: Option<(u64, usize, usize, bool)> = None;
                let mut consider = |at: usize, right: bool| {
                    let i = order[at];
                    let t = tokens[i];
                    let new_longest = longest.max(t);
                    let padded = (count as u64 + 1) * u64::from(new_longest);
                    let waste = padded - count as u64 * u64::from(longest) - u64::from(t);
                    let fill = (sum + u64::from(t)) as f64 / padded.max(1) as f64;
                    // Within the slack, or without lowering the batch's fill below MIN_FILL and
                    // without padding the neighbour itself by more than that.
                    let fits = padded <= max
                        && (waste <= JOIN_SLACK_TOKENS
                            || (fill >= MIN_FILL
                                && f64::from(t) >= MIN_FILL * f64::from(new_longest)));
                    if fits && best.is_none_or(|(w, age, _, _)| (waste, i) < (w, age)) {
                        best = Some((waste, i, at, right));
                    }
                };
                if lo > 0 {
                    consider(lo - 1, false);
                }
                if hi < order.len() {
                    consider(hi, true);
                }
                let Some((_, i, _, right)) = best else {
                    break;
                };
                if right {
                    hi += 1;
                } else {
                    lo -= 1;
                }
                longest = longest.max(tokens[i]);
                sum += u64::from(tokens[i]);
                count += 1;
            }
            let mut picked = order[lo..hi].to_vec();
            picked.sort_unstable();
            picked
        }
    }
}

/// The order in which to send a call's inputs to the upstream: by length, shortest first, ties in
/// batch order, so that a padded upstream that groups a call's inputs in arrival order (TEI's
/// candle CPU backend runs them 4 by 4) pads each group little. `None` when `lengths` is already
/// in that order (nothing to reorder).
pub fn order_by_length(lengths: &[u32]) -> Option<Vec<usize>> {
    if lengths.is_sorted() {
        return None;
    }
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| lengths[i]);
    Some(order)
}

/// Tokens and padded tokens (`longest × inputs`) of a batch of inputs of `lengths` tokens.
pub fn totals(lengths: &[u32]) -> (u64, u64) {
    let sum = lengths.iter().map(|&t| u64::from(t)).sum();
    let longest = lengths.iter().copied().max().unwrap_or(0);
    (sum, lengths.len() as u64 * u64::from(longest))
}

#[cfg(test)]
mod tests;
