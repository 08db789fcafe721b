//! One batch's upstream work: the call, and the bisection of a batch that failed because of an
//! input, so that its batch-mates still get their embeddings.
//!
//! Two kinds of failure are bisected by request:
//! - a rejection that blames an input ([`UpstreamError::blames_input`]: TEI's 400/413/422,
//!   answered by its validation before any inference): always, until the offending requests are
//!   isolated (each costs at most about 2 × log2(requests) calls, and rejections cost TEI
//!   nothing);
//! - a failure that may be an input's ([`suspects_input`]: TEI's 424 `Backend`, the model failed
//!   on the batch it ran), which may as well be the upstream failing for every input. The whole
//!   batch's failure is split once; a half that fails again is split further only once another
//!   call of the batch has succeeded (the upstream serves other inputs, so the failure is an
//!   input's), and at most [`suspect_splits`] times per batch (enough to isolate two failing
//!   requests). An upstream failing for everyone thus gets at most 3 calls per batch (the batch
//!   and its two halves), never a bisection of every request; two failing requests that land in
//!   different halves of the first split fail the batch, as before.
//!
//! Given the inputs' lengths (a padded upstream), each call sends its inputs ordered by length
//! ([`shape::order_by_length`]), so that an upstream grouping a call's inputs in arrival order
//! pads little; the replies are put back in batch order before they are split by request.
//!
//! No metrics here: every call is reported in [`Done::calls`] and the actor records them.

use std::ops::Range;
use std::time::Duration;

use embatch_protocol::{EmbedError, EmbedOptions, Input};
use tokio::time::Instant;

use super::queue::Segment;
use super::shape;
use super::unique::Unique;
use crate::{Backend, Embedding, UpstreamError};

/// How one upstream call ended (the `outcome` label of `embatch_worker_upstream_calls_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CallOutcome {
    /// Embeddings for every input.
    Ok,
    /// An input is at fault (400/413/422).
    Rejected,
    /// The upstream failed (unreachable, 5xx, timeout, malformed reply).
    Failed,
}

impl CallOutcome {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            CallOutcome::Ok => "ok",
            CallOutcome::Rejected => "rejected",
            CallOutcome::Failed => "failed",
        }
    }
}

/// One upstream call of a batch.
#[derive(Debug, Clone, Copy)]
pub(super) struct Call {
    /// Duration of the call.
    pub elapsed: Duration,
    /// How it ended.
    pub outcome: CallOutcome,
    /// Whether it failed in a way that says the upstream is unhealthy (refused, 5xx, timeout,
    /// malformed reply; see [`UpstreamError::is_unhealthy`]), for queue-group membership.
    pub unhealthy: bool,
}

/// What a batch task hands back to the actor.
pub(super) struct Done {
    /// Each segment's embeddings, or the error that ends its request.
    pub results: Vec<(Segment, Result<Vec<Embedding>, EmbedError>)>,
    /// Every call made, in order; the first carried the whole batch.
    pub calls: Vec<Call>,
}

impl Done {
    /// Duration of the first (whole-batch) call when it succeeded: the estimate's sample.
    pub fn clean_call(&self) -> Option<Duration> {
        self.calls
            .first()
            .filter(|c| c.outcome == CallOutcome::Ok)
            .map(|c| c.elapsed)
    }
}

/// Whether `err` may be caused by one input of the call although it does not say so: TEI's 424
/// `Backend` (its model failed on the batch it ran), or the built-in model's equivalent. Such a
/// failure is bisected within bounds (see the module docs); a timeout, a 5xx or an unreachable
/// upstream is not.
pub(super) fn suspects_input(err: &UpstreamError) -> bool {
    match err {
        UpstreamError::Status { status, .. } | UpstreamError::Http { status, .. } => *status == 424,
        UpstreamError::Model(err) => err.status() == 424,
        _ => false,
    }
}

/// The most splits of suspect failures ([`suspects_input`]) in one batch of `requests`
/// requests: 2 × ⌈log2(requests)⌉, enough to isolate two failing requests (each split costs two
/// calls).
pub(super) fn suspect_splits(requests: usize) -> usize {
    2 * requests.next_power_of_two().trailing_zeros() as usize
}

/// Pushes the two halves of `range` on the `work` stack, the first half on top.
fn split(work: &mut Vec<Range<usize>>, range: Range<usize>) {
    let mid = range.start + range.len() / 2;
    work.push(mid..range.end);
    work.push(range.start..mid);
}

/// Sends `inputs` upstream once; when the call fails because of an input of a batch of several
/// requests, bisects by request and retries each half until the offending requests are
/// isolated: without bound for a rejection that blames an input (at most about
/// 2 × log2(requests) extra calls per offending request), within bounds for a suspect failure
/// (see the module docs).
///
/// `lengths` holds the token count of each input of `inputs` (the order of each call).
pub(super) async fn run_batch<U: Backend>(
    upstream: &U,
    inputs: &[Input],
    lengths: &[u32],
    options: &EmbedOptions,
    segments: Vec<Segment>,
) -> Done {
    let mut results: Vec<Option<Result<Vec<Embedding>, EmbedError>>> =
        segments.iter().map(|_| None).collect();
    let mut calls = Vec::with_capacity(1);
    // Segment ranges still to send, as a stack: the whole batch first, then halves.
    let mut work: Vec<Range<usize>> = Vec::with_capacity(8);
    work.push(0..segments.len());
    // Ranges of several requests that failed with a suspect error, waiting for a call of this
    // batch to succeed (then they are split) or for the work to end (then they fail).
    let mut suspects: Vec<Suspect> = Vec::new();
    let mut splits_left = suspect_splits(segments.len());
    let mut served = false;
    loop {
        while let Some(range) = work.pop() {
            let Some((call, suspect)) = call_range(
                upstream,
                (inputs, lengths),
                options,
                &segments,
                range,
                &mut results,
                &mut work,
            )
            .await
            else {
                continue;
            };
            served |= call.outcome == CallOutcome::Ok;
            if let Some((range, err)) = suspect {
                if calls.is_empty() && splits_left > 0 {
                    // The whole batch failed: split once to learn whether an input is at fault.
                    splits_left -= 1;
                    split(&mut work, range);
                } else {
                    suspects.push((range, err));
                }
            }
            calls.push(call);
        }
        if !served {
            break;
        }
        // Another call of this batch succeeded: the upstream serves other inputs, so a suspect
        // failure is an input's. Split the suspects, within the budget.
        for (range, err) in std::mem::take(&mut suspects) {
            if splits_left > 0 {
                splits_left -= 1;
                split(&mut work, range);
            } else {
                suspects.push((range, err));
            }
        }
        if work.is_empty() {
            break;
        }
    }
    for (range, err) in suspects {
        tracing::debug!(%err, requests = range.len(), "upstream failed a part of a batch; not isolating further");
        fill(&mut results[range], &err);
    }
    let results = segments
        .into_iter()
        .zip(results)
        .map(|(segment, result)| {
            let result = result.unwrap_or_else(|| {
                Err(EmbedError::Backend(
                    "no upstream result for this request".into(),
                ))
            });
            (segment, result)
        })
        .collect();
    Done { results, calls }
}

/// A suspect failure ([`suspects_input`]) of a call of several requests: their range and the
/// error, not yet answered.
type Suspect = (Range<usize>, EmbedError);

/// One upstream call of the requests `range` of `segments`: stores their embeddings or error in
/// `results`, pushes the halves of a rejection that blames an input of several requests on
/// `work`, and hands back a suspect failure of several requests (unanswered). `None` when the
/// range holds no inputs (no call made).
async fn call_range<U: Backend>(
    upstream: &U,
    (inputs, lengths): (&[Input], &[u32]),
    options: &EmbedOptions,
    segments: &[Segment],
    range: Range<usize>,
    results: &mut [Option<Result<Vec<Embedding>, EmbedError>>],
    work: &mut Vec<Range<usize>>,
) -> Option<(Call, Option<Suspect>)> {
    let (head, tail) = (
        segments.get(range.start)?,
        segments.get(range.end.checked_sub(1)?)?,
    );
    let span = head.at..tail.at + tail.len;
    let batch = inputs.get(span.clone())?;
    let scopes = scopes_of(&segments[range.clone()], batch.len());
    let started = Instant::now();
    let outcome = embed_by_length(
        upstream,
        (batch, scopes.as_deref()),
        lengths.get(span.clone()),
        options,
    )
    .await;
    let mut call = Call {
        elapsed: started.elapsed(),
        outcome: CallOutcome::Ok,
        unhealthy: false,
    };
    let mut suspect = None;
    match outcome {
        Ok(mut vectors) if vectors.len() == batch.len() => {
            // Split from the back so each segment takes its own tail of the reply.
            for index in range.rev() {
                let own = vectors.split_off(segments[index].at - span.start);
                results[index] = Some(Ok(own));
            }
        }
        Ok(vectors) => {
            call.outcome = CallOutcome::Failed;
            call.unhealthy = true;
            let err = EmbedError::from(UpstreamError::CountMismatch {
                sent: batch.len(),
                got: vectors.len(),
            });
            fill(&mut results[range], &err);
        }
        Err(err) if err.blames_input() && range.len() > 1 => {
            call.outcome = CallOutcome::Rejected;
            tracing::debug!(%err, requests = range.len(), "upstream rejected a mixed batch; isolating");
            split(work, range);
        }
        Err(err) if suspects_input(&err) && range.len() > 1 => {
            call.outcome = CallOutcome::Failed;
            call.unhealthy = err.is_unhealthy();
            tracing::debug!(%err, requests = range.len(), "upstream failed a mixed batch; an input may be at fault");
            suspect = Some((range, EmbedError::from(err)));
        }
        Err(err) => {
            call.outcome = if err.blames_input() {
                CallOutcome::Rejected
            } else {
                CallOutcome::Failed
            };
            call.unhealthy = err.is_unhealthy();
            tracing::debug!(%err, requests = range.len(), "upstream call failed");
            fill(&mut results[range], &EmbedError::from(err));
        }
    }
    Some((call, suspect))
}

/// The cache scope of each input of the batch `segments` cover (`inputs` of them), as small
/// numbers, so that equal inputs are folded only within one scope; `None` when every segment
/// has the same scope (the usual case: nothing to tell apart).
fn scopes_of(segments: &[Segment], inputs: usize) -> Option<Vec<u32>> {
    let first = &segments.first()?.scope;
    if segments.iter().all(|s| s.scope == *first) {
        return None;
    }
    let mut seen: Vec<&str> = Vec::new();
    let mut scopes = Vec::with_capacity(inputs);
    for segment in segments {
        let index = seen
            .iter()
            .position(|s| **s == *segment.scope)
            .unwrap_or_else(|| {
                seen.push(&segment.scope);
                seen.len() - 1
            });
        let index = u32::try_from(index).unwrap_or(u32::MAX);
        scopes.extend(std::iter::repeat_n(index, segment.len));
    }
    Some(scopes)
}

/// Embeds `batch`, each distinct input once ([`Unique`]: an input repeated in the batch is sent
/// once and its embedding handed to every position holding it), in length order
/// ([`embed_in_order`]); returns one embedding per input of `batch`, in its order.
async fn embed_by_length<U: Backend>(
    upstream: &U,
    (batch, scopes): (&[Input], Option<&[u32]>),
    lengths: Option<&[u32]>,
    options: &EmbedOptions,
) -> Result<Vec<Embedding>, UpstreamError> {
    let Some(unique) = Unique::of(batch, scopes) else {
        return embed_in_order(upstream, batch, lengths, options).await;
    };
    metrics::counter!(crate::names::DEDUP_INPUTS, "where" => "batch")
        .increment(unique.folded() as u64);
    let distinct = unique.pick(batch);
    let distinct_lengths = lengths
        .filter(|l| l.len() == batch.len())
        .map(|l| unique.pick(l));
    let vectors = embed_in_order(upstream, &distinct, distinct_lengths.as_deref(), options).await?;
    if vectors.len() != distinct.len() {
        return Err(UpstreamError::CountMismatch {
            sent: distinct.len(),
            got: vectors.len(),
        });
    }
    Ok(unique.fan_out(&vectors))
}

/// Embeds `batch` with its inputs sent in length order ([`shape::order_by_length`]); returns the
/// embeddings in `batch`'s order. Sends `batch` as it is when its lengths are unknown (`None`, or
/// not one per input) or already in order.
async fn embed_in_order<U: Backend>(
    upstream: &U,
    batch: &[Input],
    lengths: Option<&[u32]>,
    options: &EmbedOptions,
) -> Result<Vec<Embedding>, UpstreamError> {
    let order = lengths
        .filter(|l| l.len() == batch.len())
        .and_then(shape::order_by_length);
    let Some(order) = order else {
        return upstream.embed(batch, options).await;
    };
    let sorted: Vec<Input> = order.iter().map(|&i| batch[i].clone()).collect();
    let vectors = upstream.embed(&sorted, options).await?;
    if vectors.len() != order.len() {
        return Ok(vectors); // the caller reports the count mismatch
    }
    let mut back: Vec<Option<Embedding>> = (0..order.len()).map(|_| None).collect();
    for (&i, vector) in order.iter().zip(vectors) {
        back[i] = Some(vector);
    }
    Ok(back.into_iter().flatten().collect())
}

fn fill(slots: &mut [Option<Result<Vec<Embedding>, EmbedError>>], err: &EmbedError) {
    for slot in slots {
        *slot = Some(Err(err.clone()));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use embatch_protocol::ErrorResponse;
    use embatch_tei_double::{Config, Faults, POISON, TeiDouble};

    use super::*;

    /// A TEI client as small as these tests need: `POST /embed` with the batch's inputs; on an
    /// error status, TEI's error body ([`UpstreamError::Status`]) or, without one,
    /// [`UpstreamError::Http`], as the worker's TEI client reads them.
    struct TeiClient {
        client: reqwest::Client,
        url: String,
    }

    impl Backend for TeiClient {
        async fn embed(
            &self,
            inputs: &[Input],
            _options: &EmbedOptions,
        ) -> Result<Vec<Embedding>, UpstreamError> {
            let unreachable = |e: reqwest::Error| UpstreamError::Unreachable(e.to_string());
            let request = serde_json::json!({ "inputs": inputs });
            let response = self
                .client
                .post(&self.url)
                .json(&request)
                .send()
                .await
                .map_err(unreachable)?;
            let status = response.status().as_u16();
            let body = response.bytes().await.map_err(unreachable)?;
            if status != 200 {
                return Err(match serde_json::from_slice::<ErrorResponse>(&body) {
                    Ok(response) => UpstreamError::Status { status, response },
                    Err(_) => UpstreamError::Http {
                        status,
                        body: String::from_utf8_lossy(&body).into_owned(),
                    },
                });
            }
            Ok(Embedding::split_reply(&body)?)
        }

        fn max_batch_size(&self) -> usize {
            512
        }
    }

    /// The TEI double and a TEI client on it.
    async fn tei() -> (TeiDouble, TeiClient) {
        let tei = TeiDouble::spawn(Config::instant())
            .await
            .expect("bind the TEI double");
        let client = TeiClient {
            client: reqwest::Client::new(),
            url: tei.embed_url(),
        };
        (tei, client)
    }

    /// The vector the double answers for `text` with default options.
    fn double_vector(text: &str) -> Vec<f32> {
        embatch_tei_double::embedding(text, Config::instant().dim, None, true)
    }

    /// One single-input request per text, as the queue forms them.
    fn batch(texts: &[String]) -> (Vec<Input>, Vec<Segment>) {
        let inputs = texts.iter().map(|t| Input::from(t.as_str())).collect();
        let segments = (0..texts.len())
            .map(|i| Segment {
                request: i as u64,
                indices: vec![0],
                at: i,
                len: 1,
                scope: "default".into(),
            })
            .collect();
        (inputs, segments)
    }

    /// 21 texts, the one at `poisoned` carrying the poison marker.
    fn texts(poisoned: Option<usize>) -> Vec<String> {
        (0..21)
            .map(|i| match poisoned {
                Some(p) if p == i => format!("bad {POISON}"),
                _ => format!("good {i}"),
            })
            .collect()
    }

    /// How many calls carried each input.
    fn sends(tei: &TeiDouble) -> HashMap<String, usize> {
        let mut sends = HashMap::new();
        for call in tei.calls() {
            for input in call.inputs {
                let text = input.as_text().unwrap_or_default().to_owned();
                *sends.entry(text).or_default() += 1;
            }
        }
        sends
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn equal_inputs_of_a_batch_are_sent_once_and_each_request_gets_its_copy() {
        let (tei, upstream) = tei().await;
        let texts: Vec<String> = ["a", "b", "a", "c", "a", "b"]
            .iter()
            .map(|t| (*t).to_owned())
            .collect();
        let (inputs, segments) = batch(&texts);
        let lengths = vec![3, 1, 3, 2, 3, 1];
        let done = run_batch(
            &upstream,
            &inputs,
            &lengths,
            &EmbedOptions::default(),
            segments,
        )
        .await;
        assert_eq!(
            sends(&tei),
            HashMap::from([("a".into(), 1), ("b".into(), 1), ("c".into(), 1)])
        );
        assert_eq!(tei.calls().len(), 1);
        for (segment, result) in done.results {
            let vectors = result.expect("served");
            let text = &texts[segment.request as usize];
            let expected = serde_json::to_vec(&double_vector(text)).expect("json");
            let got: Vec<f32> = serde_json::from_slice(vectors[0].json()).expect("a vector");
            let want: Vec<f32> = serde_json::from_slice(&expected).expect("a vector");
            assert_eq!(
                got, want,
                "request {} got the vector of its own input",
                segment.request
            );
        }

        // A poisoned input repeated in the batch: the requests holding it fail, the others are
        // served, and every call sends each distinct input once.
        tei.calls.clear();
        tei.set_faults(Faults::poisoned_with(422));
        let bad = format!("bad {POISON}");
        let texts: Vec<String> = vec!["x".into(), bad.clone(), "y".into(), bad.clone(), "x".into()];
        let (inputs, segments) = batch(&texts);
        let done = run_batch(&upstream, &inputs, &[], &EmbedOptions::default(), segments).await;
        for (segment, result) in &done.results {
            let poisoned = texts[segment.request as usize] == bad;
            assert_eq!(result.is_err(), poisoned, "request {}", segment.request);
        }
        for call in tei.calls() {
            let distinct: std::collections::HashSet<_> =
                call.inputs.iter().map(|i| format!("{i:?}")).collect();
            assert_eq!(
                distinct.len(),
                call.inputs.len(),
                "a call repeated an input: {:?}",
                call.inputs
            );
        }
    }

    #[test]
    fn the_split_budget_isolates_two_requests() {
        assert_eq!(suspect_splits(1), 0);
        assert_eq!(suspect_splits(2), 2);
        assert_eq!(suspect_splits(20), 10);
        assert_eq!(suspect_splits(32), 10);
        assert_eq!(suspect_splits(33), 12);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_input_the_model_fails_on_is_isolated_and_its_batch_mates_are_served() {
        let (tei, upstream) = tei().await;
        tei.set_faults(Faults::poisoned_with(424));
        for poisoned in [0, 7, 20] {
            tei.calls.clear();
            let texts = texts(Some(poisoned));
            let (inputs, segments) = batch(&texts);
            let done = run_batch(&upstream, &inputs, &[], &EmbedOptions::default(), segments).await;
            for (segment, result) in &done.results {
                let i = segment.request as usize;
                match result {
                    Ok(vectors) => {
                        assert_ne!(i, poisoned, "the poisoned request succeeded");
                        assert_eq!(vectors.len(), 1);
                    }
                    Err(err) => {
                        assert_eq!(i, poisoned, "a good request failed: {err}");
                        assert_eq!(err.status(), 424, "{err}");
                        assert_eq!(
                            err.error_type(),
                            embatch_protocol::ErrorType::Backend,
                            "TEI's error passed through"
                        );
                    }
                }
            }
            let calls = tei.calls();
            // 1 + 2 per level: ⌈log2 21⌉ = 5 levels at most.
            assert!(
                calls.len() <= 1 + 2 * 5,
                "poison at {poisoned}: {} calls",
                calls.len()
            );
            assert_eq!(calls.len(), done.calls.len(), "every call reported");
            assert!(
                calls.iter().all(|c| (c.status == 424)
                    == c.inputs
                        .iter()
                        .any(|i| i.as_text().is_some_and(|t| t.contains(POISON)))),
                "exactly the calls with the poisoned input failed"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_upstream_failing_for_everyone_gets_the_batch_and_its_two_halves_only() {
        let (tei, upstream) = tei().await;
        tei.set_faults(Faults::failing_with(424));
        let texts = texts(None);
        let (inputs, segments) = batch(&texts);
        let done = run_batch(&upstream, &inputs, &[], &EmbedOptions::default(), segments).await;
        assert!(
            done.results
                .iter()
                .all(|(_, r)| r.as_ref().is_err_and(|e| e.status() == 424)),
            "every request gets the upstream's 424"
        );
        assert_eq!(tei.calls.batch_sizes(), [21, 10, 11], "one split, no more");
        assert!(
            sends(&tei).values().all(|&n| n == 2),
            "each input sent twice"
        );

        // A 5xx says nothing about an input: no split at all.
        tei.calls.clear();
        tei.set_faults(Faults::failing_with(500));
        let (inputs, segments) = batch(&texts);
        let done = run_batch(&upstream, &inputs, &[], &EmbedOptions::default(), segments).await;
        assert!(done.results.iter().all(|(_, r)| r.is_err()));
        assert_eq!(tei.calls.batch_sizes(), [21]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_failing_requests_in_one_half_are_both_isolated_within_the_budget() {
        let (tei, upstream) = tei().await;
        tei.set_faults(Faults::poisoned_with(424));
        let mut texts = texts(Some(2));
        texts[8] = format!("also bad {POISON}");
        let (inputs, segments) = batch(&texts);
        let done = run_batch(&upstream, &inputs, &[], &EmbedOptions::default(), segments).await;
        let failed: Vec<u64> = done
            .results
            .iter()
            .filter(|(_, r)| r.is_err())
            .map(|(s, _)| s.request)
            .collect();
        assert_eq!(failed, [2, 8], "only the two failing requests fail");
        assert!(
            tei.calls().len() <= 1 + 2 * suspect_splits(21),
            "{} calls",
            tei.calls().len()
        );
    }
}
