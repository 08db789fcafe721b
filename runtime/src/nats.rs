//! [`NatsArgs`]: how every binary connects to NATS — the server list and the credentials of a
//! secured deployment (user/password, token, nkey, credentials file, TLS with a private CA,
//! mutual TLS) — parsed by clap and never logged in the clear.
//!
//! The server list is [`ServerList`], re-exported from `embatch-client`: one parser of server
//! lists and of the credentials a URL carries, for the binaries and for services that use the
//! client alone. This module adds the flags and applies them on top.

use std::path::PathBuf;

use async_nats::ConnectOptions;
pub use embatch_client::ServerList;

use crate::Secret;

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
    /// The thread that runs the connection ([`NatsArgs::connect_on_own_thread`]) could not be
    /// started, or stopped before it connected.
    #[error("cannot run the NATS connection on a thread of its own: {0}")]
    Thread(std::io::Error),
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
        let connected = servers.connect(options).await;
        connected.map_err(|source| NatsError::Connect {
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
