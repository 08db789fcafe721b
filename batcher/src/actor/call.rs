//! The actor's upstream calls: launching a formed batch as a supervised task, and taking its
//! outcome (the answers, the call-time estimate, the upstream's health) when it ends.

use std::sync::Arc;

use embatch_protocol::EmbedError;
use tokio::task::JoinError;
use tokio::time::Instant;
use tracing::Instrument;

use super::answer::answer;
use super::{Actor, Running};
use crate::isolate::{self, CallOutcome, Done};
use crate::names;
use crate::queue::Formed;
use crate::shape;
use crate::{Backend, UpstreamError};

impl<U: Backend> Actor<U> {
    /// Starts `formed` as a batch task (one upstream call, bisected on a bad input), with its
    /// span and batch metrics.
    pub(super) fn launch(&mut self, formed: Formed, now: Instant) {
        let Formed {
            options,
            inputs,
            lengths,
            segments,
            probe,
            ..
        } = formed;
        let span = tracing::info_span!(
            "upstream_batch",
            inputs = inputs.len(),
            requests = segments.len(),
            probe
        );
        let traces = self.shared.traces;
        if (traces.enabled)() {
            // Tracing: the batch is a child of its oldest request (in that request's trace),
            // linked to every request it serves (docs/design/tracing.md).
            let oldest = segments.iter().find_map(|segment| {
                let request = self.requests.get(&segment.request)?;
                (!request.is_bulk()).then_some(&request.span)
            });
            if let Some(oldest) = oldest {
                (traces.set_parent)(&span, oldest);
            }
        }
        for segment in &segments {
            if let Some(request) = self.requests.get_mut(&segment.request) {
                if request.is_bulk() {
                    continue;
                }
                span.follows_from(&request.span);
                if request.first_call.is_none() {
                    request.first_call = Some(now);
                    (self.meters.queue_wait).record((now - request.accepted).as_secs_f64());
                    (traces.queue_waited)(&request.span, request.accepted, now);
                }
            }
        }
        let (tokens, padded) = shape::totals(&lengths);
        let size = (inputs.len(), tokens);
        let [b_inputs, b_requests, b_tokens, b_padded, b_ratio] = &self.meters.batch;
        b_inputs.record(inputs.len() as f64);
        b_requests.record(segments.len() as f64);
        b_tokens.record(tokens as f64);
        b_padded.record(padded as f64);
        if padded > 0 {
            b_ratio.record(tokens as f64 / padded as f64);
        }
        let requests = segments.iter().map(|s| s.request).collect();
        let upstream = Arc::clone(&self.upstream);
        // Only a padded upstream gets each call ordered by length; others get batch order.
        let order = if self.shared.limits.budget.cost.orders_calls() {
            lengths
        } else {
            Vec::new()
        };
        let task = async move {
            isolate::run_batch(&*upstream, &inputs, &order, &options, segments).await
        };
        let handle = self.batches.spawn(task.instrument(span));
        self.running.insert(
            handle.id(),
            Running {
                requests,
                probe,
                launched: now,
                inputs: size.0,
                tokens: size.1,
            },
        );
        self.ledger.in_flight = self.batches.len();
        self.ledger.last_launch = Some(now);
        self.ledger.probe_in_flight |= probe;
    }

    /// Frees the batch's slot (and its probe mark); returns what it carried.
    fn finish(&mut self, id: tokio::task::Id) -> Option<Running> {
        let running = self.running.remove(&id);
        self.ledger.in_flight = self.batches.len();
        if running.as_ref().is_some_and(|r| r.probe) {
            self.ledger.probe_in_flight = false;
        }
        running
    }

    /// Takes a batch task's outcome: call metrics, the upstream's health, the call-time
    /// estimate, and each request's slice (answered once all its slices are in).
    pub(super) fn complete(&mut self, id: tokio::task::Id, done: Done) {
        let running = self.finish(id);
        let probe = running.as_ref().is_some_and(|r| r.probe);
        for call in &done.calls {
            self.meters.upstream_time.record(call.elapsed.as_secs_f64());
            metrics::counter!(names::UPSTREAM_CALLS, "outcome" => call.outcome.label())
                .increment(1);
            if call.outcome == CallOutcome::Ok {
                self.shared
                    .answered_calls
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.shared
                    .failed_calls
                    .send_if_modified(|n| std::mem::take(n) != 0);
            } else if call.unhealthy {
                self.shared
                    .failed_calls
                    .send_modify(|n| *n = n.saturating_add(1));
            }
        }
        let now = Instant::now();
        if let Some(elapsed) = done.clean_call() {
            if let Some(running) = &running {
                self.ledger
                    .fastest
                    .record(elapsed, running.inputs, running.tokens, now);
            }
            self.ledger
                .record_call(elapsed, now, probe, crate::STALL_CALLS, crate::STALL_MIN);
        }
        for (segment, result) in done.results {
            let Some(request) = self.requests.get_mut(&segment.request) else {
                continue; // already answered (failed by another segment) or cancelled
            };
            match result {
                Ok(vectors) => {
                    for (&index, vector) in segment.indices.iter().zip(vectors) {
                        if let Some(slot) = request.results.get_mut(index) {
                            *slot = Some(vector);
                        }
                    }
                    request.received += segment.len;
                    if request.received == request.results.len()
                        && let Some(request) = self.take(segment.request)
                    {
                        answer(&self.meters, request, Ok(now));
                    }
                }
                Err(err) => self.fail(segment.request, err),
            }
        }
    }

    /// A batch task panicked (or was cancelled): its requests fail with 424, its slot is free.
    pub(super) fn crashed(&mut self, err: JoinError) {
        let running = self.finish(err.id());
        let reason = if err.is_panic() {
            let panic = err.into_panic();
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            format!("the batch task panicked: {message}")
        } else {
            "the batch task was cancelled".into()
        };
        metrics::counter!(names::BATCHES_CRASHED).increment(1);
        let Some(running) = running else {
            tracing::error!(%reason, "a batch task the batcher does not know crashed");
            return;
        };
        tracing::error!(%reason, requests = running.requests.len(), "upstream call crashed");
        let error = EmbedError::from(UpstreamError::Crashed(reason));
        for id in running.requests {
            self.fail(id, error.clone());
        }
    }
}
