//! Tenants' quotas and usage at the gateway: 429 with OpenAI's `x-ratelimit-*` headers, one
//! quota held by two gateways, and the daily usage route. A real `nats-server` (with `-js` and a
//! temporary store for the usage bucket) and a stand-in worker that answers every request with
//! one vector and 3 tokens.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::checks::{self, header};
use common::{RunningGateway, start_gateway_at};
use embatch_testkit::{NatsServer, tenants_file};
use serde_json::{Value, json};

const TENANTS: &str = r#"
[tenants.search]
keys = ["sk-search"]
requests_per_minute = 1

[tenants.ads]
keys = ["sk-ads"]
tokens_per_minute = 2

[tenants.free]
keys = ["sk-free"]
"#;

/// Answers every embedding request on `nats` with `[[0.5]]` and `Embatch-Tokens: 3`.
async fn stand_in_worker(nats: &NatsServer) {
    checks::stand_in_worker(nats, &[(embatch_protocol::headers::TOKENS, "3")]).await;
}

async fn gateway(nats: &NatsServer, file: &str, window: &str) -> RunningGateway {
    start_gateway_at(
        &nats.url(),
        &["--tenants-file", file, "--quota-window", window],
        None,
    )
    .await
}

/// Sleeps until `window` has at least `margin` left, so that a test's requests fall in one.
async fn away_from_the_window_end(window: Duration, margin: Duration) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
    let left = window.as_millis() - now.as_millis() % window.as_millis();
    if left < margin.as_millis() {
        tokio::time::sleep(Duration::from_millis(left as u64 + 10)).await;
    }
}

async fn embed(http: &reqwest::Client, url: &str, route: &str, key: &str) -> reqwest::Response {
    let body = if route == "/embed" {
        json!({"inputs": "hello"})
    } else {
        json!({"input": "hello"})
    };
    http.post(format!("{url}{route}"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .expect("request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_quota_gets_429_with_the_rate_limit_headers() {
    let nats = NatsServer::start();
    stand_in_worker(&nats).await;
    let (_dir, file) = tenants_file(TENANTS);
    // 1 request and 2 tokens per minute, over 3 minutes: 3 requests, 6 tokens.
    let gw = gateway(&nats, &file, "3m").await;
    away_from_the_window_end(Duration::from_secs(180), Duration::from_secs(10)).await;
    let http = reqwest::Client::new();

    for remaining in ["2", "1", "0"] {
        let response = embed(&http, &gw.url, "/embed", "sk-search").await;
        assert_eq!(response.status(), 200);
        assert_eq!(
            header(&response, "x-ratelimit-limit-requests").as_deref(),
            Some("3")
        );
        assert_eq!(
            header(&response, "x-ratelimit-remaining-requests").as_deref(),
            Some(remaining)
        );
        assert!(header(&response, "x-ratelimit-reset-requests").is_some());
    }
    let refused = embed(&http, &gw.url, "/v1/embeddings", "sk-search").await;
    assert_eq!(refused.status(), 429);
    let retry: u64 = header(&refused, "retry-after")
        .expect("Retry-After")
        .parse()
        .expect("secs");
    assert!((1..=180).contains(&retry), "{retry}");
    assert_eq!(
        header(&refused, "x-ratelimit-remaining-requests").as_deref(),
        Some("0")
    );
    let body: Value = refused.json().await.expect("JSON");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
    let refused = embed(&http, &gw.url, "/embed", "sk-search").await;
    assert_eq!(refused.status(), 429);
    let body: Value = refused.json().await.expect("JSON");
    assert_eq!(body["error_type"], "overloaded", "{body}");

    // Tokens: charged when answered (3 each), refused once the window's 6 are spent.
    for remaining in ["3", "0"] {
        let response = embed(&http, &gw.url, "/v1/embeddings", "sk-ads").await;
        assert_eq!(response.status(), 200);
        assert_eq!(
            header(&response, "x-ratelimit-remaining-tokens").as_deref(),
            Some(remaining)
        );
        assert_eq!(header(&response, "x-ratelimit-limit-requests"), None);
    }
    let refused = embed(&http, &gw.url, "/v1/embeddings", "sk-ads").await;
    assert_eq!(refused.status(), 429);
    assert_eq!(
        header(&refused, "x-ratelimit-limit-tokens").as_deref(),
        Some("6")
    );

    // A tenant without limits is neither limited nor told of limits.
    for _ in 0..10 {
        let response = embed(&http, &gw.url, "/embed", "sk-free").await;
        assert_eq!(response.status(), 200);
        assert_eq!(header(&response, "x-ratelimit-limit-requests"), None);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_hold_one_quota_within_5_percent_at_twice_the_limit() {
    let nats = NatsServer::start();
    stand_in_worker(&nats).await;
    // 1,500 per minute over a 4 s window: 100 per window.
    let (_dir, file) =
        tenants_file(&TENANTS.replace("requests_per_minute = 1", "requests_per_minute = 1500"));
    let window = Duration::from_secs(4);
    let gateways = [
        gateway(&nats, &file, "4s").await,
        gateway(&nats, &file, "4s").await,
    ];
    // Start just after a window begins, and offer 200 requests (2x) spread over 3.6 s.
    let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
    let left = window.as_millis() - now.as_millis() % window.as_millis();
    tokio::time::sleep(Duration::from_millis(left as u64 + 100)).await;
    let served = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let http = reqwest::Client::new();
    let mut tick = tokio::time::interval(Duration::from_millis(18));
    let mut sent = Vec::new();
    for i in 0..200 {
        tick.tick().await;
        let url = gateways[i % 2].url.clone();
        let (http, served, refused) = (http.clone(), served.clone(), refused.clone());
        sent.push(tokio::spawn(async move {
            match embed(&http, &url, "/embed", "sk-search")
                .await
                .status()
                .as_u16()
            {
                200 => served.fetch_add(1, Ordering::Relaxed),
                429 => refused.fetch_add(1, Ordering::Relaxed),
                other => panic!("status {other}"),
            };
        }));
    }
    for task in sent {
        task.await.expect("request task");
    }
    let (served, refused) = (
        served.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
    );
    eprintln!("quota: served {served}, refused {refused} of 200 offered, limit 100");
    assert_eq!(served + refused, 200);
    assert!(
        (95..=105).contains(&served),
        "served {served} of a limit of 100 ({refused} refused)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_per_day_is_the_fleets_and_the_callers_own() {
    let nats = NatsServer::start_jetstream();
    stand_in_worker(&nats).await;
    let (_dir, file) = tenants_file(TENANTS);
    let (a, b) = (
        gateway(&nats, &file, "60s").await,
        gateway(&nats, &file, "60s").await,
    );
    let http = reqwest::Client::new();
    for _ in 0..4 {
        assert_eq!(
            embed(&http, &a.url, "/embed", "sk-free").await.status(),
            200
        );
    }
    assert_eq!(
        embed(&http, &b.url, "/v1/embeddings", "sk-free")
            .await
            .status(),
        200
    );
    assert_eq!(embed(&http, &b.url, "/embed", "sk-ads").await.status(), 200);

    let usage = |url: String, key: &'static str| {
        let http = http.clone();
        async move {
            let response = http
                .get(format!("{url}/v1/usage"))
                .bearer_auth(key)
                .send()
                .await
                .expect("GET /v1/usage");
            assert_eq!(response.status(), 200);
            response.json::<Value>().await.expect("JSON")
        }
    };
    // Both gateways' counts reach the bucket within a flush interval (5 s).
    let started = std::time::Instant::now();
    let free = loop {
        let free = usage(a.url.clone(), "sk-free").await;
        if free["requests"] == 5 || started.elapsed() > Duration::from_secs(15) {
            break free;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(free["tenant"], "free");
    assert_eq!(free["requests"], 5, "{free}");
    assert_eq!(free["inputs"], 5, "{free}");
    assert_eq!(free["tokens"], 15, "{free}");
    assert_eq!(free["shed"], 0, "{free}");
    let ads = usage(b.url.clone(), "sk-ads").await;
    assert_eq!(
        (ads["tenant"].clone(), ads["requests"].clone()),
        (json!("ads"), json!(1))
    );

    let response = http
        .get(format!("{}/v1/usage?date=yesterday", a.url))
        .bearer_auth("sk-free")
        .send()
        .await
        .expect("GET");
    assert_eq!(response.status(), 400);
}
