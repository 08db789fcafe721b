//! De-duplication inside one upstream call: each distinct input of a batch is sent once and its
//! embedding is handed to every position that holds it.
//!
//! Requests with equal options share a batch (see `queue`), so two equal inputs of one call
//! embed to the same vector: sending both is upstream work done twice. The worker's
//! single-flight (in its cache) keeps most duplicates out of the batcher; these are the ones
//! left (the cache bypassed per request, a resent copy retried alone, inputs repeated inside
//! a bisected half). Equal inputs of different cache scopes (tenants, see [`crate::Share`]) are
//! not folded: sharing work is sharing an answer, and it stays within a scope.

use std::collections::HashMap;

use embatch_protocol::Input;

/// An input by reference, hashable (the protocol's [`Input`] is not `Hash`).
#[derive(PartialEq, Eq, Hash)]
enum InputRef<'a> {
    Text(&'a str),
    Ids(&'a [u32]),
    Pair(&'a str, &'a str),
}

impl<'a> From<&'a Input> for InputRef<'a> {
    fn from(input: &'a Input) -> Self {
        match input {
            Input::Text(text) => InputRef::Text(text),
            Input::Ids(ids) => InputRef::Ids(ids),
            Input::Pair(query, text) => InputRef::Pair(query, text),
        }
    }
}

/// The distinct inputs of a batch and where each position's embedding comes from.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Unique {
    /// Position in the batch of the first occurrence of each distinct input, in batch order.
    pub firsts: Vec<usize>,
    /// For each position of the batch, the index in `firsts` of its input.
    pub source: Vec<usize>,
}

impl Unique {
    /// The distinct inputs of `batch`, each position of which is in the cache scope
    /// `scopes[position]` (`None`: all in one); `None` when every input is distinct (nothing to
    /// fold).
    pub fn of(batch: &[Input], scopes: Option<&[u32]>) -> Option<Unique> {
        let mut seen: HashMap<(u32, InputRef<'_>), usize> = HashMap::with_capacity(batch.len());
        let mut firsts = Vec::with_capacity(batch.len());
        let mut source = Vec::with_capacity(batch.len());
        for (at, input) in batch.iter().enumerate() {
            let next = firsts.len();
            let scope = scopes.and_then(|s| s.get(at)).copied().unwrap_or(0);
            let index = *seen.entry((scope, InputRef::from(input))).or_insert(next);
            if index == next {
                firsts.push(at);
            }
            source.push(index);
        }
        (firsts.len() < batch.len()).then_some(Unique { firsts, source })
    }

    /// Inputs folded into an earlier equal one.
    pub fn folded(&self) -> usize {
        self.source.len() - self.firsts.len()
    }

    /// Picks the values of the distinct inputs (`values[i]` for `firsts[i]`) from a per-position
    /// slice, e.g. the batch's inputs or their token counts.
    pub fn pick<T: Clone>(&self, per_position: &[T]) -> Vec<T> {
        self.firsts
            .iter()
            .filter_map(|&at| per_position.get(at).cloned())
            .collect()
    }

    /// Fans the results of the distinct inputs (one per entry of `firsts`, in order) back out to
    /// every position of the batch.
    pub fn fan_out<T: Clone>(&self, distinct: &[T]) -> Vec<T> {
        self.source
            .iter()
            .filter_map(|&i| distinct.get(i).cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Input {
        Input::Text(s.into())
    }

    #[test]
    fn folds_equal_inputs_and_fans_their_results_out() {
        let batch = [
            text("a"),
            text("b"),
            text("a"),
            Input::Ids(vec![1, 2]),
            Input::Ids(vec![1, 2]),
            text("b"),
        ];
        let unique = Unique::of(&batch, None).expect("duplicates");
        assert_eq!(unique.firsts, [0, 1, 3]);
        assert_eq!(unique.source, [0, 1, 0, 2, 2, 1]);
        assert_eq!(unique.folded(), 3);
        assert_eq!(
            unique.pick(&batch),
            [text("a"), text("b"), Input::Ids(vec![1, 2])]
        );
        assert_eq!(
            unique.fan_out(&["A", "B", "I"]),
            ["A", "B", "A", "I", "I", "B"]
        );
    }

    #[test]
    fn distinct_inputs_need_no_folding() {
        // A text and the ids of the same characters are different inputs.
        assert_eq!(
            Unique::of(&[text("a"), text("A"), Input::Ids(vec![97])], None),
            None
        );
        assert_eq!(Unique::of(&[], None), None);
    }

    #[test]
    fn equal_inputs_of_different_scopes_are_both_sent() {
        let batch = [text("a"), text("a"), text("a")];
        let unique = Unique::of(&batch, Some(&[0, 1, 0])).expect("one fold");
        assert_eq!(unique.firsts, [0, 1]);
        assert_eq!(unique.source, [0, 1, 0]);
        assert_eq!(Unique::of(&batch[..2], Some(&[0, 1])), None);
    }
}
