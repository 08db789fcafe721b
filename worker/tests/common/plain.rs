//! A plain NATS client's view of the worker (no `embatch-client`): a request with headers, the
//! reply's status and `Embatch-*` headers, and the cache bucket.
#![allow(dead_code)] // not every test binary uses every helper

use std::time::Duration;

use async_nats::HeaderMap;
use bytes::Bytes;
use embatch_protocol::{DEFAULT_SUBJECT, headers};
use futures::StreamExt;

/// A reply as a plain NATS client sees it.
pub struct Reply {
    /// 200, or the worker's `Nats-Service-Error-Code`.
    pub status: u16,
    /// `Embatch-Cache-Hits`, when present.
    pub hits: Option<usize>,
    /// `Embatch-Tokens`, when present.
    pub tokens: Option<u64>,
    /// TEI's response or error body.
    pub payload: Bytes,
}

impl Reply {
    /// The vectors of a success.
    ///
    /// # Panics
    /// When the reply is an error or its payload no list of vectors.
    pub fn vectors(&self) -> Vec<Vec<f32>> {
        assert_eq!(
            self.status,
            200,
            "{}",
            String::from_utf8_lossy(&self.payload)
        );
        serde_json::from_slice(&self.payload).expect("vectors")
    }

    /// The payload as JSON.
    ///
    /// # Panics
    /// When it is not JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.payload).expect("JSON")
    }
}

/// Sends `body` on `subject` with `extra` headers; the reply within 30 s.
///
/// # Panics
/// When no reply comes in 30 s, or a header holds no number.
pub async fn request_on(
    client: &async_nats::Client,
    subject: impl Into<String>,
    body: Bytes,
    extra: &[(&str, &str)],
) -> Reply {
    let mut request_headers = HeaderMap::new();
    for (name, value) in extra {
        request_headers.insert(*name, *value);
    }
    let subject: String = subject.into();
    let reply = tokio::time::timeout(
        Duration::from_secs(30),
        client.request_with_headers(subject, request_headers, body),
    )
    .await
    .expect("a reply within 30 s")
    .expect("a reply");
    let header = |name: &str| {
        reply
            .headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_owned())
    };
    Reply {
        status: header(headers::SERVICE_ERROR_CODE).map_or(200, |c| c.parse().expect("a code")),
        hits: header(headers::CACHE_HITS).map(|h| h.parse().expect("a count")),
        tokens: header(headers::TOKENS).map(|t| t.parse().expect("a count")),
        payload: reply.payload,
    }
}

/// Sends the JSON `body` on the request subject with `extra` headers.
pub async fn request(
    client: &async_nats::Client,
    body: serde_json::Value,
    extra: &[(&str, &str)],
) -> Reply {
    request_on(
        client,
        DEFAULT_SUBJECT,
        Bytes::from(body.to_string()),
        extra,
    )
    .await
}

/// Sends `{"inputs": [text]}` on the request subject, as `tenant` when given.
pub async fn send(client: &async_nats::Client, text: &str, tenant: Option<&str>) -> Reply {
    let tenant = tenant.map(|tenant| (headers::TENANT, tenant));
    let body = serde_json::json!({ "inputs": [text] });
    request(client, body, tenant.as_slice()).await
}

/// Waits until the cache bucket (`embatch_cache`, in `client`'s account) holds exactly
/// `entries` keys (written after the replies), at most 10 s.
///
/// # Panics
/// When the bucket does not exist, or holds fewer after 10 s, or more.
pub async fn bucket_holds(client: &async_nats::Client, entries: usize) {
    let kv = async_nats::jetstream::new(client.clone())
        .get_key_value("embatch_cache")
        .await
        .expect("the bucket exists");
    for _ in 0..500 {
        let keys: Vec<String> = kv
            .keys()
            .await
            .expect("keys")
            .filter_map(|k| async move { k.ok() })
            .collect()
            .await;
        if keys.len() >= entries {
            assert_eq!(keys.len(), entries, "more entries than expected");
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the bucket never held {entries} entries");
}
