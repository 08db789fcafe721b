//! TEI's routes a worker passes through, one upstream call per request: `POST /tokenize` and
//! `POST /decode` (contract v1.3). They run no model (TEI answers them from its tokenizer), so
//! batching them would only add a wait; the body goes to the upstream as the caller sent it and
//! TEI's reply, or TEI's error, comes back as it is.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;

use super::UpstreamError;
use super::http;
use super::tei::{TeiUpstream, status_error};

/// One pass-through call's future.
pub type RouteCall<'a> = Pin<Box<dyn Future<Output = Result<Bytes, UpstreamError>> + Send + 'a>>;

/// An upstream that serves TEI's pass-through routes (`tokenize`, `decode`).
pub trait RouteCaller: Send + Sync {
    /// `POST {upstream}/{route}` with the JSON `body`: the reply body of a 2xx, else the error
    /// by cause (TEI's error body passed through as [`UpstreamError::Status`]; a 404 of an
    /// upstream without the route as [`UpstreamError::Http`] or `Status`). Bounded by the
    /// upstream's own `UPSTREAM_TIMEOUT`; the caller bounds it by the request's deadline.
    fn call(&self, route: &'static str, body: Bytes) -> RouteCall<'_>;
}

impl RouteCaller for TeiUpstream {
    fn call(&self, route: &'static str, body: Bytes) -> RouteCall<'_> {
        Box::pin(self.post_bytes(route, body))
    }
}

impl TeiUpstream {
    /// `POST {tei_url}/{route}` with the JSON text `body` (and the trace context) on a replica
    /// ([`TeiUpstream::on_replica`]): the reply body of a 2xx, else the error by cause (TEI's
    /// error body as [`UpstreamError::Status`]).
    pub(super) async fn post_bytes(
        &self,
        route: &str,
        body: Bytes,
    ) -> Result<Bytes, UpstreamError> {
        self.on_replica(|base| {
            let body = body.clone();
            async move {
                let url = format!("{base}/{route}");
                let sent = http::post_json(&self.client, &url).body(body).send().await;
                let (status, reply) = http::answer(sent, self.timeout).await?;
                if !status.is_success() {
                    return Err(status_error(status.as_u16(), &reply));
                }
                Ok(reply)
            }
        })
        .await
    }
}
