//! TLS for tests: a private CA with a server certificate for `127.0.0.1`/`localhost` and a
//! client certificate, as PEM files ([`Pki`]), and a TLS-terminating proxy in front of a plain
//! TCP service ([`TlsProxy`]), e.g. the TEI double, to stand for TEI behind https.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// PEM files in a temporary directory (removed on drop): `ca.pem`, `server.pem`,
/// `server-key.pem`, `client.pem`, `client-key.pem`.
pub struct Pki {
    dir: PathBuf,
    server_cert: CertificateDer<'static>,
    server_key: Vec<u8>,
}

impl Pki {
    /// Generates a fresh CA and the two certificates signed by it.
    pub fn generate() -> Pki {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "embatch-pki-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("pki dir");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("ca key"))
            .expect("ca cert");
        let write = |name: &str, pem: String| std::fs::write(dir.join(name), pem).expect("write");
        write("ca.pem", ca.pem());
        let mut server = None;
        for (name, names, usage) in [
            (
                "server",
                vec!["127.0.0.1".to_string(), "localhost".to_string()],
                ExtendedKeyUsagePurpose::ServerAuth,
            ),
            (
                "client",
                vec!["embatch-client".to_string()],
                ExtendedKeyUsagePurpose::ClientAuth,
            ),
        ] {
            let mut params = CertificateParams::new(names).expect("params");
            params.extended_key_usages = vec![usage];
            let key = KeyPair::generate().expect("key");
            let cert = params.signed_by(&key, &ca).expect("signed");
            write(&format!("{name}.pem"), cert.pem());
            write(&format!("{name}-key.pem"), key.serialize_pem());
            if name == "server" {
                server = Some((cert.der().clone(), key.serialize_der()));
            }
        }
        let (server_cert, server_key) = server.expect("the server certificate");
        Pki {
            dir,
            server_cert,
            server_key,
        }
    }

    /// The path of one of the files, e.g. `pki.path("ca.pem")`.
    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TLS-terminating proxy on a free loopback port: each connection's TLS (the [`Pki`]'s server
/// certificate) is unwrapped and its bytes relayed to `upstream`. Stops when dropped.
pub struct TlsProxy {
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl TlsProxy {
    /// Starts the proxy in front of `upstream` (needs a tokio runtime).
    pub async fn start(pki: &Pki, upstream: SocketAddr) -> TlsProxy {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![pki.server_cert.clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pki.server_key.clone())),
            )
            .expect("server certificate");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the TLS proxy");
        let url = format!("https://{}", listener.local_addr().expect("addr"));
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // A failed handshake (an untrusting client) just ends this connection.
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    if let Ok(mut plain) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                    }
                });
            }
        });
        TlsProxy { url, task }
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
