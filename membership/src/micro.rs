//! The worker's NATS micro service presence: `$SRV.PING`, `$SRV.INFO` and `$SRV.STATS`
//! discovery (protocol `io.nats.micro.v1`), answered with async-nats's own wire types, plus the
//! per-endpoint counters behind `$SRV.STATS`.
//!
//! Why not async-nats's `service` API, which the worker used until its queue-group membership
//! became adaptive (see [`crate::decision`]): its metadata is fixed at start, and discovery
//! must report the live membership; and a service endpoint can only leave its queue group with
//! `Endpoint::stop()`, which unsubscribes at once and drops requests delivered to the connection
//! but not yet read. The worker's endpoints are therefore plain queue subscriptions, which leave
//! with `Subscriber::drain()` (what was delivered to the connection before the drain ended is
//! still read; what is lost around it is resent by acknowledging clients, see `crate::group`).
//! This module answers the
//! discovery verbs for them, the same JSON async-nats would send, with one addition: the
//! `membership` metadata key carries the worker's live state ([`MemberState`]), so a client that
//! gets "no responders" can tell *every worker is full* (429) from *every worker's upstream is
//! down* or *no worker runs* (503).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::service::{Info, PingResponse, Stats, endpoint, error::Error as ServiceError};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::decision::MemberState;

/// The metadata key whose value is the worker's [`MemberState`] (`joined`, `full`,
/// `upstream_unhealthy`, `stopping`) in `$SRV.PING` and `$SRV.INFO` answers.
pub const MEMBERSHIP_KEY: &str = embatch_protocol::headers::MEMBERSHIP_METADATA;

/// What `$SRV.INFO` says about one endpoint, and its counters for `$SRV.STATS`. Cloning shares
/// both (one `Arc`: each reply task holds a clone).
#[derive(Clone)]
pub struct EndpointStats(Arc<Endpoint>);

struct Endpoint {
    info: endpoint::Info,
    /// Shared with the other endpoints of [`EndpointStats::also_on`].
    counters: Arc<Mutex<Counters>>,
}

#[derive(Default)]
struct Counters {
    requests: usize,
    errors: usize,
    processing_time: Duration,
    last_error: Option<ServiceError>,
}

impl EndpointStats {
    /// An endpoint `name` on `subject` in `queue_group`, with nothing counted yet.
    pub fn new(name: &str, subject: &str, queue_group: &str) -> EndpointStats {
        EndpointStats(Arc::new(Endpoint {
            info: endpoint::Info {
                name: name.to_owned(),
                subject: subject.to_owned(),
                queue_group: queue_group.to_owned(),
                metadata: HashMap::new(),
            },
            counters: Arc::default(),
        }))
    }

    /// The same endpoint on another `subject` (the plain subject of a worker that serves the
    /// default model): listed apart by `$SRV.INFO`, counted together (one queue serves both,
    /// so `$SRV.STATS` reports the same counts for each).
    pub fn also_on(&self, subject: &str) -> EndpointStats {
        EndpointStats(Arc::new(Endpoint {
            info: endpoint::Info {
                subject: subject.to_owned(),
                ..self.0.info.clone()
            },
            counters: Arc::clone(&self.0.counters),
        }))
    }

    /// Another endpoint, `name` on `subject`, that shares these counters (the rerank endpoint,
    /// served by the embed endpoint's intake): listed apart by `$SRV.INFO`, counted together.
    pub fn also_as(&self, name: &str, subject: &str) -> EndpointStats {
        EndpointStats(Arc::new(Endpoint {
            info: endpoint::Info {
                name: name.to_owned(),
                subject: subject.to_owned(),
                ..self.0.info.clone()
            },
            counters: Arc::clone(&self.0.counters),
        }))
    }

    /// Counts one answered request that took `elapsed` from receipt to reply; `error` is the
    /// status code and one-line message of an error reply (`last_error` shows `code:message`).
    pub fn record(&self, elapsed: Duration, error: Option<ServiceError>) {
        let mut counters = self
            .0
            .counters
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        counters.requests += 1;
        counters.processing_time += elapsed;
        if let Some(error) = error {
            counters.errors += 1;
            counters.last_error = Some(error);
        }
    }

    fn stats(&self) -> endpoint::Stats {
        let counters = self
            .0
            .counters
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let average = u32::try_from(counters.requests)
            .ok()
            .filter(|n| *n > 0)
            .map_or(Duration::ZERO, |n| counters.processing_time / n);
        endpoint::Stats {
            name: self.0.info.name.clone(),
            subject: self.0.info.subject.clone(),
            requests: counters.requests,
            errors: counters.errors,
            processing_time: counters.processing_time,
            average_processing_time: average,
            last_error: counters.last_error.clone(),
            data: None,
            queue_group: self.0.info.queue_group.clone(),
        }
    }
}

/// The service's identity as discovery reports it.
pub struct Identity {
    /// The service name ([`embatch_protocol::SERVICE_NAME`]).
    pub name: String,
    /// The worker's version.
    pub version: String,
    /// One line on what it does.
    pub description: String,
    /// Static metadata (`protocol_version`); `membership` is added live.
    pub metadata: HashMap<String, String>,
}

/// The discovery responder: its subscriptions to the `$SRV` subjects and what it answers with.
pub struct Discovery {
    /// The requests on every `$SRV` subject, each with its verb.
    verbs: BoxStream<'static, (&'static str, async_nats::Message)>,
    answers: Answers,
}

/// What discovery answers with.
struct Answers {
    client: async_nats::Client,
    id: String,
    identity: Identity,
    endpoints: Vec<EndpointStats>,
    state: watch::Receiver<MemberState>,
    started: async_nats::datetime::DateTime,
}

impl Discovery {
    /// Subscribes, as service instance `id`, to the discovery subjects (`$SRV.<VERB>`,
    /// `$SRV.<VERB>.<name>`, `$SRV.<VERB>.<name>.<id>` for PING, INFO and STATS). `state` is
    /// read on every answer; `endpoints` are the endpoints `$SRV.INFO` and `$SRV.STATS` list.
    ///
    /// # Errors
    /// When a subscription cannot be made (the connection is closed).
    pub async fn subscribe(
        client: async_nats::Client,
        id: String,
        identity: Identity,
        endpoints: Vec<EndpointStats>,
        state: watch::Receiver<MemberState>,
    ) -> Result<Discovery, async_nats::SubscribeError> {
        let started = async_nats::datetime::now();
        let mut verbs = Vec::new();
        for verb in ["PING", "INFO", "STATS"] {
            for subject in [
                format!("$SRV.{verb}"),
                format!("$SRV.{verb}.{}", identity.name),
                format!("$SRV.{verb}.{}.{id}", identity.name),
            ] {
                let subscriber = client.subscribe(subject).await?;
                verbs.push(subscriber.map(move |message| (verb, message)));
            }
        }
        Ok(Discovery {
            verbs: futures::stream::select_all(verbs).boxed(),
            answers: Answers {
                client,
                id,
                identity,
                endpoints,
                state,
                started,
            },
        })
    }

    /// Answers discovery requests until `stop` is cancelled (the subscriptions are then
    /// dropped: unsubscribed) or the connection closes.
    pub async fn run(mut self, stop: CancellationToken) {
        loop {
            let (verb, message) = tokio::select! {
                next = self.verbs.next() => match next {
                    Some(next) => next,
                    None => return,
                },
                () = stop.cancelled() => return,
            };
            if let Some(reply) = message.reply {
                self.answers.send(verb, reply).await;
            }
        }
    }
}

impl Answers {
    /// Publishes the answer to `verb` on `reply`.
    async fn send(&self, verb: &str, reply: async_nats::Subject) {
        let identity = &self.identity;
        let mut metadata = identity.metadata.clone();
        metadata.insert(
            MEMBERSHIP_KEY.to_owned(),
            self.state.borrow().label().to_owned(),
        );
        let body = match verb {
            "PING" => serde_json::to_vec(&PingResponse {
                kind: "io.nats.micro.v1.ping_response".into(),
                name: identity.name.clone(),
                id: self.id.clone(),
                version: identity.version.clone(),
                metadata,
            }),
            "INFO" => serde_json::to_vec(&Info {
                kind: "io.nats.micro.v1.info_response".into(),
                name: identity.name.clone(),
                id: self.id.clone(),
                description: identity.description.clone(),
                version: identity.version.clone(),
                metadata,
                endpoints: self.endpoints.iter().map(|e| e.0.info.clone()).collect(),
            }),
            _ => serde_json::to_vec(&Stats {
                kind: "io.nats.micro.v1.stats_response".into(),
                name: identity.name.clone(),
                id: self.id.clone(),
                version: identity.version.clone(),
                started: self.started,
                endpoints: self.endpoints.iter().map(EndpointStats::stats).collect(),
            }),
        };
        match body {
            Ok(body) => {
                if let Err(err) = self.client.publish(reply, body.into()).await {
                    tracing::debug!(%err, verb, "cannot answer a discovery request");
                }
            }
            Err(err) => tracing::warn!(%err, verb, "cannot encode a discovery answer"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_count_requests_errors_and_the_average() {
        let embed = EndpointStats::new("embed", "embatch.embed.v1", "embatch");
        embed.record(Duration::from_millis(10), None);
        embed.record(
            Duration::from_millis(30),
            Some(ServiceError {
                code: 429,
                status: "full".into(),
            }),
        );
        let stats = embed.stats();
        assert_eq!((stats.requests, stats.errors), (2, 1));
        assert_eq!(stats.average_processing_time, Duration::from_millis(20));
        let json = serde_json::to_value(&stats).expect("serialisable");
        assert_eq!(json["last_error"], "429:full");
        assert_eq!(json["num_requests"], 2);
        assert_eq!(json["queue_group"], "embatch");
    }
}
