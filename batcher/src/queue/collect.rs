//! The candidates of a batch, and the verdict on each waiting request: in arrival order, or,
//! while several tenants wait, interleaved by their served marks (see [`super::super::fair`]).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::{Entry, Group, TokenBudget};
use crate::fair::{Fair, units};
use crate::fastest::Fastest;
use crate::shape;

/// How to form the next batch.
#[derive(Debug, Clone)]
pub(crate) struct Take {
    /// The current time.
    pub now: Instant,
    /// Most inputs in the batch.
    pub batch_limit: usize,
    /// Most tokens the batch may cost, and how its cost is counted.
    pub budget: TokenBudget,
    /// `MAX_WAIT_TIME`.
    pub max_wait: Duration,
    /// Send every group now, full or not (shutdown, or an idle upstream with dispatch when idle).
    pub flush_all: bool,
    /// A group that is not full may leave when its head waited `max_wait`; otherwise only a full
    /// batch may (every partial-batch slot is taken).
    pub partial: bool,
    /// A request not yet started whose deadline comes before this instant (now + one call time)
    /// would not be wanted by the time its answer came: it is expired instead of sent.
    pub cutoff: Instant,
    /// One such request whose deadline has not yet passed may be sent anyway, to re-measure the
    /// call time (a probe).
    pub probe_allowed: bool,
    /// The fastest recent calls by size: a request whose deadline comes before now + the floor
    /// of its size is expired, probe or not (no call of that size is expected to end sooner).
    pub floor: Fastest,
}

/// What [`Queue::take`] does with a waiting request.
enum Verdict {
    /// It may go in the batch.
    Send,
    /// It would come too late by the estimate, but goes as the batch's probe.
    Probe,
    /// It cannot be answered in time: 504, no upstream work.
    Expire,
}

impl Take {
    /// The verdict on `entry`; `probing`: the batch already carries a probe. A request that
    /// started goes on; one due before the fastest recent call of its size would end expires,
    /// probe or not; one due before the cutoff expires unless it may be the probe.
    fn verdict(&self, entry: &Entry, probing: bool) -> Verdict {
        if entry.started {
            return Verdict::Send;
        }
        let hopeless = self
            .floor
            .floor(entry.waiting.len(), entry.tokens(), self.now)
            .is_some_and(|floor| self.now + floor > entry.deadline);
        if hopeless {
            Verdict::Expire
        } else if self.cutoff < entry.deadline {
            Verdict::Send
        } else if self.probe_allowed && !probing && self.now < entry.deadline {
            Verdict::Probe
        } else {
            Verdict::Expire
        }
    }
}

/// A candidate of a batch: a request and the position of the input in its `waiting`.
#[derive(Clone, Copy)]
pub(super) struct Candidate {
    pub request: u64,
    pub at: usize,
    pub tokens: u32,
}

/// A group's candidates, in the order the batch's shape takes them (the first always goes), the
/// requests found hopeless on the way (to expire) and the probe among the candidates, if any.
pub(super) struct Collected {
    pub candidates: Vec<Candidate>,
    pub expired: Vec<u64>,
    pub probe: Option<u64>,
}

/// The verdict on each request, met for the first time, and what it adds: `None` to skip it.
struct Verdicts<'a> {
    take: &'a Take,
    expired: Vec<u64>,
    probe: Option<u64>,
}

impl<'a> Verdicts<'a> {
    /// No request met yet: none expired, no probe.
    fn new(take: &'a Take) -> Self {
        Verdicts {
            take,
            expired: Vec::new(),
            probe: None,
        }
    }

    /// Whether `entry` (request `id`) may give candidates; records it as expired or the probe.
    fn admit(&mut self, id: u64, entry: &Entry) -> bool {
        match self.take.verdict(entry, self.probe.is_some()) {
            Verdict::Send => true,
            Verdict::Probe => {
                self.probe = Some(id);
                true
            }
            Verdict::Expire => {
                self.expired.push(id);
                false
            }
        }
    }
}

/// The first `window` waiting inputs of `group`, in arrival order.
pub(super) fn fifo(
    group: &Group,
    entries: &HashMap<u64, Entry>,
    take: &Take,
    window: usize,
) -> Collected {
    let mut verdicts = Verdicts::new(take);
    let mut candidates: Vec<Candidate> = Vec::new();
    for &id in &group.queue {
        if candidates.len() >= window {
            break;
        }
        let Some(entry) = entries.get(&id) else {
            continue;
        };
        if !verdicts.admit(id, entry) {
            continue;
        }
        let room = window - candidates.len();
        candidates.extend(
            entry
                .waiting
                .iter()
                .take(room)
                .enumerate()
                .map(|(at, w)| Candidate {
                    request: id,
                    at,
                    tokens: w.tokens,
                }),
        );
    }
    Collected {
        candidates,
        expired: verdicts.expired,
        probe: verdicts.probe,
    }
}

/// A tenant's lane as [`fair`] walks it.
struct Cursor<'a> {
    ids: &'a VecDeque<u64>,
    /// The request of `ids` the next input comes from, and that input's position in it.
    pos: usize,
    at: usize,
    /// The request at `pos` and its entry, once the verdict let it give candidates; `None`
    /// when the lane is done.
    current: Option<(u64, &'a Entry)>,
    /// The tenant's mark as if the candidates so far were sent, and its weight.
    served: f64,
    weight: f64,
}

impl<'a> Cursor<'a> {
    /// Moves from `pos` to the first request that may give candidates (skipping requests that
    /// left, and those the verdict expires), and sets `current`.
    fn settle(&mut self, entries: &'a HashMap<u64, Entry>, verdicts: &mut Verdicts<'_>) {
        self.current = None;
        while let Some(&id) = self.ids.get(self.pos) {
            if let Some(entry) = entries.get(&id)
                && !entry.waiting.is_empty()
                && verdicts.admit(id, entry)
            {
                self.current = Some((id, entry));
                return;
            }
            self.pos += 1;
        }
    }

    /// Takes the current input as a candidate and moves past it.
    fn take(
        &mut self,
        entries: &'a HashMap<u64, Entry>,
        verdicts: &mut Verdicts<'_>,
        cost: super::shape::BatchCost,
    ) -> Option<Candidate> {
        let (id, entry) = self.current?;
        let waiting = entry.waiting.get(self.at)?;
        let unit = units(cost, 1, u64::from(waiting.tokens));
        self.served += unit as f64 / self.weight;
        self.at += 1;
        let candidate = Candidate {
            request: id,
            at: self.at - 1,
            tokens: waiting.tokens,
        };
        if self.at >= entry.waiting.len() {
            self.pos += 1;
            self.at = 0;
            self.settle(entries, verdicts);
        }
        Some(candidate)
    }
}

/// The first `window` waiting inputs of `group` in the order its tenants' marks give: each
/// next candidate comes from the tenant whose mark (as if the candidates before were sent) is
/// lowest, ties to the older request; a tenant's own inputs in arrival order.
pub(super) fn fair(
    group: &Group,
    entries: &HashMap<u64, Entry>,
    marks: &Fair,
    take: &Take,
    window: usize,
) -> Collected {
    let mut verdicts = Verdicts::new(take);
    let mut cursors: Vec<Cursor<'_>> = Vec::with_capacity(group.lanes.len());
    for (tenant, lane) in &group.lanes {
        let (served, weight) = marks.mark(tenant);
        let mut cursor = Cursor {
            ids: &lane.ids,
            pos: 0,
            at: 0,
            current: None,
            served,
            weight: f64::from(weight.max(1)),
        };
        cursor.settle(entries, &mut verdicts);
        if cursor.current.is_some() {
            cursors.push(cursor);
        }
    }
    let mut candidates: Vec<Candidate> = Vec::with_capacity(window);
    while candidates.len() < window {
        let next = cursors
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.current.map(|(_, e)| (c.served, e.accepted, i)))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let Some((_, _, i)) = next else {
            break;
        };
        match cursors[i].take(entries, &mut verdicts, take.budget.cost) {
            Some(candidate) => candidates.push(candidate),
            None => break,
        }
        if cursors[i].current.is_none() {
            cursors.swap_remove(i);
        }
    }
    Collected {
        candidates,
        expired: verdicts.expired,
        probe: verdicts.probe,
    }
}

/// The candidates of one batch, shaped by [`shape::select`]; while tenants contend, in one run
/// per request, in the order its first candidate came, inputs ascending.
pub(super) fn pick(candidates: &[Candidate], take: &Take, contended: bool) -> Vec<Candidate> {
    let tokens: Vec<u32> = candidates.iter().map(|c| c.tokens).collect();
    let mut picked: Vec<Candidate> = shape::select(&tokens, take.batch_limit, take.budget)
        .into_iter()
        .map(|i| candidates[i])
        .collect();
    if contended {
        let mut first: HashMap<u64, usize> = HashMap::new();
        for (rank, c) in candidates.iter().enumerate() {
            first.entry(c.request).or_insert(rank);
        }
        picked.sort_by_key(|c| (first.get(&c.request).copied(), c.at));
    }
    picked
}
