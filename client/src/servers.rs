//! The one place a NATS server list is parsed: [`ServerList`] (comma-separated URLs, tried in
//! order, credentials in a URL redacted when shown) and the credentials a URL carries
//! ([`with_url_credentials`]). [`crate::connect`] uses it, and so does every embatch binary
//! (through `embatch-runtime`'s `--nats-url`, which adds the credential and TLS flags).

use std::fmt;
use std::str::FromStr;

use async_nats::{ConnectOptions, ServerAddr};

/// NATS servers: one URL or several, comma-separated (a cluster), tried in the order given,
/// first to connect and again on every reconnect (list the nearest node first). A URL may carry
/// credentials (`nats://user:password@host:4222`, `nats://token@host`); `Display` and `Debug`
/// print them as `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct ServerList(Vec<ServerAddr>);

impl ServerList {
    /// The servers, in order (never empty).
    pub fn addrs(&self) -> &[ServerAddr] {
        &self.0
    }

    /// Connects with `options`, trying the servers in the order given (async-nats would shuffle
    /// them). `options` is used as given: add the URLs' credentials with
    /// [`with_url_credentials`] when no other authentication is configured.
    ///
    /// # Errors
    /// When no server accepts the connection (unreachable, TLS or authorization failure).
    pub async fn connect(
        &self,
        options: ConnectOptions,
    ) -> Result<async_nats::Client, async_nats::ConnectError> {
        options
            .retain_servers_order()
            .reconnect_delay_callback(crate::reconnect_delay)
            .connect(self.0.clone())
            .await
    }
}

/// Why a server list did not parse (shown by `--nats-url` and [`crate::connect_with`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServerListError {
    /// A comma-separated entry is not a NATS URL; `url` is shown with its credentials redacted.
    #[error("`{url}` is not a NATS URL: {reason}")]
    NotAUrl {
        /// The entry, its userinfo replaced by `***`.
        url: String,
        /// async-nats's reason.
        reason: String,
    },
    /// Nothing but commas and spaces.
    #[error("no NATS server given")]
    Empty,
}

impl FromStr for ServerList {
    /// What is wrong, naming the offending URL with its credentials redacted.
    type Err = ServerListError;

    /// Splits on commas and parses each URL (scheme `nats`, `tls`, `ws` or `wss`; `host:port`
    /// alone means `nats://`). An empty list is an error.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let servers = s
            .split(',')
            .map(str::trim)
            .filter(|url| !url.is_empty())
            .map(|url| {
                url.parse::<ServerAddr>()
                    .map_err(|e| ServerListError::NotAUrl {
                        url: redact_url(url),
                        reason: e.to_string(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if servers.is_empty() {
            return Err(ServerListError::Empty);
        }
        Ok(ServerList(servers))
    }
}

impl fmt::Display for ServerList {
    /// The URLs, comma-separated, each with its userinfo replaced by `***`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, server) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(&redact_url(server.clone().into_inner().as_str()))?;
        }
        Ok(())
    }
}

impl fmt::Debug for ServerList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

/// `url` with its userinfo (user, password or token) replaced by `***`.
fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return match url.rsplit_once('@') {
            Some((_, host)) => format!("***@{host}"),
            None => url.to_owned(),
        };
    };
    match rest.rsplit_once('@') {
        Some((_, host)) => format!("{scheme}://***@{host}"),
        None => url.to_owned(),
    }
}

/// Applies credentials carried in a server URL, as other NATS clients do: async-nats (0.51)
/// parses them but does not send them. `nats://user:password@host` → user and password;
/// `nats://token@host` → token. The first server with credentials wins; call this only when
/// no other authentication is configured.
pub fn with_url_credentials(options: ConnectOptions, servers: &[ServerAddr]) -> ConnectOptions {
    let Some(server) = servers.iter().find(|s| s.has_user_pass()) else {
        return options;
    };
    match (server.username(), server.password()) {
        (Some(user), Some(password)) => options.user_and_password(user.into(), password.into()),
        (Some(token), None) => options.token(token.into()),
        _ => options,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_lists_keep_order_and_redact_credentials() {
        let list: ServerList = "nats://alice:s3cret@a:4222, tls://tok3n@b:4443,c:4222"
            .parse()
            .expect("valid");
        let hosts: Vec<_> = list.addrs().iter().map(ServerAddr::host).collect();
        assert_eq!(hosts, ["a", "b", "c"]);
        assert_eq!(list.addrs()[0].password(), Some("s3cret"));
        let shown = format!("{list} {list:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("tok3n"),
            "{shown}"
        );
        assert!(shown.contains("nats://***@a:4222"), "{shown}");
        assert!("".parse::<ServerList>().is_err());
        assert!(" , ".parse::<ServerList>().is_err());
        let err = "http://bob:pw@x:1"
            .parse::<ServerList>()
            .expect_err("bad scheme");
        let err = err.to_string();
        assert!(!err.contains("pw"), "{err}");
    }
}
