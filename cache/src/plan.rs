//! One request's way through the cache: [`Cache::plan`] sorts its inputs into hits, repeats,
//! inputs in flight for other requests and misses it leads; the [`Plan`] then takes the shared
//! bucket's hits, the upstream's results and the waited-for ones, and [`Plan::answer`] joins
//! them into the reply.

use std::collections::HashMap;

use embatch_protocol::{EmbedError, EmbedOptions, Input};
use tokio::time::Instant;

use super::entry::Entry;
use super::flight::{Joined, Lead, Wait};
use super::key;
use super::meters::METERS;
use super::shared::Lookup;
use super::{Cache, Usage};
use embatch_batcher::Embedding;

impl Cache {
    /// What each input of a request of the cache scope `scope` (its tenant's, see
    /// [`key`]) needs (see the module docs): LRU hits are filled in, keys no one computes are led
    /// by this request, the others waited for. Keys, and so hits and inputs in flight, never
    /// cross scopes. Cheap and synchronous: a hash per input and a lock or two.
    pub fn plan(
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
                METERS.hits_local.increment(1);
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
                METERS.reads_skipped.increment(plan.leads.len() as u64);
            }
        }
        let folded = plan.same.len() + plan.waits.len();
        if folded > 0 {
            metrics::counter!(embatch_batcher::names::DEDUP_INPUTS, "where" => "flight")
                .increment(folded as u64);
        }
        plan
    }
}

/// What one request's inputs need (see [`Cache::plan`]), filled in as the results come.
///
/// In order: [`Plan::read_shared`] when [`Plan::reads_shared`]; the [`Plan::miss_inputs`] to the
/// batcher and its reply to [`Plan::complete_leads`]; when [`Plan::has_waits`], [`Plan::wait`]
/// and the abandoned inputs' reply to [`Plan::complete_retried`]; then [`Plan::answer`], and
/// [`Cache::store`] with its [`Answered::stash`] once the reply is sent. A plan dropped early
/// releases its leads: their waiters send those inputs themselves.
pub struct Plan {
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
    pub fn is_answered(&self) -> bool {
        self.leads.is_empty() && self.waits.is_empty()
    }

    /// `true` when the leads are to be looked up in the shared bucket first (an async step:
    /// [`Plan::read_shared`]).
    pub fn reads_shared(&self, cache: &Cache) -> bool {
        self.read_shared
            && !self.leads.is_empty()
            && cache.shared.as_ref().is_some_and(|s| s.readable())
    }

    /// Whether some inputs are in flight for other requests (the request may have to send
    /// them itself, see [`Plan::wait`]).
    pub fn has_waits(&self) -> bool {
        !self.waits.is_empty()
    }

    /// Inputs this request sends upstream (after [`Plan::read_shared`]).
    pub fn misses(&self) -> usize {
        self.leads.len()
    }

    /// The inputs to send upstream, in order: those of the leads.
    pub fn miss_inputs(&self, inputs: &[Input]) -> Vec<Input> {
        self.leads
            .iter()
            .filter_map(|(at, _)| inputs.get(*at).cloned())
            .collect()
    }

    /// Looks the leads up in the shared bucket, all at once, each bounded by the KV timeout;
    /// the hits are answered (and handed to their waiters), the rest stay misses.
    pub async fn read_shared(&mut self, cache: &Cache) {
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
                    METERS.hits_shared.increment(1);
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

    /// Takes the results of the leads' upstream call: `embeddings` are the batcher's answer for
    /// exactly [`Plan::miss_inputs`], in order, `lengths` their token counts when counted by a
    /// tokenizer. Hands them to every waiter, and (unless `no-store`) keeps them for
    /// [`Cache::store`] after the reply ([`Answered::stash`]).
    ///
    /// # Errors
    /// [`EmbedError::Backend`] when there is not one embedding per miss.
    pub fn complete_leads(
        &mut self,
        embeddings: Vec<Embedding>,
        lengths: Option<&[u32]>,
    ) -> Result<(), EmbedError> {
        expect_count(&embeddings, self.leads.len())?;
        if self.cache_on {
            METERS.misses.increment(self.leads.len() as u64);
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
    pub async fn wait(&mut self, deadline: Instant) -> Result<Vec<(usize, Input)>, EmbedError> {
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
    /// one: `embeddings` are the batcher's answer for exactly the inputs at `positions`.
    ///
    /// # Errors
    /// [`EmbedError::Backend`] when there is not one embedding per input.
    pub fn complete_retried(
        &mut self,
        positions: &[usize],
        embeddings: Vec<Embedding>,
        lengths: Option<&[u32]>,
    ) -> Result<(), EmbedError> {
        expect_count(&embeddings, positions.len())?;
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
    pub fn answer(mut self) -> Result<Answered, EmbedError> {
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
pub struct Answered {
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
pub struct Stash(pub(crate) Vec<(key::Key, Entry)>);

/// Checks that the batcher answered exactly `expected` embeddings (it answers one per input
/// submitted; a mismatch is a bug, answered as a backend error rather than a wrong slice).
fn expect_count(embeddings: &[Embedding], expected: usize) -> Result<(), EmbedError> {
    if embeddings.len() != expected {
        return Err(EmbedError::Backend(format!(
            "{} embeddings for {expected} inputs",
            embeddings.len()
        )));
    }
    Ok(())
}
