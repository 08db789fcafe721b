//! The HTTP target: `POST` the body to a TEI-compatible `/embed` URL.

use std::time::Duration;

use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};

use crate::LoadtestError;
use crate::corpus::Payload;
use crate::stats::{FailureKind, Outcome, classify_http};

/// The header naming the model on the gateway's TEI routes (`Embatch-Model`, as the gateway's
/// `routes::MODEL_HEADER`).
pub const MODEL_HEADER: HeaderName = HeaderName::from_static("embatch-model");

/// A TEI-compatible `/embed` endpoint reached over plain HTTP/1.1 with keep-alive.
#[derive(Debug, Clone)]
pub struct HttpTarget {
    client: reqwest::Client,
    url: reqwest::Url,
    /// Headers sent with every request besides `Content-Type` (`Embatch-Model`).
    headers: HeaderMap,
}

impl HttpTarget {
    /// A target posting to `url`; each request (connect, send and read the whole reply) is
    /// limited to `timeout`. Proxies from the environment are ignored: a benchmark measures the
    /// target, not a proxy.
    ///
    /// # Errors
    /// [`LoadtestError::Config`] for a URL that is not `http://`, [`LoadtestError::Http`] when the
    /// client cannot be built.
    pub fn new(url: &str, timeout: Duration) -> Result<HttpTarget, LoadtestError> {
        let url = reqwest::Url::parse(url)
            .map_err(|e| LoadtestError::Config(format!("--url {url:?}: {e}")))?;
        if url.scheme() != "http" {
            return Err(LoadtestError::Config(format!(
                "--url {url}: only http:// is supported"
            )));
        }
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .tcp_nodelay(true)
            .no_proxy()
            .build()?;
        Ok(HttpTarget {
            client,
            url,
            headers: HeaderMap::new(),
        })
    }

    /// The same target asking for model `model` (`--model`) with the `Embatch-Model` header on
    /// every request (contract v1.1: the gateway routes the request to that model's workers);
    /// `None` leaves the target as it is (the default model).
    ///
    /// # Errors
    /// [`LoadtestError::Config`] when `model` cannot be a header value (control characters).
    pub fn with_model(mut self, model: Option<&str>) -> Result<HttpTarget, LoadtestError> {
        if let Some(model) = model {
            let value = HeaderValue::from_str(model).map_err(|e| {
                LoadtestError::Config(format!("--model {model:?}: not a header value: {e}"))
            })?;
            self.headers.insert(MODEL_HEADER, value);
        }
        Ok(self)
    }

    /// The same target sending `key` as `Authorization: Bearer <key>` on every request (a
    /// gateway with a tenants file); `None` leaves the target as it is.
    ///
    /// # Errors
    /// [`LoadtestError::Config`] when the key cannot be a header value.
    pub fn with_api_key(mut self, key: Option<&str>) -> Result<HttpTarget, LoadtestError> {
        if let Some(key) = key {
            let mut value = HeaderValue::from_str(&format!("Bearer {key}"))
                .map_err(|_| LoadtestError::Config("--api-key: not a header value".to_owned()))?;
            value.set_sensitive(true);
            self.headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        Ok(self)
    }

    /// Sends one request and classifies its outcome.
    pub async fn send(&self, payload: Payload) -> Outcome {
        let response = self
            .client
            .post(self.url.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .headers(self.headers.clone())
            .body(payload.body)
            .send()
            .await
            .map_err(|e| classify_reqwest(&e))?;
        let status = response.status().as_u16();
        let body = response.bytes().await.map_err(|e| classify_reqwest(&e))?;
        classify_http(status, &body, payload.inputs)
    }

    /// The URL.
    pub fn describe(&self) -> String {
        self.url.to_string()
    }
}

/// Classifies a client error: timeout, connection failure, or anything else.
pub fn classify_reqwest(err: &reqwest::Error) -> FailureKind {
    if err.is_timeout() {
        FailureKind::Timeout
    } else if err.is_connect() {
        FailureKind::Connect
    } else {
        FailureKind::Transport
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_non_http_urls() {
        let t = Duration::from_secs(1);
        assert!(matches!(
            HttpTarget::new("https://x/embed", t),
            Err(LoadtestError::Config(_))
        ));
        assert!(matches!(
            HttpTarget::new("not a url", t),
            Err(LoadtestError::Config(_))
        ));
        assert!(HttpTarget::new("http://127.0.0.1:1/embed", t).is_ok());
    }

    #[tokio::test]
    async fn refused_connection_is_connect() {
        // Bind then drop a listener so the port is (very likely) closed.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let target =
            HttpTarget::new(&format!("http://{addr}/embed"), Duration::from_secs(2)).expect("ok");
        let payload = Payload {
            body: bytes::Bytes::from_static(br#"{"inputs":"x"}"#),
            inputs: 1,
        };
        assert_eq!(target.send(payload).await, Err(FailureKind::Connect));
    }

    #[tokio::test]
    async fn silent_server_is_timeout() {
        // Accepts connections but never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let target = HttpTarget::new(&format!("http://{addr}/embed"), Duration::from_millis(200))
            .expect("ok");
        let payload = Payload {
            body: bytes::Bytes::from_static(br#"{"inputs":"x"}"#),
            inputs: 1,
        };
        assert_eq!(target.send(payload).await, Err(FailureKind::Timeout));
        server.abort();
    }
}
