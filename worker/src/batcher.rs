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
            if expected > budget {
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
            .map(|r| r.accepted + self.config.max_wait)
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
                        || now >= head.accepted + self.config.max_wait;
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
            if untouched && (now >= request.deadline || request.reply.is_closed()) {
                group.queue.pop_front();
                let left = request.inputs.len();
                group.inputs -= left;
                self.shared.queued_inputs.fetch_sub(left, Ordering::Relaxed);
                metrics::gauge!(names::QUEUE_DEPTH).decrement(left as f64);
                if let Some(request) = self.requests.remove(&id) {
                    answer(
                        request,
                        Err(EmbedError::DeadlineExceeded(
                            "the request's deadline passed while it was queued".into(),
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
                    if request.received == request.results.len() {
                        if let Some(request) = self.requests.remove(&segment.request) {
                            let reply = assemble(&request, now);
                            answer(request, reply);
                        }
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
    let mut work: Vec<Range<usize>> = vec![0..segments.len()];
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
