//! embatch's cache. No upstream work twice for the same input: single-flight de-duplication in
//! the worker, an in-process LRU and a JetStream KV bucket shared by every worker of the model.
//!
//! For each request the intake makes a [`Plan`] ([`Cache::plan`]) before admission: every input
//! gets its [`key`] and is either
//! - a hit, from the in-process LRU ([`local`]) or, read before submission, the shared bucket
//!   ([`shared`]): answered without entering the batch queue or admission;
//! - the same as an earlier input of the request: answered with that one's copy;
//! - in flight for another request ([`flight`]): answered with that request's result (or, if
//!   that request ends without one, sent upstream by this request itself);
//! - a miss this request leads: the misses are counted and submitted to the batcher as today,
//!   and their results are stored in both tiers and handed to every waiter.
//!
//! Only the LRU and the bucket are the cache (`CACHE=false` turns both off); the single-flight
//! is de-duplication of work the worker already holds and stays on. A request that bypasses the
//! cache ([`embatch_protocol::headers::CACHE_CONTROL`]) neither reads it nor joins or offers its
//! inputs to the single-flight: its results are its own upstream work (an equal input in the same
//! upstream call is still sent once). How entries are stored: [`entry`]; what happens when
//! the bucket is full or down: [`shared`].

mod entry;
mod flight;
mod key;
mod local;
mod meters;
pub mod names;
mod plan;
mod shared;
mod usage;
mod writer;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use flight::Flights;
use key::ModelIdentity;
use local::Local;
pub use plan::{Answered, Plan, Stash};
use shared::{BucketConfig, Shared};
pub use usage::Usage;

/// The cache's settings (the worker's `CACHE_*` flags, see `embatch_worker::config`).
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Whether the LRU and the shared bucket are used (`CACHE`).
    pub enabled: bool,
    /// Most bytes the in-process LRU holds (`CACHE_LOCAL_BYTES`); 0: no LRU.
    pub local_bytes: usize,
    /// The shared bucket's name (`CACHE_BUCKET`); empty: no shared tier.
    pub bucket: String,
    /// Most bytes the shared bucket holds (`CACHE_SHARED_BYTES`).
    pub shared_bytes: u64,
    /// Age after which the shared bucket drops an entry (`CACHE_MAX_AGE`).
    pub max_age: Duration,
    /// Bound on each KV call (`CACHE_KV_TIMEOUT`).
    pub kv_timeout: Duration,
    /// The model's revision for the key when the upstream reports none (`CACHE_REVISION`).
    pub revision: String,
    /// Replicas of the shared bucket (`JETSTREAM_REPLICAS`), resolved against the cluster when
    /// it is opened.
    pub replicas: embatch_runtime::Replicas,
}

/// The worker's cache: the model's identity, the two tiers and the in-flight keys. One per
/// worker, shared by its requests (behind an `Arc`); every method takes `&self`.
pub struct Cache {
    /// Hashed into every key; also keys the single-flight when the cache is off.
    identity: ModelIdentity,
    /// `None` when the cache is off or the model's identity unknown.
    local: Option<Local>,
    /// `None` when the cache is off, the model's identity unknown or no bucket is named.
    shared: Option<Arc<Shared>>,
    flights: Arc<Flights>,
}

impl Cache {
    /// The cache for the model `info` describes (the upstream's `/info`; `None` when it could
    /// not be read), opening the shared bucket on `client` (see [`shared`]). Without a known
    /// model (`info` absent or naming no `model_id`) the tiers are off and only the
    /// single-flight runs: entries of an unknown model could be answered for another.
    pub async fn start(
        client: &async_nats::Client,
        config: &CacheConfig,
        info: Option<&serde_json::Value>,
        stop: &CancellationToken,
        tasks: &TaskTracker,
    ) -> Cache {
        let known = info.and_then(|info| ModelIdentity::from_info(info, &config.revision));
        let flights = Arc::new(Flights::default());
        meters::METERS.bytes.set(0.0);
        let (identity, enabled) = match known {
            Some(identity) => (identity, config.enabled),
            None => {
                if config.enabled {
                    tracing::warn!(
                        "cache: the upstream's /info names no model; the cache is off (in-flight de-duplication stays on)"
                    );
                }
                (ModelIdentity::unknown(&config.revision), false)
            }
        };
        if !enabled {
            return Cache {
                identity,
                local: None,
                shared: None,
                flights,
            };
        }
        tracing::info!(model = identity.text(), local_bytes = config.local_bytes, bucket = %config.bucket, "cache on");
        let local = (config.local_bytes > 0).then(|| Local::new(config.local_bytes));
        let shared = if config.bucket.is_empty() {
            None
        } else {
            let bucket = BucketConfig {
                bucket: config.bucket.clone(),
                max_bytes: config.shared_bytes,
                max_age: config.max_age,
                timeout: config.kv_timeout,
                replicas: config.replicas.resolve(client),
            };
            Some(Shared::open(client, bucket, stop, tasks).await)
        };
        Cache {
            identity,
            local,
            shared,
            flights,
        }
    }

    /// Whether the LRU or the shared bucket is on (replies then carry
    /// [`embatch_protocol::headers::CACHE_HITS`]).
    pub(crate) fn is_on(&self) -> bool {
        self.local.is_some() || self.shared.is_some()
    }

    /// Stores a request's new results in the LRU and the shared bucket (in a task, see
    /// [`shared`]). Called once its reply is sent: the copies, the locks and the bucket's
    /// writes (about 5 KB each at 384 dimensions) never delay a reply, nor queue ahead of one
    /// on the connection. Waiters have their results already ([`Plan::complete_leads`]).
    pub fn store(&self, stash: Stash) {
        let entries = stash.0;
        if entries.is_empty() {
            return;
        }
        let mut values = Vec::with_capacity(if self.shared.is_some() {
            entries.len()
        } else {
            0
        });
        for (key, entry) in entries {
            let (entry, value) = entry.compact();
            if let Some(local) = &self.local {
                local.insert(key, entry);
            }
            if self.shared.is_some() {
                values.push((key, value));
            }
        }
        if let Some(shared) = &self.shared {
            shared.put(values);
        }
    }
}
