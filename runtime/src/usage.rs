//! Usage per tenant and day (UTC), for charge-back: requests, inputs, tokens, shed (429) and
//! failed (5xx, 424) answers of the embedding routes, and the lines, inputs and tokens of bulk
//! jobs, kept in the JetStream KV bucket [`BUCKET`] under `<tenant>.<YYYY-MM-DD>`.
//!
//! Each gateway adds what it answered, and each worker what its bulk lane embedded, to the
//! bucket every [`FLUSH_INTERVAL`], with a compare-and-set on the entry's revision (so no
//! process overwrites another's counts); until JetStream answers, counts wait in the process
//! (at most one entry per tenant and day). The gateway's `GET /v1/usage?date=YYYY-MM-DD`
//! answers the caller's own day; `embatch usage` prints it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, kv};
use serde::{Deserialize, Serialize};
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use crate::Replicas;

/// The KV bucket of daily usage (created by the first process that writes to it).
pub const BUCKET: &str = "EMBATCH_USAGE";

/// How often a process adds its counts to [`BUCKET`].
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(5);

/// How long a day's entry is kept: 400 days, a year of monthly statements and then some.
const KEEP: Duration = Duration::from_secs(400 * 24 * 3600);

/// Compare-and-set tries of one entry in one flush before it waits for the next.
const CAS_TRIES: u32 = 5;

/// One tenant's use of one day (UTC).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DayUsage {
    /// Embedding requests answered (any status).
    pub requests: u64,
    /// Inputs of the requests answered 200.
    pub inputs: u64,
    /// Tokens of the requests answered 200, as the workers counted them.
    pub tokens: u64,
    /// Requests answered 429 (load shedding or the tenant's quota).
    pub shed: u64,
    /// Requests answered 5xx or 424.
    pub failed: u64,
    /// Bulk lines embedded (OpenAI's Batch API): their inputs and tokens are not in
    /// `inputs`/`tokens`, since batch work is priced apart.
    #[serde(default)]
    pub bulk_lines: u64,
    /// Inputs of the bulk lines embedded.
    #[serde(default)]
    pub bulk_inputs: u64,
    /// Tokens of the bulk lines embedded, as the workers counted them.
    #[serde(default)]
    pub bulk_tokens: u64,
}

impl DayUsage {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &DayUsage) {
        self.requests += other.requests;
        self.inputs += other.inputs;
        self.tokens += other.tokens;
        self.shed += other.shed;
        self.failed += other.failed;
        self.bulk_lines += other.bulk_lines;
        self.bulk_inputs += other.bulk_inputs;
        self.bulk_tokens += other.bulk_tokens;
    }

    /// One answer of `status` with `inputs` and `tokens` (counted for a 200 only).
    pub fn answer(status: u16, inputs: u64, tokens: u64) -> DayUsage {
        let ok = status == 200;
        DayUsage {
            requests: 1,
            inputs: if ok { inputs } else { 0 },
            tokens: if ok { tokens } else { 0 },
            shed: u64::from(status == 429),
            failed: u64::from(status >= 500 || status == 424),
            ..DayUsage::default()
        }
    }

    /// One bulk line embedded, of `inputs` inputs and `tokens` tokens.
    pub fn bulk_line(inputs: u64, tokens: u64) -> DayUsage {
        DayUsage {
            bulk_lines: 1,
            bulk_inputs: inputs,
            bulk_tokens: tokens,
            ..DayUsage::default()
        }
    }
}

/// The date of `time` in UTC, `YYYY-MM-DD`.
pub fn utc_date(time: SystemTime) -> String {
    let mut text = humantime::format_rfc3339_seconds(time).to_string();
    text.truncate(10);
    text
}

/// Seconds in a UTC day (Unix time has no leap seconds).
const DAY_SECS: u64 = 24 * 3600;

/// The UTC day of `time`, as days since the Unix epoch (cheap: counted per request).
fn day_number(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / DAY_SECS)
}

/// The date `YYYY-MM-DD` of day number `day`.
fn date_of(day: u64) -> String {
    utc_date(UNIX_EPOCH + Duration::from_secs(day * DAY_SECS))
}

/// Counts not yet in the bucket, by tenant and day number ([`day_number`]).
type Pending = HashMap<(Arc<str>, u64), DayUsage>;

/// This process's counts not yet in the bucket, and the bucket once bound; cheap to clone.
#[derive(Clone)]
pub struct UsageBook {
    pending: Arc<Mutex<Pending>>,
    client: async_nats::Client,
    bucket: Arc<OnceCell<kv::Store>>,
    replicas: Replicas,
}

impl UsageBook {
    /// A book writing to [`BUCKET`] over `client` (created with `replicas` copies, or brought to
    /// them, when first written to); its flusher runs until `stop`. Needs a tokio runtime.
    pub fn start(
        client: async_nats::Client,
        replicas: Replicas,
        stop: CancellationToken,
    ) -> UsageBook {
        let book = UsageBook {
            pending: Arc::default(),
            client,
            bucket: Arc::new(OnceCell::new()),
            replicas,
        };
        tokio::spawn(flush_every(book.clone(), stop));
        book
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts `usage` for `tenant` today.
    pub fn record(&self, tenant: &Arc<str>, usage: DayUsage) {
        let key = (tenant.clone(), day_number(SystemTime::now()));
        self.lock().entry(key).or_default().add(&usage);
    }

    async fn bucket(&self) -> Result<&kv::Store, UsageError> {
        self.bucket
            .get_or_try_init(|| async {
                let js = jetstream::new(self.client.clone());
                let replicas = self.replicas.resolve(&self.client);
                match js.get_key_value(BUCKET).await {
                    Ok(store) => {
                        let stream = format!("KV_{BUCKET}");
                        if let Err(err) = replicas.apply(&js, &stream).await {
                            tracing::warn!(%err, "cannot read the usage bucket's replicas");
                        }
                        Ok(store)
                    }
                    Err(_) => crate::replicas::create_or_bind(
                        js.create_key_value(kv::Config {
                            bucket: BUCKET.to_owned(),
                            description: "embatch: usage per tenant and day".to_owned(),
                            max_age: KEEP,
                            history: 1,
                            num_replicas: replicas.count,
                            ..Default::default()
                        }),
                        || async { Ok(js.get_key_value(BUCKET).await?) },
                    )
                    .await
                    .map_err(|e| UsageError::Unavailable(e.to_string())),
                }
            })
            .await
    }

    /// Adds every pending count to the bucket; what could not be written stays pending.
    async fn flush(&self) {
        let pending = std::mem::take(&mut *self.lock());
        if pending.is_empty() {
            return;
        }
        let bucket = match self.bucket().await {
            Ok(bucket) => bucket,
            Err(err) => {
                tracing::debug!(%err, "usage counts wait for JetStream");
                self.merge_back(pending);
                return;
            }
        };
        let mut unwritten = HashMap::new();
        for ((tenant, day), usage) in pending {
            let date = date_of(day);
            if let Err(err) = add_to(bucket, &key(&tenant, &date), &usage).await {
                tracing::warn!(%err, %tenant, %date, "cannot add to the usage bucket; retried next flush");
                unwritten.insert((tenant, day), usage);
            }
        }
        self.merge_back(unwritten);
    }

    fn merge_back(&self, counts: Pending) {
        let mut pending = self.lock();
        for (key, usage) in counts {
            pending.entry(key).or_default().add(&usage);
        }
    }

    /// `tenant`'s usage on `day` (`YYYY-MM-DD`): the bucket's and this process's unflushed
    /// counts.
    ///
    /// # Errors
    /// [`UsageError::Unavailable`] without JetStream.
    pub async fn day(&self, tenant: &Arc<str>, day: &str) -> Result<DayUsage, UsageError> {
        let number =
            humantime::parse_rfc3339(&format!("{day}T00:00:00Z")).map_or(u64::MAX, day_number);
        let mut usage = self
            .lock()
            .get(&(tenant.clone(), number))
            .copied()
            .unwrap_or_default();
        let bucket = self.bucket().await?;
        let stored = bucket
            .get(key(tenant, day))
            .await
            .map_err(|e| UsageError::Unavailable(e.to_string()))?;
        if let Some(bytes) = stored {
            usage.add(&serde_json::from_slice(&bytes).unwrap_or_default());
        }
        Ok(usage)
    }
}

/// The bucket key of `tenant`'s `day`.
fn key(tenant: &str, day: &str) -> String {
    format!("{tenant}.{day}")
}

/// Adds `usage` to the entry `key`, creating it when absent, by compare-and-set.
async fn add_to(bucket: &kv::Store, key: &str, usage: &DayUsage) -> Result<(), UsageError> {
    let unavailable = |e: &dyn std::fmt::Display| UsageError::Unavailable(e.to_string());
    for _ in 0..CAS_TRIES {
        let entry = bucket.entry(key).await.map_err(|e| unavailable(&e))?;
        let (mut total, revision) = match &entry {
            Some(entry) if entry.operation == kv::Operation::Put => (
                serde_json::from_slice::<DayUsage>(&entry.value).unwrap_or_default(),
                Some(entry.revision),
            ),
            _ => (DayUsage::default(), None),
        };
        total.add(usage);
        let value = serde_json::to_vec(&total).map_err(|e| unavailable(&e))?;
        let written = match revision {
            Some(revision) => bucket.update(key, value.into(), revision).await.is_ok(),
            None => bucket.create(key, value.into()).await.is_ok(),
        };
        if written {
            return Ok(());
        }
    }
    Err(UsageError::Contended)
}

async fn flush_every(book: UsageBook, stop: CancellationToken) {
    let mut tick = tokio::time::interval(FLUSH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while stop.run_until_cancelled(tick.tick()).await.is_some() {
        book.flush().await;
    }
    book.flush().await;
}

/// Why usage could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// JetStream is not enabled or did not answer.
    #[error("the usage bucket is not available (JetStream): {0}")]
    Unavailable(String),
    /// Other processes kept writing the same entry.
    #[error("the usage entry kept changing under {CAS_TRIES} compare-and-set tries")]
    Contended,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_day_number_names_its_utc_date() {
        let time = humantime::parse_rfc3339("2026-11-27T23:59:59Z").expect("time");
        assert_eq!(date_of(day_number(time)), "2026-11-27");
        assert_eq!(utc_date(time), "2026-11-27");
        let next = time + Duration::from_secs(1);
        assert_eq!(date_of(day_number(next)), "2026-11-28");
    }
}
