//! NATS accounts, as `nats/accounts.conf` ships them, on a real nats-server: a request from a
//! tenant's account is that account's tenant whatever its `Embatch-Tenant` says (the server's
//! `Nats-Request-Info` decides), one from the workers' own account names its tenant, the
//! acknowledgement protocol works across the import (`response_type: stream`), and the
//! per-tenant metrics count each request under the tenant it was served as.
//! One test in this binary: it installs the process's metrics recorder.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::metrics_text;
use common::plain::{Reply, bucket_holds, request_on, send};
use embatch_client::{EmbedClient, SendOptions};
use embatch_protocol::DEFAULT_SUBJECT;
use embatch_testkit::{
    Faults, NatsServer, RunningWorker, TeiDouble, free_port, repo_root, start_slow_tei,
    tenants_file,
};
use futures::StreamExt;

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

/// A reply's status and `Embatch-Cache-Hits`.
fn status_and_hits(reply: Reply) -> (u16, Option<usize>) {
    (reply.status, reply.hits)
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
    let tei = start_slow_tei(Duration::from_millis(100)).await;
    let (_dir, file) = tenants_file(TENANTS);
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
        status_and_hits(send(&search, "merger memo", Some("ads")).await),
        (200, Some(0))
    );
    bucket_holds(&own, 1).await;
    assert_eq!(
        status_and_hits(send(&own, "merger memo", Some("ads")).await),
        (200, Some(0)),
        "the entry SEARCH made is not ads'"
    );
    bucket_holds(&own, 2).await;
    assert_eq!(
        status_and_hits(send(&own, "merger memo", Some("search")).await),
        (200, Some(1)),
        "it is search's: the workers' own account names the tenant"
    );
    assert_eq!(
        status_and_hits(send(&ads, "merger memo", None).await),
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
    held_across_the_import(&search, &own, &client, &tei).await;

    // The rerank subject crosses the import too: this worker's model is no reranker, so it
    // answers TEI's 424 (no import would be "no responders").
    let rerank = request_on(
        &search,
        format!("{DEFAULT_SUBJECT}.rerank"),
        Bytes::from_static(br#"{"query":"q","texts":["a"]}"#),
        &[],
    )
    .await;
    assert_eq!(rerank.status, 424, "{:?}", rerank.payload);
    // So does the sparse subject (contract 1.3): a dense model answers TEI's 424.
    let sparse = request_on(
        &search,
        format!("{DEFAULT_SUBJECT}.embed_sparse"),
        Bytes::from_static(br#"{"inputs":"a"}"#),
        &[],
    )
    .await;
    assert_eq!(sparse.status, 424, "{:?}", sparse.payload);

    let metrics = metrics_text(&admin).await;
    // Three embed requests above and the held one, all from SEARCH.
    assert_eq!(served_as(&metrics, "search"), 4, "{metrics}");
    assert_eq!(served_as(&metrics, "ads"), 2, "{metrics}");
    worker.stop().await;
}

/// A request from a tenant's account held for 900 ms (over the client's 500 ms heartbeat
/// expiry) is beaten for on the exported `embed.alive`, not on the client's own heartbeat
/// subject (out of the worker's account), so the client never takes the worker for lost: no
/// copy is resent. `search` is a connection of the client's account (it sees each copy the
/// client publishes there), `own` one of the workers' account (it sees the heartbeats).
async fn held_across_the_import(
    search: &async_nats::Client,
    own: &async_nats::Client,
    client: &EmbedClient,
    tei: &TeiDouble,
) {
    let mut requests = search.subscribe(DEFAULT_SUBJECT).await.expect("subscribe");
    search.flush().await.expect("flush");
    let mut beats = own
        .subscribe(embatch_protocol::headers::heartbeat_subject(
            DEFAULT_SUBJECT,
        ))
        .await
        .expect("subscribe");
    own.flush().await.expect("flush");
    tei.set_faults(Faults {
        delay: Duration::from_millis(900),
        ..Faults::default()
    });
    let body = Bytes::from_static(br#"{"inputs":["held across the import"]}"#);
    client
        .embed(body, Duration::from_secs(10))
        .await
        .expect("answered");
    tei.set_faults(Faults::default());
    let mut copies = 0;
    while let Ok(Some(request)) =
        tokio::time::timeout(Duration::from_millis(200), requests.next()).await
    {
        copies += 1;
        let attempt = request
            .headers
            .as_ref()
            .and_then(|h| h.get(embatch_protocol::headers::ATTEMPT));
        assert!(attempt.is_none(), "a copy was resent: {attempt:?}");
    }
    assert!(copies <= 1, "one request, no resend: {copies} copies");
    assert!(
        tokio::time::timeout(Duration::from_millis(100), beats.next())
            .await
            .is_ok_and(|beat| beat.is_some()),
        "beats on the exported subject"
    );
}
