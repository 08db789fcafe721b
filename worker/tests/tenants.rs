//! Tenants on a real nats-server with the TEI double: the tenant a request is served for
//! (`Embatch-Tenant` from the worker's own account, 400 for a value that is not a name, 403
//! for a tenant `TENANTS_FILE` lacks).

mod common;

use std::time::Duration;

use common::plain::{bucket_holds, send};
use embatch_protocol::headers;
use embatch_testkit::{
    NatsServer, RunningWorker, TeiConfig, TeiDouble, start_slow_tei, start_tei, tenants_file,
};

/// The tenants of these tests: `search` (weight 2, NATS account `SEARCH`), `ads` (account
/// `ADS`) and `partner`, which shares `search`'s cache (group `acme`).
const TENANTS: &str = r#"
[tenants.search]
keys = ["sk-search"]
weight = 2
nats_account = "SEARCH"
cache_group = "acme"

[tenants.partner]
keys = ["sk-partner"]
cache_group = "acme"

[tenants.ads]
keys = ["sk-ads"]
nats_account = "ADS"
"#;

/// A worker on `nats` with the double as its upstream, the tenants file `file` and `args`.
async fn start_worker(
    nats: &NatsServer,
    tei: &TeiDouble,
    file: &str,
    args: &[&str],
) -> RunningWorker {
    let mut argv = vec!["--tei-url", tei.url.as_str(), "--tenants-file", file];
    argv.extend(args);
    RunningWorker::start(nats, &argv).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenant_header_names_a_configured_tenant_or_is_refused() {
    let nats = NatsServer::start();
    let tei = start_tei(TeiConfig::instant()).await;
    let (_dir, file) = tenants_file(TENANTS);
    let worker = start_worker(&nats, &tei, &file, &[]).await;
    let client = async_nats::connect(nats.url()).await.expect("connects");

    assert_eq!(send(&client, "hello", Some("search")).await.status, 200);
    assert_eq!(
        send(&client, "bonjour", None).await.status,
        200,
        "no header: the default tenant"
    );
    let calls = tei.calls().len();
    let invalid = send(&client, "hello", Some("a.b")).await;
    assert_eq!(invalid.status, 400);
    let body = String::from_utf8_lossy(&invalid.payload);
    assert!(body.contains(headers::TENANT), "{body}");
    let unknown = send(&client, "hello", Some("nobody")).await;
    assert_eq!(unknown.status, 403);
    assert!(String::from_utf8_lossy(&unknown.payload).contains("`nobody`"));
    assert_eq!(tei.calls().len(), calls, "refused: no upstream work");
    worker.stop().await;
}

/// How many times the double was sent `text`.
fn sends(tei: &TeiDouble, text: &str) -> usize {
    tei.calls()
        .iter()
        .flat_map(|call| call.inputs.iter())
        .filter(|input| input.as_text() == Some(text))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_entries_and_hits_are_the_callers_own_scope() {
    let nats = NatsServer::start_jetstream();
    let tei = start_tei(TeiConfig::instant()).await;
    let (_dir, file) = tenants_file(TENANTS);
    let worker = start_worker(&nats, &tei, &file, &["--cache-kv-timeout", "5s"]).await;
    let client = async_nats::connect(nats.url()).await.expect("connects");

    assert_eq!(
        send(&client, "merger memo", Some("search")).await.hits,
        Some(0)
    );
    // Stored after the reply: in the bucket means in the in-process LRU too.
    bucket_holds(&client, 1).await;
    let other = send(&client, "merger memo", Some("ads")).await;
    assert_eq!(
        (other.status, other.hits),
        (200, Some(0)),
        "another tenant's entry is no hit"
    );
    assert_eq!(
        send(&client, "merger memo", Some("search")).await.hits,
        Some(1)
    );
    assert_eq!(
        send(&client, "merger memo", Some("partner")).await.hits,
        Some(1),
        "a tenant of the same cache group shares it"
    );
    assert_eq!(
        send(&client, "merger memo", None).await.hits,
        Some(0),
        "the default tenant has a scope of its own"
    );
    assert_eq!(sends(&tei, "merger memo"), 3, "search, ads, default");
    bucket_holds(&client, 3).await;
    worker.stop().await;

    // A second worker on the same bucket: the shared tier keeps the scopes apart too.
    let second = start_worker(&nats, &tei, &file, &["--cache-kv-timeout", "5s"]).await;
    assert_eq!(
        send(&client, "merger memo", Some("partner")).await.hits,
        Some(1)
    );
    assert_eq!(
        send(&client, "merger memo", Some("ads")).await.hits,
        Some(1)
    );
    assert_eq!(sends(&tei, "merger memo"), 3, "all from the shared bucket");
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_in_flight_is_shared_within_a_scope_only() {
    let nats = NatsServer::start();
    let tei = start_slow_tei(Duration::from_millis(400)).await;
    let (_dir, file) = tenants_file(TENANTS);
    let worker = start_worker(&nats, &tei, &file, &[]).await;
    let client = async_nats::connect(nats.url()).await.expect("connects");

    let leader = tokio::spawn({
        let client = client.clone();
        async move { send(&client, "in flight", Some("search")).await }
    });
    // Both arrive while the leader's call runs: `partner` (same cache group) waits for it,
    // `ads` sends its own.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (partner, ads) = tokio::join!(
        send(&client, "in flight", Some("partner")),
        send(&client, "in flight", Some("ads")),
    );
    let leader = leader.await.expect("joins");
    for reply in [&leader, &partner, &ads] {
        assert_eq!(reply.status, 200);
        assert_eq!(reply.payload, leader.payload);
    }
    assert_eq!(sends(&tei, "in flight"), 2, "once for acme, once for ads");
    worker.stop().await;
}
