//! No upstream work twice for the same input: single-flight de-duplication in the worker, an
//! in-process LRU and a JetStream KV bucket shared by every worker of the model.
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
mod shared;
mod writer;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use embatch_protocol::{EmbedError, EmbedOptions, Input};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub(crate) use entry::Entry;
use flight::{Flights, Joined, Lead, Wait};
pub(crate) use key::ModelIdentity;
use local::Local;
pub(crate) use shared::BucketConfig;
use shared::{Lookup, Shared};

use crate::telemetry::names;
use crate::upstream::Embedding;

/// The cache's settings (see `crate::config`).
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

/// How one request uses the cache, from its [`embatch_protocol::headers::CACHE_CONTROL`] (HTTP's
/// `Cache-Control` request directives, which the gateway passes on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Usage {
    /// Read and write the cache.
    Normal,
    /// `no-cache`: do not answer from the cache; store the fresh result.
    NoCache,
    /// `no-store`: neither read nor write the cache.
    NoStore,
}

impl Usage {
    /// The usage a header value asks for: comma-separated directives, case-insensitive;
    /// `no-store` wins over `no-cache`; anything else is [`Usage::Normal`].
    pub(crate) fn from_header(value: Option<&str>) -> Usage {
        let Some(value) = value else {
            return Usage::Normal;
        };
        let mut usage = Usage::Normal;
        for directive in value.split(',').map(str::trim) {
            if directive.eq_ignore_ascii_case("no-store") {
                return Usage::NoStore;
            }
            if directive.eq_ignore_ascii_case("no-cache") {
                usage = Usage::NoCache;
            }
        }
        usage
    }
}

/// The worker's cache: the model's identity, the two tiers and the in-flight keys.
pub(crate) struct Cache {
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
    pub(crate) async fn start(
        client: &async_nats::Client,
        config: &CacheConfig,
        info: Option<&serde_json::Value>,
        stop: &CancellationToken,
        tasks: &TaskTracker,
    ) -> Cache {
        let known = info.and_then(|info| ModelIdentity::from_info(info, &config.revision));
        let flights = Arc::new(Flights::default());
        metrics::gauge!(names::CACHE_BYTES).set(0.0);
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

    /// What each input of a request of the cache scope `scope` (its tenant's, see
    /// [`key`]) needs (see the module docs): LRU hits are filled in, keys no one computes are led
    /// by this request, the others waited for. Keys, and so hits and inputs in flight, never
    /// cross scopes. Cheap and synchronous: a hash per input and a lock or two.
    pub(crate) fn plan(
        &self,
        inputs: &[Input],
        options: &EmbedOptions,
        usage: Usage,
        scope: &str,
    ) -> Plan {
        let prefix = self.identity.prefix(options, scope);
        let reads = usage == Usage::Normal;
        let mut plan = Plan {
            results: Vec::with_capacity(inputs.len()),
            same: Vec::new(),
            leads: Vec::new(),
            waits: Vec::new(),
            hits: 0,
            stash: Vec::new(),
            store: usage != Usage::NoStore && self.is_on(),
            read_shared: reads && self.shared.is_some(),
            cache_on: self.is_on(),
        };
        let mut firsts: HashMap<key::Key, usize> = HashMap::new();
        for (at, input) in inputs.iter().enumerate() {
            let key = prefix.key(input);
            plan.results.push(None);
            if inputs.len() > 1
                && let Some(&first) = firsts.get(&key)
            {
                plan.same.push((at, first));
                continue;
            }
            if inputs.len() > 1 {
                firsts.insert(key, at);
            }
            if reads && let Some(entry) = self.local.as_ref().and_then(|l| l.get(&key)) {
                metrics::counter!(names::CACHE_HITS, "tier" => "local").increment(1);
                plan.hits += 1;
                plan.results[at] = Some(entry);
                continue;
            }
            if !reads {
                // A bypass: this request's results are its own upstream work.
                plan.leads.push((at, self.flights.private(key)));
                continue;
            }
            match self.flights.join(key) {
                Joined::Lead(lead) => plan.leads.push((at, lead)),
                Joined::Wait(wait) => plan.waits.push((at, wait, input.clone())),
            }
        }
        if plan.read_shared
            && !plan.leads.is_empty()
            && let Some(shared) = &self.shared
        {
            let leads = &plan.leads;
            let lookup = shared.lookup(|| leads.iter().map(|(_, lead)| lead.key()).collect());
            if lookup != Lookup::Read {
                plan.read_shared = false;
                metrics::counter!(names::CACHE_READS_SKIPPED).increment(plan.leads.len() as u64);
            }
        }
        let folded = plan.same.len() + plan.waits.len();
        if folded > 0 {
            metrics::counter!(names::DEDUP_INPUTS, "where" => "flight").increment(folded as u64);
        }
        plan
    }

    /// Stores a request's new results in the LRU and the shared bucket (in a task, see
    /// [`shared`]). Called once its reply is sent: the copies, the locks and the bucket's
    /// writes (about 5 KB each at 384 dimensions) never delay a reply, nor queue ahead of one
    /// on the connection. Waiters have their results already ([`Plan::complete_leads`]).
    pub(crate) fn store(&self, stash: Stash) {
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

/// What one request's inputs need (see [`Cache::plan`]), filled in as the results come.
pub(crate) struct Plan {
    /// One per input: its result once known.
    results: Vec<Option<Entry>>,
    /// `(position, earlier position)`: an input equal to an earlier one of the request.
    same: Vec<(usize, usize)>,
    /// `(position, lead)`: the inputs this request sends upstream.
    leads: Vec<(usize, Lead)>,
    /// `(position, wait, input)`: inputs in flight for another request (the input is sent by
    /// this request if that one ends without a result).
    waits: Vec<(usize, Wait, Input)>,
    /// Inputs answered from the LRU or the shared bucket.
    hits: usize,
    /// The leads' results, to store once the reply is sent ([`Cache::store`]).
    stash: Vec<(key::Key, Entry)>,
    /// Whether results are written to the cache: it is on and the request is not `no-store`.
    store: bool,
    /// Whether the leads are looked up in the shared bucket before they are submitted.
    read_shared: bool,
    /// Whether the cache is on (the reply then carries [`embatch_protocol::headers::CACHE_HITS`]).
    cache_on: bool,
}

impl Plan {
    /// `true` when every input is answered already (LRU hits and their repeats): the reply can
    /// be sent at once, with [`Plan::answer`].
    pub(crate) fn is_answered(&self) -> bool {
        self.leads.is_empty() && self.waits.is_empty()
    }

    /// `true` when the leads are to be looked up in the shared bucket first (an async step:
    /// [`Plan::read_shared`]).
    pub(crate) fn reads_shared(&self, cache: &Cache) -> bool {
        self.read_shared
            && !self.leads.is_empty()
            && cache.shared.as_ref().is_some_and(|s| s.readable())
    }

    /// Whether some inputs are in flight for other requests (the request may have to send
    /// them itself, see [`Plan::wait`]).
    pub(crate) fn has_waits(&self) -> bool {
        !self.waits.is_empty()
    }

    /// Inputs this request sends upstream (after [`Plan::read_shared`]).
    pub(crate) fn misses(&self) -> usize {
        self.leads.len()
    }

    /// The inputs to send upstream, in order: those of the leads.
    pub(crate) fn miss_inputs(&self, inputs: &[Input]) -> Vec<Input> {
        self.leads
            .iter()
            .filter_map(|(at, _)| inputs.get(*at).cloned())
            .collect()
    }

    /// Looks the leads up in the shared bucket, all at once, each bounded by the KV timeout;
    /// the hits are answered (and handed to their waiters), the rest stay misses.
    pub(crate) async fn read_shared(&mut self, cache: &Cache) {
        let Some(shared) = &cache.shared else {
            return;
        };
        let found =
            futures::future::join_all(self.leads.iter().map(|(_, lead)| shared.get(lead.key())))
                .await;
        let leads = std::mem::take(&mut self.leads);
        let hits = found.iter().filter(|entry| entry.is_some()).count();
        shared.found(hits, found.len());
        for ((at, lead), entry) in leads.into_iter().zip(found) {
            match entry {
                Some(entry) => {
                    metrics::counter!(names::CACHE_HITS, "tier" => "shared").increment(1);
                    self.hits += 1;
                    if let Some(local) = &cache.local {
                        local.insert(lead.key(), entry.clone());
                    }
                    self.results[at] = Some(entry.clone());
                    lead.resolve(entry);
                }
                None => self.leads.push((at, lead)),
            }
        }
    }

    /// Takes the results of the leads' upstream call: `reply` is the batcher's reply body for
    /// exactly [`Plan::miss_inputs`], `lengths` their token counts when counted by a tokenizer.
    /// Hands them to every waiter, and (unless `no-store`) keeps them for [`Cache::store`]
    /// after the reply ([`Answered::stash`]).
    ///
    /// # Errors
    /// [`EmbedError::Backend`] when the body does not hold one embedding per miss.
    pub(crate) fn complete_leads(
        &mut self,
        reply: &bytes::Bytes,
        lengths: Option<&[u32]>,
    ) -> Result<(), EmbedError> {
        let embeddings = split(reply, self.leads.len())?;
        if self.cache_on {
            metrics::counter!(names::CACHE_MISSES).increment(self.leads.len() as u64);
        }
        if self.store {
            self.stash.reserve(self.leads.len());
        }
        for (i, ((at, lead), embedding)) in std::mem::take(&mut self.leads)
            .into_iter()
            .zip(embeddings)
            .enumerate()
        {
            let entry = Entry {
                embedding,
                tokens: lengths.and_then(|l| l.get(i).copied()),
            };
            if self.store {
                self.stash.push((lead.key(), entry.clone()));
            }
            self.results[at] = Some(entry.clone());
            lead.resolve(entry);
        }
        Ok(())
    }

    /// Waits, until `deadline`, for the inputs in flight for other requests; returns those
    /// whose leader ended without a result (`(position, input)`), for this request to send
    /// itself ([`Plan::complete_retried`]).
    ///
    /// # Errors
    /// [`EmbedError::DeadlineExceeded`] when `deadline` passes first.
    pub(crate) async fn wait(
        &mut self,
        deadline: Instant,
    ) -> Result<Vec<(usize, Input)>, EmbedError> {
        let waits = std::mem::take(&mut self.waits);
        let (positions, rest): (Vec<usize>, Vec<(Wait, Input)>) = waits
            .into_iter()
            .map(|(at, wait, input)| (at, (wait, input)))
            .unzip();
        let (waits, inputs): (Vec<Wait>, Vec<Input>) = rest.into_iter().unzip();
        let results = tokio::time::timeout_at(
            deadline,
            futures::future::join_all(waits.into_iter().map(Wait::result)),
        )
        .await
        .map_err(|_| {
            EmbedError::DeadlineExceeded(
                "the request's deadline passed while it waited for an equal input in flight".into(),
            )
        })?;
        let mut abandoned = Vec::new();
        for ((at, input), result) in positions.into_iter().zip(inputs).zip(results) {
            match result {
                Some(entry) => self.results[at] = Some(entry),
                None => abandoned.push((at, input)),
            }
        }
        Ok(abandoned)
    }

    /// Takes the results of inputs this request sent itself after their leader ended without
    /// one: `reply` is the batcher's reply body for exactly the inputs at `positions`.
    ///
    /// # Errors
    /// [`EmbedError::Backend`] when the body does not hold one embedding per input.
    pub(crate) fn complete_retried(
        &mut self,
        positions: &[usize],
        reply: &bytes::Bytes,
        lengths: Option<&[u32]>,
    ) -> Result<(), EmbedError> {
        let embeddings = split(reply, positions.len())?;
        for (i, (&at, embedding)) in positions.iter().zip(embeddings).enumerate() {
            self.results[at] = Some(Entry {
                embedding,
                tokens: lengths.and_then(|l| l.get(i).copied()),
            });
        }
        Ok(())
    }

    /// The reply body (TEI's `[[...],...]`, each vector as the upstream wrote it), the
    /// request's tokens when every input's are known, and the headers this plan adds
    /// ([`embatch_protocol::headers::CACHE_HITS`] while the cache is on).
    ///
    /// # Errors
    /// [`EmbedError::Backend`] when an input has no result (a bug: every path fills one).
    pub(crate) fn answer(mut self) -> Result<Answered, EmbedError> {
        for &(at, first) in &self.same {
            let copy = self.results.get(first).cloned().flatten();
            self.results[at] = copy;
        }
        let mut len = 2;
        let mut tokens = Some(0u64);
        for (i, entry) in self.results.iter().enumerate() {
            let Some(entry) = entry else {
                return Err(EmbedError::Backend(format!(
                    "missing embedding for input {i}"
                )));
            };
            len += entry.embedding.json().len() + 1;
            tokens = tokens.zip(entry.tokens).map(|(sum, n)| sum + u64::from(n));
        }
        let mut body = Vec::with_capacity(len);
        body.push(b'[');
        for (i, entry) in self.results.iter().flatten().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(entry.embedding.json());
        }
        body.push(b']');
        Ok(Answered {
            payload: bytes::Bytes::from(body),
            tokens,
            hits: self.cache_on.then_some(self.hits),
            stash: Stash(self.stash),
        })
    }
}

/// A request's reply assembled by [`Plan::answer`].
pub(crate) struct Answered {
    /// TEI's response body.
    pub payload: bytes::Bytes,
    /// The request's tokens, when every input's count is known.
    pub tokens: Option<u64>,
    /// Inputs answered from the cache, while the cache is on.
    pub hits: Option<usize>,
    /// The request's new results, for [`Cache::store`] once the reply is sent.
    pub stash: Stash,
}

/// A request's new results (key, entry), to be stored after its reply ([`Cache::store`]).
#[derive(Default)]
pub(crate) struct Stash(Vec<(key::Key, Entry)>);

/// Splits a reply body into exactly `expected` embeddings.
fn split(reply: &bytes::Bytes, expected: usize) -> Result<Vec<Embedding>, EmbedError> {
    let embeddings =
        Embedding::split_reply(reply).map_err(|e| EmbedError::Backend(e.to_string()))?;
    if embeddings.len() != expected {
        return Err(EmbedError::Backend(format!(
            "{} embeddings for {expected} inputs",
            embeddings.len()
        )));
    }
    Ok(embeddings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_control_directives_pick_the_usage() {
        assert_eq!(Usage::from_header(None), Usage::Normal);
        assert_eq!(Usage::from_header(Some("max-age=0")), Usage::Normal);
        assert_eq!(Usage::from_header(Some("No-Cache")), Usage::NoCache);
        assert_eq!(
            Usage::from_header(Some("no-cache, no-store")),
            Usage::NoStore
        );
        assert_eq!(Usage::from_header(Some("no-store")), Usage::NoStore);
    }
}
