//! Who the worker is on NATS: its service id and the identity discovery reports.

use embatch_protocol::model as model_keys;
use embatch_protocol::{CONTRACT_VERSION, PROTOCOL_VERSION, SERVICE_NAME};

use crate::{intake, micro, model};

/// The worker's service id: a NUID, as async-nats's own services make it (the last token of a
/// fresh inbox subject is one). Discovery reports it and membership announcements carry it.
pub(super) fn service_id(client: &async_nats::Client) -> String {
    let inbox = client.new_inbox();
    inbox.rsplit('.').next().unwrap_or(&inbox).to_owned()
}

/// The service's identity as discovery reports it: the contract version and the model served
/// (`model`, `model_revision` when known, `default_model`: whether it answers the plain subject,
/// `capabilities`: what the model does, comma-separated).
pub(super) fn identity(
    served: &model::Served,
    capabilities: intake::Capabilities,
) -> micro::Identity {
    let mut metadata: std::collections::HashMap<String, String> = [
        ("protocol_version", PROTOCOL_VERSION),
        ("contract_version", CONTRACT_VERSION),
        (model_keys::MODEL_METADATA, served.model.name.as_str()),
        (
            model_keys::DEFAULT_METADATA,
            if served.plain { "true" } else { "false" },
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    metadata.insert(
        model_keys::CAPABILITIES_METADATA.to_owned(),
        capabilities.names().join(","),
    );
    if let Some(revision) = &served.model.revision {
        metadata.insert(
            model_keys::MODEL_REVISION_METADATA.to_owned(),
            revision.clone(),
        );
    }
    micro::Identity {
        name: SERVICE_NAME.to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        description: "embatch: batches embedding requests for an upstream model".to_owned(),
        metadata,
    }
}
