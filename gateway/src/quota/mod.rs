//! Per-tenant quotas, held fleet-wide: `requests_per_minute` and `tokens_per_minute` of the
//! tenants file, counted in fixed windows of `QUOTA_WINDOW` (60 s) aligned to Unix time.
//!
//! Each gateway counts what it admitted and publishes its counts of the window on core NATS
//! every [`sync::INTERVAL`] ([`sync`]); every gateway adds the others' latest counts to its own
//! before it admits a request. No store of our own, no round trip per request: a gateway may
//! admit what its peers admitted in the last interval before it hears of it, so the fleet can
//! overshoot a limit by about (the peers' rate × 100 ms); docs/tenants.md gives the measured
//! figure. Tokens are known once the worker has counted them (`Embatch-Tokens`): a request is
//! admitted while the window's tokens are under the limit, and charged its tokens when answered.
//!
//! Over a limit: 429 with `Retry-After` (the window's end) and OpenAI's `x-ratelimit-*` headers,
//! which every answer of a limited tenant carries.

pub mod sync;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, HeaderValue};
use embatch_runtime::tenants::Tenant;
use serde::{Deserialize, Serialize};

/// What one gateway counted for one tenant in one window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Requests admitted.
    pub requests: u64,
    /// Tokens charged (the workers' `Embatch-Tokens`).
    pub tokens: u64,
}

/// Which limit a request hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// `requests_per_minute`.
    Requests,
    /// `tokens_per_minute`.
    Tokens,
}

/// A refused request: which limit, and the `x-ratelimit-*` state to answer with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limited {
    /// The limit hit.
    pub limit: Limit,
    /// The headers of the answer.
    pub state: RateState,
}

/// The `x-ratelimit-*` state of a tenant after a decision (OpenAI's headers: limit, remaining
/// and time to reset, for requests and for tokens; only for the limits the tenant has).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateState {
    /// `(limit, remaining)` of requests in the window, when limited.
    pub requests: Option<(u64, u64)>,
    /// `(limit, remaining)` of tokens in the window, when limited.
    pub tokens: Option<(u64, u64)>,
    /// Time left in the window.
    pub reset: Duration,
}

impl RateState {
    /// Writes OpenAI's `x-ratelimit-limit-*`, `x-ratelimit-remaining-*` and
    /// `x-ratelimit-reset-*` headers into `headers` (nothing for an unlimited tenant).
    pub fn write(&self, headers: &mut HeaderMap) {
        let reset = format_reset(self.reset);
        for (kind, state) in [("requests", self.requests), ("tokens", self.tokens)] {
            let Some((limit, remaining)) = state else {
                continue;
            };
            let pairs = [
                (format!("x-ratelimit-limit-{kind}"), limit.to_string()),
                (
                    format!("x-ratelimit-remaining-{kind}"),
                    remaining.to_string(),
                ),
                (format!("x-ratelimit-reset-{kind}"), reset.clone()),
            ];
            for (name, value) in pairs {
                if let (Ok(name), Ok(value)) = (
                    axum::http::HeaderName::try_from(name),
                    HeaderValue::try_from(value),
                ) {
                    headers.insert(name, value);
                }
            }
        }
    }

    /// Whole seconds to the window's end, at least 1: the 429's `Retry-After`.
    pub fn retry_after_secs(&self) -> u64 {
        (self.reset.as_secs() + u64::from(self.reset.subsec_nanos() > 0)).max(1)
    }
}

/// A duration as OpenAI writes `x-ratelimit-reset-*`: `250ms`, `12s`, `1m30s`.
fn format_reset(left: Duration) -> String {
    let secs = left.as_secs();
    match secs {
        0 => format!("{}ms", left.subsec_millis()),
        1..60 => format!("{secs}s"),
        _ => format!("{}m{}s", secs / 60, secs % 60),
    }
}

/// The fleet's quota counts as this gateway knows them; cheap to clone.
#[derive(Clone)]
pub struct Quotas {
    state: Arc<Mutex<State>>,
    /// The window's length (`QUOTA_WINDOW`).
    window: Duration,
}

#[derive(Default)]
struct State {
    /// The window the counts are of: Unix time / window length.
    window: u64,
    /// This gateway's counts in `window`.
    own: HashMap<Arc<str>, Counts>,
    /// Each peer gateway's latest counts: its window and its counts per tenant.
    peers: HashMap<String, (u64, HashMap<String, Counts>)>,
    /// Whether `own` changed since it was last published.
    dirty: bool,
}

impl Quotas {
    /// Quotas counted in windows of `window` (at least 1 s).
    pub fn new(window: Duration) -> Quotas {
        Quotas {
            state: Arc::default(),
            window: window.max(Duration::from_secs(1)),
        }
    }

    /// The current window's index and the time left in it.
    fn now(&self) -> (u64, Duration) {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let length = self.window.as_millis().max(1) as u64;
        let millis = since.as_millis() as u64;
        (
            millis / length,
            Duration::from_millis(length - millis % length),
        )
    }

    /// A limit per minute scaled to the window (at least 1).
    fn per_window(&self, per_minute: u64) -> u64 {
        let scaled = u128::from(per_minute) * self.window.as_millis() / 60_000;
        u64::try_from(scaled).unwrap_or(u64::MAX).max(1)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while counting leaves counts that are still counts.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits one request of `tenant` (counting it) or refuses it; `Ok(None)` for a tenant
    /// without limits (nothing counted).
    ///
    /// # Errors
    /// [`Limited`] when the window's requests or tokens, fleet-wide, reached a limit.
    pub fn admit(&self, tenant: &Tenant) -> Result<Option<RateState>, Limited> {
        let rpm = tenant.requests_per_minute.map(|l| self.per_window(l));
        let tpm = tenant.tokens_per_minute.map(|l| self.per_window(l));
        if rpm.is_none() && tpm.is_none() {
            return Ok(None);
        }
        let (window, reset) = self.now();
        let mut state = self.lock();
        state.roll(window);
        let used = state.total(&tenant.name);
        let rate = |requests: u64| RateState {
            requests: rpm.map(|l| (l, l.saturating_sub(requests))),
            tokens: tpm.map(|l| (l, l.saturating_sub(used.tokens))),
            reset,
        };
        if rpm.is_some_and(|l| used.requests >= l) {
            let state = rate(used.requests);
            return Err(Limited {
                limit: Limit::Requests,
                state,
            });
        }
        if tpm.is_some_and(|l| used.tokens >= l) {
            let state = rate(used.requests);
            return Err(Limited {
                limit: Limit::Tokens,
                state,
            });
        }
        state.own.entry(tenant.name.clone()).or_default().requests += 1;
        state.dirty = true;
        Ok(Some(rate(used.requests + 1)))
    }

    /// Charges `tokens` to `tenant` in the current window (a request it admitted was answered).
    pub fn charge(&self, tenant: &Tenant, tokens: u64) {
        if tokens == 0 || tenant.tokens_per_minute.is_none() {
            return;
        }
        let (window, _) = self.now();
        let mut state = self.lock();
        state.roll(window);
        state.own.entry(tenant.name.clone()).or_default().tokens += tokens;
        state.dirty = true;
    }

    /// This gateway's counts of the current window, if they changed since the last call (or
    /// always, with `force`, when there are any).
    fn take_changes(&self, force: bool) -> Option<(u64, HashMap<String, Counts>)> {
        let (window, _) = self.now();
        let mut state = self.lock();
        state.roll(window);
        let dirty = std::mem::take(&mut state.dirty);
        let refresh = force && !state.own.is_empty();
        if !dirty && !refresh {
            return None;
        }
        let own = state.own.iter().map(|(t, c)| (t.to_string(), *c)).collect();
        Some((state.window, own))
    }

    /// Records a peer gateway's counts of `window`.
    fn record_peer(&self, gateway: String, window: u64, counts: HashMap<String, Counts>) {
        let mut state = self.lock();
        match state.peers.get(&gateway) {
            Some((known, _)) if *known > window => {}
            _ => {
                state.peers.insert(gateway, (window, counts));
            }
        }
    }
}

impl State {
    /// Moves to `window`: a new window starts from zero, and peers' older counts are dropped.
    fn roll(&mut self, window: u64) {
        if self.window != window {
            self.window = window;
            self.own.clear();
            // Peers' counts of an older window no longer count; nothing to publish of a new
            // window until something is counted in it.
            self.peers.retain(|_, (w, _)| *w >= window);
            self.dirty = false;
        }
    }

    /// The fleet's counts of `tenant` in the current window: this gateway's and its peers'.
    fn total(&self, tenant: &str) -> Counts {
        let mut total = self.own.get(tenant).copied().unwrap_or_default();
        for (window, counts) in self.peers.values() {
            if *window == self.window
                && let Some(counts) = counts.get(tenant)
            {
                total.requests += counts.requests;
                total.tokens += counts.tokens;
            }
        }
        total
    }
}

#[cfg(test)]
mod tests;
