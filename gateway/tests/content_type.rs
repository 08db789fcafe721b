//! A body not declared as JSON is refused with 415, as TEI 1.9.3 does (`text/plain`, or no
//! `Content-Type` at all), on every embedding route; `application/json` with parameters is fine.

mod common;

use common::start_gateway_at;
use embatch_testkit::{Stack, TeiConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_json_bodies_are_accepted() {
    // The cache off: each accepted request reaches the upstream (they all embed "a").
    let Stack { nats, tei, worker } =
        Stack::start(TeiConfig::instant(), &["--cache", "false"]).await;
    let gateway = start_gateway_at(&nats.url(), &[], None).await;
    let client = reqwest::Client::new();
    for path in ["/embed", "/", "/v1/embeddings"] {
        let body = if path == "/v1/embeddings" {
            r#"{"input":"a"}"#
        } else {
            r#"{"inputs":"a"}"#
        };
        for content_type in [Some("text/plain"), None] {
            let mut request = client.post(format!("{}{path}", gateway.url)).body(body);
            if let Some(value) = content_type {
                request = request.header("content-type", value);
            }
            let response = request.send().await.expect("send");
            assert_eq!(response.status().as_u16(), 415, "{path} {content_type:?}");
        }
        let ok = client
            .post(format!("{}{path}", gateway.url))
            .header("content-type", "application/json; charset=utf-8")
            .body(body)
            .send()
            .await
            .expect("send");
        assert_eq!(ok.status().as_u16(), 200, "{path}");
    }
    assert_eq!(
        tei.calls().len(),
        3,
        "only the JSON requests reached the upstream"
    );
    worker.stop().await;
}
