//! [`NatsArgs`]: how every binary connects to NATS — the server list and the credentials of a
//! secured deployment (user/password, token, nkey, credentials file, TLS with a private CA,
//! mutual TLS) — parsed by clap and never logged in the clear.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use async_nats::{ConnectOptions, ServerAddr};

use crate::Secret;

/// The NATS servers of `--nats-url`: one URL or several, comma-separated (a cluster), tried in
/// the order given, first to connect and again on every reconnect (list the nearest node
/// first). A URL may carry credentials (`nats://user:password@host:4222`, `nats://token@host`);
/// `Display` and `Debug` print them as `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct ServerList(Vec<ServerAddr>);

impl ServerList {
    /// The servers, in order.
    pub fn addrs(&self) -> &[ServerAddr] {
        &self.0
    }
}

impl FromStr for ServerList {
    type Err = String;

    /// Splits on commas and parses each URL (scheme `nats`, `tls`, `ws` or `wss`; `host:port`
    /// alone means `nats://`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let servers = s
            .split(',')
            .map(str::trim)
            .filter(|url| !url.is_empty())
            .map(|url| {
                url.parse::<ServerAddr>()
                    .map_err(|e| format!("`{}` is not a NATS URL: {e}", redact_url(url)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if servers.is_empty() {
            return Err("no NATS server given".into());
        }
        Ok(ServerList(servers))
    }
}

impl fmt::Display for ServerList {
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

/// Installs aws-lc-rs, the workspace's one rustls crypto provider, as the process default (a
/// second call, or one after another provider was installed, changes nothing). Needed because
/// two providers are compiled in (a dependency of the hub download enables ring), and rustls
/// then cannot pick one by itself for async-nats' TLS connections.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// The NATS connection settings of the gateway and the worker (`#[command(flatten)]`): the
/// servers and [`NatsAuth`].
#[derive(Debug, Clone, clap::Args)]
pub struct NatsArgs {
    /// NATS server URL(s), comma-separated for a cluster, tried in the order given: list the
    /// nearest node first. May carry credentials (nats://user:password@host:4222); they are
    /// never logged.
    #[arg(
        long = "nats-url",
        env = "NATS_URL",
        default_value = "nats://127.0.0.1:4222"
    )]
    pub servers: ServerList,

    /// Credentials and TLS.
    #[command(flatten)]
    pub auth: NatsAuth,
}

/// How to authenticate to NATS and which TLS to use, for every binary (`#[command(flatten)]`;
/// the load generator takes its server from `--nats`). At most one way of authenticating may be
/// given; TLS settings combine with any of them. Without one, credentials in the server URL are
/// used.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct NatsAuth {
    /// NATS credentials file (a user JWT and nkey seed, `.creds`, as `nsc` writes it).
    #[arg(long, env = "NATS_CREDS", group = "nats_auth")]
    pub nats_creds: Option<PathBuf>,

    /// NATS nkey seed (`SU...`) for nkey authentication. Never logged.
    #[arg(long, env = "NATS_NKEY", hide_env_values = true, group = "nats_auth")]
    pub nats_nkey: Option<Secret>,

    /// NATS user name (with --nats-password).
    #[arg(
        long,
        env = "NATS_USER",
        requires = "nats_password",
        group = "nats_auth"
    )]
    pub nats_user: Option<String>,

    /// NATS password (with --nats-user). Never logged.
    #[arg(
        long,
        env = "NATS_PASSWORD",
        hide_env_values = true,
        requires = "nats_user"
    )]
    pub nats_password: Option<Secret>,

    /// NATS authentication token. Never logged.
    #[arg(long, env = "NATS_TOKEN", hide_env_values = true, group = "nats_auth")]
    pub nats_token: Option<Secret>,

    /// PEM file of the CA that signed the NATS servers' certificates (a private CA); implies
    /// TLS. The system's roots are trusted without it.
    #[arg(long, env = "NATS_TLS_CA")]
    pub nats_tls_ca: Option<PathBuf>,

    /// PEM client certificate for mutual TLS (with --nats-tls-key); implies TLS.
    #[arg(long, env = "NATS_TLS_CERT", requires = "nats_tls_key")]
    pub nats_tls_cert: Option<PathBuf>,

    /// PEM private key of --nats-tls-cert.
    #[arg(long, env = "NATS_TLS_KEY", requires = "nats_tls_cert")]
    pub nats_tls_key: Option<PathBuf>,
}

/// Why a binary could not connect to NATS at start-up. The message names the servers with
/// their credentials redacted.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    /// The credentials file could not be read.
    #[error("cannot read the NATS credentials file {path}: {source}")]
    Credentials {
        /// `--nats-creds`.
        path: PathBuf,
        /// The read error.
        source: std::io::Error,
    },
    /// No server accepted the connection (unreachable, TLS or authorization failure).
    #[error("cannot connect to NATS at {servers}: {source}")]
    Connect {
        /// `--nats-url`, redacted.
        servers: String,
        /// The client's error (e.g. `authorization violation`).
        source: async_nats::ConnectError,
    },
}

impl NatsArgs {
    /// Connects as `name` (shown by `nats server report connections`) with the caller's
    /// `options` plus the credentials and TLS settings, trying the servers in order (see
    /// [`NatsAuth::connect`]).
    ///
    /// # Errors
    /// As [`NatsAuth::connect`].
    pub async fn connect(
        &self,
        name: &str,
        options: ConnectOptions,
    ) -> Result<async_nats::Client, NatsError> {
        self.auth.connect(&self.servers, name, options).await
    }
}

impl NatsAuth {
    /// Connects to `servers` as `name` with the caller's `options` plus these credentials and
    /// TLS settings, trying the servers in order.
    ///
    /// # Errors
    /// [`NatsError::Credentials`] when the credentials file cannot be read,
    /// [`NatsError::Connect`] when no server accepts the connection.
    pub async fn connect(
        &self,
        servers: &ServerList,
        name: &str,
        options: ConnectOptions,
    ) -> Result<async_nats::Client, NatsError> {
        install_crypto_provider();
        let options = self.apply(options.name(name), servers).await?;
        options
            .retain_servers_order()
            .reconnect_delay_callback(embatch_client::reconnect_delay)
            .connect(servers.addrs().to_vec())
            .await
            .map_err(|source| NatsError::Connect {
                servers: servers.to_string(),
                source,
            })
    }

    async fn apply(
        &self,
        mut options: ConnectOptions,
        servers: &ServerList,
    ) -> Result<ConnectOptions, NatsError> {
        if let Some(path) = &self.nats_creds {
            options =
                options
                    .credentials_file(path)
                    .await
                    .map_err(|source| NatsError::Credentials {
                        path: path.clone(),
                        source,
                    })?;
        }
        if let Some(seed) = &self.nats_nkey {
            options = options.nkey(seed.expose().to_owned());
        }
        if let (Some(user), Some(password)) = (&self.nats_user, &self.nats_password) {
            options = options.user_and_password(user.clone(), password.expose().to_owned());
        }
        if let Some(token) = &self.nats_token {
            options = options.token(token.expose().to_owned());
        }
        if let Some(ca) = &self.nats_tls_ca {
            options = options.add_root_certificates(ca.clone()).require_tls(true);
        }
        let explicit = self.nats_creds.is_some()
            || self.nats_nkey.is_some()
            || self.nats_user.is_some()
            || self.nats_token.is_some();
        if !explicit {
            options = embatch_client::with_url_credentials(options, servers.addrs());
        }
        if let (Some(cert), Some(key)) = (&self.nats_tls_cert, &self.nats_tls_key) {
            options = options
                .add_client_certificate(cert.clone(), key.clone())
                .require_tls(true);
        }
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        nats: NatsArgs,
    }

    fn parse(args: &[&str]) -> Result<NatsArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("test").chain(args.iter().copied())).map(|c| c.nats)
    }

    #[test]
    fn server_lists_keep_order_and_redact_credentials() {
        let list: ServerList = "nats://alice:s3cret@a:4222, tls://tok3n@b:4443,c:4222"
            .parse()
            .expect("valid");
        assert_eq!(list.addrs().len(), 3);
        assert_eq!(list.addrs()[0].password(), Some("s3cret"));
        let shown = format!("{list} {list:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("tok3n"),
            "{shown}"
        );
        assert!(shown.contains("nats://***@a:4222"), "{shown}");
        assert!("".parse::<ServerList>().is_err());
        let err = "http://bob:pw@x:1"
            .parse::<ServerList>()
            .expect_err("bad scheme");
        assert!(!err.contains("pw"), "{err}");
    }

    #[test]
    fn secrets_are_flags_and_never_debug_printed() {
        let args = parse(&["--nats-user", "u", "--nats-password", "hunter2"]).expect("valid");
        assert!(!format!("{args:?}").contains("hunter2"));
        assert!(
            parse(&["--nats-user", "u"]).is_err(),
            "a user needs a password"
        );
        assert!(
            parse(&[
                "--nats-token",
                "t",
                "--nats-user",
                "u",
                "--nats-password",
                "p"
            ])
            .is_err(),
            "one way of authenticating"
        );
        assert!(
            parse(&["--nats-tls-cert", "c.pem"]).is_err(),
            "a cert needs its key"
        );
    }
}
