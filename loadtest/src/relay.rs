//! `embatch-loadtest nats-relay`: the least a NATS-to-TEI bridge can do, as a benchmark
//! reference. Each request message on the subject is POSTed as it is to the upstream's `/embed`
//! (one HTTP call per message: no batching, no validation, no admission, no deadline), and the
//! upstream's body is published to the message's reply inbox.
//!
//! Benchmark 2 runs it in the worker's place: the nats path less this path is what the worker
//! itself adds (intake, batcher, reply assembly); this path less the direct HTTP path is the
//! price of the two NATS hops on the machine. A status other than 200 is answered with the
//! contract's error headers (`Nats-Service-Error-Code`), so the load generator counts it as a
//! failure.

use async_nats::HeaderMap;
use bytes::Bytes;
use embatch_protocol::headers;
use futures::StreamExt;

use crate::LoadtestError;

/// Serves `subject` on the NATS connection `nats`, relaying every message to `upstream`
/// (`http://host:port`, the TEI base URL) until Ctrl-C.
///
/// # Errors
/// When the subscription cannot be made.
pub async fn serve(
    nats: async_nats::Client,
    subject: String,
    upstream: String,
) -> Result<(), LoadtestError> {
    let http = reqwest::Client::builder().build()?;
    let url = format!("{}/embed", upstream.trim_end_matches('/'));
    let mut messages = nats
        .subscribe(subject.clone())
        .await
        .map_err(|e| LoadtestError::Config(format!("cannot subscribe to {subject}: {e}")))?;
    println!("relaying {subject} to {url}");
    let stop = tokio::signal::ctrl_c();
    tokio::pin!(stop);
    loop {
        let message = tokio::select! {
            message = messages.next() => match message {
                Some(message) => message,
                None => return Ok(()),
            },
            _ = &mut stop => return Ok(()),
        };
        let Some(inbox) = message.reply else {
            continue;
        };
        let (nats, http, url) = (nats.clone(), http.clone(), url.clone());
        tokio::spawn(async move {
            let (error, body) = match call(&http, &url, message.payload).await {
                Ok(body) => (None, body),
                Err((code, text)) => (Some(code), Bytes::from(text)),
            };
            let published = match error {
                None => nats.publish(inbox, body).await,
                Some(code) => {
                    let mut reply_headers = HeaderMap::new();
                    reply_headers.insert(headers::SERVICE_ERROR_CODE, code.to_string().as_str());
                    reply_headers.insert(headers::SERVICE_ERROR, "relay: upstream call failed");
                    nats.publish_with_headers(inbox, reply_headers, body).await
                }
            };
            if let Err(err) = published {
                tracing::debug!(%err, "cannot publish a reply");
            }
        });
    }
}

/// One upstream call: the body on 200, else the status (502 when there is none) and a text.
async fn call(http: &reqwest::Client, url: &str, body: Bytes) -> Result<Bytes, (u16, String)> {
    let response = http
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| (502, e.to_string()))?;
    let status = response.status().as_u16();
    let body = response.bytes().await.map_err(|e| (502, e.to_string()))?;
    if status == 200 {
        Ok(body)
    } else {
        Err((status, String::from_utf8_lossy(&body).into_owned()))
    }
}
