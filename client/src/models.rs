//! Which models a fleet serves, as NATS micro discovery reports it (contract v1.1, see
//! [`embatch_protocol::model`]).
//!
//! One `$SRV.INFO.embatch` request is answered by every worker; each answer names the model the
//! worker serves (`model`, `model_revision`, `default_model` metadata) and its endpoints. The
//! workers of the fleet under a subject prefix are those with an `embed` endpoint on the plain
//! subject or on one of its model subjects. The gateway fills its live model table from this
//! at start (and when a request names a model it has not heard of), then from the workers'
//! announcements.

use std::time::Duration;

use bytes::Bytes;
use embatch_protocol::headers::{MEMBERSHIP_METADATA, membership};
use embatch_protocol::model::{
    self, CAPABILITIES_METADATA, MODEL_METADATA, MODEL_REVISION_METADATA,
};
use futures::StreamExt;
use tokio::time::Instant;

/// One worker's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerModel {
    /// The worker's service id.
    pub id: String,
    /// The model it serves; `None` for a v1 worker (which announces none and serves the plain
    /// subject).
    pub model: Option<String>,
    /// The model's revision, when the worker knows it.
    pub revision: Option<String>,
    /// Whether it answers the plain subject.
    pub plain: bool,
    /// What its model does (`embed`, `sparse`, `rerank`, `classify`); `None` for a worker that
    /// predates contract v1.4.
    pub capabilities: Option<Vec<String>>,
    /// Its membership (`joined`, `full`, `upstream_unhealthy`, `stopping`).
    pub membership: String,
}

/// The workers of service `service` under subject prefix `prefix` that answer `$SRV.INFO`
/// within `wait`.
///
/// # Errors
/// When the inbox cannot be subscribed or the request published (the connection is closed).
pub async fn discover(
    nats: &async_nats::Client,
    service: &str,
    prefix: &str,
    wait: Duration,
) -> Result<Vec<WorkerModel>, async_nats::Error> {
    let inbox = nats.new_inbox();
    let mut answers = nats.subscribe(inbox.clone()).await?;
    nats.publish_with_reply(format!("$SRV.INFO.{service}"), inbox, Bytes::new())
        .await?;
    let until = Instant::now() + wait;
    let mut workers = Vec::new();
    while let Ok(Some(answer)) = tokio::time::timeout_at(until, answers.next()).await {
        let Ok(info) = serde_json::from_slice::<async_nats::service::Info>(&answer.payload) else {
            continue;
        };
        if let Some(worker) = worker_model(&info, prefix) {
            workers.push(worker);
        }
    }
    Ok(workers)
}

/// What `info` says of the worker's model, when it serves under `prefix`.
fn worker_model(info: &async_nats::service::Info, prefix: &str) -> Option<WorkerModel> {
    let mut plain = false;
    let mut model_subject = None;
    for endpoint in &info.endpoints {
        if endpoint.subject == prefix {
            plain = true;
        } else if let Some(name) = model::parse_model_subject(prefix, &endpoint.subject) {
            model_subject = Some(name);
        }
    }
    if !plain && model_subject.is_none() {
        return None; // a worker of another subject
    }
    let meta = |key: &str| info.metadata.get(key).cloned();
    Some(WorkerModel {
        id: info.id.clone(),
        model: meta(MODEL_METADATA).or(model_subject),
        revision: meta(MODEL_REVISION_METADATA),
        plain,
        capabilities: meta(CAPABILITIES_METADATA).map(|names| {
            names
                .split(',')
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
                .collect()
        }),
        membership: meta(MEMBERSHIP_METADATA).unwrap_or_else(|| membership::JOINED.to_owned()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(endpoints: &[&str], metadata: &[(&str, &str)]) -> async_nats::service::Info {
        serde_json::from_value(serde_json::json!({
            "type": "io.nats.micro.v1.info_response",
            "name": "embatch", "id": "w1", "description": "", "version": "0.1.0",
            "metadata": metadata.iter().map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<std::collections::HashMap<_, _>>(),
            "endpoints": endpoints.iter().map(|s| serde_json::json!({
                "name": "embed", "subject": s, "queue_group": "embatch", "metadata": {}
            })).collect::<Vec<_>>(),
        }))
        .expect("an info response")
    }

    #[test]
    fn a_workers_model_comes_from_its_metadata_and_endpoints() {
        let both = info(
            &["embed.BAAI/bge-small-en-v1%2E5", "embed"],
            &[("model", "BAAI/bge-small-en-v1.5"), ("membership", "full")],
        );
        let worker = worker_model(&both, "embed").expect("serves under embed");
        assert_eq!(worker.model.as_deref(), Some("BAAI/bge-small-en-v1.5"));
        assert!(worker.plain);
        assert_eq!(worker.membership, "full");
        let v1 = worker_model(&info(&["embed"], &[]), "embed").expect("a v1 worker");
        assert_eq!((v1.model, v1.plain), (None, true));
        assert!(worker_model(&both, "other").is_none(), "another prefix");
        let only_model = info(&["embed.m"], &[]);
        let worker = worker_model(&only_model, "embed").expect("a model subject");
        assert_eq!((worker.model.as_deref(), worker.plain), (Some("m"), false));
    }
}
