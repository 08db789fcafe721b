//! The delivery protocol of one request ([`EmbedClient::embed_with`]): send a copy, then react
//! to what comes back until the request is answered, fails, or needs another copy.
//!
//! The protocol is a state machine without I/O ([`state::State`]): each [`event::Event`] (a
//! message on the reply inbox, the timer, an inbox announcement) is one transition that says
//! what comes [`Next`]. [`deliver`] is the driver around it: it waits for an event, reads it
//! into an `Event`, and does what the transition says (publish a copy, pause, withdraw,
//! answer). docs/design/recovery.md explains the protocol; `tests.rs` has a unit test for each
//! transition.

mod event;
mod state;
#[cfg(test)]
mod tests;

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use self::event::{Announcement, Event, Resend};
use self::state::{Learnt, Next, State};
use crate::inbox::{Generation, Inbox};
use crate::{EmbedClient, RETRIES, Reply, RequestError, SendOptions, retry_jitter};

/// Publishes a request's id on the cancel subject when dropped while armed (the caller stopped
/// waiting, or the request timed out): the worker that holds it drops it.
///
/// Holds the connection by reference: a `Client` clone costs several reference counts, and
/// almost every request ends disarmed.
struct CancelOnDrop<'a> {
    nats: Option<&'a async_nats::Client>,
    subject: &'a str,
    id: &'a str,
}

impl CancelOnDrop<'_> {
    fn disarm(&mut self) {
        self.nats = None;
    }
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(nats) = self.nats.take() {
            crate::publish_cancel(nats.clone(), self.subject, self.id);
        }
    }
}

/// Sends `body` on `client`'s subject and waits for its answer within `budget`, resending as
/// the protocol says (see [`EmbedClient::embed`]).
pub(crate) async fn deliver(
    client: &EmbedClient,
    body: Bytes,
    budget: Duration,
    options: &SendOptions,
) -> Result<Reply, RequestError> {
    let started = Instant::now();
    let inbox = client.inbox().await?;
    let (slot, mut replies) = inbox.register();
    let id = slot.subject.as_str();
    let mut cancel = CancelOnDrop {
        nats: Some(&client.nats),
        subject: &client.subject,
        id,
    };
    let mut state = State::new(started, budget, inbox.ack_timeout());
    let mut events = inbox.events();
    // One timer per request: the acknowledgement wait while one runs, else the deadline.
    let wake = tokio::time::sleep_until(state.deadline());
    tokio::pin!(wake);
    loop {
        let waited = client.wait_connected(state.deadline()).await?;
        let seen = *events.borrow_and_update();
        let send = state.prepare(waited, seen.reconnected_at, Instant::now());
        let published = client
            .publish(id, &body, send.remaining, send.attempt, options)
            .await;
        if let Err(err) = published {
            if send.attempt == 1 {
                cancel.disarm();
            }
            return Err(err);
        }
        state.sent(seen, client.connects(), Instant::now());
        let reason = loop {
            let timer = state.timer();
            wake.as_mut().reset(timer.at());
            let event = tokio::select! {
                message = replies.recv() => Event::of_message(message, retry_jitter),
                () = &mut wake => timer.event(),
                changed = events.changed() => match changed {
                    Ok(()) => {
                        let generation = *events.borrow_and_update();
                        Event::Announced(announce(client, inbox, &state, generation))
                    }
                    Err(_) => Event::Closed,
                },
            };
            if let Event::Unavailable { error, .. } = &event {
                tracing::debug!(%error, "a worker answered 503");
            }
            let next = state.on(event, Instant::now());
            match perform(next, client, inbox, id, &mut cancel).await {
                Flow::Wait => {}
                Flow::Resend(reason) => break reason,
                Flow::Return(outcome) => return outcome,
            }
        };
        metrics::counter!(RETRIES, "reason" => reason.label()).increment(1);
        tracing::debug!(
            reason = reason.label(),
            sends = send.attempt,
            "resending a request"
        );
    }
}

/// Where the driver goes after [`perform`]ing a transition.
enum Flow {
    /// Wait for the next event.
    Wait,
    /// Send another copy (its pause is over), counted under this reason.
    Resend(Resend),
    /// Return this to the caller.
    Return(Result<Reply, RequestError>),
}

/// Does what a transition said: tells the inbox, pauses, withdraws, asks discovery.
async fn perform(
    next: Next,
    client: &EmbedClient,
    inbox: &Inbox,
    id: &str,
    cancel: &mut CancelOnDrop<'_>,
) -> Flow {
    match next {
        Next::Wait => Flow::Wait,
        Next::Acknowledged {
            worker,
            connects,
            rtt,
        } => {
            inbox.acknowledged(&worker, connects, rtt);
            Flow::Wait
        }
        Next::Resend { reason, after } => {
            if !after.is_zero() {
                tokio::time::sleep(after).await;
            }
            Flow::Resend(reason)
        }
        Next::AskDiscovery => {
            let err = client.why_no_responders().await;
            cancel.disarm();
            Flow::Return(Err(err))
        }
        Next::Answer {
            outcome,
            learnt,
            withdraw,
        } => {
            learn(inbox, learnt);
            if withdraw {
                client.withdraw(id);
            }
            cancel.disarm();
            Flow::Return(outcome)
        }
        Next::Fail(err) => Flow::Return(Err(err)),
    }
}

/// The inbox's announcement `generation`, with this client's connect count and the liveness
/// of the workers holding a copy of the request, read now.
fn announce(
    client: &EmbedClient,
    inbox: &Inbox,
    state: &State,
    generation: Generation,
) -> Announcement {
    let mut announcement = Announcement {
        generation,
        connects: client.connects(),
        ..Announcement::default()
    };
    for (worker, acked) in state.holders() {
        if inbox.is_lost(worker) {
            announcement.lost.push(worker.to_owned());
        }
        if inbox.reconnected_since(worker, acked) {
            announcement.reconnected.push(worker.to_owned());
        }
    }
    announcement
}

/// Tells the inbox what a reply taught about the workers' acknowledgements.
fn learn(inbox: &Inbox, learnt: Option<Learnt>) {
    match learnt {
        Some(Learnt::AcknowledgesAfter { ms }) => inbox.acknowledges_after(ms),
        Some(Learnt::Unacknowledged) => inbox.unacknowledged_success(),
        None => {}
    }
}
