//! The HTTP client of the `http/protobuf` exporter: the workspace's reqwest (rustls with
//! aws-lc-rs, so no second TLS stack), its calls run on the process's tokio runtime.
//!
//! The SDK's batch processor exports from a thread of its own, outside the runtime, where
//! reqwest's async client cannot drive a connection; each export is therefore spawned onto the
//! runtime that built the client and awaited from there. An export is bounded by the client's
//! timeout, so no task outlives it by more.

use std::time::Duration;

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};

/// Longest one export may take: 10 s (the SDK's `OTEL_EXPORTER_OTLP_TIMEOUT` default).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// reqwest on the runtime it was built in.
#[derive(Debug, Clone)]
pub(super) struct OnRuntime {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

impl OnRuntime {
    /// A client on the current runtime.
    ///
    /// # Errors
    /// When reqwest cannot build its client (its TLS set-up failed).
    ///
    /// # Panics
    /// Outside a tokio runtime (the binaries call [`super::init`] inside theirs).
    pub(super) fn new() -> Result<OnRuntime, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(EXPORT_TIMEOUT)
            .connect_timeout(Duration::from_secs(2))
            .build()?;
        Ok(OnRuntime {
            client,
            runtime: tokio::runtime::Handle::current(),
        })
    }
}

#[async_trait::async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let request = reqwest::Request::try_from(request)?;
        let client = self.client.clone();
        let exchange = self.runtime.spawn(async move {
            let response = client.execute(request).await?;
            let status = response.status();
            let headers = response.headers().clone();
            let body = response.bytes().await?;
            let mut answer = Response::new(body);
            *answer.status_mut() = status;
            *answer.headers_mut() = headers;
            Ok::<_, reqwest::Error>(answer)
        });
        Ok(exchange.await??)
    }
}
