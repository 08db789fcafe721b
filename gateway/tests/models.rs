//! Many models behind one gateway, over a real nats-server with workers on TEI doubles that
//! announce different `model_id`s: routing by the OpenAI `model`, by the `Embatch-Model` header
//! and by the `/models/{model}/` path prefix, 404 `model_not_found` for a model nobody serves,
//! `GET /v1/models` following workers as they come and go, and per-model `/health` and `/info`.

mod common;

use common::checks::wait_for_models;
use common::{json_post, start_gateway_at};
use embatch_testkit::{NatsServer, RunningWorker, TeiConfig, TeiDouble, start_tei};
use serde_json::{Value, json};

const A: &str = "org/model-a.v1";
const B: &str = "model-b";
/// The model of the single-model test (its own name, so the metrics of the two tests, which
/// share the process's recorder, stay apart).
const SOLO: &str = "solo-model";

async fn tei_of(model_id: &str) -> TeiDouble {
    start_tei(TeiConfig {
        model_id: model_id.into(),
        ..TeiConfig::instant()
    })
    .await
}

/// A worker on `tei` with `EMBATCH_DEFAULT_MODEL` = [`A`].
async fn worker(nats: &NatsServer, tei: &TeiDouble) -> RunningWorker {
    RunningWorker::start(nats, &["--tei-url", tei.url.as_str(), "--default-model", A]).await
}

/// The texts `tei` was called with.
fn texts(tei: &TeiDouble) -> Vec<String> {
    tei.calls()
        .iter()
        .flat_map(|c| c.inputs.iter().map(|i| format!("{i:?}")))
        .collect()
}

async fn get(url: &str) -> (u16, Value) {
    let response = reqwest::get(url).await.expect("HTTP response");
    let status = response.status().as_u16();
    let body = response.text().await.expect("body");
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

async fn post(url: &str, body: &Value, model_header: Option<&str>) -> (u16, Value) {
    let http = reqwest::Client::new();
    let mut request = json_post(&http, url, body.to_string());
    if let Some(model) = model_header {
        request = request.header("Embatch-Model", model);
    }
    let response = request.send().await.expect("HTTP response");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_routed_by_model_and_v1_models_follows_the_workers() {
    let metrics = embatch_gateway::telemetry::init_metrics().expect("the process's one recorder");
    let nats = NatsServer::start();
    let (tei_a, tei_b) = (tei_of(A).await, tei_of(B).await);
    let worker_a = worker(&nats, &tei_a).await;
    let worker_b = worker(&nats, &tei_b).await;
    let gateway = start_gateway_at(&nats.url(), &["--default-model", A], Some(metrics)).await;
    let url = gateway.url.as_str();

    // Listed at once: the gateway asks discovery at start and when a model is unknown.
    wait_for_models(url, &[B, A]).await;
    let (_, list) = get(&format!("{url}/v1/models")).await;
    let a = &list["data"][1];
    assert_eq!(
        (&a["object"], &a["owned_by"], &a["default"], &a["workers"]),
        (&json!("model"), &json!("embatch"), &json!(true), &json!(1)),
        "{list}"
    );
    assert!(
        a["created"].as_u64().is_some_and(|t| t > 1_600_000_000),
        "{a}"
    );
    assert_eq!(list["data"][0]["default"], false);

    // OpenAI: `model` picks the workers; no model is the default model.
    let (status, body) = post(
        &format!("{url}/v1/embeddings"),
        &json!({"input": "openai for b", "model": B}),
        None,
    )
    .await;
    assert_eq!((status, &body["model"]), (200, &json!(B)), "{body}");
    let (status, _) = post(
        &format!("{url}/v1/embeddings"),
        &json!({"input": "openai for a", "model": A}),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = post(
        &format!("{url}/v1/embeddings"),
        &json!({"input": "openai default"}),
        None,
    )
    .await;
    assert_eq!(status, 200);

    // TEI: the header, the path prefix (`/` percent-encoded), or the default.
    let embed = json!({"inputs": "tei header for b"});
    assert_eq!(post(&format!("{url}/embed"), &embed, Some(B)).await.0, 200);
    let embed = json!({"inputs": "tei path for b"});
    assert_eq!(
        post(&format!("{url}/models/{B}/embed"), &embed, None)
            .await
            .0,
        200
    );
    let embed = json!({"inputs": "tei root path for b"});
    assert_eq!(
        post(&format!("{url}/models/{B}"), &embed, None).await.0,
        200
    );
    let embed = json!({"inputs": "tei path for a"});
    let encoded = A.replace('/', "%2F");
    assert_eq!(
        post(&format!("{url}/models/{encoded}/embed"), &embed, None)
            .await
            .0,
        200
    );
    let embed = json!({"inputs": "tei default"});
    assert_eq!(post(&format!("{url}/embed"), &embed, None).await.0, 200);

    let (on_a, on_b) = (texts(&tei_a), texts(&tei_b));
    assert_eq!(on_b.len(), 4, "{on_b:?}");
    assert!(
        on_b.iter().all(|t| t.contains("for b")),
        "b got another model's input: {on_b:?}"
    );
    assert_eq!(on_a.len(), 4, "{on_a:?}");
    assert!(
        on_a.iter().all(|t| !t.contains("for b")),
        "a got b's input: {on_a:?}"
    );

    // An unknown model: 404 in OpenAI's shape, listing the models served; TEI's shape on TEI's
    // routes.
    let (status, body) = post(
        &format!("{url}/v1/embeddings"),
        &json!({"input": "x", "model": "text-embedding-3-small"}),
        None,
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        body,
        json!({"error": {
            "message": format!(
                "The model `text-embedding-3-small` does not exist or you do not have access \
                 to it. Models served: {B}, {A}"
            ),
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }})
    );
    let (status, body) = post(
        &format!("{url}/embed"),
        &json!({"inputs": "x"}),
        Some("nope"),
    )
    .await;
    assert_eq!(
        (status, &body["error_type"]),
        (404, &json!("Validation")),
        "{body}"
    );
    assert_eq!(
        texts(&tei_a).len() + texts(&tei_b).len(),
        8,
        "nothing reached a model"
    );

    // Per-model /health and /info.
    assert_eq!(get(&format!("{url}/health?model={B}")).await.0, 200);
    assert_eq!(get(&format!("{url}/models/{B}/health")).await.0, 200);
    assert_eq!(get(&format!("{url}/health?model=nope")).await.0, 404);
    assert_eq!(get(&format!("{url}/health")).await.0, 200);
    let (status, info) = get(&format!("{url}/info?model={B}")).await;
    assert_eq!((status, &info["model_id"]), (200, &json!(B)), "{info}");
    let (_, info) = get(&format!("{url}/models/{encoded}/info")).await;
    assert_eq!(info["model_id"], A);
    let (_, info) = get(&format!("{url}/info")).await;
    assert_eq!(info["model_id"], A, "the default model");

    // Metrics by model.
    let (_, _) = get(&format!("{url}/metrics")).await;
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let line = |model: &str| {
        text.lines()
            .find(|l| {
                l.starts_with("embatch_gateway_requests_total{")
                    && l.contains(&format!("model=\"{model}\""))
                    && l.contains("status=\"200\"")
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    assert_eq!(line(B), Some(4.0), "{text}");
    assert_eq!(line(A), Some(4.0), "{text}");

    // The last worker of b leaves: b disappears, and is unknown again.
    worker_b.stop().await;
    wait_for_models(url, &[A]).await;
    let (status, body) = post(
        &format!("{url}/v1/embeddings"),
        &json!({"input": "x", "model": B}),
        None,
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.ends_with(&format!("Models served: {A}"))),
        "{body}"
    );
    assert_eq!(get(&format!("{url}/health?model={B}")).await.0, 404);

    // A worker of a new model joins: it appears.
    let tei_c = tei_of("model-c").await;
    let worker_c = worker(&nats, &tei_c).await;
    wait_for_models(url, &["model-c", A]).await;
    let (status, _) = post(
        &format!("{url}/v1/embeddings"),
        &json!({"input": "for c", "model": "model-c"}),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(texts(&tei_c).len(), 1);
    worker_c.stop().await;
    worker_a.stop().await;
    wait_for_models(url, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_default_model_a_single_model_fleet_works_as_before() {
    let nats = NatsServer::start();
    let tei = tei_of(SOLO).await;
    let worker = RunningWorker::start(&nats, &["--tei-url", tei.url.as_str()]).await;
    let gateway = start_gateway_at(&nats.url(), &[], None).await;
    let url = gateway.url.as_str();
    // TEI's route and an OpenAI request without a model take the plain subject.
    assert_eq!(
        post(&format!("{url}/embed"), &json!({"inputs": "x"}), None)
            .await
            .0,
        200
    );
    let (status, body) = post(
        &format!("{url}/v1/embeddings"),
        &json!({"input": "y"}),
        None,
    )
    .await;
    assert_eq!((status, &body["model"]), (200, &json!("")));
    // The model's own name works too, on its model subject.
    let (status, _) = post(
        &format!("{url}/v1/embeddings"),
        &json!({"input": "z", "model": SOLO}),
        None,
    )
    .await;
    assert_eq!(status, 200);
    wait_for_models(url, &[SOLO]).await;
    let (_, list) = get(&format!("{url}/v1/models")).await;
    assert_eq!(
        list["data"][0]["default"], true,
        "it answers the plain subject"
    );
    assert_eq!(tei.calls().len(), 3);
    worker.stop().await;
}
