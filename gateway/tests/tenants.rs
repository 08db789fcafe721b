//! Tenants at the gateway: 401 in each API's shape on every route that needs a key, live key
//! revocation, the caller's tenant on the NATS request, and bulk data no other tenant can see.
//! A real `nats-server` (with `-js` and a temporary store where bulk routes run), the TEI
//! double and an in-process worker.

mod common;

use std::time::{Duration, Instant};

use common::checks::stand_in_worker;
use common::start_gateway_at;
use embatch_testkit::{NatsServer, RunningWorker, TeiConfig, start_tei, tenants_file};
use serde_json::{Value, json};

const TENANTS: &str = r#"
[tenants.search]
keys = ["sk-search"]

[tenants.ads]
keys = ["sha256:4a9f6e0e1f4e0e2d6a8c8f0b3bd1b8e1f2f0d4d7b8a2c9e5f1a3b6c7d8e9f0a1", "sk-ads"]
"#;

/// `path` of a served route with its parameters filled in.
fn concrete(path: &str) -> String {
    path.replace("{model}", "m").replace("{id}", "x")
}

async fn call(
    http: &reqwest::Client,
    method: &str,
    url: &str,
    key: Option<&str>,
) -> reqwest::Response {
    let mut request = http.request(method.parse().expect("method"), url);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.expect("request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_but_the_public_ones_needs_a_key_and_answers_401_in_its_shape() {
    let nats = NatsServer::start();
    let (_dir, file) = tenants_file(TENANTS);
    let gateway = start_gateway_at(&nats.url(), &["--tenants-file", &file], None).await;
    let http = reqwest::Client::new();
    let mut protected = 0;
    for (method, path) in embatch_gateway::routes::served() {
        let url = format!("{}{}", gateway.url, concrete(path));
        if embatch_gateway::routes::PUBLIC.contains(&path) {
            let response = call(&http, method, &url, None).await;
            assert_ne!(response.status().as_u16(), 401, "{method} {path} is public");
            continue;
        }
        protected += 1;
        for key in [None, Some("sk-wrong"), Some("sk-searc")] {
            let response = call(&http, method, &url, key).await;
            assert_eq!(
                response.status().as_u16(),
                401,
                "{method} {path} with {key:?}"
            );
            assert_eq!(
                response
                    .headers()
                    .get("www-authenticate")
                    .map(|v| v.as_bytes()),
                Some(&b"Bearer"[..])
            );
            let body: Value = response.json().await.expect("JSON");
            if embatch_gateway::tenancy::is_openai_path(path) {
                assert_eq!(body["error"]["code"], "invalid_api_key", "{path}: {body}");
                assert_eq!(
                    body["error"]["type"], "invalid_request_error",
                    "{path}: {body}"
                );
            } else {
                assert_eq!(body["error_type"], "unauthorized", "{path}: {body}");
                assert!(body["error"].is_string(), "{path}: {body}");
            }
        }
        let response = call(&http, method, &url, Some("sk-ads")).await;
        assert_ne!(
            response.status().as_u16(),
            401,
            "{method} {path} with a valid key"
        );
    }
    assert!(protected >= 15, "only {protected} protected routes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_key_stops_working_within_5_s_without_a_restart() {
    let nats = NatsServer::start();
    let (dir, file) = tenants_file(TENANTS);
    let gateway = start_gateway_at(&nats.url(), &["--tenants-file", &file], None).await;
    let http = reqwest::Client::new();
    let models = format!("{}/v1/models", gateway.url);
    assert_eq!(
        call(&http, "GET", &models, Some("sk-ads")).await.status(),
        200
    );

    std::fs::write(
        dir.path().join("tenants.toml"),
        TENANTS.replace("\"sk-ads\"", "\"sk-ads-2\""),
    )
    .expect("rewrite");
    let revoked_at = Instant::now();
    loop {
        let status = call(&http, "GET", &models, Some("sk-ads")).await.status();
        if status == 401 {
            break;
        }
        assert!(
            revoked_at.elapsed() < Duration::from_secs(5),
            "still {status} after 5 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        call(&http, "GET", &models, Some("sk-ads-2")).await.status(),
        200
    );
    assert_eq!(
        call(&http, "GET", &models, Some("sk-search"))
            .await
            .status(),
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_carries_the_tenant_its_key_names_not_one_the_client_sends() {
    let nats = NatsServer::start();
    let (_dir, file) = tenants_file(TENANTS);
    let gateway = start_gateway_at(&nats.url(), &["--tenants-file", &file], None).await;
    // A stand-in worker: answers every request with one vector and keeps its tenant header.
    let mut seen = stand_in_worker(&nats, &[]).await;
    let http = reqwest::Client::new();
    let response = http
        .post(format!("{}/embed", gateway.url))
        .bearer_auth("sk-search")
        .header("embatch-tenant", "ads")
        .json(&json!({"inputs": "hello"}))
        .send()
        .await
        .expect("POST /embed");
    assert_eq!(response.status(), 200);
    let tenant = seen.recv().await.flatten().and_then(|headers| {
        let tenant = headers.get(embatch_protocol::headers::TENANT)?;
        Some(tenant.to_string())
    });
    assert_eq!(tenant.as_deref(), Some("search"));
}

/// The bulk routes of one gateway as one tenant.
struct Api {
    http: reqwest::Client,
    url: String,
    key: &'static str,
}

impl Api {
    async fn send(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self
            .http
            .request(
                method.parse().expect("method"),
                format!("{}{path}", self.url),
            )
            .bearer_auth(self.key);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("request");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn upload(&self, jsonl: &str) -> String {
        let form = reqwest::multipart::Form::new()
            .text("purpose", "batch")
            .part(
                "file",
                reqwest::multipart::Part::bytes(jsonl.as_bytes().to_vec()).file_name("in.jsonl"),
            );
        let response = self
            .http
            .post(format!("{}/v1/files", self.url))
            .bearer_auth(self.key)
            .multipart(form)
            .send()
            .await
            .expect("upload");
        assert_eq!(response.status(), 200);
        let file: Value = response.json().await.expect("JSON");
        file["id"].as_str().expect("id").to_owned()
    }

    fn ids(list: &Value) -> Vec<String> {
        list["data"]
            .as_array()
            .expect("a list")
            .iter()
            .map(|item| item["id"].as_str().expect("id").to_owned())
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_sees_none_of_another_tenants_files_and_batches() {
    let nats = NatsServer::start_jetstream();
    let tei = start_tei(TeiConfig::instant()).await;
    let _worker = RunningWorker::start(&nats, &["--tei-url", tei.url.as_str()]).await;
    let (_dir, file) = tenants_file(TENANTS);
    let gateway = start_gateway_at(&nats.url(), &["--tenants-file", &file], None).await;
    let api = |key| Api {
        http: reqwest::Client::new(),
        url: gateway.url.clone(),
        key,
    };
    let (search, ads) = (api("sk-search"), api("sk-ads"));

    let line = json!({"custom_id": "memo", "method": "POST", "url": "/v1/embeddings",
                      "body": {"input": "confidential merger memo"}});
    let input = search.upload(&format!("{line}\n")).await;
    let create = json!({"input_file_id": input, "endpoint": "/v1/embeddings",
                        "completion_window": "24h"});
    let (status, batch) = search
        .send("POST", "/v1/batches", Some(create.clone()))
        .await;
    assert_eq!(status, 200, "{batch}");
    let batch_id = batch["id"].as_str().expect("id").to_owned();
    let started = Instant::now();
    let batch = loop {
        let (_, batch) = search
            .send("GET", &format!("/v1/batches/{batch_id}"), None)
            .await;
        if batch["status"] == "completed" {
            break batch;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{batch}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let output = batch["output_file_id"]
        .as_str()
        .expect("an output file")
        .to_owned();

    // The owner sees all of it.
    let (_, files) = search.send("GET", "/v1/files", None).await;
    let mut owned = Api::ids(&files);
    owned.sort();
    let mut expected = vec![input.clone(), output.clone()];
    expected.sort();
    assert_eq!(owned, expected);
    let (status, content) = search
        .send("GET", &format!("/v1/files/{output}/content"), None)
        .await;
    assert_eq!(status, 200, "{content}");

    // Another tenant sees none of it, and cannot act on it: 404 as for an id that does not exist.
    let (_, files) = ads.send("GET", "/v1/files", None).await;
    assert_eq!(Api::ids(&files), Vec::<String>::new());
    let (_, batches) = ads.send("GET", "/v1/batches", None).await;
    assert_eq!(Api::ids(&batches), Vec::<String>::new());
    for file in [&input, &output] {
        for (method, path) in [
            ("GET", format!("/v1/files/{file}")),
            ("GET", format!("/v1/files/{file}/content")),
            ("DELETE", format!("/v1/files/{file}")),
        ] {
            let (status, body) = ads.send(method, &path, None).await;
            assert_eq!(status, 404, "{method} {path}: {body}");
            assert!(!body.to_string().contains("merger"), "{body}");
        }
    }
    for (method, path) in [
        ("GET", format!("/v1/batches/{batch_id}")),
        ("POST", format!("/v1/batches/{batch_id}/cancel")),
    ] {
        let (status, body) = ads.send(method, &path, None).await;
        assert_eq!(status, 404, "{method} {path}: {body}");
    }
    let (status, body) = ads.send("POST", "/v1/batches", Some(create)).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["param"], "input_file_id", "{body}");

    // Still there for its owner.
    let (status, _) = search
        .send("GET", &format!("/v1/files/{input}"), None)
        .await;
    assert_eq!(status, 200);
}
