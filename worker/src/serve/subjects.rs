//! The subjects a worker serves on: its discovery endpoints, its queue-group address (the
//! request subjects with their rerank and route subjects) and its cancel subscriptions.

use embatch_protocol::{embed_all, headers, predict, similarity, tokenize};

use crate::{Config, group, info, micro, model};

/// The worker's service endpoints, for discovery and `$SRV.STATS`.
pub(super) struct Endpoints {
    /// `<subject>.info` of each served subject, the model subject first.
    pub(super) info_subjects: Vec<String>,
    /// The `embed` endpoint's counters (shared by every request subject, rerank included).
    pub(super) embed_stats: micro::EndpointStats,
    /// The `info` endpoint's counters.
    pub(super) info_stats: micro::EndpointStats,
    /// Every endpoint discovery lists.
    pub(super) all: Vec<micro::EndpointStats>,
}

impl Endpoints {
    /// The endpoints of `served` in `queue_group`: the model subject first, then the plain
    /// subject when this worker serves the default model; rerank requests (contract v1.2) share
    /// the intake, and its counters, with embeddings.
    pub(super) fn of(served: &model::Served, queue_group: &str) -> Endpoints {
        let info_subjects: Vec<String> = served
            .subjects
            .iter()
            .map(|s| headers::info_subject(s))
            .collect();
        let embed_stats = micro::EndpointStats::new("embed", &served.subjects[0], queue_group);
        let info_stats = micro::EndpointStats::new(info::ENDPOINT, &info_subjects[0], queue_group);
        let mut all = vec![embed_stats.clone(), info_stats.clone()];
        for (subject, info_subject) in served.subjects.iter().zip(&info_subjects).skip(1) {
            all.push(embed_stats.also_on(subject));
            all.push(info_stats.also_on(info_subject));
        }
        for subject in &served.subjects {
            let rerank_subject = embatch_protocol::rerank::rerank_subject(subject);
            all.push(embed_stats.also_as("rerank", &rerank_subject));
            // Contract v1.3: sparse embeddings, served by the same intake.
            let sparse_subject = embatch_protocol::sparse::sparse_subject(subject);
            all.push(embed_stats.also_as(embatch_protocol::sparse::ROUTE, &sparse_subject));
            // Contract v1.4: classification, token embeddings and similarity, the same intake.
            for (route, route_subject) in [
                (predict::ROUTE, predict::predict_subject(subject)),
                (embed_all::ROUTE, embed_all::embed_all_subject(subject)),
                (similarity::ROUTE, similarity::similarity_subject(subject)),
            ] {
                all.push(embed_stats.also_as(route, &route_subject));
            }
            // Tokenize and decode, passed to the upstream by the same intake.
            for (route, route_subject) in [
                (tokenize::TOKENIZE, tokenize::tokenize_subject(subject)),
                (tokenize::DECODE, tokenize::decode_subject(subject)),
            ] {
                all.push(embed_stats.also_as(route, &route_subject));
            }
        }
        Endpoints {
            info_subjects,
            embed_stats,
            info_stats,
            all,
        }
    }
}

/// The queue-group address of worker `id`, whose model does `capabilities`: its request
/// subjects, with the `routes`' subjects (rerank's, sparse's, ...), which join and leave with
/// them.
pub(super) fn address<const N: usize>(
    config: &Config,
    served: &model::Served,
    routes: [&Vec<String>; N],
    (id, capabilities): (&str, &crate::intake::Capabilities),
) -> group::Address {
    group::Address {
        subject: config.subject.clone(),
        subjects: served
            .subjects
            .iter()
            .chain(routes.into_iter().flatten())
            .cloned()
            .collect(),
        queue_group: config.queue_group.clone(),
        speaker: crate::peers::Speaker {
            id: id.to_owned(),
            model: served.model.clone(),
            plain: served.plain,
            capabilities: capabilities.names(),
        },
    }
}

/// One subscription per served subject's cancel subject: a request sent on either subject is
/// withdrawn on that subject's.
pub(super) async fn subscribe_cancels(
    client: &async_nats::Client,
    subjects: &[String],
) -> Result<futures::stream::SelectAll<async_nats::Subscriber>, async_nats::SubscribeError> {
    let mut cancels = futures::stream::SelectAll::new();
    for subject in subjects {
        cancels.push(client.subscribe(headers::cancel_subject(subject)).await?);
    }
    Ok(cancels)
}
