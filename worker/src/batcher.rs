//! The batcher: an actor that turns many small requests into few full upstream calls.
//!
//! [`spawn`] starts one task that owns all queue state; callers talk to it through a cloneable
//! [`BatcherHandle`] and get their answer on a `oneshot` channel.
//!
//! # How a batch forms
//! Requests are grouped by their [`EmbedOptions`] (requests whose options differ never share an
//! upstream call). A group is sent upstream when it holds `max_batch_size` inputs, or when its
//! oldest request has waited `max_wait`, whichever comes first. At most `max_concurrent_batches`
//! calls are in flight; while all are busy, groups keep filling, so the next batch leaves full.
//! A request with more inputs than one call may carry (the smaller of `max_batch_size` and the
//! upstream's own limit) is split over several calls and reassembled in order.
//!
//! # Overload
//! - Queue bound: at most `queue_cap` inputs are accepted and not yet answered; beyond it a
//!   request is answered 429 at once ([`EmbedError::Overloaded`]).
//! - Admission by deadline: when the inputs queued ahead, at the upstream throughput measured so
//!   far, cannot be done before the request's deadline, it is answered 429 at once instead of
//!   expiring in the queue, so the upstream spends its time only on requests still wanted.
//! - A request whose deadline passed before its first input left the queue gets 504
//!   ([`EmbedError::DeadlineExceeded`]) and causes no upstream work.
//!
//! # Faults
//! When the upstream rejects a batch of several requests with a 4xx, the batch is bisected by
//! request and retried until the offending request(s) are isolated; the others still get their
//! embeddings. Upstream failures (refused, 5xx, timeout) fail only the requests of that call.
//!
//! # Shutdown
//! When every [`BatcherHandle`] is dropped, the actor stops waiting for `max_wait`, sends all it
//! holds upstream, answers every accepted request and exits.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use embatch_protocol::{EmbedError, EmbedOptions};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::telemetry::names;
use crate::upstream::{Embedding, Upstream, UpstreamError};

/// Batching and overload limits (see the module docs).
#[derive(Debug, Clone)]
pub struct BatcherConfig {
    /// Most inputs in one upstream call (inputs, not requests).
    pub max_batch_size: usize,
    /// Longest time the first request of a batch waits for more to join.
    pub max_wait: Duration,
    /// Most upstream calls in flight at once.
    pub max_concurrent_batches: usize,
    /// Most inputs accepted and not yet answered; more are shed with 429.
    pub queue_cap: usize,
}

/// A successful answer: TEI's response body for exactly the request's inputs, in order.
#[derive(Debug, Clone)]
pub struct Reply {
    /// `[[f32, ...], ...]` as JSON bytes, assembled from the upstream's raw JSON vectors.
    pub payload: Bytes,
    /// Time from acceptance to the first upstream call that carried this request.
    pub queue_time: Duration,
    /// Time from that first call to the last result (the upstream's share).
    pub inference_time: Duration,
}

/// What a caller receives: its reply or the error that ended it.
pub type Outcome = Result<Reply, EmbedError>;

/// A cloneable handle to submit requests to the batcher.
#[derive(Clone)]
pub struct BatcherHandle {
    tx: mpsc::UnboundedSender<Job>,
    queue: Arc<Semaphore>,
    shared: Arc<Shared>,
    config: Arc<BatcherConfig>,
}

/// State the handle (admission) and the actor (measurement) share.
#[derive(Default)]
struct Shared {
    /// Inputs accepted but not yet sent upstream.
    queued_inputs: std::sync::atomic::AtomicUsize,
    /// Upstream speed measured so far; `None` until the first batch completes.
    rate: Mutex<Option<Rate>>,
}

/// Exponentially weighted averages of completed upstream calls.
#[derive(Debug, Clone, Copy)]
struct Rate {
    /// Inputs per second of one call (inputs / call duration).
    inputs_per_sec: f64,
    /// Seconds one call takes.
    call_secs: f64,
}

/// Weight of the newest sample in the [`Rate`] averages.
const RATE_ALPHA: f64 = 0.2;

/// tokio's timer fires on whole-millisecond ticks, rounding a deadline up by as much as 1 ms. The
/// flush timer aims this much early so that a batch leaves no later than `max_wait` after its
/// first request (it may leave up to this much before).
const TIMER_SLACK: Duration = Duration::from_micros(999);

/// Admission by deadline admits a request only when the work ahead of it is expected to finish
/// within this share of its remaining budget. The rest absorbs the estimate's error (inputs of
/// different lengths, a CPU shared with other processes): admitting right up to the deadline
/// would let a large share of admitted requests miss it. The upstream stays just as busy, the
/// queue is only shorter.
const ADMISSION_HEADROOM: f64 = 0.75;

impl Shared {
    fn rate(&self) -> Option<Rate> {
        *self.rate.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record_call(&self, inputs: usize, elapsed: Duration) {
        let secs = elapsed.as_secs_f64().max(1e-6);
        let sample = Rate {
            inputs_per_sec: inputs as f64 / secs,
            call_secs: secs,
        };
        let mut rate = self.rate.lock().unwrap_or_else(|e| e.into_inner());
        *rate = Some(match *rate {
            None => sample,
            Some(old) => Rate {
                inputs_per_sec: old.inputs_per_sec
                    + RATE_ALPHA * (sample.inputs_per_sec - old.inputs_per_sec),
                call_secs: old.call_secs + RATE_ALPHA * (sample.call_secs - old.call_secs),
            },
        });
    }
}

struct Job {
    inputs: Vec<String>,
    options: EmbedOptions,
    deadline: Instant,
    accepted: Instant,
    reply: oneshot::Sender<Outcome>,
    permit: OwnedSemaphorePermit,
}

impl BatcherHandle {
    /// Submits one request: its inputs, options and absolute deadline.
    ///
    /// Returns the receiver of its [`Outcome`] once accepted.
    ///
    /// # Errors
    /// Answered at once, without queueing:
    /// - [`EmbedError::TooLarge`] (413) when the request alone holds more than `queue_cap` inputs;
    /// - [`EmbedError::DeadlineExceeded`] (504) when `deadline` has already passed;
    /// - [`EmbedError::Overloaded`] (429) when the queue is full, or when the work queued ahead
    ///   cannot finish before `deadline` at the measured upstream throughput;
    /// - [`EmbedError::Unavailable`] (503) when the batcher has stopped.
    pub fn submit(
        &self,
        inputs: Vec<String>,
        options: EmbedOptions,
        deadline: Instant,
    ) -> Result<oneshot::Receiver<Outcome>, EmbedError> {
        use std::sync::atomic::Ordering;
        let n = inputs.len();
        let now = Instant::now();
        if n > self.config.queue_cap {
            return Err(EmbedError::TooLarge(format!(
                "`inputs` must have at most {} elements (the worker's QUEUE_CAP). Given: {n}",
                self.config.queue_cap
            )));
        }
        if now >= deadline {
            metrics::counter!(names::SHED, "reason" => "expired").increment(1);
            return Err(EmbedError::DeadlineExceeded(
                "the request's deadline passed before it reached a worker".into(),
            ));
        }
        let permits = u32::try_from(n).unwrap_or(u32::MAX);
        let Ok(permit) = Arc::clone(&self.queue).try_acquire_many_owned(permits) else {
            metrics::counter!(names::SHED, "reason" => "queue_full").increment(1);
            return Err(EmbedError::Overloaded(format!(
                "the worker's queue is full (QUEUE_CAP = {} inputs)",
                self.config.queue_cap
            )));
        };
        let queued = self.shared.queued_inputs.load(Ordering::Relaxed);
        if let Some(rate) = self.shared.rate() {
            let throughput = rate.inputs_per_sec * self.config.max_concurrent_batches as f64;
            let expected = Duration::from_secs_f64(
                (queued + n) as f64 / throughput.max(1e-3) + rate.call_secs,
            );
            let budget = deadline - now;
            if expected > budget.mul_f64(ADMISSION_HEADROOM) {
                metrics::counter!(names::SHED, "reason" => "deadline").increment(1);
                return Err(EmbedError::Overloaded(format!(
                    "cannot finish before the deadline: {queued} inputs queued ahead at ~{throughput:.0} \
                     inputs/s need ~{} ms, the deadline is in {} ms",
                    expected.as_millis(),
                    budget.as_millis()
                )));
            }
        }
        let (tx, rx) = oneshot::channel();
        self.shared.queued_inputs.fetch_add(n, Ordering::Relaxed);
        let job = Job {
            inputs,
            options,
            deadline,
            accepted: now,
            reply: tx,
            permit,
        };
        if self.tx.send(job).is_err() {
            self.shared.queued_inputs.fetch_sub(n, Ordering::Relaxed);
            return Err(EmbedError::Unavailable(
                "the worker is shutting down".into(),
            ));
        }
        Ok(rx)
    }
}

/// Starts the batcher task for `upstream`.
///
/// The task ends after every [`BatcherHandle`] clone is dropped and every accepted request is
/// answered.
pub fn spawn<U: Upstream>(
    upstream: Arc<U>,
    config: BatcherConfig,
) -> (BatcherHandle, JoinHandle<()>) {
    let config = BatcherConfig {
        max_batch_size: config.max_batch_size.max(1),
        max_concurrent_batches: config.max_concurrent_batches.max(1),
        queue_cap: config.queue_cap.max(1),
        ..config
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared::default());
    let queue = Arc::new(Semaphore::new(config.queue_cap.min(Semaphore::MAX_PERMITS)));
    let batch_limit = config.max_batch_size.min(upstream.max_batch_size()).max(1);
    let config = Arc::new(config);
    let actor = Actor {
        upstream,
        config: Arc::clone(&config),
        batch_limit,
        shared: Arc::clone(&shared),
        rx,
        done_tx,
        done_rx,
        requests: HashMap::new(),
        groups: HashMap::new(),
        next_id: 0,
        in_flight: 0,
        closed: false,
    };
    let task = tokio::spawn(actor.run());
    (
        BatcherHandle {
            tx,
            queue,
            shared,
            config,
        },
        task,
    )
}

/// A request inside the actor.
struct Pending {
    /// Inputs not yet sent upstream.
    inputs: Vec<String>,
    /// Index (in the request) of `inputs[0]`.
    dispatched: usize,
    results: Vec<Option<Embedding>>,
    received: usize,
    options: EmbedOptions,
    deadline: Instant,
    accepted: Instant,
    first_call: Option<Instant>,
    reply: oneshot::Sender<Outcome>,
    /// Holds this request's share of `queue_cap` until it is answered.
    _permit: OwnedSemaphorePermit,
}

/// Requests sharing one set of options, oldest first.
#[derive(Default)]
struct Group {
    queue: VecDeque<u64>,
    /// Inputs of this group not yet sent upstream.
    inputs: usize,
}

/// A contiguous run of one request's inputs inside a batch.
#[derive(Debug, Clone)]
struct Segment {
    request: u64,
    /// Index in the request of the segment's first input.
    offset: usize,
    /// Position in the batch of the segment's first input.
    at: usize,
    len: usize,
}

struct Done {
    results: Vec<(Segment, Result<Vec<Embedding>, EmbedError>)>,
    inputs: usize,
    /// Duration of the first (whole-batch) call when it succeeded.
    clean_call: Option<Duration>,
}

struct Actor<U> {
    upstream: Arc<U>,
    config: Arc<BatcherConfig>,
    batch_limit: usize,
    shared: Arc<Shared>,
    rx: mpsc::UnboundedReceiver<Job>,
    done_tx: mpsc::UnboundedSender<Done>,
    done_rx: mpsc::UnboundedReceiver<Done>,
    requests: HashMap<u64, Pending>,
    groups: HashMap<EmbedOptions, Group>,
    next_id: u64,
    in_flight: usize,
    closed: bool,
}

impl<U: Upstream> Actor<U> {
    async fn run(mut self) {
        loop {
            self.dispatch_ready();
            if self.closed && self.requests.is_empty() && self.in_flight == 0 {
                break;
            }
            let flush_at = self.next_flush();
            tokio::select! {
                biased;
                Some(done) = self.done_rx.recv() => self.complete(done),
                job = self.rx.recv(), if !self.closed => match job {
                    Some(job) => self.enqueue(job),
                    None => self.closed = true,
                },
                () = sleep_until_opt(flush_at) => {}
            }
        }
        tracing::debug!("batcher stopped");
    }

    fn enqueue(&mut self, job: Job) {
        let id = self.next_id;
        self.next_id += 1;
        let n = job.inputs.len();
        let group = self.groups.entry(job.options.clone()).or_default();
        group.queue.push_back(id);
        group.inputs += n;
        self.requests.insert(
            id,
            Pending {
                inputs: job.inputs,
                dispatched: 0,
                results: (0..n).map(|_| None).collect(),
                received: 0,
                options: job.options,
                deadline: job.deadline,
                accepted: job.accepted,
                first_call: None,
                reply: job.reply,
                _permit: job.permit,
            },
        );
        metrics::gauge!(names::QUEUE_DEPTH).increment(n as f64);
    }

    /// When the oldest group that is not yet full becomes due; `None` when nothing waits or no
    /// call slot is free (then only a completion can make progress).
    fn next_flush(&self) -> Option<Instant> {
        if self.in_flight >= self.config.max_concurrent_batches {
            return None;
        }
        self.groups
            .values()
            .filter_map(|g| g.queue.front())
            .filter_map(|id| self.requests.get(id))
            .map(|r| {
                (r.accepted + self.config.max_wait)
                    .checked_sub(TIMER_SLACK)
                    .unwrap_or(r.accepted)
            })
            .min()
    }

    /// Sends every due group upstream while call slots are free, oldest first.
    fn dispatch_ready(&mut self) {
        while self.in_flight < self.config.max_concurrent_batches {
            let now = Instant::now();
            let due = self
                .groups
                .iter()
                .filter_map(|(key, g)| {
                    let head = self.requests.get(g.queue.front()?)?;
                    let ready = self.closed
                        || g.inputs >= self.batch_limit
                        || now + TIMER_SLACK >= head.accepted + self.config.max_wait;
                    ready.then_some((head.accepted, key))
                })
                .min_by_key(|(accepted, _)| *accepted)
                .map(|(_, key)| key.clone());
            let Some(key) = due else { break };
            if let Some((options, inputs, segments)) = self.take_batch(&key, now) {
                self.launch(options, inputs, segments);
            }
            if self.groups.get(&key).is_some_and(|g| g.queue.is_empty()) {
                self.groups.remove(&key);
            }
        }
    }

    /// Takes up to `batch_limit` inputs from the head of group `key`. Requests whose deadline has
    /// passed before any of their inputs left are answered 504 here, with no upstream work.
    fn take_batch(
        &mut self,
        key: &EmbedOptions,
        now: Instant,
    ) -> Option<(EmbedOptions, Vec<String>, Vec<Segment>)> {
        use std::sync::atomic::Ordering;
        // A request whose deadline comes before one upstream call could finish is not wanted by
        // the time its answer would come: answer 504 now and spend no upstream time on it.
        let cutoff = now
            + self
                .shared
                .rate()
                .map(|r| Duration::from_secs_f64(r.call_secs))
                .unwrap_or_default();
        let group = self.groups.get_mut(key)?;
        let mut inputs: Vec<String> = Vec::with_capacity(self.batch_limit.min(group.inputs));
        let mut segments = Vec::new();
        while inputs.len() < self.batch_limit {
            let Some(&id) = group.queue.front() else {
                break;
            };
            let Some(request) = self.requests.get_mut(&id) else {
                group.queue.pop_front();
                continue;
            };
            let untouched = request.dispatched == 0;
            if untouched && (cutoff >= request.deadline || request.reply.is_closed()) {
                group.queue.pop_front();
                let left = request.inputs.len();
                group.inputs -= left;
                self.shared.queued_inputs.fetch_sub(left, Ordering::Relaxed);
                metrics::gauge!(names::QUEUE_DEPTH).decrement(left as f64);
                if let Some(request) = self.requests.remove(&id) {
                    answer(
                        request,
                        Err(EmbedError::DeadlineExceeded(
                            "the request's deadline passes before an upstream call could finish"
                                .into(),
                        )),
                    );
                }
                continue;
            }
            let take = (self.batch_limit - inputs.len()).min(request.inputs.len());
            segments.push(Segment {
                request: id,
                offset: request.dispatched,
                at: inputs.len(),
                len: take,
            });
            if request.first_call.is_none() {
                request.first_call = Some(now);
                metrics::histogram!(names::QUEUE_WAIT)
                    .record((now - request.accepted).as_secs_f64());
            }
            if take == request.inputs.len() {
                inputs.append(&mut request.inputs);
                group.queue.pop_front();
            } else {
                inputs.extend(request.inputs.drain(..take));
            }
            request.dispatched += take;
            group.inputs -= take;
            self.shared.queued_inputs.fetch_sub(take, Ordering::Relaxed);
            metrics::gauge!(names::QUEUE_DEPTH).decrement(take as f64);
        }
        if inputs.is_empty() {
            return None;
        }
        Some((key.clone(), inputs, segments))
    }

    fn launch(&mut self, options: EmbedOptions, inputs: Vec<String>, segments: Vec<Segment>) {
        self.in_flight += 1;
        metrics::gauge!(names::BATCHES_IN_FLIGHT).set(self.in_flight as f64);
        metrics::histogram!(names::BATCH_INPUTS).record(inputs.len() as f64);
        metrics::histogram!(names::BATCH_REQUESTS).record(segments.len() as f64);
        tracing::trace!(
            inputs = inputs.len(),
            requests = segments.len(),
            "batch sent upstream"
        );
        let upstream = Arc::clone(&self.upstream);
        let done_tx = self.done_tx.clone();
        tokio::spawn(async move {
            let done = run_batch(&*upstream, &inputs, &options, segments).await;
            // The actor holds the receiver until every in-flight batch is back.
            let _ = done_tx.send(done);
        });
    }

    fn complete(&mut self, done: Done) {
        self.in_flight -= 1;
        metrics::gauge!(names::BATCHES_IN_FLIGHT).set(self.in_flight as f64);
        if let Some(elapsed) = done.clean_call {
            self.shared.record_call(done.inputs, elapsed);
        }
        let now = Instant::now();
        for (segment, result) in done.results {
            let Some(request) = self.requests.get_mut(&segment.request) else {
                continue; // already answered (failed by another segment)
            };
            match result {
                Ok(vectors) => {
                    for (slot, vector) in request.results[segment.offset..].iter_mut().zip(vectors)
                    {
                        *slot = Some(vector);
                    }
                    request.received += segment.len;
                    if request.received == request.results.len()
                        && let Some(request) = self.requests.remove(&segment.request)
                    {
                        let reply = assemble(&request, now);
                        answer(request, reply);
                    }
                }
                Err(err) => {
                    if let Some(request) = self.requests.remove(&segment.request) {
                        self.forget_queued(segment.request, &request);
                        answer(request, Err(err));
                    }
                }
            }
        }
    }

    /// Un-counts the inputs of a failed request that had not yet been sent upstream.
    fn forget_queued(&mut self, id: u64, request: &Pending) {
        let left = request.inputs.len();
        if left == 0 {
            return;
        }
        self.shared
            .queued_inputs
            .fetch_sub(left, std::sync::atomic::Ordering::Relaxed);
        metrics::gauge!(names::QUEUE_DEPTH).decrement(left as f64);
        if let Some(group) = self.groups.get_mut(&request.options) {
            group.inputs -= left;
            group.queue.retain(|&queued| queued != id);
            if group.queue.is_empty() {
                self.groups.remove(&request.options);
            }
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Sends `inputs` upstream once; on a 4xx rejection of several requests, bisects by request and
/// retries each half until the offending requests are isolated.
async fn run_batch<U: Upstream>(
    upstream: &U,
    inputs: &[String],
    options: &EmbedOptions,
    segments: Vec<Segment>,
) -> Done {
    let mut results: Vec<Option<Result<Vec<Embedding>, EmbedError>>> =
        segments.iter().map(|_| None).collect();
    let mut clean_call = None;
    // Segment ranges still to send, as a stack: the whole batch first, then halves.
    let mut work: Vec<Range<usize>> = Vec::with_capacity(8);
    work.push(0..segments.len());
    let mut first = true;
    while let Some(range) = work.pop() {
        let (Some(head), Some(tail)) = (
            segments.get(range.start),
            segments.get(range.end.saturating_sub(1)),
        ) else {
            continue;
        };
        let span = head.at..tail.at + tail.len;
        let started = Instant::now();
        let outcome = upstream.embed(&inputs[span.clone()], options).await;
        let elapsed = started.elapsed();
        metrics::histogram!(names::UPSTREAM_TIME).record(elapsed.as_secs_f64());
        match outcome {
            Ok(mut vectors) => {
                metrics::counter!(names::UPSTREAM_CALLS, "outcome" => "ok").increment(1);
                if first {
                    clean_call = Some(elapsed);
                }
                // Split from the back so each segment takes its own tail of the reply.
                for index in range.rev() {
                    let segment = &segments[index];
                    let own = vectors.split_off(segment.at - span.start);
                    results[index] = Some(Ok(own));
                }
            }
            Err(UpstreamError::Rejected(err)) if range.len() > 1 => {
                metrics::counter!(names::UPSTREAM_CALLS, "outcome" => "rejected").increment(1);
                tracing::debug!(%err, requests = range.len(), "upstream rejected a mixed batch; isolating");
                let mid = range.start + range.len() / 2;
                work.push(mid..range.end);
                work.push(range.start..mid);
            }
            Err(err) => {
                let label = match err {
                    UpstreamError::Rejected(_) => "rejected",
                    UpstreamError::Failed(_) => "failed",
                };
                metrics::counter!(names::UPSTREAM_CALLS, "outcome" => label).increment(1);
                let err = EmbedError::from(err);
                for slot in &mut results[range] {
                    *slot = Some(Err(err.clone()));
                }
            }
        }
        first = false;
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
    Done {
        results,
        inputs: inputs.len(),
        clean_call,
    }
}

/// Joins a request's raw JSON vectors into TEI's response body, `[v0,v1,...]`.
fn assemble(request: &Pending, now: Instant) -> Outcome {
    let len: usize = request
        .results
        .iter()
        .flatten()
        .map(|v| v.get().len() + 1)
        .sum();
    let mut body = Vec::with_capacity(len + 2);
    body.push(b'[');
    for (i, vector) in request.results.iter().enumerate() {
        let Some(vector) = vector else {
            return Err(EmbedError::Backend(format!(
                "missing embedding for input {i}"
            )));
        };
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(vector.get().as_bytes());
    }
    body.push(b']');
    let first_call = request.first_call.unwrap_or(now);
    Ok(Reply {
        payload: Bytes::from(body),
        queue_time: first_call - request.accepted,
        inference_time: now - first_call,
    })
}

/// Delivers an outcome (the caller may have gone away: nothing to do then) and records it.
fn answer(request: Pending, outcome: Outcome) {
    let label = match &outcome {
        Ok(_) => "ok",
        Err(e) => e.kind(),
    };
    metrics::counter!(names::REQUESTS, "outcome" => label).increment(1);
    metrics::histogram!(names::REQUEST_TIME).record(request.accepted.elapsed().as_secs_f64());
    let _ = request.reply.send(outcome);
}

#[cfg(test)]
mod tests {
    //! Batching behaviour on paused tokio time with an in-process upstream double: no wall-clock
    //! sleeps, exact timings.

    use super::*;
    use serde_json::value::RawValue;

    /// Records calls; answers each input with `["<input>"]` so replies prove identity.
    struct Recording {
        calls: Mutex<Vec<(Vec<String>, EmbedOptions)>>,
        delay: Duration,
        max: usize,
        fail: Mutex<Option<UpstreamError>>,
    }

    impl Recording {
        fn new(delay: Duration, max: usize) -> Arc<Recording> {
            Arc::new(Recording {
                calls: Mutex::new(Vec::new()),
                delay,
                max,
                fail: Mutex::new(None),
            })
        }

        fn calls(&self) -> Vec<(Vec<String>, EmbedOptions)> {
            self.calls.lock().expect("lock").clone()
        }
    }

    impl Upstream for Recording {
        async fn embed(
            &self,
            inputs: &[String],
            options: &EmbedOptions,
        ) -> Result<Vec<Embedding>, UpstreamError> {
            self.calls
                .lock()
                .expect("lock")
                .push((inputs.to_vec(), options.clone()));
            tokio::time::sleep(self.delay).await;
            if let Some(err) = self.fail.lock().expect("lock").clone() {
                return Err(err);
            }
            if inputs.iter().any(|i| i.contains("poison")) {
                return Err(UpstreamError::Rejected(EmbedError::Validation(
                    "poisoned input".into(),
                )));
            }
            Ok(inputs
                .iter()
                .map(|i| {
                    RawValue::from_string(serde_json::json!([i]).to_string()).expect("valid json")
                })
                .collect())
        }

        fn max_batch_size(&self) -> usize {
            self.max
        }
    }

    fn config(max_batch_size: usize, max_wait_ms: u64, concurrent: usize) -> BatcherConfig {
        BatcherConfig {
            max_batch_size,
            max_wait: Duration::from_millis(max_wait_ms),
            max_concurrent_batches: concurrent,
            queue_cap: 10_000,
        }
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }

    fn texts(reply: &Reply) -> Vec<String> {
        let parsed: Vec<Vec<String>> =
            serde_json::from_slice(&reply.payload).expect("reply is JSON");
        parsed.into_iter().map(|mut v| v.remove(0)).collect()
    }

    async fn outcome(rx: oneshot::Receiver<Outcome>) -> Outcome {
        rx.await.expect("the batcher answers")
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_single_requests_fill_batches_and_each_gets_its_own_vector() {
        let upstream = Recording::new(Duration::from_millis(5), usize::MAX);
        let (batcher, _task) = spawn(Arc::clone(&upstream), config(8, 5, 2));
        let receivers: Vec<_> = (0..64)
            .map(|i| {
                batcher
                    .submit(vec![format!("text {i}")], EmbedOptions::default(), far())
                    .expect("accepted")
            })
            .collect();
        for (i, rx) in receivers.into_iter().enumerate() {
            let reply = outcome(rx).await.expect("ok");
            assert_eq!(texts(&reply), vec![format!("text {i}")]);
        }
        let calls = upstream.calls();
        assert_eq!(calls.len(), 8, "64 inputs / MAX_BATCH_SIZE 8 = 8 calls");
        assert!(calls.iter().all(|(inputs, _)| inputs.len() == 8));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_request_leaves_after_max_wait_time() {
        let upstream = Recording::new(Duration::ZERO, usize::MAX);
        let (batcher, _task) = spawn(Arc::clone(&upstream), config(32, 5, 2));
        let start = Instant::now();
        let rx = batcher
            .submit(vec!["alone".into()], EmbedOptions::default(), far())
            .expect("accepted");
        tokio::time::sleep(Duration::from_millis(4)).await;
        assert!(upstream.calls().is_empty(), "sent before MAX_WAIT_TIME");
        let reply = outcome(rx).await.expect("ok");
        assert_eq!(start.elapsed(), Duration::from_millis(5));
        assert_eq!(reply.queue_time, Duration::from_millis(5));
        assert_eq!(upstream.calls().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_leaves_at_once() {
        let upstream = Recording::new(Duration::ZERO, usize::MAX);
        let (batcher, _task) = spawn(Arc::clone(&upstream), config(4, 1000, 2));
        let start = Instant::now();
        let receivers: Vec<_> = (0..4)
            .map(|i| {
                batcher
                    .submit(vec![format!("{i}")], EmbedOptions::default(), far())
                    .expect("accepted")
            })
            .collect();
        for rx in receivers {
            outcome(rx).await.expect("ok");
        }
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "a full batch does not wait for MAX_WAIT_TIME"
        );
        assert_eq!(upstream.calls().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn requests_with_different_options_never_share_a_call() {
        let upstream = Recording::new(Duration::ZERO, usize::MAX);
        let (batcher, _task) = spawn(Arc::clone(&upstream), config(32, 5, 2));
        let variants = [
            EmbedOptions::default(),
            EmbedOptions {
                normalize: false,
                ..EmbedOptions::default()
            },
            EmbedOptions {
                truncate: Some(true),
                ..EmbedOptions::default()
            },
            EmbedOptions {
                dimensions: Some(2),
                ..EmbedOptions::default()
            },
            EmbedOptions {
                prompt_name: Some("query".into()),
                ..EmbedOptions::default()
            },
        ];
        let mut receivers = Vec::new();
        for round in 0..3 {
            for (v, options) in variants.iter().enumerate() {
                let text = format!("v{v} r{round}");
                receivers.push((
                    text.clone(),
                    batcher
                        .submit(vec![text], options.clone(), far())
                        .expect("accepted"),
                ));
            }
        }
        for (text, rx) in receivers {
            assert_eq!(texts(&outcome(rx).await.expect("ok")), vec![text]);
        }
        let calls = upstream.calls();
        assert_eq!(
            calls.len(),
            variants.len(),
            "one call per distinct option set"
        );
        for (inputs, options) in calls {
            let v = variants
                .iter()
                .position(|o| *o == options)
                .expect("known options");
            assert!(
                inputs.iter().all(|i| i.starts_with(&format!("v{v} "))),
                "{inputs:?} mixed options"
            );
            assert_eq!(inputs.len(), 3);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_oversized_request_is_split_and_reassembled_in_order() {
        let upstream = Recording::new(Duration::from_millis(1), 3);
        let (batcher, _task) = spawn(Arc::clone(&upstream), config(32, 5, 2));
        let inputs: Vec<String> = (0..10).map(|i| format!("part {i}")).collect();
        let rx = batcher
            .submit(inputs.clone(), EmbedOptions::default(), far())
            .expect("accepted");
        assert_eq!(texts(&outcome(rx).await.expect("ok")), inputs);
        let sizes: Vec<usize> = upstream.calls().iter().map(|(i, _)| i.len()).collect();
        assert_eq!(
            sizes,
            vec![3, 3, 3, 1],
            "upstream limit 3 → calls of at most 3"
        );
    }

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
        *upstream.fail.lock().expect("lock") = Some(UpstreamError::Failed(
            EmbedError::Unavailable("down".into()),
        ));
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

    #[tokio::test(start_paused = true)]
    async fn closing_the_batcher_flushes_and_answers_everything_accepted() {
        let upstream = Recording::new(Duration::from_millis(10), usize::MAX);
        let (batcher, task) = spawn(Arc::clone(&upstream), config(32, 60_000, 1));
        let receivers: Vec<_> = (0..5)
            .map(|i| {
                batcher
                    .submit(vec![format!("{i}")], EmbedOptions::default(), far())
                    .expect("accepted")
            })
            .collect();
        drop(batcher);
        task.await.expect("batcher ends");
        for rx in receivers {
            outcome(rx).await.expect("answered before exit");
        }
    }
}
