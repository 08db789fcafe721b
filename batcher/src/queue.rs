//! The queue: requests grouped by options, due times and batch formation, shared between
//! tenants by weight ([`super::fair`]).
//!
//! Plain data: no channels, no metrics, no clock reads (every function takes `now`).
//!
//! A queue holding one tenant's inputs forms batches in arrival order, exactly as without
//! tenants. While several tenants' inputs wait, each group's candidates are the tenants' inputs
//! interleaved by their served marks (`collect::fair`), so the most owed tenant's oldest input
//! heads the batch; the group whose most owed tenant is the most owed goes first among those
//! due; and when the groups due hold other tenants only, a group holding the most owed
//! tenant's inputs that waited `MAX_WAIT_TIME` leaves instead, even partial, into any free slot
//! (it would be passed over while other tenants' full batches take every slot).

mod collect;
mod group;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use embatch_protocol::{EmbedOptions, Input};
use tokio::time::Instant;

use super::fair::{Ahead, Fair, Share, units};
use super::shape::{self, MAX_WINDOW, TokenBudget, WINDOW_BATCHES};
pub(super) use collect::Take;
use collect::{Collected, pick};
use group::{Group, cut, left_group};

/// tokio's timer fires on whole-millisecond ticks, rounding a deadline up by as much as 1 ms. The
/// flush timer aims this much early so that a batch leaves no later than `max_wait` after its
/// first request (it may leave up to this much before).
pub(super) const TIMER_SLACK: Duration = Duration::from_micros(999);

/// One input not yet sent upstream.
struct Waiting {
    /// Its index in the request.
    index: usize,
    input: Input,
    /// Its token count.
    tokens: u32,
}

/// A request's inputs not yet sent upstream.
struct Entry {
    /// Inputs not yet sent upstream, in the request's order.
    waiting: Vec<Waiting>,
    /// Some of its inputs were sent upstream.
    started: bool,
    options: EmbedOptions,
    /// Its tenant's share.
    share: Share,
    accepted: Instant,
    deadline: Instant,
}

impl Entry {
    fn tokens(&self) -> u64 {
        self.waiting.iter().map(|w| u64::from(w.tokens)).sum()
    }
}

/// One request's inputs inside a batch: a contiguous run of the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Segment {
    /// The request's id.
    pub request: u64,
    /// Index in the request of each input of the run, ascending (not necessarily consecutive:
    /// a request's inputs may be shaped into different batches by length).
    pub indices: Vec<usize>,
    /// Position in the batch of the run's first input.
    pub at: usize,
    /// Inputs (`indices.len()`).
    pub len: usize,
    /// The request's cache scope: equal inputs are sent once per scope (see `unique`).
    pub scope: Arc<str>,
}

/// A request as the queue takes it.
pub(super) struct Arrival {
    pub inputs: Vec<Input>,
    /// Token count of each input.
    pub lengths: Vec<u32>,
    pub options: EmbedOptions,
    /// Its tenant's share of the upstream.
    pub share: Share,
    pub accepted: Instant,
    pub deadline: Instant,
}

/// A batch taken from the queue (possibly empty when every candidate had expired).
#[derive(Debug)]
pub(super) struct Formed {
    /// Options of every input of the batch.
    pub options: EmbedOptions,
    /// The inputs, in segment order.
    pub inputs: Vec<Input>,
    /// Token count of each input of `inputs`.
    pub lengths: Vec<u32>,
    /// Which request each run of `inputs` belongs to.
    pub segments: Vec<Segment>,
    /// Requests removed because of the cutoff, with their inputs and tokens.
    pub expired: Vec<(u64, Removed)>,
    /// The batch carries a request sent despite the cutoff.
    pub probe: bool,
}

/// What left the queue: inputs and their tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Removed {
    pub inputs: usize,
    pub tokens: u64,
}

impl Removed {
    /// What `entry` still has waiting: all of it leaves at once.
    fn of(entry: &Entry) -> Removed {
        Removed {
            inputs: entry.waiting.len(),
            tokens: entry.tokens(),
        }
    }
}

/// All requests with inputs not yet sent upstream.
#[derive(Default)]
pub(super) struct Queue {
    entries: HashMap<u64, Entry>,
    groups: HashMap<EmbedOptions, Group>,
    inputs: usize,
    /// Every waiting request's deadline, earliest on top. Entries of requests that left the
    /// queue otherwise (sent, cancelled, failed) are dropped when they reach the top, or all at
    /// once when they outnumber the waiting requests (see [`Queue::push`]).
    deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
    /// The tenants' served marks.
    fair: Fair,
}

/// The deadline index is rebuilt when it holds more than this many entries beyond twice the
/// waiting requests (amortised O(1) per request).
const DEADLINES_SLACK: usize = 1024;

impl Queue {
    /// Inputs not yet sent upstream.
    pub fn inputs(&self) -> usize {
        self.inputs
    }

    /// Appends a request to the group of its options (and to its tenant's lane there).
    pub fn push(&mut self, id: u64, arrival: Arrival) {
        let Arrival {
            inputs,
            lengths,
            options,
            share,
            accepted,
            deadline,
        } = arrival;
        let n = inputs.len();
        if self.deadlines.len() >= 2 * self.entries.len() + DEADLINES_SLACK {
            let entries = &self.entries;
            self.deadlines
                .retain(|Reverse((_, id))| entries.contains_key(id));
        }
        self.deadlines.push(Reverse((deadline, id)));
        let waiting: Vec<Waiting> = inputs
            .into_iter()
            .enumerate()
            .map(|(index, input)| Waiting {
                index,
                input,
                tokens: lengths.get(index).copied().unwrap_or(1),
            })
            .collect();
        let entry = Entry {
            waiting,
            started: false,
            options,
            share,
            accepted,
            deadline,
        };
        let tokens = entry.tokens();
        self.fair.arrive(&entry.share, n, tokens);
        let group = self.groups.entry(entry.options.clone()).or_default();
        group.queue.push_back(id);
        let lane = group.lanes.entry(entry.share.tenant.clone()).or_default();
        lane.ids.push_back(id);
        lane.inputs += n;
        group.inputs += n;
        group.tokens += tokens;
        self.inputs += n;
        self.entries.insert(id, entry);
    }

    /// Removes what is left of a request (cancelled, failed by another of its calls, or shed for
    /// a tenant under its share). Returns the inputs and tokens removed.
    pub fn remove(&mut self, id: u64) -> Removed {
        let Some(entry) = self.entries.remove(&id) else {
            return Removed::default();
        };
        let left = Removed::of(&entry);
        if let Some(group) = self.groups.get_mut(&entry.options) {
            let counts = (&mut self.inputs, &mut self.fair);
            left_group(group, counts, &entry.share.tenant, left);
            // Its id stays in the group's order until it reaches the front: no scan.
            group.settle(&self.entries);
            if group.queue.is_empty() {
                self.groups.remove(&entry.options);
            }
        }
        left
    }

    /// The earliest deadline of a request with inputs still waiting (`None`: nothing waits).
    /// Drops the index entries of requests that left the queue on the way.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(&Reverse((deadline, id))) = self.deadlines.peek() {
            if self.entries.contains_key(&id) {
                return Some(deadline);
            }
            self.deadlines.pop();
        }
        None
    }

    /// Removes every waiting request whose deadline is at or before `now`, earliest first (also
    /// one whose earlier inputs were already sent). Returns their ids with what was removed.
    pub fn expire(&mut self, now: Instant) -> Vec<(u64, Removed)> {
        let mut expired = Vec::new();
        while let Some(&Reverse((deadline, id))) = self.deadlines.peek() {
            if deadline > now {
                break;
            }
            self.deadlines.pop();
            if self.entries.contains_key(&id) {
                expired.push((id, self.remove(id)));
            }
        }
        expired
    }

    /// When the oldest group becomes due by `max_wait` (`None`: nothing waits).
    pub fn next_due(&self, max_wait: Duration) -> Option<Instant> {
        self.groups
            .values()
            .filter_map(|g| self.entries.get(g.queue.front()?))
            .map(|e| {
                (e.accepted + max_wait)
                    .checked_sub(TIMER_SLACK)
                    .unwrap_or(e.accepted)
            })
            .min()
    }

    /// The work a new request of `share` asking `units` units would find ahead of it and beside
    /// it under the fair share; `None` when no other tenant waits (see [`Fair::ahead`]).
    pub fn ahead(&self, share: &Share, units: u64, cost: shape::BatchCost) -> Option<Ahead> {
        self.fair.ahead(share, units, cost)
    }

    /// The newest request of `tenant` none of whose inputs was sent yet (what sheds first when
    /// the tenant is furthest over its share).
    pub fn newest_unstarted(&self, tenant: &str) -> Option<u64> {
        self.groups
            .values()
            .filter_map(|group| {
                let lane = group.lanes.get(tenant)?;
                lane.ids.iter().rev().find_map(|id| {
                    let entry = self.entries.get(id)?;
                    (!entry.started).then_some((entry.accepted, *id))
                })
            })
            .max()
            .map(|(_, id)| id)
    }

    /// The group the next batch comes from, `None` when none is due: among the groups that are
    /// due (holding a full batch, any with `flush_all`, or with `partial` one whose head waited
    /// `max_wait`), the one whose most owed tenant is the most owed (by tenants' served marks;
    /// all equal with one tenant), then the oldest head. While several tenants wait and the
    /// groups due hold other tenants only, a group holding the most owed tenant whose head
    /// waited `max_wait` goes instead.
    fn due_group(&self, take: &Take, contended: bool) -> Option<EmbedOptions> {
        let mut best: Option<(f64, Instant, &EmbedOptions)> = None;
        let mut owed_waiting: Option<(Instant, &EmbedOptions)> = None;
        let owed = contended.then(|| self.fair.most_owed()).flatten();
        for (key, g) in &self.groups {
            let Some(head) = g.queue.front().and_then(|id| self.entries.get(id)) else {
                continue;
            };
            let rank = if contended { g.rank(&self.fair) } else { 0.0 };
            let waited = take.now + TIMER_SLACK >= head.accepted + take.max_wait;
            let ready = take.flush_all
                || g.inputs >= take.batch_limit
                || g.tokens >= take.budget.max_batch_tokens
                || (take.partial && waited);
            if ready {
                let better = best.is_none_or(|(r, at, _)| {
                    rank.total_cmp(&r).then(head.accepted.cmp(&at)).is_lt()
                });
                if better {
                    best = Some((rank, head.accepted, key));
                }
            } else if waited
                && owed.is_some_and(|o| rank <= o)
                && owed_waiting.is_none_or(|(at, _)| head.accepted < at)
            {
                owed_waiting = Some((head.accepted, key));
            }
        }
        // Only when another tenant's group would go instead: with none due, the owed tenant's
        // partial group waits as any partial group does.
        let passed_over = matches!((owed, best), (Some(o), Some((r, _, _))) if r > o);
        match (best, owed_waiting) {
            (_, Some((_, key))) if passed_over => Some(key.clone()),
            (Some((_, _, key)), _) => Some(key.clone()),
            (None, _) => None,
        }
    }

    /// Takes one batch from the group [`Queue::due_group`] picks. The batch holds the group's
    /// first candidate, its oldest waiting input or, while several tenants wait, the most owed
    /// tenant's oldest, and is shaped by [`shape::select`] among the group's first
    /// `WINDOW_BATCHES × batch_limit` candidates (in arrival order, or interleaved by the
    /// tenants' marks: `collect`). Every input sent is charged to its tenant. `None` when no
    /// group is due.
    pub fn take(&mut self, take: Take) -> Option<Formed> {
        let contended = self.fair.contended();
        let key = self.due_group(&take, contended)?;
        let window = take
            .batch_limit
            .saturating_mul(WINDOW_BATCHES)
            .clamp(1, MAX_WINDOW);
        let group = self.groups.get_mut(&key)?;
        let Collected {
            candidates,
            expired,
            probe,
        } = if contended {
            collect::fair(group, &self.entries, &self.fair, &take, window)
        } else {
            collect::fifo(group, &self.entries, &take, window)
        };
        let mut formed = Formed {
            options: key.clone(),
            inputs: Vec::new(),
            lengths: Vec::new(),
            segments: Vec::new(),
            expired: Vec::with_capacity(expired.len()),
            probe: false,
        };
        for id in expired {
            if let Some(entry) = self.entries.remove(&id) {
                let left = Removed::of(&entry);
                let counts = (&mut self.inputs, &mut self.fair);
                left_group(group, counts, &entry.share.tenant, left);
                formed.expired.push((id, left));
            }
        }
        if let Some(head) = candidates
            .first()
            .and_then(|c| self.entries.get(&c.request))
        {
            self.fair.mark_head(&head.share.tenant);
        }
        let picked = pick(&candidates, &take, contended);
        // What left, by tenant: charged and counted once per tenant, not per request.
        let mut sent: Vec<(Arc<str>, Removed)> = Vec::with_capacity(1);
        let mut picked = picked.into_iter().peekable();
        while let Some(first) = picked.next() {
            let mut ats = vec![first.at];
            while let Some(next) = picked.next_if(|c| c.request == first.request) {
                ats.push(next.at);
            }
            let Some(entry) = self.entries.get_mut(&first.request) else {
                continue;
            };
            formed.probe |= probe == Some(first.request);
            let (segment, taken) = cut(entry, first.request, &ats, &mut formed);
            add_sent(&mut sent, &entry.share.tenant, segment.len, taken);
            if entry.waiting.is_empty() {
                self.entries.remove(&first.request);
            }
            formed.segments.push(segment);
        }
        for (tenant, left) in sent {
            self.fair
                .charge(&tenant, units(take.budget.cost, left.inputs, left.tokens));
            left_group(group, (&mut self.inputs, &mut self.fair), &tenant, left);
        }
        group.settle(&self.entries);
        if group.queue.is_empty() {
            self.groups.remove(&key);
        }
        Some(formed)
    }

    /// Fills `formed` (a batch taken from another queue) with this queue's waiting inputs of the
    /// same options, oldest first, while the batch stays within `batch_limit` inputs and
    /// `budget` (counted over the whole batch, the inputs already in it included). Stops at the
    /// first input that does not fit, so this queue keeps its order. Returns the inputs and
    /// tokens added.
    pub fn top_up(
        &mut self,
        formed: &mut Formed,
        batch_limit: usize,
        budget: TokenBudget,
    ) -> Removed {
        let mut added = Removed::default();
        let Some(group) = self.groups.get_mut(&formed.options) else {
            return added;
        };
        let mut longest = formed.lengths.iter().copied().max().unwrap_or(0);
        let mut sum: u64 = formed.lengths.iter().map(|&t| u64::from(t)).sum();
        let ids: Vec<u64> = group.queue.iter().copied().collect();
        let mut full = false;
        for id in ids {
            if full || formed.inputs.len() >= batch_limit {
                break;
            }
            let Some(entry) = self.entries.get_mut(&id) else {
                continue;
            };
            let mut segment = Segment {
                request: id,
                indices: Vec::new(),
                at: formed.inputs.len(),
                len: 0,
                scope: entry.share.scope.clone(),
            };
            let mut taken = 0;
            let mut tokens = 0;
            for w in &mut entry.waiting {
                let n = formed.inputs.len() + 1;
                let cost = budget
                    .cost
                    .of(n, longest.max(w.tokens), sum + u64::from(w.tokens));
                if n > batch_limit || cost > budget.max_batch_tokens {
                    full = true;
                    break;
                }
                longest = longest.max(w.tokens);
                sum += u64::from(w.tokens);
                segment.indices.push(w.index);
                formed
                    .inputs
                    .push(std::mem::replace(&mut w.input, Input::Ids(Vec::new())));
                formed.lengths.push(w.tokens);
                tokens += u64::from(w.tokens);
                taken += 1;
            }
            if taken == 0 {
                break;
            }
            entry.waiting.drain(..taken);
            entry.started = true;
            segment.len = taken;
            let tenant = entry.share.tenant.clone();
            if entry.waiting.is_empty() {
                self.entries.remove(&id);
            }
            let left = Removed {
                inputs: taken,
                tokens,
            };
            added.inputs += taken;
            added.tokens += tokens;
            self.fair
                .charge(&tenant, units(budget.cost, left.inputs, left.tokens));
            left_group(group, (&mut self.inputs, &mut self.fair), &tenant, left);
            formed.segments.push(segment);
        }
        group.settle(&self.entries);
        if group.queue.is_empty() {
            self.groups.remove(&formed.options);
        }
        added
    }
}

/// Adds `inputs` inputs of `tokens` tokens to what left for `tenant`.
fn add_sent(sent: &mut Vec<(Arc<str>, Removed)>, tenant: &Arc<str>, inputs: usize, tokens: u64) {
    match sent.iter_mut().find(|(t, _)| t == tenant) {
        Some((_, left)) => {
            left.inputs += inputs;
            left.tokens += tokens;
        }
        None => sent.push((tenant.clone(), Removed { inputs, tokens })),
    }
}

#[cfg(test)]
mod tests;
