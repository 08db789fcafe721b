//! The queue: requests grouped by options, due times and batch formation.
//!
//! Plain data: no channels, no metrics, no clock reads (every function takes `now`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::time::Duration;

use embatch_protocol::{EmbedOptions, Input};
use tokio::time::Instant;

use super::fastest::Fastest;
use super::shape::{self, MAX_WINDOW, TokenBudget, WINDOW_BATCHES};

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
    accepted: Instant,
    deadline: Instant,
}

impl Entry {
    fn tokens(&self) -> u64 {
        self.waiting.iter().map(|w| u64::from(w.tokens)).sum()
    }
}

/// Requests sharing one set of options, oldest first.
#[derive(Default)]
struct Group {
    queue: VecDeque<u64>,
    /// Inputs of this group not yet sent upstream.
    inputs: usize,
    /// Their tokens.
    tokens: u64,
}

impl Group {
    /// Drops the ids of requests that left the queue from the front, so the front is always a
    /// waiting request (its age makes the group due) or the group is empty.
    fn settle(&mut self, entries: &HashMap<u64, Entry>) {
        while self
            .queue
            .front()
            .is_some_and(|id| !entries.contains_key(id))
        {
            self.queue.pop_front();
        }
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
}

/// How to form the next batch.
#[derive(Debug, Clone, Copy)]
pub(super) struct Take {
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
}

/// The deadline index is rebuilt when it holds more than this many entries beyond twice the
/// waiting requests (amortised O(1) per request).
const DEADLINES_SLACK: usize = 1024;

/// A candidate of [`Queue::take`]: a request and the position of the input in its `waiting`.
#[derive(Clone, Copy)]
struct Candidate {
    request: u64,
    at: usize,
    tokens: u32,
}

impl Queue {
    /// Inputs not yet sent upstream.
    pub fn inputs(&self) -> usize {
        self.inputs
    }

    /// Appends a request, with the token count of each input, to the group of its options.
    pub fn push(
        &mut self,
        id: u64,
        inputs: Vec<Input>,
        lengths: &[u32],
        options: EmbedOptions,
        accepted: Instant,
        deadline: Instant,
    ) {
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
            accepted,
            deadline,
        };
        let tokens = entry.tokens();
        let group = self.groups.entry(entry.options.clone()).or_default();
        group.queue.push_back(id);
        group.inputs += n;
        group.tokens += tokens;
        self.inputs += n;
        self.entries.insert(id, entry);
    }

    /// Removes what is left of a request (cancelled, or failed by another of its calls).
    /// Returns the inputs and tokens removed.
    pub fn remove(&mut self, id: u64) -> Removed {
        let Some(entry) = self.entries.remove(&id) else {
            return Removed::default();
        };
        let left = Removed {
            inputs: entry.waiting.len(),
            tokens: entry.tokens(),
        };
        self.inputs -= left.inputs;
        if let Some(group) = self.groups.get_mut(&entry.options) {
            group.inputs -= left.inputs;
            group.tokens -= left.tokens;
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

    /// Takes one batch from the oldest due group: one holding a full batch (`batch_limit`
    /// inputs, or tokens enough to fill the budget), any with `flush_all`, or, with `partial`,
    /// one whose head waited `max_wait`. The batch holds the group's oldest waiting input and
    /// is shaped by [`shape::select`] among the group's first
    /// `WINDOW_BATCHES × batch_limit` waiting inputs. `None` when no group is due.
    pub fn take(&mut self, take: Take) -> Option<Formed> {
        let key = self
            .groups
            .iter()
            .filter_map(|(key, g)| {
                let head = self.entries.get(g.queue.front()?)?;
                let ready = take.flush_all
                    || g.inputs >= take.batch_limit
                    || g.tokens >= take.budget.max_batch_tokens
                    || (take.partial && take.now + TIMER_SLACK >= head.accepted + take.max_wait);
                ready.then_some((head.accepted, key))
            })
            .min_by_key(|(accepted, _)| *accepted)
            .map(|(_, key)| key.clone())?;
        let mut formed = Formed {
            options: key.clone(),
            inputs: Vec::new(),
            lengths: Vec::new(),
            segments: Vec::new(),
            expired: Vec::new(),
            probe: false,
        };
        let window = take
            .batch_limit
            .saturating_mul(WINDOW_BATCHES)
            .clamp(1, MAX_WINDOW);
        let mut probe: Option<u64> = None;
        let mut candidates: Vec<Candidate> = Vec::new();
        let group = self.groups.get_mut(&key)?;
        let mut expired = Removed::default();
        for &id in &group.queue {
            if candidates.len() >= window {
                break;
            }
            let Some(entry) = self.entries.get(&id) else {
                continue;
            };
            match take.verdict(entry, probe.is_some()) {
                Verdict::Send => {}
                Verdict::Probe => probe = Some(id),
                Verdict::Expire => {
                    let left = Removed {
                        inputs: entry.waiting.len(),
                        tokens: entry.tokens(),
                    };
                    expired.inputs += left.inputs;
                    expired.tokens += left.tokens;
                    formed.expired.push((id, left));
                    continue;
                }
            }
            let room = window - candidates.len();
            candidates.extend(entry.waiting.iter().take(room).enumerate().map(|(at, w)| {
                Candidate {
                    request: id,
                    at,
                    tokens: w.tokens,
                }
            }));
        }
        for (id, _) in &formed.expired {
            self.entries.remove(id);
        }
        group.inputs -= expired.inputs;
        group.tokens -= expired.tokens;
        self.inputs -= expired.inputs;
        let tokens: Vec<u32> = candidates.iter().map(|c| c.tokens).collect();
        let mut picked = shape::select(&tokens, take.batch_limit, take.budget)
            .into_iter()
            .map(|i| candidates[i])
            .peekable();
        // `picked` is in candidate order: by request in queue order, then by input.
        while let Some(first) = picked.next() {
            let mut ats = vec![first.at];
            while let Some(next) = picked.next_if(|c| c.request == first.request) {
                ats.push(next.at);
            }
            let Some(entry) = self.entries.get_mut(&first.request) else {
                continue;
            };
            formed.probe |= probe == Some(first.request);
            entry.started = true;
            let mut segment = Segment {
                request: first.request,
                indices: Vec::with_capacity(ats.len()),
                at: formed.inputs.len(),
                len: ats.len(),
            };
            let mut taken = 0u64;
            let mut next = ats.iter().copied().peekable();
            let mut position = 0;
            entry.waiting.retain_mut(|w| {
                let pick = next.next_if_eq(&position).is_some();
                position += 1;
                if pick {
                    segment.indices.push(w.index);
                    formed
                        .inputs
                        .push(std::mem::replace(&mut w.input, Input::Ids(Vec::new())));
                    formed.lengths.push(w.tokens);
                    taken += u64::from(w.tokens);
                }
                !pick
            });
            group.inputs -= segment.len;
            group.tokens -= taken;
            self.inputs -= segment.len;
            if entry.waiting.is_empty() {
                self.entries.remove(&first.request);
            }
            formed.segments.push(segment);
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
            };
            let mut taken = 0;
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
                added.tokens += u64::from(w.tokens);
                taken += 1;
            }
            if taken == 0 {
                break;
            }
            entry.waiting.drain(..taken);
            entry.started = true;
            segment.len = taken;
            added.inputs += taken;
            group.inputs -= taken;
            if entry.waiting.is_empty() {
                self.entries.remove(&id);
            }
            formed.segments.push(segment);
        }
        group.tokens -= added.tokens;
        self.inputs -= added.inputs;
        group.settle(&self.entries);
        if group.queue.is_empty() {
            self.groups.remove(&formed.options);
        }
        added
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pushes a request whose inputs all count 1 token (count batching).
    fn push(
        queue: &mut Queue,
        id: u64,
        inputs: Vec<Input>,
        options: EmbedOptions,
        accepted: Instant,
        deadline: Instant,
    ) {
        let lengths = vec![1; inputs.len()];
        queue.push(id, inputs, &lengths, options, accepted, deadline);
    }

    fn take(now: Instant, batch_limit: usize) -> Take {
        Take {
            now,
            batch_limit,
            budget: TokenBudget::default(),
            max_wait: Duration::from_millis(5),
            flush_all: false,
            partial: true,
            cutoff: now,
            probe_allowed: false,
            floor: Fastest::default(),
        }
    }

    fn texts(prefix: &str, n: usize) -> Vec<Input> {
        (0..n)
            .map(|i| Input::from(format!("{prefix}{i}")))
            .collect()
    }

    #[test]
    fn a_group_is_due_when_full_or_when_its_head_waited_max_wait() {
        let t0 = Instant::now();
        let mut queue = Queue::default();
        push(
            &mut queue,
            1,
            texts("a", 2),
            EmbedOptions::default(),
            t0,
            t0 + Duration::from_secs(9),
        );
        assert!(queue.take(take(t0, 4)).is_none(), "neither full nor due");
        assert_eq!(
            queue.next_due(Duration::from_millis(5)),
            Some(t0 + Duration::from_millis(5) - TIMER_SLACK)
        );
        let formed = queue
            .take(take(t0 + Duration::from_millis(5), 4))
            .expect("due");
        assert_eq!(formed.inputs, texts("a", 2));
        assert_eq!(queue.inputs(), 0);
        assert_eq!(queue.next_due(Duration::from_millis(5)), None);
    }

    #[test]
    fn a_large_request_is_split_into_segments_and_options_never_mix() {
        let t0 = Instant::now();
        let far = t0 + Duration::from_secs(9);
        let other = EmbedOptions {
            normalize: false,
            ..EmbedOptions::default()
        };
        let mut queue = Queue::default();
        push(
            &mut queue,
            1,
            texts("a", 3),
            EmbedOptions::default(),
            t0,
            far,
        );
        push(&mut queue, 2, texts("b", 1), other.clone(), t0, far);
        push(
            &mut queue,
            3,
            texts("c", 3),
            EmbedOptions::default(),
            t0,
            far,
        );
        let first = queue.take(take(t0, 4)).expect("full group");
        assert_eq!(first.options, EmbedOptions::default());
        assert_eq!(first.inputs, ["a0", "a1", "a2", "c0"]);
        assert_eq!(
            first.segments,
            [
                Segment {
                    request: 1,
                    indices: vec![0, 1, 2],
                    at: 0,
                    len: 3
                },
                Segment {
                    request: 3,
                    indices: vec![0],
                    at: 3,
                    len: 1
                },
            ]
        );
        let all = Take {
            flush_all: true,
            ..take(t0, 4)
        };
        let mut rest = [
            queue.take(all).expect("flush"),
            queue.take(all).expect("flush"),
        ];
        rest.sort_by_key(|f| f.inputs.len());
        assert_eq!(rest[0].options, other);
        assert_eq!(rest[1].inputs, ["c1", "c2"]);
        assert_eq!(
            rest[1].segments[0],
            Segment {
                request: 3,
                indices: vec![1, 2],
                at: 0,
                len: 2
            }
        );
        assert!(queue.take(all).is_none());
    }

    #[test]
    fn requests_that_cannot_finish_in_time_expire_unless_one_may_probe() {
        let t0 = Instant::now();
        let mut queue = Queue::default();
        for id in 0..3 {
            push(
                &mut queue,
                id,
                texts("x", 1),
                EmbedOptions::default(),
                t0,
                t0 + Duration::from_millis(50),
            );
        }
        push(
            &mut queue,
            3,
            texts("ok", 1),
            EmbedOptions::default(),
            t0,
            t0 + Duration::from_secs(9),
        );
        let formed = queue
            .take(Take {
                cutoff: t0 + Duration::from_millis(100),
                probe_allowed: true,
                flush_all: true,
                ..take(t0, 8)
            })
            .expect("due");
        assert!(formed.probe);
        assert_eq!(
            formed
                .segments
                .iter()
                .map(|s| s.request)
                .collect::<Vec<_>>(),
            [0, 3]
        );
        assert_eq!(
            formed.expired,
            [
                (
                    1,
                    Removed {
                        inputs: 1,
                        tokens: 1
                    }
                ),
                (
                    2,
                    Removed {
                        inputs: 1,
                        tokens: 1
                    }
                )
            ]
        );
        assert_eq!(queue.inputs(), 0);
    }

    #[test]
    fn a_request_due_before_the_fastest_call_expires_even_when_a_probe_is_allowed() {
        let t0 = Instant::now();
        let mut queue = Queue::default();
        // Due in 5 ms and in 50 ms; the fastest one-input call lately took 22 ms.
        for (id, due) in [(0, 5), (1, 50)] {
            push(
                &mut queue,
                id,
                texts("x", 1),
                EmbedOptions::default(),
                t0,
                t0 + Duration::from_millis(due),
            );
        }
        let mut floor = Fastest::default();
        floor.record(Duration::from_millis(22), 1, 1, t0);
        floor.record(Duration::from_millis(23), 1, 1, t0);
        let formed = queue
            .take(Take {
                probe_allowed: true,
                flush_all: true,
                floor,
                ..take(t0, 8)
            })
            .expect("due");
        assert!(!formed.probe, "the hopeless request is no probe");
        assert_eq!(
            formed
                .segments
                .iter()
                .map(|s| s.request)
                .collect::<Vec<_>>(),
            [1]
        );
        assert_eq!(
            formed.expired,
            [(
                0,
                Removed {
                    inputs: 1,
                    tokens: 1
                }
            )]
        );
    }

    #[test]
    fn expiry_follows_the_earliest_deadline_and_skips_requests_that_left() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut queue = Queue::default();
        push(
            &mut queue,
            1,
            texts("a", 1),
            EmbedOptions::default(),
            t0,
            at(300),
        );
        push(
            &mut queue,
            2,
            texts("b", 2),
            EmbedOptions::default(),
            t0,
            at(100),
        );
        push(
            &mut queue,
            3,
            texts("c", 1),
            EmbedOptions::default(),
            t0,
            at(200),
        );
        assert_eq!(queue.next_deadline(), Some(at(100)));
        assert_eq!(queue.remove(2).inputs, 2);
        assert_eq!(
            queue.next_deadline(),
            Some(at(200)),
            "a removed request is skipped"
        );
        assert!(queue.expire(at(199)).is_empty());
        assert_eq!(
            queue
                .expire(at(300))
                .iter()
                .map(|(id, removed)| (*id, removed.inputs))
                .collect::<Vec<_>>(),
            [(3, 1), (1, 1)]
        );
        assert_eq!(queue.inputs(), 0);
        assert_eq!(queue.next_deadline(), None);
        assert!(
            queue
                .take(Take {
                    flush_all: true,
                    ..take(t0, 8)
                })
                .is_none()
        );
    }

    #[test]
    fn a_group_whose_head_left_is_due_by_its_next_request() {
        let t0 = Instant::now();
        let far = t0 + Duration::from_secs(9);
        let mut queue = Queue::default();
        push(
            &mut queue,
            1,
            texts("a", 1),
            EmbedOptions::default(),
            t0,
            far,
        );
        let later = t0 + Duration::from_millis(3);
        push(
            &mut queue,
            2,
            texts("b", 1),
            EmbedOptions::default(),
            later,
            far,
        );
        queue.remove(1);
        assert_eq!(
            queue.next_due(Duration::from_millis(5)),
            Some(later + Duration::from_millis(5) - TIMER_SLACK)
        );
        assert!(queue.take(take(t0 + Duration::from_millis(5), 8)).is_none());
        let formed = queue
            .take(take(later + Duration::from_millis(5), 8))
            .expect("due by its own age");
        assert_eq!(formed.inputs, ["b0"]);
    }

    #[test]
    fn removing_a_request_frees_its_inputs_and_keeps_the_rest_in_order() {
        let t0 = Instant::now();
        let far = t0 + Duration::from_secs(9);
        let mut queue = Queue::default();
        push(
            &mut queue,
            1,
            texts("a", 2),
            EmbedOptions::default(),
            t0,
            far,
        );
        push(
            &mut queue,
            2,
            texts("b", 2),
            EmbedOptions::default(),
            t0,
            far,
        );
        assert_eq!(queue.remove(1).inputs, 2);
        assert_eq!(queue.remove(1).inputs, 0, "already gone");
        assert_eq!(queue.inputs(), 2);
        let formed = queue.take(take(t0, 2)).expect("full");
        assert_eq!(formed.inputs, ["b0", "b1"]);
    }
}
