//! A secured NATS deployment: real nats-server processes with user/password, token and mutual
//! TLS under a private CA (certificates generated here with rcgen). The gateway and a worker
//! join with the `--nats-*` flags (or credentials in the URL), a request goes through, and a
//! wrong secret fails at start-up with the server's reason and without the secret in the
//! message.

mod common;

use std::path::{Path, PathBuf};

use clap::Parser;
use common::{json_post, start_gateway_at};
use embatch_testkit::{NatsServer, RunningWorker, TeiConfig, TeiDouble, double_vector, start_tei};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
};

/// POSTs one input through the gateway and checks the TEI double's vector came back.
async fn embeds_through(gateway_url: &str) {
    let url = format!("{gateway_url}/embed");
    let response = json_post(&reqwest::Client::new(), &url, r#"{"inputs":"secured"}"#)
        .send()
        .await
        .expect("send");
    assert_eq!(response.status().as_u16(), 200);
    let vectors: Vec<Vec<f32>> = response.json().await.expect("vectors");
    assert_eq!(vectors, vec![double_vector("secured")]);
}

/// The TEI double and a worker on it joining NATS at `nats_url`, configured by `args` after
/// `--tei-url`.
async fn tei_and_worker(nats_url: &str, args: &[&str]) -> (TeiDouble, RunningWorker) {
    let tei = start_tei(TeiConfig::instant()).await;
    let mut worker_args = vec!["--tei-url", tei.url.as_str()];
    worker_args.extend(args);
    let worker = RunningWorker::start_at(nats_url, &worker_args).await;
    (tei, worker)
}

/// `nats`'s URL with `credentials` (`user:password` or a token) in it, as `nats://…@127.0.0.1:PORT`.
fn url_with_credentials(nats: &NatsServer, credentials: &str) -> String {
    nats.url()
        .replacen("nats://", &format!("nats://{credentials}@"), 1)
}

/// The gateway's start-up connect with `args`, as its error message.
async fn gateway_connect_error(url: &str, args: &[&str]) -> String {
    let mut argv = vec!["embatch-gateway", "--nats-url", url];
    argv.extend(args);
    let config = embatch_gateway::Config::parse_from(argv);
    embatch_gateway::connect(&config)
        .await
        .expect_err("the server refuses")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_and_password_from_flags_or_url_and_a_wrong_password_fails_clearly() {
    let nats = NatsServer::start_with_args(&["--user", "embatch", "--pass", "s3cret-pw"]);
    let (_tei, worker) =
        tei_and_worker(&url_with_credentials(&nats, "embatch:s3cret-pw"), &[]).await;
    let gateway = start_gateway_at(
        &nats.url(),
        &["--nats-user", "embatch", "--nats-password", "s3cret-pw"],
        None,
    )
    .await;
    embeds_through(&gateway.url).await;

    let err = gateway_connect_error(
        &nats.url(),
        &["--nats-user", "embatch", "--nats-password", "wrong-pw"],
    )
    .await;
    assert!(err.contains("authorization violation"), "{err}");
    assert!(!err.contains("wrong-pw"), "{err}");
    let err = gateway_connect_error(&url_with_credentials(&nats, "embatch:wrong-pw"), &[]).await;
    assert!(err.contains("authorization violation"), "{err}");
    assert!(
        !err.contains("wrong-pw") && err.contains("nats://***@127.0.0.1"),
        "{err}"
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_authentication() {
    let nats = NatsServer::start_with_args(&["--auth", "t0ken-value"]);
    let (_tei, worker) = tei_and_worker(&url_with_credentials(&nats, "t0ken-value"), &[]).await;
    let gateway = start_gateway_at(&nats.url(), &["--nats-token", "t0ken-value"], None).await;
    embeds_through(&gateway.url).await;
    let err = gateway_connect_error(&nats.url(), &["--nats-token", "other"]).await;
    assert!(err.contains("authorization violation"), "{err}");
    worker.stop().await;
}

/// PEM files of a private CA, a server certificate for 127.0.0.1 and a client certificate.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn generate() -> Pki {
        let dir = std::env::temp_dir().join(format!("embatch-pki-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("pki dir");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("ca key"))
            .expect("ca cert");
        let write = |name: &str, pem: String| std::fs::write(dir.join(name), pem).expect("write");
        write("ca.pem", ca.pem());
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
        }
        Pki { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_with_a_private_ca() {
    let pki = Pki::generate();
    let nats = NatsServer::start_with_args(&[
        "--tls",
        "--tlscert",
        &pki.path("server.pem"),
        "--tlskey",
        &pki.path("server-key.pem"),
        "--tlscacert",
        &pki.path("ca.pem"),
        "--tlsverify",
    ]);
    let (ca, cert, key) = (
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client-key.pem"),
    );
    let tls = [
        "--nats-tls-ca",
        ca.as_str(),
        "--nats-tls-cert",
        cert.as_str(),
        "--nats-tls-key",
        key.as_str(),
    ];
    let (_tei, worker) = tei_and_worker(&nats.url(), &tls).await;
    let gateway = start_gateway_at(&nats.url(), &tls, None).await;
    embeds_through(&gateway.url).await;

    // Without the private CA the server's certificate is not trusted; without a client
    // certificate the server refuses the connection.
    let err = gateway_connect_error(
        &nats.url(),
        &["--nats-tls-cert", &cert, "--nats-tls-key", &key],
    )
    .await;
    assert!(
        err.to_lowercase().contains("certificate") || err.contains("issuer"),
        "{err}"
    );
    let err = gateway_connect_error(&nats.url(), &["--nats-tls-ca", &ca]).await;
    assert!(err.starts_with("cannot connect to NATS"), "{err}");
    assert!(Path::new(&ca).exists());
    worker.stop().await;
}
