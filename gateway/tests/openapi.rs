//! The OpenAPI document (`GET /openapi.json`, `GET /api-doc/openapi.json`) over HTTP, a real
//! nats-server and an in-process worker on the TEI double: it is OpenAPI 3.x JSON, it describes
//! every route the router serves (and no other), and real answers of the embedding routes (200s
//! and errors) have the statuses, headers and fields it documents. A light structural check:
//! required fields, JSON types and enums of the documented schemas (scripts/client-tests.sh runs
//! schemathesis for full schema conformance).

mod common;

use std::time::Duration;

use common::checks::header;
use common::{json_post, stack_with_gateway, start_gateway_at, tei_taking};
use embatch_testkit::{Stack, TeiConfig};
use serde_json::Value;

/// `GET {url}{path}`: status, `content-type` and body bytes.
async fn get(url: &str, path: &str) -> (u16, String, bytes::Bytes) {
    let response = reqwest::get(format!("{url}{path}"))
        .await
        .expect("HTTP response");
    let status = response.status().as_u16();
    let content_type = header(&response, "content-type").unwrap_or_default();
    (status, content_type, response.bytes().await.expect("body"))
}

/// The gateway's document, checked to be OpenAPI 3.x JSON and the same at both paths.
async fn fetch_document(url: &str) -> Value {
    let (status, content_type, body) = get(url, "/openapi.json").await;
    assert_eq!(status, 200);
    assert_eq!(content_type, "application/json");
    let doc: Value = serde_json::from_slice(&body).expect("the document is JSON");
    let version = doc["openapi"].as_str().expect("an `openapi` version");
    assert!(version.starts_with("3."), "OpenAPI 3.x, got {version}");
    assert!(doc["info"]["title"].is_string(), "info.title");
    assert!(doc["paths"].is_object(), "paths");
    let (status, _, tei_path) = get(url, "/api-doc/openapi.json").await;
    assert_eq!(status, 200);
    assert_eq!(tei_path, body, "TEI's path serves the same document");
    doc
}

/// `value` with its `$ref` (`#/components/schemas/Name`) followed.
fn resolve<'a>(doc: &'a Value, value: &'a Value) -> &'a Value {
    match value["$ref"].as_str() {
        Some(reference) => {
            let name = reference
                .strip_prefix("#/components/schemas/")
                .expect("a local schema reference");
            let schema = &doc["components"]["schemas"][name];
            assert!(schema.is_object(), "{reference} is defined");
            schema
        }
        None => value,
    }
}

/// The response object the document gives `method path` for `status`.
fn documented_response<'a>(doc: &'a Value, method: &str, path: &str, status: u16) -> &'a Value {
    let response = &doc["paths"][path][method]["responses"][status.to_string()];
    assert!(
        response.is_object(),
        "{method} {path} answered {status}, which the document does not list"
    );
    response
}

/// The JSON schema of the body the document gives `method path` for `status`.
fn response_schema<'a>(doc: &'a Value, method: &str, path: &str, status: u16) -> &'a Value {
    let response = documented_response(doc, method, path, status);
    resolve(doc, &response["content"]["application/json"]["schema"])
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_u64() || n.is_i64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// `value` has the JSON type and (when one is given) an `enum` value that `schema` names.
fn assert_type(doc: &Value, schema: &Value, value: &Value, what: &str) {
    let schema = resolve(doc, schema);
    let actual = json_type(value);
    let allowed: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(types) => types.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let integer_as_number = actual == "integer" && allowed.contains(&"number");
    assert!(
        allowed.is_empty() || allowed.contains(&actual) || integer_as_number,
        "{what}: {value} is {actual}, the document says {allowed:?}"
    );
    if let Some(values) = schema["enum"].as_array() {
        assert!(
            values.contains(value),
            "{what}: {value} is not one of {values:?}"
        );
    }
}

/// `body` has every field `schema` (an object schema) requires, each of its documented type.
fn assert_fields(doc: &Value, schema: &Value, body: &Value, what: &str) {
    let schema = resolve(doc, schema);
    assert_type(doc, schema, body, what);
    let required = schema["required"].as_array().expect("required fields");
    for field in required.iter().filter_map(Value::as_str) {
        let value = body
            .get(field)
            .unwrap_or_else(|| panic!("{what}: `{field}` is required but absent in {body}"));
        assert_type(
            doc,
            &schema["properties"][field],
            value,
            &format!("{what}.{field}"),
        );
    }
}

/// TEI's error body, as the document gives it for `method path` and `status`.
fn assert_tei_error_shape(doc: &Value, path: &str, status: u16, body: &Value) {
    let schema = response_schema(doc, "post", path, status);
    assert_fields(doc, schema, body, &format!("POST {path} {status}"));
    assert!(
        body["error"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

/// OpenAI's error body, as the document gives it for `method path` and `status`.
fn assert_openai_error_shape(doc: &Value, path: &str, status: u16, body: &Value) {
    let what = format!("POST {path} {status}");
    let schema = response_schema(doc, "post", path, status);
    assert_fields(doc, schema, body, &what);
    assert_fields(
        doc,
        &schema["properties"]["error"],
        &body["error"],
        &format!("{what} error"),
    );
}

/// Sends `body` to `path` (as JSON unless `content_type` is `None`): status, headers, JSON body.
async fn post(
    url: &str,
    path: &str,
    body: &str,
    content_type: Option<&str>,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let http = reqwest::Client::new();
    let request = match content_type {
        Some("application/json") => json_post(&http, &format!("{url}{path}"), body.to_owned()),
        Some(other) => http
            .post(format!("{url}{path}"))
            .header("content-type", other)
            .body(body.to_owned()),
        None => http.post(format!("{url}{path}")).body(body.to_owned()),
    };
    let response = request.send().await.expect("HTTP response");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.json().await.expect("a JSON body");
    (status, headers, body)
}

/// The headers the document gives the 200 of `path` are sent, each a whole number.
fn assert_documented_headers(
    doc: &Value,
    path: &str,
    status: u16,
    headers: &reqwest::header::HeaderMap,
) {
    let documented = documented_response(doc, "post", path, status)["headers"]
        .as_object()
        .expect("documented headers");
    assert!(!documented.is_empty());
    for (name, header) in documented {
        assert_eq!(header["schema"]["type"], "integer", "{name}");
        let value = headers
            .get(name.as_str())
            .unwrap_or_else(|| panic!("POST {path} {status}: no `{name}` header"));
        let value = value.to_str().expect("ASCII");
        assert!(value.parse::<u64>().is_ok(), "{name}: {value:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_describes_every_route_the_router_serves() {
    let stack = Stack::start(TeiConfig::instant(), &[]).await;
    // A recorder that is not installed: `/metrics` renders (an empty exposition), not 404.
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle();
    let gateway = start_gateway_at(&stack.nats.url(), &[], Some(metrics)).await;
    let doc = fetch_document(&gateway.url).await;

    let served = embatch_gateway::routes::served();
    let mut documented = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("a path item") {
            assert!(
                operation["responses"]
                    .as_object()
                    .is_some_and(|r| !r.is_empty()),
                "{method} {path} has responses"
            );
            assert!(operation["operationId"].is_string(), "{method} {path}");
            documented.push((method.to_uppercase(), path.clone()));
        }
    }
    let mut served_owned: Vec<(String, String)> = served
        .iter()
        .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    served_owned.sort();
    documented.sort();
    assert_eq!(
        documented, served_owned,
        "the document's operations are the router's routes"
    );

    // Each route answers its method (not 404 or 405), so the table matches the router.
    let http = reqwest::Client::new();
    for (method, path) in &served {
        // A model's path prefix names the model served (its `/` percent-encoded).
        let url = format!(
            "{}{}",
            gateway.url,
            path.replace("{model}", "embatch%2Ftei-double")
        );
        let response = match *method {
            "GET" => http.get(&url).send().await,
            "POST" => {
                json_post(&http, &url, r#"{"inputs":"x","input":"x"}"#)
                    .send()
                    .await
            }
            "DELETE" => http.delete(&url).send().await,
            other => panic!("unexpected method {other}"),
        }
        .expect("HTTP response");
        let status = response.status().as_u16();
        assert!(
            status != 404 && status != 405,
            "{method} {path} answered {status}"
        );
        let response_doc = documented_response(&doc, &method.to_lowercase(), path, status);
        // The answer's content type is the documented one (none documented: no body).
        let content_type = header(&response, "content-type").unwrap_or_default();
        let essence = content_type.split(';').next().unwrap_or_default();
        match response_doc["content"].as_object() {
            Some(content) => assert!(
                content.contains_key(essence),
                "{method} {path} {status}: {content_type:?} is not documented"
            ),
            None => assert_eq!(content_type, "", "{method} {path} {status}"),
        }
    }
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tei_routes_answer_as_documented() {
    let (stack, gateway) = stack_with_gateway(TeiConfig::instant(), &[], 1 << 20, 4).await;
    let doc = fetch_document(&gateway.url).await;
    let url = gateway.url.as_str();

    for path in ["/embed", "/"] {
        let (status, headers, body) = post(
            url,
            path,
            r#"{"inputs":["alpha","beta"]}"#,
            Some("application/json"),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let schema = response_schema(&doc, "post", path, 200);
        assert_type(&doc, schema, &body, path);
        let vectors = body.as_array().expect("an array");
        assert_eq!(vectors.len(), 2);
        for vector in vectors {
            assert_type(&doc, &schema["items"], vector, path);
            for value in vector.as_array().expect("a vector") {
                assert_type(&doc, &schema["items"]["items"], value, path);
            }
        }
        assert_documented_headers(&doc, path, 200, &headers);

        let errors = [
            (r#"{"inputs":[]}"#, Some("application/json"), 400, "Empty"),
            (r#"{"inputs":"a"}"#, Some("text/plain"), 415, "Validation"),
            (r#"{"inputs":"a"}"#, None, 415, "Validation"),
            (
                r#"{"inputs":[1,"a"]}"#,
                Some("application/json"),
                422,
                "Validation",
            ),
            (
                r#"{"inputs":["a","b","c","d","e"]}"#,
                Some("application/json"),
                422,
                "Validation",
            ),
            ("{not json", Some("application/json"), 400, "Validation"),
        ];
        for (request, content_type, want, error_type) in errors {
            let (status, _, body) = post(url, path, request, content_type).await;
            assert_eq!(status, want, "{path} {request}: {body}");
            assert_tei_error_shape(&doc, path, status, &body);
            assert_eq!(body["error_type"], error_type, "{body}");
        }
    }
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_routes_answer_as_documented() {
    let (stack, gateway) = stack_with_gateway(TeiConfig::instant(), &[], 1 << 20, 4).await;
    let doc = fetch_document(&gateway.url).await;
    let url = gateway.url.as_str();

    for path in ["/v1/embeddings", "/embeddings"] {
        for format in ["float", "base64"] {
            let request = format!(r#"{{"input":["alpha","beta"],"encoding_format":"{format}"}}"#);
            let (status, headers, body) = post(url, path, &request, Some("application/json")).await;
            assert_eq!(status, 200, "{body}");
            let schema = response_schema(&doc, "post", path, 200);
            assert_fields(&doc, schema, &body, path);
            let item_schema = &schema["properties"]["data"]["items"];
            for item in body["data"].as_array().expect("data") {
                assert_fields(&doc, item_schema, item, &format!("{path} data"));
                let embedding_schema =
                    resolve(&doc, &resolve(&doc, item_schema)["properties"]["embedding"]);
                let branches = embedding_schema["oneOf"].as_array().expect("oneOf");
                let matching = branches
                    .iter()
                    .filter(|b| b["type"] == json_type(&item["embedding"]))
                    .count();
                assert_eq!(matching, 1, "{format}: {}", item["embedding"]);
            }
            assert_fields(
                &doc,
                &resolve(&doc, schema)["properties"]["usage"],
                &body["usage"],
                &format!("{path} usage"),
            );
            assert_documented_headers(&doc, path, 200, &headers);
        }

        let errors = [
            (r#"{"input":[]}"#, Some("application/json"), 400),
            (r#"{"input":"a"}"#, Some("text/plain"), 415),
            (
                r#"{"input":"a","encoding_format":"hex"}"#,
                Some("application/json"),
                422,
            ),
            (r#"{"model":"m"}"#, Some("application/json"), 422),
            ("{not json", Some("application/json"), 400),
            (
                r#"{"input":["a","b","c","d","e"]}"#,
                Some("application/json"),
                422,
            ),
        ];
        for (request, content_type, want) in errors {
            let (status, _, body) = post(url, path, request, content_type).await;
            assert_eq!(status, want, "{path} {request}: {body}");
            assert_openai_error_shape(&doc, path, status, &body);
        }
    }
    stack.worker.stop().await;
}

/// Load shedding at the gateway (`--max-in-flight 1`, an upstream that takes 400 ms): the 429
/// of every embedding route has the documented body and `Retry-After` header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_429_has_the_documented_retry_after() {
    // The cache off: the busy request ("a" each time) must reach the upstream every time.
    let stack = Stack::start(
        tei_taking(Duration::from_millis(400)),
        &["--cache", "false"],
    )
    .await;
    let gateway = start_gateway_at(&stack.nats.url(), &["--max-in-flight", "1"], None).await;
    let doc = fetch_document(&gateway.url).await;
    let url = gateway.url.clone();

    for (path, body) in [
        ("/embed", r#"{"inputs":"b"}"#),
        ("/v1/embeddings", r#"{"input":"b"}"#),
    ] {
        let busy_url = url.clone();
        let busy = tokio::spawn(async move {
            post(
                &busy_url,
                "/embed",
                r#"{"inputs":"a"}"#,
                Some("application/json"),
            )
            .await
        });
        // The first request holds the only permit for ~400 ms.
        tokio::time::sleep(Duration::from_millis(150)).await;
        let (status, headers, answer) = post(&url, path, body, Some("application/json")).await;
        assert_eq!(status, 429, "{path}: {answer}");
        if path == "/embed" {
            assert_tei_error_shape(&doc, path, status, &answer);
        } else {
            assert_openai_error_shape(&doc, path, status, &answer);
        }
        let documented = documented_response(&doc, "post", path, 429);
        assert!(documented["headers"]["Retry-After"].is_object(), "{path}");
        assert_eq!(
            headers.get("retry-after").and_then(|v| v.to_str().ok()),
            Some("1")
        );
        let (status, _, _) = busy.await.expect("the first request");
        assert_eq!(status, 200);
    }
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerank_routes_answer_as_documented() {
    let reranker = TeiConfig {
        reranker: true,
        ..TeiConfig::instant()
    };
    let (stack, gateway) = stack_with_gateway(reranker, &[], 1 << 20, 4).await;
    let doc = fetch_document(&gateway.url).await;
    let url = gateway.url.as_str();

    let request = r#"{"query":"q","texts":["alpha","beta"],"return_text":true}"#;
    let (status, headers, body) = post(url, "/rerank", request, Some("application/json")).await;
    assert_eq!(status, 200, "{body}");
    let schema = response_schema(&doc, "post", "/rerank", 200);
    assert_type(&doc, schema, &body, "/rerank");
    for rank in body.as_array().expect("ranks") {
        assert_fields(&doc, &schema["items"], rank, "/rerank rank");
    }
    assert_documented_headers(&doc, "/rerank", 200, &headers);

    let cohere = r#"{"query":"q","documents":["alpha",{"text":"beta"}],"return_documents":true}"#;
    for path in ["/v1/rerank", "/v2/rerank"] {
        let (status, headers, body) = post(url, path, cohere, Some("application/json")).await;
        assert_eq!(status, 200, "{body}");
        let schema = response_schema(&doc, "post", path, 200);
        assert_fields(&doc, schema, &body, path);
        for result in body["results"].as_array().expect("results") {
            let item = &schema["properties"]["results"]["items"];
            assert_fields(&doc, item, result, &format!("{path} result"));
        }
        assert_documented_headers(&doc, path, 200, &headers);
    }

    let errors = [
        ("/rerank", r#"{"query":"q","texts":[]}"#, 400, "Empty"),
        (
            "/rerank",
            r#"{"query":"q","texts":["a","b","c","d","e"]}"#,
            422,
            "Validation",
        ),
        ("/rerank", "{not json", 400, "Validation"),
        (
            "/v2/rerank",
            r#"{"query":"q","documents":[]}"#,
            400,
            "Empty",
        ),
        (
            "/v1/rerank",
            r#"{"query":"q","documents":["a"],"top_n":0}"#,
            422,
            "Validation",
        ),
    ];
    for (path, request, want, error_type) in errors {
        let (status, _, body) = post(url, path, request, Some("application/json")).await;
        assert_eq!(status, want, "{path} {request}: {body}");
        assert_tei_error_shape(&doc, path, status, &body);
        assert_eq!(body["error_type"], error_type, "{body}");
    }
    stack.worker.stop().await;
}
