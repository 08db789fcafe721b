//! What a worker knows of its peers' queue-group membership, from their announcements on
//! [`embatch_protocol::headers::members_subject`].
//!
//! Every worker publishes `{"id": "<its service id>", "membership": "<state>"}` there on every
//! change of membership and every [`HEARTBEAT`]; every worker listens. A full worker leaves the
//! queue group only while a peer is a member, and a full worker that is out rejoins when the last
//! member leaves: the group never empties because everyone is busy (a lone worker keeps its
//! queue and sheds with 429 itself, as with `MEMBERSHIP=static`), only because upstreams fail.
//! A peer not heard from for [`EXPIRY`] (killed, partitioned) counts as gone.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use embatch_protocol::headers::membership;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::membership::MemberState;

/// How often a worker repeats its state.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long a peer's last announcement counts.
pub const EXPIRY: Duration = Duration::from_secs(3);

/// One announcement (`membership` is the key discovery uses too).
#[derive(Debug, Serialize, Deserialize)]
struct Announcement<'a> {
    id: &'a str,
    #[serde(rename = "membership")]
    state: &'a str,
}

pub(crate) use embatch_protocol::headers::members_subject;

/// The announcement of worker `id` in `state`, as JSON bytes.
pub(crate) fn announcement(id: &str, state: MemberState) -> Bytes {
    serde_json::to_vec(&Announcement {
        id,
        state: state.label(),
    })
    .map(Bytes::from)
    .unwrap_or_default()
}

/// The peers heard from, by service id: whether each is a member, and when it was last heard.
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

    /// Takes an announcement received at `now`; `true` when it changed whether that peer is a
    /// member. Malformed payloads are ignored.
    pub(crate) fn record(&mut self, payload: &[u8], now: Instant) -> bool {
        let Ok(heard) = serde_json::from_slice::<Announcement<'_>>(payload) else {
            return false;
        };
        if heard.id == self.me {
            return false;
        }
        let member = heard.state == membership::JOINED;
        if heard.state == membership::STOPPING {
            return self.seen.remove(heard.id).is_some_and(|(was, _)| was);
        }
        let before = self.seen.insert(heard.id.to_owned(), (member, now));
        before.is_none_or(|(was, _)| was != member)
    }

    /// Whether a peer heard from within [`EXPIRY`] of `now` is a member; forgets the expired.
    pub(crate) fn any_member(&mut self, now: Instant) -> bool {
        self.seen
            .retain(|_, (_, at)| now.saturating_duration_since(*at) <= EXPIRY);
        self.seen.values().any(|(member, _)| *member)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_tracked_until_they_leave_stop_or_expire() {
        let start = Instant::now();
        let mut peers = Peers::new("me".into());
        assert!(!peers.any_member(start));
        assert!(!peers.record(&announcement("me", MemberState::Joined), start));
        assert!(
            !peers.any_member(start),
            "its own announcement is not a peer"
        );
        assert!(peers.record(&announcement("a", MemberState::Joined), start));
        assert!(peers.any_member(start));
        assert!(peers.record(&announcement("a", MemberState::Full), start));
        assert!(!peers.any_member(start));
        assert!(peers.record(&announcement("a", MemberState::Joined), start));
        assert!(peers.record(&announcement("a", MemberState::Stopping), start));
        assert!(!peers.any_member(start));
        peers.record(&announcement("b", MemberState::Joined), start);
        assert!(peers.any_member(start + EXPIRY));
        assert!(!peers.any_member(start + EXPIRY + Duration::from_millis(1)));
        assert!(!peers.record(b"not json", start));
    }
}
