//! Two real models behind one gateway: a worker on the built-in MiniLM
//! (`sentence-transformers/all-MiniLM-L6-v2`, `EMBATCH_MODEL_DIR`) and one on
//! BAAI/bge-small-en-v1.5 (`EMBATCH_BGE_MODEL_DIR`), a real nats-server with JetStream (the
//! workers' shared cache bucket), `EMBATCH_DEFAULT_MODEL` = MiniLM. Each model's vectors are
//! checked against its reference embeddings in `testdata/` (cosine ≥ 0.999), on OpenAI's route
//! by `model` and on TEI's by the `Embatch-Model` header (none: the default model); an unknown
//! model is 404 `model_not_found`; a repeated request is answered from the cache, bit-identical,
//! and the same text under the two models never shares a cache entry.
//!
//! Needs bge-small: `scripts/fetch-model.sh --model bge-small-en-v1.5` (`scripts/test.sh` sets
//! `EMBATCH_BGE_MODEL_DIR`). With that variable unset and no model at
//! `<repo>/models/bge-small-en-v1.5` the test is skipped, saying so; with it set to a directory
//! without the model, it fails.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::checks::wait_for_models;
use common::{json_post, start_gateway_at};
use embatch_testkit::{NatsServer, RunningWorker, cosine, model_dir, repo_root, testdata};
use serde::Deserialize;
use serde_json::{Value, json};

/// What the reference files of `testdata/` hold (their first case: default options).
#[derive(Deserialize)]
struct Reference {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    request: Value,
    embeddings: Vec<Vec<f32>>,
}

/// Inputs of the first reference case used here (a few short ones: a debug build runs the
/// models on the CPU).
const INPUTS: usize = 3;
/// The shared cache bucket's stream (the worker's default `CACHE_BUCKET`, `embatch_cache`).
const CACHE_STREAM: &str = "KV_embatch_cache";

/// The inputs and each model's reference vectors for them.
struct Expected {
    inputs: Vec<String>,
    minilm: Vec<Vec<f32>>,
    bge: Vec<Vec<f32>>,
}

fn first_case(file: &str) -> Case {
    let raw = std::fs::read(testdata().join(file)).expect("reference embeddings in testdata/");
    let reference: Reference = serde_json::from_slice(&raw).expect("reference JSON");
    reference.cases.into_iter().next().expect("a first case")
}

fn expected() -> Expected {
    let minilm = first_case("minilm-reference-embeddings.json");
    let bge = first_case("bge-small-reference-embeddings.json");
    assert_eq!(
        minilm.request, bge.request,
        "both files' first case, the same request"
    );
    let inputs: Vec<String> = minilm.request["inputs"]
        .as_array()
        .expect("inputs")
        .iter()
        .take(INPUTS)
        .map(|i| i.as_str().expect("a text").to_owned())
        .collect();
    let expected = Expected {
        inputs,
        minilm: minilm.embeddings.into_iter().take(INPUTS).collect(),
        bge: bge.embeddings.into_iter().take(INPUTS).collect(),
    };
    // The check below can tell the models apart: their vectors of a text are far apart.
    for (m, b) in expected.minilm.iter().zip(&expected.bge) {
        assert!(cosine(m, b) < 0.9, "the two models' references are alike");
    }
    expected
}

fn assert_vectors(got: &[Vec<f32>], want: &[Vec<f32>], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: one vector per input");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{what}: dimension of input {i}");
        let cos = cosine(g, w);
        assert!(cos >= 0.999, "{what}: input {i} cosine {cos} < 0.999");
    }
}

/// bge-small's directory: `$EMBATCH_BGE_MODEL_DIR`, else `<repo>/models/bge-small-en-v1.5`;
/// `None` (skip) only when the variable is unset and the default directory has no model.
fn bge_dir() -> Option<PathBuf> {
    match std::env::var_os("EMBATCH_BGE_MODEL_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            assert!(
                dir.join("model.safetensors").is_file(),
                "EMBATCH_BGE_MODEL_DIR={} holds no model.safetensors",
                dir.display()
            );
            Some(dir)
        }
        None => {
            let dir = repo_root().join("models").join("bge-small-en-v1.5");
            dir.join("model.safetensors").is_file().then_some(dir)
        }
    }
}

/// The built-in model's name: its directory's (what `GET /v1/models` lists for it).
fn name_of(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .expect("a model directory")
}

/// A reply: status, `x-embatch-cache-hits` and the JSON body.
struct Reply {
    status: u16,
    hits: Option<String>,
    body: Value,
}

async fn post(url: &str, body: &Value, model_header: Option<&str>) -> Reply {
    let mut request = json_post(&reqwest::Client::new(), url, body.to_string());
    if let Some(model) = model_header {
        request = request.header("Embatch-Model", model);
    }
    let response = request.send().await.expect("HTTP response");
    let status = response.status().as_u16();
    let hits = response
        .headers()
        .get("x-embatch-cache-hits")
        .map(|v| v.to_str().expect("ASCII").to_owned());
    let body = response.json().await.expect("JSON body");
    Reply { status, hits, body }
}

/// The vectors of an OpenAI reply (`data[i].embedding`, in `index` order).
fn openai_vectors(body: &Value) -> Vec<Vec<f32>> {
    let data = body["data"].as_array().expect("data");
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["index"], json!(i), "{body}");
    }
    data.iter()
        .map(|d| serde_json::from_value(d["embedding"].clone()).expect("a float vector"))
        .collect()
}

/// The vectors of a TEI `/embed` reply (an array of arrays).
fn tei_vectors(body: &Value) -> Vec<Vec<f32>> {
    serde_json::from_value(body.clone()).expect("an array of vectors")
}

/// Polls the shared cache bucket's stream every 20 ms until it holds `entries` messages (one
/// per key), for at most 10 s: the workers write the bucket after they reply.
async fn wait_for_bucket_entries(js: &async_nats::jetstream::Context, entries: u64) {
    let mut held = 0;
    for _ in 0..500 {
        // Absent until a worker creates it.
        let messages = match js.get_stream(CACHE_STREAM).await {
            Ok(mut stream) => stream.info().await.ok().map(|info| info.state.messages),
            Err(_) => None,
        };
        if let Some(messages) = messages {
            held = messages;
            if held >= entries {
                assert_eq!(held, entries, "one entry per model and input");
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the cache bucket holds {held} entries, not {entries}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_real_models_are_routed_checked_and_cached_apart() {
    let Some(bge_dir) = bge_dir() else {
        eprintln!(
            "SKIPPED: EMBATCH_BGE_MODEL_DIR is unset and models/bge-small-en-v1.5 holds no \
             model; run scripts/fetch-model.sh --model bge-small-en-v1.5"
        );
        return;
    };
    let minilm_dir = model_dir();
    let (minilm, bge) = (name_of(&minilm_dir), name_of(&bge_dir));
    let want = expected();

    let nats = NatsServer::start_jetstream();
    let mut workers = Vec::new();
    for dir in [&minilm_dir, &bge_dir] {
        let dir = dir.to_str().expect("UTF-8 model path");
        let args = [
            "--model-dir",
            dir,
            "--default-model",
            minilm.as_str(),
            "--max-wait-time",
            "2ms",
        ];
        workers.push(RunningWorker::start(&nats, &args).await);
    }
    let gateway = start_gateway_at(&nats.url(), &["--default-model", minilm.as_str()], None).await;
    let url = gateway.url.as_str();
    let nats_client = async_nats::connect(nats.url())
        .await
        .expect("client connects");
    let js = async_nats::jetstream::new(nats_client);

    // Both listed (sorted by name), once both workers have announced themselves.
    let mut both = [minilm.as_str(), bge.as_str()];
    both.sort_unstable();
    wait_for_models(url, &both).await;

    // OpenAI, `model` = bge: bge's vectors, none from the cache.
    let openai = format!("{url}/v1/embeddings");
    let body = json!({"input": want.inputs, "model": bge});
    let first_bge = post(&openai, &body, None).await;
    assert_eq!(first_bge.status, 200, "{}", first_bge.body);
    assert_eq!(first_bge.body["model"], json!(bge));
    assert_eq!(first_bge.hits.as_deref(), Some("0"));
    assert_vectors(&openai_vectors(&first_bge.body), &want.bge, "OpenAI, bge");
    // Once bge's entries are in the shared bucket, the same texts under MiniLM must still miss
    // (a key shared across models would answer bge's vectors here).
    wait_for_bucket_entries(&js, INPUTS as u64).await;
    let body = json!({"input": want.inputs, "model": minilm});
    let first_minilm = post(&openai, &body, None).await;
    assert_eq!(first_minilm.status, 200, "{}", first_minilm.body);
    assert_eq!(first_minilm.body["model"], json!(minilm));
    assert_eq!(
        first_minilm.hits.as_deref(),
        Some("0"),
        "the same texts under another model are not cache hits"
    );
    assert_vectors(
        &openai_vectors(&first_minilm.body),
        &want.minilm,
        "OpenAI, MiniLM",
    );
    wait_for_bucket_entries(&js, 2 * INPUTS as u64).await;

    // Repeated: every input a cache hit, the reply bit-identical to the first, per model.
    let hits = INPUTS.to_string();
    for (model, first) in [(&bge, &first_bge), (&minilm, &first_minilm)] {
        let again = post(
            &openai,
            &json!({"input": want.inputs, "model": model}),
            None,
        )
        .await;
        assert_eq!(again.status, 200, "{}", again.body);
        assert_eq!(again.hits.as_deref(), Some(hits.as_str()), "{model}: hits");
        assert_eq!(
            again.body["data"], first.body["data"],
            "{model}: the same vectors"
        );
    }

    // TEI's /embed: no header is the default model (MiniLM), `Embatch-Model` picks bge.
    let embed = format!("{url}/embed");
    let body = json!({"inputs": want.inputs});
    let reply = post(&embed, &body, None).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_vectors(&tei_vectors(&reply.body), &want.minilm, "/embed, no model");
    let reply = post(&embed, &body, Some(bge.as_str())).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_vectors(
        &tei_vectors(&reply.body),
        &want.bge,
        "/embed, Embatch-Model bge",
    );
    let reply = post(&embed, &body, Some(minilm.as_str())).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_vectors(
        &tei_vectors(&reply.body),
        &want.minilm,
        "/embed, Embatch-Model MiniLM",
    );

    // A model nobody serves: 404 `model_not_found`, naming the two that are.
    let reply = post(
        &openai,
        &json!({"input": "x", "model": "text-embedding-3-small"}),
        None,
    )
    .await;
    assert_eq!(reply.status, 404, "{}", reply.body);
    assert_eq!(
        reply.body["error"]["code"], "model_not_found",
        "{}",
        reply.body
    );
    let message = reply.body["error"]["message"].as_str().expect("a message");
    assert!(
        message.ends_with(&format!("Models served: {}, {}", both[0], both[1])),
        "{message}"
    );
    let reply = post(&embed, &json!({"inputs": "x"}), Some("nope")).await;
    assert_eq!(reply.status, 404, "{}", reply.body);

    for worker in workers {
        worker.stop().await;
    }
}
