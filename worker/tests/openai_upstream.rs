//! The worker on an OpenAI-compatible upstream (`--openai-url`), over a real nats-server and the
//! TEI double's `POST /v1/embeddings`: the vectors are the double's, callers' requests share one
//! call, the bearer key is sent, a bad input is isolated, the server's 5xx and 429 are mapped as
//! TEI's, and what the API cannot do is refused naming the option or the route.

mod common;

use bytes::Bytes;
use common::plain::request_on;
use embatch_protocol::embed_all::embed_all_subject;
use embatch_protocol::rerank::rerank_subject;
use embatch_protocol::similarity::similarity_subject;
use embatch_protocol::{DEFAULT_SUBJECT, Input, tokenize};
use embatch_testkit::{
    Faults, NatsServer, POISON, RunningWorker, TeiConfig, TeiDouble, cosine, double_vector,
    embedding_of, start_tei,
};

/// A nats-server, the double and a worker posting to the double's `/v1` with key `sk-test`;
/// batches form when full or after 250 ms, so requests sent together share one call.
struct OpenAiStack {
    nats: NatsServer,
    double: TeiDouble,
    worker: RunningWorker,
}

async fn start() -> OpenAiStack {
    start_with(&[]).await
}

/// [`start`] with `extra` worker arguments.
async fn start_with(extra: &[&str]) -> OpenAiStack {
    let nats = NatsServer::start();
    let double = start_tei(TeiConfig::instant()).await;
    let base = format!("{}/v1", double.url);
    let model = TeiConfig::instant().model_id;
    let args = [
        "--openai-url",
        base.as_str(),
        "--openai-model",
        model.as_str(),
        "--openai-api-key",
        "sk-test",
        "--cache",
        "false",
    ];
    let args: Vec<&str> = args
        .iter()
        .chain(&common::SHARED_BATCHES)
        .chain(extra)
        .copied()
        .collect();
    let worker = RunningWorker::start(&nats, &args).await;
    OpenAiStack {
        nats,
        double,
        worker,
    }
}

/// Sends each body at once as its own request; each reply's status and body, in order.
async fn send_all(
    stack: &OpenAiStack,
    bodies: Vec<serde_json::Value>,
) -> Vec<(u16, serde_json::Value)> {
    common::send_all(&stack.nats.url(), bodies).await
}

fn vectors(body: &serde_json::Value) -> Vec<Vec<f32>> {
    serde_json::from_value(body.clone()).expect("vectors")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_share_one_call_with_the_key_and_get_the_doubles_vectors() {
    let stack = start().await;
    let texts: Vec<String> = (0..12).map(|i| format!("shared call {i}")).collect();
    let replies = common::send_texts(&stack.nats.url(), &texts).await;
    for (text, (status, body)) in texts.iter().zip(&replies) {
        assert_eq!(*status, 200, "{text}: {body}");
        assert_eq!(vectors(body), vec![double_vector(text)], "{text}");
    }
    let calls = stack.double.calls();
    assert_eq!(
        stack.double.calls.batch_sizes(),
        [12],
        "one call for the 12 callers"
    );
    assert_eq!(calls[0].authorization.as_deref(), Some("Bearer sk-test"));
    assert_eq!(calls[0].options["model"], TeiConfig::instant().model_id);
    assert_eq!(calls[0].options["encoding_format"], "float");
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn texts_token_ids_and_dimensions_map_onto_the_api() {
    let stack = start().await;
    let mixed = serde_json::json!({ "inputs": ["mixed text", [101, 7592, 102], "more text"] });
    let cut = serde_json::json!({ "inputs": "cut to four", "dimensions": 4 });
    let replies = send_all(&stack, vec![mixed, cut]).await;
    assert_eq!(replies[0].0, 200, "{}", replies[0].1);
    let dim = TeiConfig::instant().dim;
    let ids = embedding_of(&Input::Ids(vec![101, 7592, 102]), dim, None, true);
    assert_eq!(
        vectors(&replies[0].1),
        [double_vector("mixed text"), ids, double_vector("more text")],
        "in the request's order"
    );
    assert_eq!(replies[1].0, 200, "{}", replies[1].1);
    let four = embedding_of(&Input::Text("cut to four".into()), dim, Some(4), true);
    assert_eq!(vectors(&replies[1].1), [four]);
    let calls = stack.double.calls();
    // Texts and token arrays never share an `input`: the mixed request is two calls.
    let mut sizes: Vec<usize> = calls.iter().map(|c| c.inputs.len()).collect();
    sizes.sort_unstable();
    assert_eq!(sizes, [1, 1, 2], "{calls:?}");
    assert!(calls.iter().any(|c| c.options["dimensions"] == 4));
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_input_is_isolated_and_server_failures_are_mapped() {
    let stack = start().await;
    let mut texts: Vec<String> = (0..9).map(|i| format!("good {i}")).collect();
    texts.insert(4, format!("bad {POISON}"));
    let replies = common::send_texts(&stack.nats.url(), &texts).await;
    for (text, (status, body)) in texts.iter().zip(&replies) {
        if text.contains(POISON) {
            assert_eq!(*status, 400, "the server's 400 blames the input: {body}");
            assert!(
                body["error"].as_str().is_some_and(|e| e.contains("poison")),
                "{body}"
            );
        } else {
            assert_eq!(*status, 200, "{text}: {body}");
            assert_eq!(vectors(body), vec![double_vector(text)]);
        }
    }
    assert_eq!(stack.double.calls()[0].inputs.len(), 10, "one batch first");
    for (fault, expected) in [(500, 424), (429, 429)] {
        stack.double.set_faults(Faults::failing_with(fault));
        let body = serde_json::json!({ "inputs": format!("during a {fault}") });
        let replies = send_all(&stack, vec![body]).await;
        assert_eq!(replies[0].0, expected, "{fault}: {}", replies[0].1);
    }
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_api_cannot_do_is_refused_naming_it() {
    let stack = start().await;
    let client = async_nats::connect(stack.nats.url())
        .await
        .expect("client connects");
    for (option, body) in [
        (
            "normalize: false",
            serde_json::json!({"inputs": "a", "normalize": false}),
        ),
        (
            "prompt_name",
            serde_json::json!({"inputs": "a", "prompt_name": "query"}),
        ),
        (
            "truncate: false",
            serde_json::json!({"inputs": "a", "truncate": false}),
        ),
    ] {
        let reply = request_on(&client, DEFAULT_SUBJECT, Bytes::from(body.to_string()), &[]).await;
        assert_eq!(reply.status, 422, "{option}");
        let error = reply.json()["error"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(error.contains(option), "{option}: {error}");
    }
    let routes = [
        (
            tokenize::tokenize_subject(DEFAULT_SUBJECT),
            r#"{"inputs":"a"}"#,
            "POST /tokenize",
        ),
        (
            embed_all_subject(DEFAULT_SUBJECT),
            r#"{"inputs":"a"}"#,
            "/embed_all is not served",
        ),
        (
            rerank_subject(DEFAULT_SUBJECT),
            r#"{"query":"q","texts":["a"]}"#,
            "re-ranker",
        ),
    ];
    for (subject, body, named) in routes {
        let reply = request_on(&client, subject, Bytes::from(body), &[]).await;
        assert_eq!(reply.status, 424, "{named}");
        let text = String::from_utf8_lossy(&reply.payload);
        assert!(text.contains(named), "{named}: {text}");
    }
    assert!(
        stack.double.calls().is_empty(),
        "no call for what was refused"
    );
    // A prompt hint (Cohere's `input_type`) is not refused: the API takes no prompts, so the
    // worker embeds without one.
    let hinted = serde_json::json!({"inputs": "a", "prompt_hint": "query"});
    let reply = request_on(
        &client,
        DEFAULT_SUBJECT,
        Bytes::from(hinted.to_string()),
        &[],
    )
    .await;
    assert_eq!(reply.status, 200, "{:?}", reply.json());
    assert_eq!(stack.double.calls().len(), 1);
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn similarity_asks_for_unit_vectors_and_answers_their_cosines() {
    let stack = start().await;
    let client = async_nats::connect(stack.nats.url())
        .await
        .expect("client connects");
    let sentences = ["a close sentence", "another one", "the source"];
    let body = serde_json::json!({
        "inputs": {"source_sentence": "the source", "sentences": sentences}
    });
    let subject = similarity_subject(DEFAULT_SUBJECT);
    let reply = request_on(&client, subject, Bytes::from(body.to_string()), &[]).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.payload)
    );
    let got: Vec<f32> = serde_json::from_value(reply.json()).expect("a float per sentence");
    let source = double_vector("the source");
    let want: Vec<f32> = sentences
        .iter()
        .map(|s| cosine(&source, &double_vector(s)))
        .collect();
    assert_eq!(got.len(), want.len());
    for (got, want) in got.iter().zip(&want) {
        assert!((got - want).abs() < 1e-6, "{got} against {want}");
    }
    assert!(
        (got[2] - 1.0).abs() < 1e-6 && got[0].abs() < 0.9,
        "the source is itself, the others not: {got:?}"
    );
    // The source and the sentences in one call, which the server answered (not refused for
    // TEI's `normalize: false`).
    let calls = stack.double.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].status, 200, "{calls:?}");
    stack.worker.stop().await;
}

#[tokio::test]
async fn health_is_get_models_and_info_is_made_of_the_settings() {
    use embatch_worker::upstream::Upstream;
    use embatch_worker::upstream::openai::{OpenAiConfig, OpenAiUpstream};
    let double = start_tei(TeiConfig::instant()).await;
    let upstream = OpenAiUpstream::new(&OpenAiConfig {
        base_urls: vec![format!("{}/v1/", double.url)],
        model: "some/model".into(),
        api_key: None,
        timeout: std::time::Duration::from_secs(5),
        max_inputs: 96,
        max_input_tokens: Some(512),
    })
    .expect("client");
    upstream.health().await.expect("GET /v1/models answers 200");
    double.set_faults(Faults {
        health_status: Some(503),
        ..Faults::default()
    });
    let err = upstream.health().await.expect_err("503");
    assert!(err.is_unhealthy(), "{err}");
    let info = upstream.info().await.expect("made of the settings");
    assert_eq!(info["model_id"], "some/model");
    assert_eq!(info["max_client_batch_size"], 96);
    assert_eq!(info["max_input_length"], 512);
    assert_eq!(
        info["model_type"],
        serde_json::json!({"embedding": {"pooling": null}})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_input_limit_and_tokenizer_truncate_false_is_honoured_by_the_worker() {
    let tokenizer = embatch_testkit::model_dir().join("tokenizer.json");
    let tokenizer = tokenizer.to_string_lossy();
    let stack = start_with(&["--openai-max-input-tokens", "16", "--tokenizer", &tokenizer]).await;
    let long = "word ".repeat(40);
    let bodies = vec![
        serde_json::json!({"inputs": "short enough", "truncate": false}),
        serde_json::json!({"inputs": long, "truncate": false}),
    ];
    let replies = send_all(&stack, bodies).await;
    assert_eq!(replies[0].0, 200, "{}", replies[0].1);
    assert_eq!(vectors(&replies[0].1), [double_vector("short enough")]);
    assert_eq!(replies[1].0, 422, "{}", replies[1].1);
    let error = replies[1].1["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("less than 16 tokens"),
        "TEI's answer: {error}"
    );
    assert_eq!(
        stack.double.calls.batch_sizes(),
        [1],
        "the long input never went upstream"
    );
    stack.worker.stop().await;
}
