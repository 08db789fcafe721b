//! What a worker knows of its peers' queue-group membership, from their announcements on
//! [`embatch_protocol::headers::members_subject`].
//!
//! Every worker publishes `{"id": "<its service id>", "membership": "<state>", "room": <bool>}`
//! there when its state or its room changes and every [`HEARTBEAT`]; every worker listens.
//! `room` says the worker is a member whose typical queue wait (smoothed over its recent
//! requests) is under half its bound. A full worker leaves
//! the queue group only while a peer has room, and a full worker that is out rejoins when no
//! peer has room any more: a fleet that is full everywhere stays in the group and sheds with 429
//! as `MEMBERSHIP=static` does (each leave would only push its share onto peers that shed it);
//! the group empties only when upstreams fail. A peer not heard from for [`EXPIRY`] (killed,
//! partitioned) counts as gone.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use embatch_protocol::headers::membership;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::membership::MemberState;

/// How often a worker repeats its state.
pub const HEARTBEAT: Duration = Duration::from_millis(500);
/// How long a peer's last announcement counts (three heartbeats). A killed worker announces
/// nothing: for this long its peers may still count it as a member with room, and a full worker
/// may leave the group for it.
pub const EXPIRY: Duration = Duration::from_millis(1500);

/// One announcement (`membership` is the key discovery uses too).
#[derive(Debug, Serialize, Deserialize)]
struct Announcement<'a> {
    id: &'a str,
    #[serde(rename = "membership")]
    state: &'a str,
    #[serde(default)]
    room: bool,
}

pub(crate) use embatch_protocol::headers::members_subject;

/// The announcement of worker `id` in `state`, with or without `room`, as JSON bytes.
pub(crate) fn announcement(id: &str, state: MemberState, room: bool) -> Bytes {
    serde_json::to_vec(&Announcement {
        id,
        state: state.label(),
        room,
    })
    .map(Bytes::from)
    .unwrap_or_default()
}

/// The peers heard from, by service id: whether each is a member with room, and when it was
/// last heard.
#[derive(Debug)]
pub(crate) struct Peers {
    me: String,
    seen: HashMap<String, (bool, Instant)>,
}

impl Peers {
    /// The view of worker `me` (its own announcements are ignored).
    pub(crate) fn new(me: String) -> Peers {
        Peers {
            me,
            seen: HashMap::new(),
        }
    }

    /// Takes an announcement received at `now`; `true` when it changed whether that peer has
    /// room. Malformed payloads are ignored.
    pub(crate) fn record(&mut self, payload: &[u8], now: Instant) -> bool {
        let Ok(heard) = serde_json::from_slice::<Announcement<'_>>(payload) else {
            return false;
        };
        if heard.id == self.me {
            return false;
        }
        let member = heard.state == membership::JOINED && heard.room;
        if heard.state == membership::STOPPING {
            return self.seen.remove(heard.id).is_some_and(|(was, _)| was);
        }
        let before = self.seen.insert(heard.id.to_owned(), (member, now));
        before.is_none_or(|(was, _)| was != member)
    }

    /// Whether a peer heard from within [`EXPIRY`] of `now` is a member with room (asked per
    /// request: it only reads).
    pub(crate) fn any_room(&self, now: Instant) -> bool {
        self.seen
            .values()
            .any(|(room, at)| *room && now.saturating_duration_since(*at) <= EXPIRY)
    }

    /// Forgets the peers not heard from within [`EXPIRY`] of `now` (at each heartbeat).
    pub(crate) fn forget_expired(&mut self, now: Instant) {
        self.seen
            .retain(|_, (_, at)| now.saturating_duration_since(*at) <= EXPIRY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_with_room_are_tracked_until_they_fill_leave_stop_or_expire() {
        let start = Instant::now();
        let mut peers = Peers::new("me".into());
        assert!(!peers.any_room(start));
        assert!(!peers.record(&announcement("me", MemberState::Joined, true), start));
        assert!(!peers.any_room(start), "its own announcement is not a peer");
        assert!(peers.record(&announcement("a", MemberState::Joined, true), start));
        assert!(peers.any_room(start));
        assert!(peers.record(&announcement("a", MemberState::Joined, false), start));
        assert!(!peers.any_room(start), "a member without room");
        assert!(!peers.record(&announcement("a", MemberState::Full, false), start));
        assert!(!peers.any_room(start));
        assert!(peers.record(&announcement("a", MemberState::Joined, true), start));
        assert!(peers.record(&announcement("a", MemberState::Stopping, false), start));
        assert!(!peers.any_room(start));
        peers.record(&announcement("b", MemberState::Joined, true), start);
        assert!(peers.any_room(start + EXPIRY));
        assert!(!peers.any_room(start + EXPIRY + Duration::from_millis(1)));
        assert!(!peers.record(b"not json", start));
    }
}
