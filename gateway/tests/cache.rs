//! The workers' cache seen over HTTP: the gateway reports each reply's cache hits in
//! `x-embatch-cache-hits` and passes a request's `Cache-Control` (`no-cache`, `no-store`) on to
//! the worker, on TEI's and OpenAI's routes.

mod common;

use common::{json_post, stack_with_gateway};
use embatch_testkit::TeiConfig;

/// `POST {url}{path}` with `body` and, if given, a `Cache-Control` header: the status and the
/// `x-embatch-cache-hits` header.
async fn post(
    url: &str,
    path: &str,
    body: &str,
    cache_control: Option<&str>,
) -> (u16, Option<String>) {
    let mut request = json_post(
        &reqwest::Client::new(),
        &format!("{url}{path}"),
        body.to_owned(),
    );
    if let Some(value) = cache_control {
        request = request.header("cache-control", value);
    }
    let response = request.send().await.expect("HTTP response");
    let hits = response
        .headers()
        .get("x-embatch-cache-hits")
        .map(|v| v.to_str().expect("ASCII").to_owned());
    (response.status().as_u16(), hits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_report_their_cache_hits_and_cache_control_bypasses_the_cache() {
    let (stack, gateway) = stack_with_gateway(TeiConfig::instant(), &[], 1 << 20, 64).await;
    let url = &gateway.url;
    let body = r#"{"inputs":["alpha","beta"]}"#;
    assert_eq!(
        post(url, "/embed", body, None).await,
        (200, Some("0".into()))
    );
    assert_eq!(
        post(url, "/embed", body, None).await,
        (200, Some("2".into()))
    );
    assert_eq!(
        post(url, "/embed", body, Some("no-cache")).await,
        (200, Some("0".into())),
        "no-cache: answered by the upstream"
    );
    let openai = r#"{"input":["alpha","gamma"],"model":"embatch/tei-double"}"#;
    assert_eq!(
        post(url, "/v1/embeddings", openai, Some("no-store")).await,
        (200, Some("0".into()))
    );
    assert_eq!(
        post(url, "/v1/embeddings", openai, None).await,
        (200, Some("1".into())),
        "alpha cached; gamma was not stored"
    );
    let sent: usize = stack.tei.calls().iter().map(|c| c.inputs.len()).sum();
    assert_eq!(sent, 2 + 2 + 2 + 1, "misses only");
}
