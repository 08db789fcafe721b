//! Whether a peer of this worker's model has room for its share: asked when it matters, never
//! listened for.
//!
//! A worker that has room (a member whose typical queue wait is under half its bound, see
//! [`crate::decision::Membership::has_room`]) is a member of the queue group of
//! [`room_subject`] (`<model subject>.room`) while it has it. A full worker asks there with a
//! NATS request before it leaves the request subject's group, and every [`ASK_EVERY`] while it is
//! out: one member with room answers `{"id": "<service id>", "room": true}` ([`RoomAnswer`]);
//! "no responders" or no answer within [`ROOM_ASK_TIMEOUT`] means no peer has room. An idle or
//! merely busy fleet sends nothing; a full worker costs one question and one answer per
//! [`ASK_EVERY`] (docs/design/control-plane.md).
//!
//! A full worker leaves the queue group only while a peer has room, and a full worker that is
//! out rejoins when no peer has room any more: a fleet that is full everywhere stays in the
//! group and sheds with 429 as `MEMBERSHIP=static` does (each leave would only push its share
//! onto peers that shed it); the group empties only when upstreams fail.
//!
//! Each worker also announces itself on [`members_subject`] once when it starts and once when it
//! stops (for the gateways' model tables; never repeated).

use std::time::Duration;

use async_nats::{Client, Message};
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::decision::MemberState;

pub use embatch_protocol::headers::{ROOM_ASK_TIMEOUT, members_subject, room_subject};
use embatch_protocol::model::Announcement;

/// How long an answer counts, and how often a full worker asks again: 500 ms.
pub const ASK_EVERY: Duration = Duration::from_millis(500);

/// Shortest time between leaving the room subject's queue group and joining it again: 500 ms,
/// so a worker whose room flickers does not subscribe and unsubscribe per request.
pub const RESUBSCRIBE_AFTER: Duration = Duration::from_millis(500);

/// The answer of a worker with room: its service id and whether it (still) has room.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RoomAnswer {
    /// The answering worker's service id.
    pub id: String,
    /// Whether it has room now (a worker that lost room since it subscribed answers `false`).
    pub room: bool,
}

/// Who announces and asks: the worker's service id, the model it serves and whether it also
/// answers the plain subject (the default model).
#[derive(Debug, Clone)]
pub struct Speaker {
    /// The service id.
    pub id: String,
    /// The model served.
    pub model: embatch_protocol::model::ModelId,
    /// Whether it answers the plain subject too.
    pub plain: bool,
    /// What its model does ([`embatch_protocol::model::CAPABILITIES`]).
    pub capabilities: Vec<String>,
}

/// The announcement of `speaker` in `state`, with or without `room`, as JSON bytes
/// ([`Announcement`]).
pub fn announcement(speaker: &Speaker, state: MemberState, room: bool) -> Bytes {
    serde_json::to_vec(&Announcement {
        id: speaker.id.clone(),
        membership: state.label().to_owned(),
        room,
        model: Some(speaker.model.name.clone()),
        model_revision: speaker.model.revision.clone(),
        default_model: Some(speaker.plain),
        capabilities: Some(speaker.capabilities.clone()),
    })
    .map(Bytes::from)
    .unwrap_or_default()
}

/// Answers a question on the room subject: `room` as `me` sees it now. A question without a
/// reply subject is ignored; a failed publish (the connection is closed) is logged at debug.
pub async fn answer(client: &Client, question: &Message, me: &str, room: bool) {
    let Some(reply) = question.reply.clone() else {
        return;
    };
    let body = serde_json::to_vec(&RoomAnswer {
        id: me.to_owned(),
        room,
    })
    .map(Bytes::from)
    .unwrap_or_default();
    if let Err(err) = client.publish(reply, body).await {
        tracing::debug!(%err, "cannot answer a room question");
    }
}

/// Whether `reply` says that a worker other than `me` has room. Anything else (malformed, its
/// own answer, no room) is "no".
pub fn says_room(reply: &[u8], me: &str) -> bool {
    serde_json::from_slice::<RoomAnswer>(reply).is_ok_and(|a| a.room && a.id != me)
}

/// Asks `subject` (a [`room_subject`]) whether a peer has room, as `me`, in a task of its own:
/// the answer goes to `answers` (no responders, a timeout or any error: `false`).
pub fn ask(client: &Client, subject: String, me: String, answers: mpsc::Sender<bool>) {
    let client = client.clone();
    tokio::spawn(async move {
        let request = async_nats::Request::new()
            .payload(Bytes::from(me.clone().into_bytes()))
            .timeout(Some(ROOM_ASK_TIMEOUT));
        let yes = match client.send_request(subject, request).await {
            Ok(reply) => says_room(&reply.payload, &me),
            Err(err) => {
                tracing::trace!(%err, "no peer has room");
                false
            }
        };
        // The receiver is gone only when the worker stops.
        let _ = answers.send(yes).await;
    });
}

/// The last answer to "does a peer have room", and whether a question is out.
#[derive(Debug, Default)]
pub struct Answers {
    last: Option<(bool, Instant)>,
    asking: bool,
}

impl Answers {
    /// Whether a peer had room by an answer still good at `now` (one received within
    /// [`ASK_EVERY`] plus [`ROOM_ASK_TIMEOUT`]: the next question is on its way by then).
    pub fn peer_has_room(&self, now: Instant) -> bool {
        self.last.is_some_and(|(yes, at)| {
            yes && now.saturating_duration_since(at) <= ASK_EVERY + ROOM_ASK_TIMEOUT
        })
    }

    /// Whether to ask now: no question out, and no answer within [`ASK_EVERY`] of `now`. Marks
    /// a question as out when it says yes.
    pub fn should_ask(&mut self, now: Instant) -> bool {
        let fresh = self
            .last
            .is_some_and(|(_, at)| now.saturating_duration_since(at) < ASK_EVERY);
        let ask = !self.asking && !fresh;
        self.asking |= ask;
        ask
    }

    /// Takes the answer to the question out, received at `now`.
    pub fn record(&mut self, yes: bool, now: Instant) {
        self.asking = false;
        self.last = Some((yes, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_counts_for_one_interval_and_one_question_is_out_at_a_time() {
        let start = Instant::now();
        let mut answers = Answers::default();
        assert!(!answers.peer_has_room(start), "nothing asked yet");
        assert!(answers.should_ask(start));
        assert!(!answers.should_ask(start), "a question is out");
        answers.record(true, start);
        assert!(answers.peer_has_room(start));
        assert!(!answers.should_ask(start + ASK_EVERY / 2), "still fresh");
        assert!(answers.should_ask(start + ASK_EVERY));
        assert!(
            answers.peer_has_room(start + ASK_EVERY + ROOM_ASK_TIMEOUT),
            "good while the next question is out"
        );
        assert!(!answers.peer_has_room(start + ASK_EVERY * 2));
        answers.record(false, start + ASK_EVERY);
        assert!(!answers.peer_has_room(start + ASK_EVERY));
    }

    #[test]
    fn only_another_worker_with_room_is_a_yes() {
        let yes = serde_json::to_vec(&RoomAnswer {
            id: "peer".into(),
            room: true,
        })
        .expect("JSON");
        assert!(says_room(&yes, "me"));
        assert!(!says_room(&yes, "peer"), "its own answer");
        let no = br#"{"id":"peer","room":false}"#;
        assert!(!says_room(no, "me"));
        assert!(!says_room(b"not json", "me"));
    }
}
