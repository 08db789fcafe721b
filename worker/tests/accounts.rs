//! NATS accounts, as `nats/accounts.conf` ships them, on a real nats-server: a request from a
//! tenant's account is that account's tenant whatever its `Embatch-Tenant` says (the server's
//! `Nats-Request-Info` decides), one from the workers' own account names its tenant, the
//! acknowledgement protocol works across the import (`response_type: stream`), and the
//! per-tenant metrics count each request under the tenant it was served as.
//! One test in this binary: it installs the process's metrics recorder.

use std::net::SocketAddr;
use std::time::Duration;

use async_nats::HeaderMap;
use bytes::Bytes;
use embatch_client::{EmbedClient, SendOptions};
use embatch_protocol::{DEFAULT_SUBJECT, headers};
use embatch_testkit::{NatsServer, RunningWorker, TeiConfig, free_port, repo_root, start_tei};

/// The workers' tenants: `search` is the account SEARCH, `ads` the account ADS.
const TENANTS: &str = r#"
[tenants.search]
keys = ["sk-search"]
nats_account = "SEARCH"

[tenants.ads]
keys = ["sk-ads"]
nats_account = "ADS"
"#;

/// `nats://<user>:<password>@127.0.0.1:<port>` for a user of `nats/accounts.conf`.
fn url(nats: &NatsServer, user: &str) -> String {
    format!("nats://{user}:change-me-{user}@127.0.0.1:{}", nats.port)
}

/// Sends `text` on the request subject (as `tenant` when given); the reply's status and
/// `Embatch-Cache-Hits`.
async fn send(client: &async_nats::Client, text: &str, tenant: Option<&str>) -> (u16, Option<u64>) {
    let mut request_headers = HeaderMap::new();
    if let Some(tenant) = tenant {
        request_headers.insert(headers::TENANT, tenant);
    }
    let body = serde_json::json!({ "inputs": [text] }).to_string();
    let reply = tokio::time::timeout(
        Duration::from_secs(30),
        client.request_with_headers(DEFAULT_SUBJECT, request_headers, Bytes::from(body)),
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
    (
        header(headers::SERVICE_ERROR_CODE).map_or(200, |c| c.parse().expect("a code")),
        header(headers::CACHE_HITS).map(|h| h.parse().expect("a count")),
    )
}

/// Waits until the cache bucket (in the workers' account) holds `entries` keys, at most 10 s.
async fn bucket_holds(client: &async_nats::Client, entries: usize) {
    use futures::StreamExt;
    let js = async_nats::jetstream::new(client.clone());
    let kv = js
        .get_key_value("embatch_cache")
        .await
        .expect("the bucket exists");
    for _ in 0..500 {
        if kv.keys().await.expect("keys").count().await >= entries {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the bucket never held {entries} entries");
}

/// The value of `embatch_worker_tenant_requests_total` for `tenant`, interactive, `ok`.
fn served_as(metrics: &str, tenant: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("embatch_worker_tenant_requests_total{"))
        .filter(|l| l.contains(&format!("tenant=\"{tenant}\"")))
        .filter(|l| l.contains("lane=\"interactive\"") && l.contains("outcome=\"ok\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_account_is_its_tenant_and_only_the_workers_account_names_one() {
    let conf = repo_root().join("nats").join("accounts.conf");
    let conf = conf.to_string_lossy().into_owned();
    let store = tempfile::tempdir().expect("a JetStream store");
    let store_dir = store.path().to_string_lossy().into_owned();
    let nats = NatsServer::start_with_args(&["-c", &conf, "-js", "-sd", &store_dir]);
    // Each call takes 100 ms: the worker acknowledges requests that ask (held over 20 ms).
    let tei = start_tei(TeiConfig {
        base: Duration::from_millis(100),
        ..TeiConfig::instant()
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("tenants.toml");
    std::fs::write(&file, TENANTS).expect("write the tenants file");
    let file = file.to_string_lossy().into_owned();
    let admin = SocketAddr::from(([127, 0, 0, 1], free_port())).to_string();
    let worker = RunningWorker::start_at(
        &url(&nats, "embatch"),
        &[
            "--tei-url",
            tei.url.as_str(),
            "--tenants-file",
            &file,
            "--cache-kv-timeout",
            "5s",
            "--metrics-addr",
            &admin,
        ],
    )
    .await;
    let address = format!("nats://127.0.0.1:{}", nats.port);
    let connect = |user: &'static str| {
        async_nats::ConnectOptions::with_user_and_password(user.into(), format!("change-me-{user}"))
            .connect(address.clone())
    };
    let search = connect("search").await.expect("SEARCH connects");
    let ads = connect("ads").await.expect("ADS connects");
    let own = connect("embatch").await.expect("EMBATCH connects");

    // From SEARCH, claiming to be ads: served as search.
    assert_eq!(
        send(&search, "merger memo", Some("ads")).await,
        (200, Some(0))
    );
    bucket_holds(&own, 1).await;
    assert_eq!(
        send(&own, "merger memo", Some("ads")).await,
        (200, Some(0)),
        "the entry SEARCH made is not ads'"
    );
    bucket_holds(&own, 2).await;
    assert_eq!(
        send(&own, "merger memo", Some("search")).await,
        (200, Some(1)),
        "it is search's: the workers' own account names the tenant"
    );
    assert_eq!(
        send(&ads, "merger memo", None).await,
        (200, Some(1)),
        "ADS is ads"
    );

    // The client's acknowledgement protocol across the import: an acknowledgement, then the
    // reply (a singleton import would route the first only).
    let client = EmbedClient::new(search.clone(), DEFAULT_SUBJECT);
    let options = SendOptions {
        tenant: Some("ads".into()),
        ..SendOptions::default()
    };
    let body = Bytes::from_static(br#"{"inputs":["acknowledged"]}"#);
    let reply = client
        .embed_with(body, Duration::from_secs(10), &options)
        .await
        .expect("the reply follows the acknowledgement");
    assert_eq!(reply.cache_hits, Some(0));

    // The rerank subject crosses the import too: this worker's model is no reranker, so it
    // answers TEI's 424 (no import would be "no responders").
    let rerank = tokio::time::timeout(
        Duration::from_secs(10),
        search.request(
            format!("{DEFAULT_SUBJECT}.rerank"),
            Bytes::from_static(br#"{"query":"q","texts":["a"]}"#),
        ),
    )
    .await
    .expect("a reply within 10 s")
    .expect("a reply from the worker across the import");
    let code = rerank
        .headers
        .as_ref()
        .and_then(|h| h.get(headers::SERVICE_ERROR_CODE))
        .map(|v| v.as_str().to_owned());
    assert_eq!(code.as_deref(), Some("424"), "{rerank:?}");
    // So does the sparse subject (contract 1.3): a dense model answers TEI's 424.
    let sparse = tokio::time::timeout(
        Duration::from_secs(10),
        search.request(
            format!("{DEFAULT_SUBJECT}.embed_sparse"),
            Bytes::from_static(br#"{"inputs":"a"}"#),
        ),
    )
    .await
    .expect("a reply within 10 s")
    .expect("a reply from the worker across the import");
    let code = sparse
        .headers
        .as_ref()
        .and_then(|h| h.get(headers::SERVICE_ERROR_CODE))
        .map(|v| v.as_str().to_owned());
    assert_eq!(code.as_deref(), Some("424"), "{sparse:?}");

    let metrics = reqwest::get(format!("http://{admin}/metrics"))
        .await
        .expect("/metrics answers")
        .text()
        .await
        .expect("a text body");
    assert_eq!(served_as(&metrics, "search"), 3, "{metrics}");
    assert_eq!(served_as(&metrics, "ads"), 2, "{metrics}");
    worker.stop().await;
}
