//! Saturation versus absence: what NATS micro discovery says about the workers when the server
//! kept answering "no responders" (no worker is a member of the queue group) for the whole
//! retry window.
//!
//! Workers leave the queue group while they are full or their upstream fails, and say so in the
//! `membership` metadata of their `$SRV.INFO` answer
//! ([`embatch_protocol::headers::MEMBERSHIP_METADATA`]). One `$SRV.INFO.embatch` request,
//! answered by every worker within [`DISCOVERY_WAIT`], tells the cases apart:
//! - a worker on our subject is `full`: [`Fleet::Saturated`] (429: retry later);
//! - none is full and one is `upstream_unhealthy`: [`Fleet::Unhealthy`] (503);
//! - none answers, or they are `joined` (re-subscribing) or `stopping`: [`Fleet::Absent`] (503:
//!   no worker).
//!
//! A saturated verdict is kept for [`SATURATED_FOR`], so an overloaded fleet costs one discovery
//! round per that interval, not one per request. Workers leave while full only if another member
//! has room, so an empty group of full workers is a race of a few ms, and requests that meet it
//! usually find a member again within the caller's retry window.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use embatch_protocol::headers::{MEMBERSHIP_METADATA, membership};
use futures::StreamExt;
use tokio::time::Instant;

/// How long discovery collects `$SRV.INFO` answers: 25 ms.
pub const DISCOVERY_WAIT: Duration = Duration::from_millis(25);

/// How long a [`Fleet::Saturated`] verdict is reused before discovery asks again: 50 ms.
pub const SATURATED_FOR: Duration = Duration::from_millis(50);

/// What discovery found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fleet {
    /// Workers exist and at least one is full: every worker is at capacity.
    Saturated,
    /// Workers exist, none full, and at least one reports a failing upstream.
    Unhealthy,
    /// No worker answered for our subject (or only ones re-subscribing or stopping).
    Absent,
}

/// The verdict from the `membership` values of the workers that serve our subject.
pub fn verdict<'a>(states: impl IntoIterator<Item = &'a str>) -> Fleet {
    let mut fleet = Fleet::Absent;
    for state in states {
        match state {
            membership::FULL => return Fleet::Saturated,
            membership::UPSTREAM_UNHEALTHY => fleet = Fleet::Unhealthy,
            _ => {}
        }
    }
    fleet
}

/// Asks discovery, with a shared cache of the last saturated verdict.
#[derive(Debug, Clone, Default)]
pub(crate) struct Discovery {
    saturated_at: Arc<Mutex<Option<Instant>>>,
}

impl Discovery {
    /// The fleet serving `subject` as discovery (service `service`) reports it now.
    pub(crate) async fn ask(
        &self,
        nats: &async_nats::Client,
        service: &str,
        subject: &str,
    ) -> Fleet {
        let cached = *self
            .saturated_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if cached.is_some_and(|at| at.elapsed() < SATURATED_FOR) {
            return Fleet::Saturated;
        }
        let fleet = match gather(nats, service, subject).await {
            Ok(states) => verdict(states.iter().map(String::as_str)),
            Err(err) => {
                tracing::debug!(%err, "service discovery failed");
                Fleet::Absent
            }
        };
        if fleet == Fleet::Saturated {
            *self
                .saturated_at
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        }
        fleet
    }
}

/// The `membership` of every worker of `service` that answers `$SRV.INFO` within
/// [`DISCOVERY_WAIT`] and has an endpoint on `subject` (`joined` for workers that predate the
/// key). Stops early at the first `full`.
async fn gather(
    nats: &async_nats::Client,
    service: &str,
    subject: &str,
) -> Result<Vec<String>, async_nats::Error> {
    let inbox = nats.new_inbox();
    let mut answers = nats.subscribe(inbox.clone()).await?;
    nats.publish_with_reply(format!("$SRV.INFO.{service}"), inbox, Bytes::new())
        .await?;
    let until = Instant::now() + DISCOVERY_WAIT;
    let mut states = Vec::new();
    while let Ok(Some(answer)) = tokio::time::timeout_at(until, answers.next()).await {
        let Ok(info) = serde_json::from_slice::<async_nats::service::Info>(&answer.payload) else {
            continue;
        };
        if !info.endpoints.iter().any(|e| e.subject == subject) {
            continue; // a worker of another subject
        }
        let state = info
            .metadata
            .get(MEMBERSHIP_METADATA)
            .map_or(membership::JOINED, String::as_str)
            .to_owned();
        let full = state == membership::FULL;
        states.push(state);
        if full {
            break;
        }
    }
    Ok(states)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_full_worker_means_saturated_whatever_the_others_say() {
        assert_eq!(
            verdict(["upstream_unhealthy", "full", "joined"]),
            Fleet::Saturated
        );
        assert_eq!(
            verdict(["upstream_unhealthy", "stopping"]),
            Fleet::Unhealthy
        );
        assert_eq!(verdict(["joined", "stopping"]), Fleet::Absent);
        assert_eq!(verdict([]), Fleet::Absent);
    }
}
