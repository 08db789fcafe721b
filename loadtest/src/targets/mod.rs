//! Where requests go. Both targets reduce every request to a [`crate::stats::Outcome`] through
//! the classification functions of [`crate::stats`], so the statistics are the same code path
//! whichever target is measured.

pub mod http;
pub mod nats;

use crate::corpus::Payload;
use crate::stats::Outcome;

pub use http::HttpTarget;
pub use nats::NatsTarget;

/// A target of the load.
#[derive(Debug, Clone)]
pub enum Target {
    /// Any TEI-compatible `POST /embed` URL (the gateway, TEI, the fake upstream).
    Http(HttpTarget),
    /// The embatch NATS subject, request-reply.
    Nats(NatsTarget),
}

impl Target {
    /// Sends one request and classifies its outcome; never fails otherwise.
    pub async fn send(&self, payload: Payload) -> Outcome {
        match self {
            Target::Http(t) => t.send(payload).await,
            Target::Nats(t) => t.send(payload).await,
        }
    }

    /// A short description for the report (`http://…/embed` or `nats://… subject embed`).
    pub fn describe(&self) -> String {
        match self {
            Target::Http(t) => t.describe(),
            Target::Nats(t) => t.describe(),
        }
    }
}
