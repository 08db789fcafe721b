//! The delivery protocol of one request ([`EmbedClient::embed_with`]): send a copy, then react
//! to what comes back until the request is answered, fails, or needs another copy.
//!
//! [`Delivery`] holds what lasts across copies (the deadline, the acknowledgement wait, the
//! back-off, the workers holding a copy); [`Copy`] what one copy in flight needs. Each event
//! (a message on the reply inbox, the timer, an inbox event) is one method that says what comes
//! [`Next`]; [`deliver`] is the loop around them. docs/design/recovery.md explains the protocol.

use std::time::Duration;

use async_nats::Message;
use bytes::Bytes;
use embatch_protocol::headers;
use tokio::time::Instant;

use crate::inbox::{Generation, Inbox};
use crate::{
    ACK_TIMEOUT_MAX, EmbedClient, MIN_RESEND_BUDGET, NO_RESPONDERS_RETRY, RECONNECT_GRACE, RETRIES,
    Reply, RequestError, SendOptions, UNAVAILABLE_RETRIES, decode, header,
};

/// The longest pause between two "no responders" retries: 100 ms.
const NO_RESPONDERS_BACKOFF_MAX: Duration = Duration::from_millis(100);

/// The first pause after a "no responders" answer: 10 ms.
const NO_RESPONDERS_BACKOFF_MIN: Duration = Duration::from_millis(10);

/// Why a request is sent again: the label of [`RETRIES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resend {
    /// No worker was subscribed yet (workers re-subscribe after a reconnect).
    NoResponders,
    /// A worker answered 503.
    Unavailable,
    /// No worker acknowledged the copy in time.
    NoAck,
    /// The connection came back while the copy was in flight.
    Reconnect,
    /// Every worker holding a copy stopped its heartbeat.
    WorkerLost,
    /// Every worker holding a copy stopped its heartbeat or reconnected to NATS since it
    /// acknowledged the copy, at least one of them reconnected.
    WorkerReconnected,
}

impl Resend {
    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Resend::NoResponders => "no_responders",
            Resend::Unavailable => "unavailable",
            Resend::NoAck => "no_ack",
            Resend::Reconnect => "reconnect",
            Resend::WorkerLost => "worker_lost",
            Resend::WorkerReconnected => "worker_reconnected",
        }
    }
}

/// What the request does after an event.
enum Next {
    /// Keep waiting for the copies out.
    Wait,
    /// Send another copy.
    Resend(Resend),
    /// A worker (or discovery) answered: the caller has its outcome, nothing is to be withdrawn.
    Answered(Result<Reply, RequestError>),
    /// The request failed without an answer: the copies out are withdrawn.
    Failed(RequestError),
}

/// One copy in flight.
struct Copy {
    /// When it was sent.
    sent: Instant,
    /// The connection it went out on ([`EmbedClient::connects`]): a reconnect announced later
    /// that this copy was sent after (the announcement lags by up to 50 ms) lost nothing of it.
    connects_at_send: u64,
    /// Until when an acknowledgement is awaited; `None` once one came, or when none is expected.
    ack_by: Option<Instant>,
    /// The inbox's events as of its sending.
    seen: Generation,
}

/// What lasts across the copies of one request.
struct Delivery<'a> {
    client: &'a EmbedClient,
    inbox: &'a Inbox,
    /// The request's id (its reply subject).
    id: &'a str,
    deadline: Instant,
    budget: Duration,
    /// How long a copy waits for an acknowledgement before it is resent; `None` while workers
    /// are not known to acknowledge.
    ack_wait: Option<Duration>,
    /// The pause before the next "no responders" retry.
    backoff: Duration,
    /// Since when "no responders" has been the answer.
    no_responders_since: Option<Instant>,
    /// Until when "no responders" is expected: workers re-subscribe after a reconnect.
    reconnect_grace_until: Instant,
    sends: u32,
    /// 503s resent so far.
    unavailable: u32,
    /// The workers that acknowledged a copy, each with the connect count its acknowledgement
    /// carried ([`headers::WORKER_CONNECTS`]); cleared when their heartbeats stop or show a
    /// reconnect, or on a 503.
    holders: Vec<(String, Option<u64>)>,
    /// Whether any copy was ever acknowledged. `holders` cannot tell a worker that predates
    /// acknowledgements from one whose heartbeat was merely late (a starved process): only a
    /// success with no acknowledgement at all, and without the acknowledgement delay that an
    /// acknowledging worker puts on every reply, turns acknowledgement waits off.
    acknowledged: bool,
}

/// Publishes a request's id on the cancel subject when dropped while armed (the caller stopped
/// waiting, or the request timed out): the worker that holds it drops it.
struct CancelOnDrop<'a> {
    nats: Option<async_nats::Client>,
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
            crate::publish_cancel(nats, self.subject, self.id);
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
    let mut cancel = CancelOnDrop {
        nats: Some(client.nats.clone()),
        subject: &client.subject,
        id: &slot.subject,
    };
    let mut delivery = Delivery {
        client,
        inbox,
        id: &slot.subject,
        deadline: started + budget,
        budget,
        ack_wait: inbox.ack_timeout(),
        backoff: NO_RESPONDERS_BACKOFF_MIN,
        no_responders_since: None,
        reconnect_grace_until: started,
        sends: 0,
        unavailable: 0,
        holders: Vec::new(),
        acknowledged: false,
    };
    let mut events = inbox.events();
    // One timer per request: the acknowledgement wait while one runs, else the deadline.
    let wake = tokio::time::sleep_until(delivery.deadline);
    tokio::pin!(wake);
    loop {
        let waited = client.wait_connected(delivery.deadline).await?;
        let seen = *events.borrow_and_update();
        let mut copy = match delivery.send(waited, seen, &body, options).await {
            Ok(copy) => copy,
            Err(err) => {
                if delivery.sends == 0 {
                    cancel.disarm();
                }
                return Err(err);
            }
        };
        let reason = loop {
            wake.as_mut()
                .reset(copy.ack_by.unwrap_or(delivery.deadline));
            let next = tokio::select! {
                message = replies.recv() => delivery.on_reply(&mut copy, message).await,
                () = &mut wake => delivery.on_wake(&mut copy),
                changed = events.changed() => {
                    let now = changed.is_ok().then(|| *events.borrow_and_update());
                    delivery.on_event(&mut copy, now)
                }
            };
            match next {
                Next::Wait => {}
                Next::Resend(reason) => break reason,
                Next::Answered(outcome) => {
                    cancel.disarm();
                    return outcome;
                }
                Next::Failed(err) => return Err(err),
            }
        };
        metrics::counter!(RETRIES, "reason" => reason.label()).increment(1);
        tracing::debug!(
            reason = reason.label(),
            sends = delivery.sends,
            "resending a request"
        );
    }
}

impl Delivery<'_> {
    /// Publishes the next copy. `waited`: the request waited for a reconnect first.
    async fn send(
        &mut self,
        waited: bool,
        seen: Generation,
        body: &Bytes,
        options: &SendOptions,
    ) -> Result<Copy, RequestError> {
        if waited {
            self.reconnect_grace_until = Instant::now() + RECONNECT_GRACE;
        }
        // Sent within RECONNECT_GRACE of a reconnect of this client, even one this request did
        // not wait through: workers may not have re-subscribed yet.
        if let Some(at) = seen.reconnected_at {
            self.reconnect_grace_until = self.reconnect_grace_until.max(at + RECONNECT_GRACE);
        }
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        self.client
            .publish(self.id, body, remaining, self.sends + 1, options)
            .await?;
        self.sends += 1;
        let sent = Instant::now();
        Ok(Copy {
            sent,
            connects_at_send: self.client.connects(),
            ack_by: self.ack_by(sent),
            seen,
        })
    }

    /// Until when a copy sent at `sent` waits for its acknowledgement; `None` when that would
    /// be past the deadline or none is expected. Within RECONNECT_GRACE of a reconnect, the
    /// requests clients held reach the workers together, and acknowledging them all takes the
    /// workers longer than a round trip: a copy sent then waits the longest acknowledgement
    /// wait, not a few round trips, before it is resent (a burst of spurious resends filled a
    /// worker's QUEUE_CAP, benchmark 16).
    fn ack_by(&self, sent: Instant) -> Option<Instant> {
        let after_reconnect = sent < self.reconnect_grace_until;
        self.ack_wait
            .map(|wait| {
                sent + if after_reconnect {
                    wait.max(ACK_TIMEOUT_MAX)
                } else {
                    wait
                }
            })
            .filter(|at| *at < self.deadline)
    }

    /// A message on the reply inbox: "no responders", an acknowledgement, or the answer.
    async fn on_reply(&mut self, copy: &mut Copy, message: Option<Message>) -> Next {
        let Some(message) = message else {
            return Next::Failed(RequestError::Transport("the reply inbox closed".into()));
        };
        if message.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
            return self.on_no_responders().await;
        }
        self.no_responders_since = None;
        self.backoff = NO_RESPONDERS_BACKOFF_MIN;
        if let Some(worker) = header(&message, headers::ACCEPTED_BY) {
            let connects = crate::inbox::connects_of(&message);
            self.inbox
                .acknowledged(worker, connects, copy.sent.elapsed());
            self.acknowledged = true;
            // A later acknowledgement by the same worker (of a resent copy, on a newer
            // connection) says it holds the request now: its reply is not behind a reconnect.
            match self.holders.iter_mut().find(|(h, _)| h == worker) {
                Some((_, acked)) => *acked = (*acked).max(connects),
                None => self.holders.push((worker.to_owned(), connects)),
            }
            copy.ack_by = None;
            return Next::Wait;
        }
        // An acknowledging worker says so on its reply, acknowledged or not.
        let ack_delay_ms = headers::parse_millis(header(&message, headers::ACK_DELAY_MS));
        let outcome = decode(message);
        if let Err(RequestError::Reply(err)) = &outcome
            && err.status() == 503
            && self.unavailable < UNAVAILABLE_RETRIES
        {
            let pause = crate::unavailable_pause(self.unavailable + 1) + crate::retry_jitter();
            if Instant::now() + pause + MIN_RESEND_BUDGET < self.deadline {
                self.unavailable += 1;
                tracing::debug!(%err, unavailable = self.unavailable, "a worker answered 503; resending");
                self.holders.clear();
                tokio::time::sleep(pause).await;
                return Next::Resend(Resend::Unavailable);
            }
        }
        if let Some(delay_ms) = ack_delay_ms {
            self.inbox.acknowledges_after(delay_ms);
        } else if outcome.is_ok() && !self.acknowledged {
            self.inbox.unacknowledged_success();
        }
        if self.sends > 1 {
            self.client.withdraw(self.id);
        }
        Next::Answered(outcome)
    }

    /// "No responders": retried with back-off while workers may be re-subscribing, else
    /// discovery says why none is in the queue group.
    async fn on_no_responders(&mut self) -> Next {
        // A copy resent while another worker holds one: that one answers.
        if !self.holders.is_empty() {
            return Next::Wait;
        }
        let now = Instant::now();
        let since = *self.no_responders_since.get_or_insert(now);
        let give_up = (since + NO_RESPONDERS_RETRY)
            .max(self.reconnect_grace_until)
            .min(self.deadline);
        if now + self.backoff < give_up {
            tokio::time::sleep(self.backoff).await;
            self.backoff = (self.backoff * 2).min(NO_RESPONDERS_BACKOFF_MAX);
            return Next::Resend(Resend::NoResponders);
        }
        Next::Answered(Err(self.client.why_no_responders().await))
    }

    /// The timer: the acknowledgement wait ran out (resend, with a doubled wait), or the
    /// deadline passed.
    fn on_wake(&mut self, copy: &mut Copy) -> Next {
        if copy.ack_by.take().is_none() {
            return Next::Failed(RequestError::TimedOut {
                budget_ms: self.budget.as_millis(),
            });
        }
        if !resend_in_time(self.deadline) {
            return Next::Wait;
        }
        self.ack_wait = self.ack_wait.map(|wait| (wait * 2).min(ACK_TIMEOUT_MAX));
        Next::Resend(Resend::NoAck)
    }

    /// An inbox event: this client reconnected (copies sent before it may be lost), or a
    /// worker's heartbeat stopped or came from a later connection than its acknowledgement
    /// (`now`; `None` when the inbox closed). Resends when every worker holding a copy is lost
    /// or reconnected: a reply sent before a reconnect may have been lost with its server.
    fn on_event(&mut self, copy: &mut Copy, now: Option<Generation>) -> Next {
        let Some(now) = now else {
            return Next::Failed(RequestError::Transport("the reply inbox closed".into()));
        };
        let reconnected = now.reconnects != copy.seen.reconnects
            && self.client.connects() != copy.connects_at_send;
        let moved = |(id, acked): &(String, Option<u64>)| self.inbox.reconnected_since(id, *acked);
        let changed =
            now.lost != copy.seen.lost || now.worker_reconnects != copy.seen.worker_reconnects;
        let lost = changed
            && !self.holders.is_empty()
            && self
                .holders
                .iter()
                .all(|holder| self.inbox.is_lost(&holder.0) || moved(holder));
        let worker_reconnected = lost && self.holders.iter().any(moved);
        copy.seen = now;
        if reconnected {
            self.reconnect_grace_until = Instant::now() + RECONNECT_GRACE;
        }
        if lost {
            self.holders.clear();
        }
        if !(reconnected || lost) || !resend_in_time(self.deadline) {
            return Next::Wait;
        }
        Next::Resend(if reconnected {
            Resend::Reconnect
        } else if worker_reconnected {
            Resend::WorkerReconnected
        } else {
            Resend::WorkerLost
        })
    }
}

/// Whether a copy sent now would still have [`MIN_RESEND_BUDGET`] before `deadline`; when not,
/// the request waits for the copies already out.
fn resend_in_time(deadline: Instant) -> bool {
    Instant::now() + MIN_RESEND_BUDGET < deadline
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_resend_reason_has_its_own_label() {
        let all = [
            Resend::NoResponders,
            Resend::Unavailable,
            Resend::NoAck,
            Resend::Reconnect,
            Resend::WorkerLost,
            Resend::WorkerReconnected,
        ];
        let mut labels: Vec<&str> = all.iter().map(|r| r.label()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), all.len());
    }
}
