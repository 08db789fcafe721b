//! The gateway in front of a worker on an OpenAI-compatible upstream (`--openai-url`, the TEI
//! double's `/v1/embeddings`), over a real nats-server: OpenAI's route answers the double's
//! vectors, and `/v1/models` lists the model with the `embed` capability only.

mod common;

use common::{json_post, start_gateway};
use embatch_testkit::{NatsServer, RunningWorker, TeiConfig, double_vector, start_tei};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openais_route_through_an_openai_upstream() {
    let nats = NatsServer::start();
    let double = start_tei(TeiConfig::instant()).await;
    let base = format!("{}/v1", double.url);
    let model = TeiConfig::instant().model_id;
    let args = [
        "--openai-url",
        &base,
        "--openai-model",
        &model,
        "--cache",
        "false",
    ];
    let worker = RunningWorker::start(&nats, &args).await;
    let gateway = start_gateway(&nats, 1 << 20, 512).await;
    let http = reqwest::Client::new();
    let body = serde_json::json!({"model": model, "input": ["first text", "second text"]});
    let url = format!("{}/v1/embeddings", gateway.url);
    let reply = json_post(&http, &url, body.to_string())
        .send()
        .await
        .expect("the gateway answers");
    assert_eq!(reply.status(), 200);
    let reply: serde_json::Value = reply.json().await.expect("JSON");
    for (i, text) in ["first text", "second text"].iter().enumerate() {
        let vector: Vec<f32> =
            serde_json::from_value(reply["data"][i]["embedding"].clone()).expect("a vector");
        assert_eq!(vector, double_vector(text), "{text}");
    }
    let models: serde_json::Value = http
        .get(format!("{}/v1/models", gateway.url))
        .send()
        .await
        .expect("the gateway answers")
        .json()
        .await
        .expect("JSON");
    assert_eq!(models["data"][0]["id"], model.as_str());
    assert_eq!(
        models["data"][0]["capabilities"],
        serde_json::json!(["embed"])
    );
    assert_eq!(double.calls.batch_sizes(), [2], "one upstream call");
    worker.stop().await;
}
