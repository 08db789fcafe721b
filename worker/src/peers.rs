//! What a worker knows of its peers' queue-group membership, from their announcements on
//! [`embatch_protocol::headers::members_subject`].
//!
//! Every worker publishes `{"id": "<its service id>", "membership": "<state>", "room": <bool>,
//! "model": "<name>", "model_revision": "<sha>", "default_model": <bool>}`
//! ([`embatch_protocol::model::Announcement`]) there when its state or its room changes and
//! every [`HEARTBEAT`]; every worker listens, and counts only the peers of its own model: each
//! model has its own queue group.
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
use tokio::time::Instant;

use crate::membership::MemberState;

/// How often a worker repeats its state.
pub const HEARTBEAT: Duration = embatch_protocol::model::ANNOUNCEMENT_INTERVAL;
/// How long a peer's last announcement counts (three heartbeats). A killed worker announces
/// nothing: for this long its peers may still count it as a member with room, and a full worker
/// may leave the group for it.
pub const EXPIRY: Duration = embatch_protocol::model::ANNOUNCEMENT_EXPIRY;

pub(crate) use embatch_protocol::headers::members_subject;
use embatch_protocol::model::Announcement;

/// Who announces: the worker's service id, the model it serves and whether it also answers the
/// plain subject (the default model).
#[derive(Debug, Clone)]
pub(crate) struct Speaker {
    /// The service id.
    pub id: String,
    /// The model served.
    pub model: embatch_protocol::model::ModelId,
    /// Whether it answers the plain subject too.
    pub plain: bool,
}

/// The announcement of `speaker` in `state`, with or without `room`, as JSON bytes
/// ([`Announcement`]).
pub(crate) fn announcement(speaker: &Speaker, state: MemberState, room: bool) -> Bytes {
    serde_json::to_vec(&Announcement {
        id: speaker.id.clone(),
        membership: state.label().to_owned(),
        room,
        model: Some(speaker.model.name.clone()),
        model_revision: speaker.model.revision.clone(),
        default_model: Some(speaker.plain),
    })
    .map(Bytes::from)
    .unwrap_or_default()
}

/// The peers heard from, by service id: whether each is a member with room, and when it was
/// last heard.
#[derive(Debug)]
pub(crate) struct Peers {
    me: String,
    /// The model this worker serves: only peers of the same model share its queue group.
    model: String,
    /// Whether this worker answers the plain subject: v1 peers (no model announced) serve it.
    plain: bool,
    seen: HashMap<String, (bool, Instant)>,
}

impl Peers {
    /// The view of worker `me` (its own announcements are ignored), serving `model` (and the
    /// plain subject when `plain`): announcements of workers of another model are ignored, as
    /// their queue group is another one.
    pub(crate) fn new(me: String, model: String, plain: bool) -> Peers {
        Peers {
            me,
            model,
            plain,
            seen: HashMap::new(),
        }
    }

    /// Takes an announcement received at `now`; `true` when it changed whether that peer has
    /// room. Malformed payloads are ignored.
    pub(crate) fn record(&mut self, payload: &[u8], now: Instant) -> bool {
        let Ok(heard) = serde_json::from_slice::<Announcement>(payload) else {
            return false;
        };
        if heard.id == self.me {
            return false;
        }
        let same_model = match &heard.model {
            Some(model) => *model == self.model,
            None => self.plain,
        };
        if !same_model {
            return false;
        }
        let member = heard.membership == membership::JOINED && heard.room;
        if heard.membership == membership::STOPPING {
            return self.seen.remove(&heard.id).is_some_and(|(was, _)| was);
        }
        let before = self.seen.insert(heard.id, (member, now));
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
        let mut peers = Peers::new("me".into(), "m".into(), true);
        let announcement = |id: &str, state, room| announcement(&speaker(id, "m"), state, room);
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

    fn speaker(id: &str, model: &str) -> Speaker {
        Speaker {
            id: id.into(),
            model: embatch_protocol::model::ModelId {
                name: model.into(),
                revision: None,
            },
            plain: false,
        }
    }

    #[test]
    fn only_peers_of_the_same_model_count() {
        let now = Instant::now();
        let mut peers = Peers::new("me".into(), "a".into(), false);
        let other = announcement(&speaker("x", "b"), MemberState::Joined, true);
        assert!(
            !peers.record(&other, now),
            "model b has its own queue group"
        );
        assert!(!peers.any_room(now));
        let v1 = br#"{"id":"y","membership":"joined","room":true}"#;
        assert!(
            !peers.record(v1, now),
            "a v1 worker serves the plain subject only"
        );
        let mut plain = Peers::new("me".into(), "a".into(), true);
        assert!(
            plain.record(v1, now),
            "... which a default-model worker shares"
        );
        let same = announcement(&speaker("z", "a"), MemberState::Joined, true);
        assert!(peers.record(&same, now));
        assert!(peers.any_room(now));
    }
}
