//! The request subject's queue subscription, held or drained as [`Membership`] decides from
//! the load, the upstream calls' failures and the upstream `/health` probe results it is fed
//! (the worker's probes send them over a channel, see [`Group::join`]).
//!
//! [`Group::next`] yields the requests of the current subscription and of subscriptions still
//! draining; between requests it takes probe results and, while the worker is full, re-checks
//! its load every [`FULL_RECHECK`]. Leaving drains (`Subscriber::drain()`: UNSUB then PING; what
//! was delivered to the connection is still read and answered); rejoining subscribes anew.
//! A leave can lose requests on the way: async-nats 0.51.0 ends a drain one poll after writing
//! the UNSUB, not at the server's PONG, and drops what the server routed here before it read the
//! UNSUB; and nats-server, which delivers at most once, may drop a message routed to a member
//! around its UNSUB. Neither is recovered here: such a request was never acknowledged
//! ([`embatch_protocol::headers::ACK`]), so a client that asked for acknowledgements (the
//! gateway, `embatch-client`) resends it to the group; a plain `request` ends at its timeout.
//! Every change is logged, counted in `embatch_worker_membership_changes_total` and published to
//! discovery ([`crate::micro`]).
//!
//! The group also holds the worker's place in its model's room subject while it has room, and
//! asks that subject whether a peer has room when its decision needs to know ([`crate::peers`]):
//! nothing is published periodically.

use std::time::Duration;

use async_nats::{Client, Message, Subscriber};
use futures::StreamExt;
use futures::stream::SelectAll;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, Interval, MissedTickBehavior};

use crate::decision::{Load, MemberState, Membership, Transition};
use crate::names;
use crate::peers::{self, Answers, RESUBSCRIBE_AFTER};
use embatch_batcher::BatcherHandle;

/// How often a full worker re-checks whether its queue has drained enough to rejoin.
pub const FULL_RECHECK: Duration = Duration::from_millis(2);

/// Where the worker subscribes: the request subjects and the shared queue group name, and who
/// it is.
#[derive(Debug, Clone)]
pub struct Address {
    /// `EMBATCH_SUBJECT`: the prefix, whose `.members` subject carries the start and stop
    /// announcements.
    pub subject: String,
    /// The subjects served, joined and left together: the model subject, and the plain subject
    /// when this worker serves the default model.
    pub subjects: Vec<String>,
    /// `QUEUE_GROUP`: the queue group's name on each subject (NATS keeps one group per subject).
    pub queue_group: String,
    /// The worker's service id and model, in its announcements and room questions.
    pub speaker: peers::Speaker,
}

/// What [`Group::next`] yields.
#[derive(Debug)]
pub enum Event {
    /// A request (from the current subscription or one draining).
    Request(Message),
    /// Something for the membership decision: pass it to [`Group::control`].
    Control(Control),
    /// Every subscription has ended: after [`Group::stop`], or the connection closed.
    Ended,
}

/// An input of the membership decision.
#[derive(Debug)]
pub enum Control {
    /// A `/health` probe's result.
    Probe(bool),
    /// Full and time to re-check the load, an upstream call failed, or time to rejoin the room
    /// subject.
    Recheck,
    /// A peer's question on the room subject: answer it.
    RoomAsked(Message),
    /// The answer to this worker's question: whether a peer has room.
    RoomAnswered(bool),
}

/// The worker's membership in the queue group of the request subject.
pub struct Group {
    client: Client,
    address: Address,
    /// One queue subscription per subject of [`Address::subjects`], held or drained together.
    current: Option<SelectAll<Subscriber>>,
    draining: SelectAll<Subscriber>,
    membership: Membership,
    state: watch::Sender<MemberState>,
    batcher: BatcherHandle,
    probes: Option<mpsc::Receiver<bool>>,
    failures: watch::Receiver<u32>,
    recheck: Interval,
    /// The queue subscription to the room subject, held while this worker has room.
    room: Option<Subscriber>,
    /// When it last left the room subject (joins are at least [`RESUBSCRIBE_AFTER`] apart).
    room_left_at: Instant,
    /// When to try joining the room subject again, while a join waits for that.
    room_retry: Option<Instant>,
    /// The last answer to this worker's question on the room subject.
    answers: Answers,
    /// A member over its high water looks for a peer with room: it re-checks on `recheck` as a
    /// full worker does, so it asks again (every `peers::ASK_EVERY`) without waiting for the
    /// next request (a peer that joins after a burst is found while the burst's queue lasts).
    asking: bool,
    answered: mpsc::Receiver<bool>,
    answer_to: mpsc::Sender<bool>,
    /// [`BatcherHandle::answered_calls`] at the last probe result.
    answered_at_probe: u64,
    /// The queue wait requests met on admission, smoothed ([`ROOM_SMOOTHING`] per admitted
    /// request): whether this worker has room for a peer's share.
    typical_wait: Duration,
}

/// Weight of each admitted request's queue wait in [`Group`]'s typical wait.
const ROOM_SMOOTHING: f64 = 0.1;

impl Group {
    /// Subscribes to `address` as a member; `probes` carries the upstream's `/health` results
    /// (the worker's probes; `None` for `MEMBERSHIP=static`).
    ///
    /// # Errors
    /// When the subscription cannot be made.
    pub async fn join(
        client: Client,
        address: Address,
        membership: Membership,
        state: watch::Sender<MemberState>,
        batcher: BatcherHandle,
        probes: Option<mpsc::Receiver<bool>>,
    ) -> Result<Group, async_nats::SubscribeError> {
        let current = subscribe_all(&client, &address).await?;
        metrics::gauge!(names::MEMBER).set(1.0);
        state.send_replace(membership.state());
        let mut recheck = tokio::time::interval(FULL_RECHECK);
        recheck.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let failures = batcher.failures();
        let (answer_to, answered) = mpsc::channel(1);
        let mut group = Group {
            room: None,
            room_left_at: Instant::now()
                .checked_sub(RESUBSCRIBE_AFTER)
                .unwrap_or_else(Instant::now),
            room_retry: None,
            answers: Answers::default(),
            asking: false,
            answered,
            answer_to,
            typical_wait: Duration::ZERO,
            answered_at_probe: batcher.answered_calls(),
            failures,
            client,
            address,
            current: Some(current),
            draining: SelectAll::new(),
            membership,
            state,
            batcher,
            probes,
            recheck,
        };
        group.announce().await;
        let load = group.load();
        group.follow_room(load).await;
        Ok(group)
    }

    /// The next thing to handle: a request routed to this worker, or an input of the
    /// membership decision. Cancel-safe: it only waits; acting on a control
    /// ([`Group::control`]) is the caller's next step, outside any `select!`.
    pub async fn next(&mut self) -> Event {
        loop {
            let state = self.membership.state();
            let stopping = state == MemberState::Stopping;
            if stopping && self.current.is_none() && self.draining.is_empty() {
                return Event::Ended;
            }
            let full = state == MemberState::Full;
            let adaptive = self.probes.is_some() && !stopping;
            let request = tokio::select! {
                message = next_of(&mut self.current) => match message {
                    Some(message) => message,
                    None => {
                        self.current = None;
                        if self.draining.is_empty() {
                            return Event::Ended;
                        }
                        continue;
                    }
                },
                message = self.draining.next(), if !self.draining.is_empty() => match message {
                    Some(message) => message,
                    None => continue, // every drain is complete
                },
                Some(ok) = recv_of(&mut self.probes) => return Event::Control(Control::Probe(ok)),
                _ = self.recheck.tick(), if full || self.asking => {
                    return Event::Control(Control::Recheck);
                }
                Ok(()) = self.failures.changed(), if adaptive => {
                    return Event::Control(Control::Recheck);
                }
                Some(question) = next_of_one(&mut self.room) => {
                    return Event::Control(Control::RoomAsked(question));
                }
                Some(yes) = self.answered.recv() => {
                    return Event::Control(Control::RoomAnswered(yes));
                }
                () = sleep_until(self.room_retry) => {
                    self.room_retry = None;
                    return Event::Control(Control::Recheck);
                }
            };
            return Event::Request(request);
        }
    }

    /// Acts on a membership input.
    pub async fn control(&mut self, control: Control) {
        match control {
            Control::Probe(ok) => {
                // A probe that failed while the upstream kept answering this worker's calls is
                // no failure: the upstream is busy, not sick (TEI's /health queues behind the
                // batches; a Python server's threads wait for the GIL).
                let answered = self.batcher.answered_calls();
                let ok = ok || answered != self.answered_at_probe;
                self.answered_at_probe = answered;
                let load = self.load();
                let (transition, recovered) = self.membership.probed(ok, load);
                if recovered {
                    self.batcher.reset_failures();
                }
                self.apply(transition).await;
            }
            Control::Recheck => self.observe().await,
            Control::RoomAsked(question) => {
                let room = self.has_room(self.load());
                peers::answer(&self.client, &question, &self.address.speaker.id, room).await;
            }
            Control::RoomAnswered(yes) => {
                self.answers.record(yes, Instant::now());
                self.observe().await;
            }
        }
    }

    /// After a request was admitted: takes the queue wait it met into the typical wait, then
    /// re-decides ([`Group::observe`]). One read of the batcher's load per request.
    pub async fn admitted(&mut self) {
        let load = self.load();
        if let Some(wait) = load.start_wait {
            let typical = self.typical_wait.as_secs_f64();
            self.typical_wait =
                Duration::from_secs_f64(typical + ROOM_SMOOTHING * (wait.as_secs_f64() - typical));
        }
        self.decide(load).await;
    }

    /// The membership state now (a member, or out: full, which a worker leaves only for a peer
    /// with room; upstream unhealthy; stopping).
    pub fn state(&self) -> MemberState {
        self.membership.state()
    }

    /// Re-decides from the load now (a re-check while full, a failed call, a peer's answer),
    /// and follows this worker's room on the room subject.
    pub async fn observe(&mut self) {
        let load = self.load();
        self.decide(load).await;
    }

    async fn decide(&mut self, load: Load) {
        let transition = self.membership.observe(load);
        self.apply(transition).await;
        self.follow_room(load).await;
        self.asking = self.membership.asks_for_room(load);
        if self.asking && self.answers.should_ask(Instant::now()) {
            peers::ask(
                &self.client,
                self.room_subject(),
                self.address.speaker.id.clone(),
                self.answer_to.clone(),
            );
        }
    }

    /// Whether this worker has room for a peer's share, by its typical wait under `load`.
    fn has_room(&self, load: Load) -> bool {
        self.membership.has_room(Load {
            start_wait: load.start_wait.map(|_| self.typical_wait),
            ..load
        })
    }

    /// The batcher's load, and whether a peer has room by the last answer.
    fn load(&self) -> Load {
        Load {
            peer_has_room: self.answers.peer_has_room(Instant::now()),
            ..self.batcher.load()
        }
    }

    /// The room subject of this worker's model (its first request subject).
    fn room_subject(&self) -> String {
        peers::room_subject(&self.address.subjects[0])
    }

    /// Joins the room subject's queue group while this worker has room and does not itself
    /// look for a peer with room (it would answer its own question), and leaves it otherwise:
    /// leaving at once, joining at most [`RESUBSCRIBE_AFTER`] after the last leave (a retry is
    /// scheduled in between).
    async fn follow_room(&mut self, load: Load) {
        let want = self.membership.state() != MemberState::Stopping
            && self.has_room(load)
            && !self.membership.asks_for_room(load);
        let now = Instant::now();
        match (want, self.room.take()) {
            (false, Some(mut room)) => {
                if let Err(err) = room.unsubscribe().await {
                    tracing::debug!(%err, "cannot leave the room subject");
                }
                self.room_left_at = now;
                self.room_retry = None;
            }
            (true, None) => {
                let at = self.room_left_at + RESUBSCRIBE_AFTER;
                if now < at {
                    self.room_retry = Some(at);
                    return;
                }
                self.room_retry = None;
                let subject = self.room_subject();
                match self
                    .client
                    .queue_subscribe(subject, self.address.queue_group.clone())
                    .await
                {
                    Ok(room) => self.room = Some(room),
                    Err(err) => tracing::debug!(%err, "cannot join the room subject"),
                }
            }
            (_, room) => {
                self.room = room;
                if !want {
                    self.room_retry = None;
                }
            }
        }
    }

    /// Publishes this worker's state on the members subject: once at start (`joined`) and once
    /// at stop (`stopping`), for the gateways' model tables.
    async fn announce(&mut self) {
        let state = self.membership.state();
        let room = self.has_room(self.batcher.load());
        let payload = peers::announcement(&self.address.speaker, state, room);
        let subject = peers::members_subject(&self.address.subject);
        if let Err(err) = self.client.publish(subject, payload).await {
            tracing::debug!(%err, "cannot announce the membership");
        }
    }

    /// Leaves for good: drains the subscription; [`Group::next`] then yields what the server
    /// had routed here until it confirms, and ends.
    pub async fn stop(&mut self) {
        self.probes = None;
        let transition = self.membership.stop();
        self.apply(transition).await;
        let load = self.load();
        self.follow_room(load).await;
        self.announce().await;
    }

    async fn apply(&mut self, transition: Option<Transition>) {
        let Some(transition) = transition else {
            return;
        };
        self.state.send_replace(transition.to);
        let event = transition.event();
        metrics::counter!(
            names::MEMBERSHIP_CHANGES,
            "event" => event.unwrap_or("changed"),
            "state" => transition.to.label()
        )
        .increment(1);
        let load = self.batcher.load();
        tracing::info!(
            from = transition.from.label(),
            to = transition.to.label(),
            start_wait_ms = load.start_wait.map(|d| d.as_millis()),
            call_ms = load.call.map(|d| d.as_millis()),
            failed_calls = load.failed_calls,
            "queue-group membership: {}",
            event.unwrap_or("reason changed")
        );
        match event {
            Some("left") => {
                if let Some(subscribers) = self.current.take() {
                    for mut subscriber in subscribers {
                        if let Err(err) = subscriber.drain().await {
                            tracing::warn!(%err, "cannot drain the request subscription");
                        }
                        self.draining.push(subscriber);
                    }
                }
                metrics::gauge!(names::MEMBER).set(0.0);
            }
            Some(_) => {
                match subscribe_all(&self.client, &self.address).await {
                    Ok(subscriber) => {
                        self.current = Some(subscriber);
                        metrics::gauge!(names::MEMBER).set(1.0);
                    }
                    // The connection is closed: the next read ends the intake.
                    Err(err) => tracing::warn!(%err, "cannot rejoin the queue group"),
                }
            }
            None => {}
        }
    }
}

/// Queue subscriptions to every subject of `address`, in its queue group.
async fn subscribe_all(
    client: &Client,
    address: &Address,
) -> Result<SelectAll<Subscriber>, async_nats::SubscribeError> {
    let mut all = SelectAll::new();
    for subject in &address.subjects {
        all.push(
            client
                .queue_subscribe(subject.clone(), address.queue_group.clone())
                .await?,
        );
    }
    Ok(all)
}

async fn next_of(subscriber: &mut Option<SelectAll<Subscriber>>) -> Option<Message> {
    match subscriber {
        Some(subscriber) => subscriber.next().await,
        None => std::future::pending().await,
    }
}

async fn next_of_one(subscriber: &mut Option<Subscriber>) -> Option<Message> {
    match subscriber {
        Some(subscriber) => subscriber.next().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn recv_of(probes: &mut Option<mpsc::Receiver<bool>>) -> Option<bool> {
    match probes {
        Some(probes) => probes.recv().await,
        None => std::future::pending().await,
    }
}
