//! A group of requests sharing options, its tenants' lanes, and the bookkeeping of inputs that
//! leave it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use embatch_protocol::Input;

use super::{Entry, Formed, Removed, Segment};
use crate::fair::Fair;

/// Requests sharing one set of options, oldest first.
#[derive(Default)]
pub(super) struct Group {
    pub queue: VecDeque<u64>,
    /// Inputs of this group not yet sent upstream.
    pub inputs: usize,
    /// Their tokens.
    pub tokens: u64,
    /// The same requests by tenant, oldest first: each lane holds a tenant with inputs waiting.
    pub lanes: HashMap<Arc<str>, Lane>,
}

/// One tenant's requests in a group.
#[derive(Default)]
pub(super) struct Lane {
    /// Ids, oldest first; those of requests that left are dropped when they reach the front.
    pub ids: VecDeque<u64>,
    /// Inputs waiting.
    pub inputs: usize,
}

impl Group {
    /// Drops the ids of requests that left the queue from the front, so the front is always a
    /// waiting request (its age makes the group due) or the group is empty.
    pub fn settle(&mut self, entries: &HashMap<u64, Entry>) {
        while self
            .queue
            .front()
            .is_some_and(|id| !entries.contains_key(id))
        {
            self.queue.pop_front();
        }
        for lane in self.lanes.values_mut() {
            while lane.ids.front().is_some_and(|id| !entries.contains_key(id)) {
                lane.ids.pop_front();
            }
        }
    }

    /// The lowest served mark of the tenants waiting here (`fair`'s).
    pub fn rank(&self, fair: &Fair) -> f64 {
        self.lanes
            .keys()
            .map(|tenant| fair.mark(tenant).0)
            .fold(f64::INFINITY, f64::min)
    }
}

/// Counts `left` inputs of `tenant` out of `group`, the queue's total and `fair`: sent,
/// expired or removed.
pub(super) fn left_group(
    group: &mut Group,
    (total, fair): (&mut usize, &mut Fair),
    tenant: &str,
    left: Removed,
) {
    group.inputs -= left.inputs;
    group.tokens -= left.tokens;
    *total -= left.inputs;
    if let Some(lane) = group.lanes.get_mut(tenant) {
        lane.inputs = lane.inputs.saturating_sub(left.inputs);
        if lane.inputs == 0 {
            group.lanes.remove(tenant);
        }
    }
    fair.leave(tenant, left.inputs, left.tokens);
}

/// Moves the inputs at positions `ats` (ascending) of `entry.waiting` (request `id`) to the end
/// of `formed`; returns their segment and their tokens.
pub(super) fn cut(
    entry: &mut Entry,
    id: u64,
    ats: &[usize],
    formed: &mut Formed,
) -> (Segment, u64) {
    entry.started = true;
    let mut segment = Segment {
        request: id,
        indices: Vec::with_capacity(ats.len()),
        at: formed.inputs.len(),
        len: ats.len(),
        scope: entry.share.scope.clone(),
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
    (segment, taken)
}
