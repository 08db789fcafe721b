//! Batcher behaviour on paused tokio time with an in-process upstream double: no wall-clock
//! sleeps, exact timings.

mod batching;
mod bulk;
mod fair;
mod fair_report;
mod faults;
mod overload;
mod tokens;
mod traces;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use embatch_protocol::{EmbedError, EmbedOptions, Input};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{BatcherConfig, BatcherHandle, Outcome, QueueDelay, Reply, TokenBudget, spawn};
use crate::{Backend, Embedding, UpstreamError};

/// Records calls; answers each input with `["<input>"]` so replies prove identity. An input
/// containing `poison` is rejected (422, blames the input); one containing `panic` makes the
/// call panic.
struct Recording {
    calls: Mutex<Vec<(Vec<String>, EmbedOptions)>>,
    delay: Mutex<Duration>,
    max: usize,
    fail: Mutex<Option<UpstreamError>>,
}

impl Recording {
    fn new(delay: Duration, max: usize) -> Arc<Recording> {
        Arc::new(Recording {
            calls: Mutex::new(Vec::new()),
            delay: Mutex::new(delay),
            max,
            fail: Mutex::new(None),
        })
    }

    fn calls(&self) -> Vec<(Vec<String>, EmbedOptions)> {
        self.calls.lock().expect("lock").clone()
    }

    fn set_delay(&self, delay: Duration) {
        *self.delay.lock().expect("lock") = delay;
    }
}

impl Backend for Recording {
    async fn embed(
        &self,
        inputs: &[Input],
        options: &EmbedOptions,
    ) -> Result<Vec<Embedding>, UpstreamError> {
        // Token ids are recorded (and answered) as their debug text, `[101, 102]`.
        let inputs: Vec<String> = inputs
            .iter()
            .map(|input| match input {
                Input::Text(text) => text.clone(),
                Input::Ids(ids) => format!("{ids:?}"),
                Input::Pair(query, text) => format!("{query}|{text}"),
            })
            .collect();
        self.calls
            .lock()
            .expect("lock")
            .push((inputs.clone(), options.clone()));
        let delay = *self.delay.lock().expect("lock");
        tokio::time::sleep(delay).await;
        if let Some(err) = self.fail.lock().expect("lock").clone() {
            return Err(err);
        }
        if inputs.iter().any(|i| i.contains("panic")) {
            panic!("the upstream double panics on a marker input");
        }
        if inputs.iter().any(|i| i.contains("poison")) {
            return Err(UpstreamError::Model(EmbedError::Validation(
                "poisoned input".into(),
            )));
        }
        Ok(inputs
            .iter()
            .map(|i| Embedding::from_json(serde_json::json!([i]).to_string()))
            .collect())
    }

    fn max_batch_size(&self) -> usize {
        self.max
    }
}

/// Limits for tests that are not about the queue-delay bound (fixed at an hour).
fn config(max_batch_size: usize, max_wait_ms: u64, concurrent: usize) -> BatcherConfig {
    BatcherConfig {
        max_batch_size,
        tokens: TokenBudget::default(),
        max_wait: Duration::from_millis(max_wait_ms),
        max_concurrent_batches: concurrent,
        partial_batch_slots: None,
        queue_cap: 10_000,
        max_queue_bytes: 1 << 20,
        max_queue_delay: QueueDelay::Fixed(Duration::from_secs(3600)),
        dispatch_when_idle: false,
    }
}

/// One bound of [`config`] changed.
impl BatcherConfig {
    fn with_queue_cap(self, queue_cap: usize) -> BatcherConfig {
        BatcherConfig { queue_cap, ..self }
    }

    fn with_max_queue_bytes(self, max_queue_bytes: usize) -> BatcherConfig {
        BatcherConfig {
            max_queue_bytes,
            ..self
        }
    }

    fn with_max_queue_delay(self, max_queue_delay: QueueDelay) -> BatcherConfig {
        BatcherConfig {
            max_queue_delay,
            ..self
        }
    }
}

/// A batcher with `config` on a [`Recording`] upstream that takes `delay` per call and has no
/// batch limit of its own.
fn start(
    delay: Duration,
    config: BatcherConfig,
) -> (Arc<Recording>, BatcherHandle, JoinHandle<()>) {
    let upstream = Recording::new(delay, usize::MAX);
    let (batcher, task) = spawn(Arc::clone(&upstream), config);
    (upstream, batcher, task)
}

/// Submits `texts` as one request with default options and `deadline` (every input counts 1
/// token: count batching), and waits for the admission answer.
async fn submit<S: AsRef<str>>(
    batcher: &BatcherHandle,
    texts: &[S],
    deadline: Instant,
) -> Result<oneshot::Receiver<Outcome>, EmbedError> {
    let inputs: Vec<Input> = texts.iter().map(|t| Input::from(t.as_ref())).collect();
    let lengths = vec![1; inputs.len()];
    batcher
        .try_submit(inputs, lengths, EmbedOptions::default(), deadline)
        .await
        .map_err(EmbedError::from)
}

/// Submits each of `texts` as a request of its own (1 token each), with default options and a
/// far deadline.
fn submit_each(
    batcher: &BatcherHandle,
    texts: impl IntoIterator<Item = String>,
) -> Vec<oneshot::Receiver<Outcome>> {
    texts
        .into_iter()
        .map(|text| submit_text(batcher, text))
        .collect()
}

/// Submits `text` as a request of its own (1 token), with default options and a far deadline;
/// its refusal, if any, comes as its outcome (a submit that the actor received).
fn submit_text(batcher: &BatcherHandle, text: impl Into<String>) -> oneshot::Receiver<Outcome> {
    batcher
        .submit(
            vec![Input::from(text.into())],
            vec![1],
            EmbedOptions::default(),
            far(),
        )
        .expect("validated and sent to the actor")
}

/// `"0"`, `"1"`, … up to `n - 1`.
fn numbered(n: usize) -> Vec<String> {
    (0..n).map(|i| i.to_string()).collect()
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

/// The deadline `ms` milliseconds from now.
fn in_ms(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

fn texts(reply: &Reply) -> Vec<String> {
    reply
        .embeddings
        .iter()
        .map(|e| {
            let mut v: Vec<String> = serde_json::from_slice(e.json()).expect("a JSON array");
            v.remove(0)
        })
        .collect()
}

async fn outcome(rx: oneshot::Receiver<Outcome>) -> Outcome {
    rx.await.expect("the batcher answers")
}
