//! The Rust client of the embatch NATS contract (see `embatch-protocol` and docs/nats-contract.md):
//! connect to NATS, send one embed request with its deadline, get back the embeddings or a typed
//! error.
//!
//! The gateway, the load generator and the tests all send requests through [`EmbedClient`], so the
//! request headers, the reply decoding and the mapping of NATS request failures to
//! [`EmbedError`](embatch_protocol::EmbedError)s are written once. Likewise [`ServerList`] is the
//! one parser of NATS server lists and URL credentials: [`connect`] uses it, and so does every
//! embatch binary's `--nats-url`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! let nats = embatch_client::connect("nats://127.0.0.1:4222", "my-service").await?;
//! let client = embatch_client::EmbedClient::new(nats, embatch_protocol::DEFAULT_SUBJECT);
//! let reply = client
//!     .embed(r#"{"inputs":["hello"]}"#.into(), Duration::from_secs(2))
//!     .await?;
//! println!("{}", String::from_utf8_lossy(&reply.payload)); // [[0.01, ...]]
//! # Ok(()) }
//! ```
//!
//! A fleet that serves several models (contract v1.1) is reached per model with
//! [`EmbedClient::for_model`]; [`models::discover`] lists the models served.

mod delivery;
mod embed_client;
mod error;
pub mod fleet;
mod inbox;
mod message;
pub mod models;
mod options;
mod resend;
mod servers;
pub mod trace;

use std::time::Duration;

pub use embed_client::EmbedClient;
pub use error::RequestError;
pub use inbox::{ACK_TIMEOUT_MAX, ACK_TIMEOUT_MIN};
use message::decode;
pub use message::{Reply, header, header_in};
pub use options::{Operation, SendOptions};
use resend::{MIN_RESEND_BUDGET, publish_cancel, retry_jitter, unavailable_pause};
pub use resend::{
    NO_RESPONDERS_RETRY, RECONNECT_GRACE, RECONNECT_POLL, RETRIES, UNAVAILABLE_RETRIES,
};
pub use servers::{ServerList, ServerListError, with_url_credentials};
pub use trace::TraceContext;

/// Connects to NATS as `name` (shown by `nats server report connections` and in the monitoring
/// endpoints).
///
/// `urls` may list several servers, comma-separated (see [`ServerList`]). They are tried in the
/// order given, first to connect and again on every reconnect: list the nearest node first.
/// Credentials in a URL are sent ([`with_url_credentials`]).
///
/// # Errors
/// When no server in `urls` answers, or one is not a NATS URL.
pub async fn connect(
    urls: &str,
    name: &str,
) -> Result<async_nats::Client, async_nats::ConnectError> {
    connect_with(urls, async_nats::ConnectOptions::new().name(name)).await
}

/// [`connect`] with the caller's own options (e.g. a subscription capacity).
///
/// # Errors
/// When no server in `urls` answers, or one is not a NATS URL
/// (`ConnectErrorKind::ServerParse`, the URL shown redacted).
pub async fn connect_with(
    urls: &str,
    options: async_nats::ConnectOptions,
) -> Result<async_nats::Client, async_nats::ConnectError> {
    let servers = urls.parse::<ServerList>().map_err(|e| {
        async_nats::ConnectError::with_source(async_nats::ConnectErrorKind::ServerParse, e)
    })?;
    servers
        .connect(with_url_credentials(options, servers.addrs()))
        .await
}

/// The pause before reconnect attempt `attempts` (1-based): none for the first, then 10, 20,
/// 40, 80 ms, then 100 ms for every later one. async-nats's default doubles up to 4 s, so a
/// client could come back seconds after a restarted server did, while requests wait for it
/// within their deadline; an attempt on a local network costs a TCP connect, so ten per second
/// per client is cheap. [`connect`] and the gateway and worker (`embatch-runtime`) use it.
pub fn reconnect_delay(attempts: usize) -> Duration {
    match attempts {
        0 | 1 => Duration::ZERO,
        n => {
            let exp = u32::try_from(n - 2).unwrap_or(u32::MAX).min(4);
            Duration::from_millis(10u64 << exp).min(RECONNECT_DELAY_MAX)
        }
    }
}

/// The longest pause between reconnect attempts ([`reconnect_delay`]): 100 ms.
pub const RECONNECT_DELAY_MAX: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnects_come_fast_and_then_every_100_ms() {
        let delays: Vec<u64> = (1..=8)
            .map(|n| u64::try_from(reconnect_delay(n).as_millis()).unwrap_or(u64::MAX))
            .collect();
        assert_eq!(delays, [0, 10, 20, 40, 80, 100, 100, 100]);
        assert_eq!(reconnect_delay(usize::MAX), RECONNECT_DELAY_MAX);
    }
}
