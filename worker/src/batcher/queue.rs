//! The queue: requests grouped by options, due times and batch formation.
//!
//! Plain data: no channels, no metrics, no clock reads (every function takes `now`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::time::Duration;

use embatch_protocol::{EmbedOptions, Input};
use tokio::time::Instant;

/// tokio's timer fires on whole-millisecond ticks, rounding a deadline up by as much as 1 ms. The
/// flush timer aims this much early so that a batch leaves no later than `max_wait` after its
/// first request (it may leave up to this much before).
pub(super) const TIMER_SLACK: Duration = Duration::from_micros(999);

/// A request's inputs not yet sent upstream.
struct Entry {
    /// Inputs not yet sent upstream.
    inputs: Vec<Input>,
    /// Index (in the request) of `inputs[0]`.
    dispatched: usize,
    options: EmbedOptions,
    accepted: Instant,
    deadline: Instant,
}

/// Requests sharing one set of options, oldest first.
#[derive(Default)]
struct Group {
    queue: VecDeque<u64>,
    /// Inputs of this group not yet sent upstream.
    inputs: usize,
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

/// A contiguous run of one request's inputs inside a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Segment {
    /// The request's id.
    pub request: u64,
    /// Index in the request of the segment's first input.
    pub offset: usize,
    /// Position in the batch of the segment's first input.
    pub at: usize,
    /// Inputs.
    pub len: usize,
}

/// How to form the next batch.
#[derive(Debug, Clone, Copy)]
pub(super) struct Take {
    /// The current time.
    pub now: Instant,
    /// Most inputs in the batch.
    pub batch_limit: usize,
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
}

/// A batch taken from the queue (possibly empty when every candidate had expired).
#[derive(Debug)]
pub(super) struct Formed {
    /// Options of every input of the batch.
    pub options: EmbedOptions,
    /// The inputs, in segment order.
    pub inputs: Vec<Input>,
    /// Which request each run of `inputs` belongs to.
    pub segments: Vec<Segment>,
    /// Requests removed because of the cutoff, with their inputs.
    pub expired: Vec<(u64, usize)>,
    /// The batch carries a request sent despite the cutoff.
    pub probe: bool,
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

impl Queue {
    /// Inputs not yet sent upstream.
    pub fn inputs(&self) -> usize {
        self.inputs
    }

    /// Appends a request to the group of its options.
    pub fn push(
        &mut self,
        id: u64,
        inputs: Vec<Input>,
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
        let group = self.groups.entry(options.clone()).or_default();
        group.queue.push_back(id);
        group.inputs += n;
        self.inputs += n;
        self.entries.insert(
            id,
            Entry {
                inputs,
                dispatched: 0,
                options,
                accepted,
                deadline,
            },
        );
    }

    /// Removes what is left of a request (cancelled, or failed by another of its calls).
    /// Returns the inputs removed.
    pub fn remove(&mut self, id: u64) -> usize {
        let Some(entry) = self.entries.remove(&id) else {
            return 0;
        };
        let left = entry.inputs.len();
        self.inputs -= left;
        if let Some(group) = self.groups.get_mut(&entry.options) {
            group.inputs -= left;
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
    /// one whose earlier inputs were already sent). Returns their ids with the inputs removed.
    pub fn expire(&mut self, now: Instant) -> Vec<(u64, usize)> {
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

    /// Takes up to `batch_limit` inputs from the oldest due group: one holding a full batch, any
    /// with `flush_all`, or, with `partial`, one whose head waited `max_wait`. `None` when no
    /// group is due.
    pub fn take(&mut self, take: Take) -> Option<Formed> {
        let key = self
            .groups
            .iter()
            .filter_map(|(key, g)| {
                let head = self.entries.get(g.queue.front()?)?;
                let ready = take.flush_all
                    || g.inputs >= take.batch_limit
                    || (take.partial && take.now + TIMER_SLACK >= head.accepted + take.max_wait);
                ready.then_some((head.accepted, key))
            })
            .min_by_key(|(accepted, _)| *accepted)
            .map(|(_, key)| key.clone())?;
        let mut formed = Formed {
            options: key.clone(),
            inputs: Vec::new(),
            segments: Vec::new(),
            expired: Vec::new(),
            probe: false,
        };
        let mut probe_allowed = take.probe_allowed;
        let group = self.groups.get_mut(&key)?;
        while formed.inputs.len() < take.batch_limit {
            let Some(&id) = group.queue.front() else {
                break;
            };
            let Some(entry) = self.entries.get_mut(&id) else {
                group.queue.pop_front();
                continue;
            };
            if entry.dispatched == 0 && take.cutoff >= entry.deadline {
                if probe_allowed && take.now < entry.deadline {
                    probe_allowed = false;
                    formed.probe = true;
                } else {
                    group.queue.pop_front();
                    let left = entry.inputs.len();
                    group.inputs -= left;
                    self.inputs -= left;
                    self.entries.remove(&id);
                    formed.expired.push((id, left));
                    continue;
                }
            }
            let room = take.batch_limit - formed.inputs.len();
            let len = room.min(entry.inputs.len());
            formed.segments.push(Segment {
                request: id,
                offset: entry.dispatched,
                at: formed.inputs.len(),
                len,
            });
            entry.dispatched += len;
            group.inputs -= len;
            self.inputs -= len;
            if len == entry.inputs.len() {
                formed.inputs.append(&mut entry.inputs);
                group.queue.pop_front();
                self.entries.remove(&id);
            } else {
                formed.inputs.extend(entry.inputs.drain(..len));
            }
        }
        group.settle(&self.entries);
        if group.queue.is_empty() {
            self.groups.remove(&key);
        }
        Some(formed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(now: Instant, batch_limit: usize) -> Take {
        Take {
            now,
            batch_limit,
            max_wait: Duration::from_millis(5),
            flush_all: false,
            partial: true,
            cutoff: now,
            probe_allowed: false,
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
        queue.push(
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
        queue.push(1, texts("a", 3), EmbedOptions::default(), t0, far);
        queue.push(2, texts("b", 1), other.clone(), t0, far);
        queue.push(3, texts("c", 3), EmbedOptions::default(), t0, far);
        let first = queue.take(take(t0, 4)).expect("full group");
        assert_eq!(first.options, EmbedOptions::default());
        assert_eq!(first.inputs, ["a0", "a1", "a2", "c0"]);
        assert_eq!(
            first.segments,
            [
                Segment {
                    request: 1,
                    offset: 0,
                    at: 0,
                    len: 3
                },
                Segment {
                    request: 3,
                    offset: 0,
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
                offset: 1,
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
            queue.push(
                id,
                texts("x", 1),
                EmbedOptions::default(),
                t0,
                t0 + Duration::from_millis(50),
            );
        }
        queue.push(
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
        assert_eq!(formed.expired, [(1, 1), (2, 1)]);
        assert_eq!(queue.inputs(), 0);
    }

    #[test]
    fn expiry_follows_the_earliest_deadline_and_skips_requests_that_left() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut queue = Queue::default();
        queue.push(1, texts("a", 1), EmbedOptions::default(), t0, at(300));
        queue.push(2, texts("b", 2), EmbedOptions::default(), t0, at(100));
        queue.push(3, texts("c", 1), EmbedOptions::default(), t0, at(200));
        assert_eq!(queue.next_deadline(), Some(at(100)));
        assert_eq!(queue.remove(2), 2);
        assert_eq!(
            queue.next_deadline(),
            Some(at(200)),
            "a removed request is skipped"
        );
        assert!(queue.expire(at(199)).is_empty());
        assert_eq!(queue.expire(at(300)), [(3, 1), (1, 1)]);
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
        queue.push(1, texts("a", 1), EmbedOptions::default(), t0, far);
        let later = t0 + Duration::from_millis(3);
        queue.push(2, texts("b", 1), EmbedOptions::default(), later, far);
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
        queue.push(1, texts("a", 2), EmbedOptions::default(), t0, far);
        queue.push(2, texts("b", 2), EmbedOptions::default(), t0, far);
        assert_eq!(queue.remove(1), 2);
        assert_eq!(queue.remove(1), 0, "already gone");
        assert_eq!(queue.inputs(), 2);
        let formed = queue.take(take(t0, 2)).expect("full");
        assert_eq!(formed.inputs, ["b0", "b1"]);
    }
}
