//! Token counts in the worker (`embatch_worker::tokens`) on a real nats-server: the
//! `Embatch-Tokens` reply header against the model's own tokenizer, and over-long inputs answered
//! as TEI 1.9.3 answers them (truncated by default, 422 with `truncate: false`) before any
//! upstream work.

mod common;

use embatch_local_model::Encoder;
use embatch_protocol::{Input, TruncationDirection};
use embatch_testkit::{NatsServer, RunningWorker, TeiConfig, model_dir, testdata};

/// The built-in model's limit (all-MiniLM-L6-v2's `max_seq_length`).
const MINILM_LIMIT: usize = 256;

/// A reply as a plain NATS client sees it: the status (200 or the error header's), the
/// `Embatch-Tokens` header and the body.
async fn request(
    client: &async_nats::Client,
    body: serde_json::Value,
) -> (u16, Option<u64>, serde_json::Value) {
    let reply = common::plain::request(client, body, &[]).await;
    (reply.status, reply.tokens, reply.json())
}

/// The reference inputs of `testdata/` (30 texts of mixed lengths, languages and scripts).
fn reference_inputs() -> Vec<String> {
    std::fs::read_to_string(testdata().join("reference-inputs.txt"))
        .expect("reference inputs")
        .lines()
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect()
}

fn long_input() -> String {
    std::fs::read_to_string(testdata().join("reference-long-input.txt"))
        .expect("long input")
        .trim_end()
        .to_owned()
}

/// The model's own tokenizer, as the test computes counts independently of the worker.
fn encoder(max_input_length: usize) -> Encoder {
    Encoder::load_file(&model_dir().join("tokenizer.json"), max_input_length).expect("tokenizer")
}

fn texts(inputs: &[String]) -> Vec<Input> {
    inputs.iter().map(|t| Input::from(t.as_str())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_built_in_model_reports_its_tokenizers_counts_and_answers_long_inputs_as_tei() {
    let nats = NatsServer::start();
    let dir = model_dir();
    // The cache off: every request is counted by the worker's tokenizer (a hit reports the
    // count stored with it, see worker/tests/cache.rs). Static membership: on a loaded host, a
    // call of 30 inputs to the unoptimized built-in model can outlast the adaptive membership's
    // stall rule (no call started or ended for 10 call times, at least 250 ms), and a worker
    // out of the queue group answers nothing.
    let worker = RunningWorker::start(
        &nats,
        &[
            "--model-dir",
            dir.to_str().expect("UTF-8 path"),
            "--cache",
            "false",
            "--membership",
            "static",
        ],
    )
    .await;
    let client = async_nats::connect(nats.url()).await.expect("connects");
    let encoder = encoder(MINILM_LIMIT);
    let right = Some(TruncationDirection::Right);

    // Every reference input alone, then all of them in one request.
    let inputs = reference_inputs();
    assert!(inputs.len() >= 20, "reference inputs present");
    for input in &inputs {
        let want = encoder
            .count(&texts(std::slice::from_ref(input)), None, right)
            .expect("counts")[0];
        let (status, tokens, body) = request(&client, serde_json::json!({"inputs": input})).await;
        assert_eq!(status, 200, "{input:?}: {body}");
        assert_eq!(tokens, Some(u64::from(want)), "{input:?}");
    }
    let want: u32 = encoder
        .count(&texts(&inputs), None, right)
        .expect("counts")
        .iter()
        .sum();
    let (status, tokens, _) = request(&client, serde_json::json!({"inputs": inputs})).await;
    assert_eq!(status, 200);
    assert_eq!(tokens, Some(u64::from(want)));

    // Token ids are counted as the model sees them: as given.
    let ids = [101, 7592, 1010, 2088, 999, 102];
    let (status, tokens, _) = request(&client, serde_json::json!({"inputs": [ids]})).await;
    assert_eq!(status, 200);
    assert_eq!(tokens, Some(6));

    // Over the limit: truncated to it without `truncate` (TEI 1.9.3's default) ...
    let long = long_input();
    let (status, tokens, body) = request(&client, serde_json::json!({"inputs": long})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(tokens, Some(MINILM_LIMIT as u64));
    // Next to short inputs (a few: every input of a forward pass is padded to the longest).
    let mixed = [inputs[0].clone(), inputs[1].clone(), long.clone()];
    let want: u32 = encoder
        .count(&texts(&mixed), None, right)
        .expect("counts")
        .iter()
        .sum();
    let (status, tokens, body) = request(&client, serde_json::json!({"inputs": mixed})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(tokens, Some(u64::from(want)));
    assert!(want > MINILM_LIMIT as u32);
    // ... and with `truncate: false`, TEI's 422 with its message, next to a short input.
    let refused = encoder
        .count(&[Input::from(long.as_str())], None, None)
        .expect_err("over the limit");
    let (status, tokens, body) = request(
        &client,
        serde_json::json!({"inputs": ["short", long], "truncate": false}),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(tokens, None);
    assert_eq!(body["error_type"], "Validation");
    assert_eq!(body["error"], refused.to_string());
    assert!(
        refused.to_string().starts_with(
            "Input validation error: `inputs` must have less than 256 tokens. Given: "
        ),
        "{refused}"
    );
    worker.stop().await;
}

/// With a TEI upstream and `--tokenizer`, an over-long input that would be refused is answered
/// 422 by the worker before any upstream call, and its batch-mates are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tei_over_long_inputs_never_reach_the_upstream() {
    let tokenizer = model_dir().join("tokenizer.json");
    let stack = embatch_testkit::Stack::start(
        TeiConfig::instant(),
        &[
            "--tokenizer",
            tokenizer.to_str().expect("UTF-8 path"),
            "--max-wait-time",
            "20ms",
        ],
    )
    .await;
    let client = async_nats::connect(stack.nats.url())
        .await
        .expect("connects");
    // The double's /info: max_input_length 512, auto_truncate false.
    let limit = 512;
    let encoder = encoder(limit);
    let long = "word ".repeat(700);
    let short = "a short query".to_owned();

    let refused = {
        let client = client.clone();
        let long = long.clone();
        tokio::spawn(async move { request(&client, serde_json::json!({"inputs": long})).await })
    };
    let (status, tokens, body) = request(&client, serde_json::json!({"inputs": short})).await;
    assert_eq!(status, 200, "{body}");
    let want = encoder
        .count(&[Input::from(short.as_str())], None, None)
        .expect("fits")[0];
    assert_eq!(tokens, Some(u64::from(want)));
    let (status, tokens, body) = refused.await.expect("the long request");
    assert_eq!(status, 422, "{body}");
    assert_eq!(tokens, None);
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|m| m.contains("`inputs` must have less than 512 tokens. Given: 702")),
        "{body}"
    );
    let sent: Vec<Input> = stack
        .tei
        .calls()
        .iter()
        .flat_map(|call| call.inputs.clone())
        .collect();
    assert_eq!(
        sent,
        [Input::from(short.as_str())],
        "only the short input reached TEI"
    );

    // Asking to truncate: the upstream gets it, and the count is the limit.
    let (status, tokens, body) = request(
        &client,
        serde_json::json!({"inputs": long, "truncate": true}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(tokens, Some(limit as u64));

    // A prompt hint (Cohere's `input_type`): the tokenizer's model (MiniLM) defines no
    // prompts, so the worker embeds without one instead of passing on what TEI would refuse.
    let hinted = serde_json::json!({"inputs": "hinted", "prompt_hint": "query"});
    let (status, _, body) = request(&client, hinted).await;
    assert_eq!(status, 200, "{body}");
    let calls = stack.tei.calls();
    let last = calls.last().expect("a call");
    assert_eq!(last.inputs, [Input::from("hinted")]);
    assert!(
        last.options
            .get("prompt_name")
            .is_none_or(serde_json::Value::is_null),
        "no prompt sent: {:?}",
        last.options
    );
    stack.worker.stop().await;
}

/// Without a tokenizer for the TEI model (the double's `model_id` is on no hub, and it has no
/// `/tokenize`), inputs are counted and replies carry no token count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_tokenizer_replies_carry_no_token_count() {
    let stack = embatch_testkit::Stack::start(TeiConfig::instant(), &[]).await;
    let client = async_nats::connect(stack.nats.url())
        .await
        .expect("connects");
    let (status, tokens, body) =
        request(&client, serde_json::json!({"inputs": ["a", "b c"]})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(tokens, None);
    stack.worker.stop().await;
}
