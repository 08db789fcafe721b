//! What the double records and what it is told to do wrong: each call as received
//! ([`RecordedCall`], kept in a [`CallLog`]), and the [`Faults`] injected into later calls.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, header};
use embatch_protocol::Input;
use serde::Serialize;

/// One `/embed` call as the TEI double received it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RecordedCall {
    /// The inputs, in order (a single-string `inputs` is one element).
    pub inputs: Vec<Input>,
    /// The other fields that change the result (the batching key), as JSON:
    /// `{"normalize": true, "truncate": …, "truncation_direction": …, "prompt_name": …,
    /// "dimensions": …}` with absent options left out.
    pub options: serde_json::Value,
    /// The HTTP status the call was answered with (200, or the error's status).
    pub status: u16,
    /// The `Authorization` header, if any (to check that a worker sends its TEI API key).
    pub authorization: Option<String>,
    /// When the call arrived.
    #[serde(skip)]
    pub at: Instant,
}

/// Faults injected into later calls; change them on a running double with
/// [`TeiDouble::set_faults`](crate::TeiDouble::set_faults). The default injects nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults {
    /// Added to every call before it is answered (on top of the cost model, outside the
    /// concurrency limit: a slow network or a stalled server rather than a busy GPU).
    pub delay: Duration,
    /// `Some(status)`: answer every call with this HTTP status and a TEI error body
    /// (`error_type` as TEI gives for that status), after [`Faults::delay`]. A 5xx also makes
    /// `GET /health` answer 503.
    pub fail_with: Option<u16>,
    /// `Some(status)`: a call with a [`POISON`](crate::POISON) input is answered this status and a TEI error
    /// body (`error_type` as TEI gives for it) after its compute time, as TEI answers 424
    /// `Backend` when the model fails on an input of the batch it ran. `None`: such a call is
    /// rejected 422 `Validation` at once, as TEI's validation does.
    pub poison_status: Option<u16>,
    /// `Some(status)`: `GET /health` answers this status while calls are served as usual, as
    /// a server whose health check lags behind its work (TEI's `/health` waits behind the
    /// batches it runs).
    pub health_status: Option<u16>,
}

impl Faults {
    /// Every call answered `status` with TEI's error body for it ([`Faults::fail_with`]); no
    /// other fault.
    pub fn failing_with(status: u16) -> Faults {
        Faults {
            fail_with: Some(status),
            ..Faults::default()
        }
    }

    /// A call with a [`POISON`](crate::POISON) input answered `status` after its compute time
    /// ([`Faults::poison_status`]); no other fault.
    pub fn poisoned_with(status: u16) -> Faults {
        Faults {
            poison_status: Some(status),
            ..Faults::default()
        }
    }

    /// The failure a call meets after its compute time when one of its `inputs` holds
    /// [`POISON`](crate::POISON) ([`Faults::poison_status`]): that status and the input's
    /// index. `None` for a call that failed its checks (`checked` false): that error comes first.
    pub(crate) fn model_failure(&self, checked: bool, inputs: &[Input]) -> Option<(u16, usize)> {
        self.poison_status
            .filter(|_| checked)
            .and_then(|status| crate::poisoned(inputs).map(|i| (status, i)))
    }

    /// Waits out [`Faults::delay`], then gives [`Faults::fail_with`]: the first two faults a
    /// call meets, in that order, on every route.
    pub(crate) async fn injected(&self) -> Option<u16> {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        self.fail_with
    }
}

impl crate::AppState {
    /// The faults in effect now, copied: a call keeps those it arrived with.
    pub(crate) fn faults(&self) -> Faults {
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Logs a call that arrived `at`, to be answered `status`, when a log is kept (`options` is
    /// only built then); `headers` gives its `Authorization` (`None`: a route that does not
    /// record it).
    pub(crate) fn record(
        &self,
        inputs: &[Input],
        options: impl FnOnce() -> serde_json::Value,
        status: u16,
        headers: Option<&HeaderMap>,
        at: Instant,
    ) {
        let Some(calls) = &self.calls else {
            return;
        };
        calls.push(RecordedCall {
            inputs: inputs.to_vec(),
            options: options(),
            status,
            authorization: headers
                .and_then(|h| h.get(header::AUTHORIZATION))
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            at,
        });
    }
}

/// The shared log of calls, in arrival order. Cloning shares the log.
#[derive(Debug, Clone, Default)]
pub struct CallLog {
    /// The calls; prefer the methods below.
    pub calls: Arc<Mutex<Vec<RecordedCall>>>,
}

impl CallLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<RecordedCall>> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn push(&self, call: RecordedCall) {
        self.lock().push(call);
    }

    /// A copy of the calls so far.
    pub fn snapshot(&self) -> Vec<RecordedCall> {
        self.lock().clone()
    }

    /// Number of calls so far.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// `true` before the first call.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Forgets the calls so far.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// The number of inputs of each call so far, in order.
    pub fn batch_sizes(&self) -> Vec<usize> {
        self.lock().iter().map(|c| c.inputs.len()).collect()
    }
}

/// The faults of a running double, shared with whoever may change them (see
/// [`serve_until_with`](crate::serve_until_with)); cloning shares them. [`TeiDouble::set_faults`](crate::TeiDouble::set_faults) is the same for a spawned
/// double.
pub type SharedFaults = Arc<Mutex<Faults>>;
