//! The `embatch` binary against a real stack: `nats-server -js` on a temporary store
//! ([`NatsServer::start_jetstream`]), the TEI double behind an in-process worker, an in-process
//! gateway. Each test runs the binary as a user would and checks what it wrote and what the
//! gateway holds.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use embatch_testkit::{NatsServer, RunningWorker, TeiConfig, TeiDouble, double_vector, start_tei};
use serde_json::Value;

/// nats-server with JetStream (or without), the double, a worker and a gateway.
struct BulkStack {
    _nats: NatsServer,
    _tei: TeiDouble,
    _worker: RunningWorker,
    gateway: String,
    _gateway_task: tokio::task::JoinHandle<()>,
}

impl BulkStack {
    async fn start(tei: TeiConfig, jetstream: bool) -> BulkStack {
        BulkStack::start_with(tei, jetstream, None).await
    }

    /// [`BulkStack::start`] with the gateway reading `tenants` (`--tenants-file`), if any.
    async fn start_with(tei: TeiConfig, jetstream: bool, tenants: Option<&Path>) -> BulkStack {
        let nats = if jetstream {
            NatsServer::start_jetstream()
        } else {
            NatsServer::start()
        };
        let tei = start_tei(tei).await;
        let worker = RunningWorker::start(&nats, &["--tei-url", tei.url.as_str()]).await;
        let config =
            embatch_gateway::Config::parse_from(["embatch-gateway", "--nats-url", &nats.url()]);
        let client = embatch_gateway::connect(&config)
            .await
            .expect("gateway connects");
        let mut state = embatch_gateway::AppState::new(client, &config, None);
        if let Some(file) = tenants {
            let stop = tokio_util::sync::CancellationToken::new();
            let watch = embatch_runtime::tenants::watch(Some(file), stop).expect("tenants");
            state = state.with_tenants(watch);
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let gateway = format!("http://{}", listener.local_addr().expect("addr"));
        let task = tokio::spawn(async move {
            embatch_gateway::serve(listener, state, std::future::pending())
                .await
                .expect("serves");
        });
        BulkStack {
            _nats: nats,
            _tei: tei,
            _worker: worker,
            gateway,
            _gateway_task: task,
        }
    }

    /// `GET /v1/batches?limit=100`'s `data`.
    async fn batches(&self) -> Vec<Value> {
        let list: Value = reqwest::get(format!("{}/v1/batches?limit=100", self.gateway))
            .await
            .expect("lists")
            .json()
            .await
            .expect("JSON");
        list["data"].as_array().cloned().unwrap_or_default()
    }
}

/// `embatch --url GATEWAY ARGS...` in a blocking thread (the stack runs on this runtime).
async fn embatch(gateway: &str, args: &[impl AsRef<str>]) -> Output {
    let mut argv = vec!["--url".to_owned(), gateway.to_owned()];
    argv.extend(args.iter().map(|a| a.as_ref().to_owned()));
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_embatch"))
            .args(&argv)
            .env_remove("EMBATCH_URL")
            .output()
            .expect("embatch runs")
    })
    .await
    .expect("joins")
}

/// `batch INPUT -o OUTPUT --poll-interval 100ms -q`.
fn batch_args(input: &Path, output: &Path) -> Vec<String> {
    let path = |p: &Path| p.to_str().expect("utf8 path").to_owned();
    ["batch", &path(input), "-o", &path(output)]
        .into_iter()
        .chain(["--poll-interval", "100ms", "-q"])
        .map(str::to_owned)
        .collect()
}

/// Runs `embatch ARGS` again on a stack holding one batch, this input's, and checks that it
/// resumes that batch (succeeds, says `(resumed)`, submits no second batch) and writes the
/// results of all `lines` requests to `output`.
async fn assert_resumes(stack: &BulkStack, args: &[String], output: &Path, lines: usize) {
    let rerun = embatch(&stack.gateway, args).await;
    assert!(rerun.status.success(), "{}", text(&rerun.stderr));
    assert!(
        text(&rerun.stdout).contains("(resumed)"),
        "{}",
        text(&rerun.stdout)
    );
    assert_eq!(stack.batches().await.len(), 1, "not submitted twice");
    assert_eq!(lines_by_id(output).len(), lines, "results written again");
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The output file's lines by custom_id (panics on a repeated custom_id).
fn lines_by_id(path: &Path) -> std::collections::BTreeMap<String, Value> {
    let mut out = std::collections::BTreeMap::new();
    let content = std::fs::read_to_string(path).expect("output written");
    for line in content.lines().filter(|l| !l.trim().is_empty()) {
        let value: Value = serde_json::from_str(line).expect("an output line is JSON");
        let id = value["custom_id"].as_str().expect("custom_id").to_owned();
        assert!(out.insert(id.clone(), value).is_none(), "{id} twice");
    }
    out
}

/// Starts a stack (JetStream or not), runs `embatch batch` on an input file `name` holding
/// `content`, asserts it exits 1, and returns the stack and the run's stderr.
async fn refused(jetstream: bool, name: &str, content: &str) -> (BulkStack, String) {
    let stack = BulkStack::start(TeiConfig::instant(), jetstream).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join(name);
    std::fs::write(&input, content).expect("write");
    let out = embatch(
        &stack.gateway,
        &["batch", input.to_str().expect("utf8"), "-o", "unused.jsonl"],
    )
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    (stack, text(&out.stderr))
}

fn assert_close(got: &Value, want: &[f32], what: &str) {
    let got: Vec<f32> = serde_json::from_value(got.clone()).expect("a float vector");
    assert_eq!(got.len(), want.len(), "{what}: dims");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-5, "{what}: {got:?} != {want:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_file_is_embedded_and_a_rerun_does_not_submit_it_again() {
    let stack = BulkStack::start(TeiConfig::instant(), true).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("corpus.txt");
    let texts: Vec<String> = (0..40).map(|i| format!("sentence number {i}")).collect();
    // An empty line is skipped; custom_ids follow the line numbers.
    std::fs::write(
        &input,
        format!("{}\n\n{}\n", texts[0], texts[1..].join("\n")),
    )
    .expect("write");
    let output = dir.path().join("out.jsonl");
    let args = batch_args(&input, &output);

    let first = embatch(&stack.gateway, &args).await;
    assert!(first.status.success(), "{}", text(&first.stderr));
    let lines = lines_by_id(&output);
    assert_eq!(lines.len(), texts.len());
    for (i, t) in texts.iter().enumerate() {
        let line_no = if i == 0 { 1 } else { i + 2 };
        let line = &lines[&format!("line-{line_no}")];
        assert_eq!(line["response"]["status_code"], 200, "{line}");
        assert_close(
            &line["response"]["body"]["data"][0]["embedding"],
            &double_vector(t),
            t,
        );
    }
    let errors = std::fs::read_to_string(dir.path().join("out.jsonl.errors.jsonl"))
        .expect("errors file written");
    assert_eq!(errors, "", "no request failed");
    let batches = stack.batches().await;
    assert_eq!(batches.len(), 1);
    let sha = batches[0]["metadata"]["embatch_input_sha256"]
        .as_str()
        .expect("the input's sha256 in the metadata");
    assert_eq!(sha.len(), 64);

    std::fs::remove_file(&output).expect("rm");
    assert_resumes(&stack, &args, &output, texts.len()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_killed_mid_job_is_resumed_by_the_same_command() {
    // 20 ms per upstream call of at most 32 inputs: 4,000 lines take 2.5 s or more.
    let tei = TeiConfig {
        base: Duration::from_millis(20),
        ..TeiConfig::instant()
    };
    let stack = BulkStack::start(tei, true).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("corpus.txt");
    let texts: Vec<String> = (0..4000).map(|i| format!("input {i}")).collect();
    std::fs::write(&input, texts.join("\n")).expect("write");
    let output = dir.path().join("out.jsonl");
    let args = batch_args(&input, &output);
    let mut child = Command::new(env!("CARGO_BIN_EXE_embatch"))
        .args(["--url", &stack.gateway])
        .args(&args)
        .env_remove("EMBATCH_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("embatch runs");
    // Killed (SIGKILL, no chance to clean up) once its batch exists.
    let deadline = Instant::now() + Duration::from_secs(20);
    while stack.batches().await.is_empty() {
        assert!(Instant::now() < deadline, "no batch after 20 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().expect("kill");
    child.wait().expect("reaped");
    let status = stack.batches().await[0]["status"].clone();
    assert!(
        status == "validating" || status == "in_progress",
        "killed mid-job, not after: {status}"
    );
    assert!(!output.exists(), "killed before the results");

    assert_resumes(&stack, &args, &output, texts.len()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_the_gateway_rejects_is_reported_with_its_line_number() {
    let stack = BulkStack::start(TeiConfig::instant(), true).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("requests.jsonl");
    std::fs::write(
        &input,
        concat!(
            r#"{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":{"model":"embatch/tei-double","input":"x"}}"#,
            "\n",
            r#"{"custom_id":"b","method":"POST","url":"/v1/completions","body":{"model":"embatch/tei-double","prompt":"x"}}"#,
            "\n"
        ),
    )
    .expect("write");
    let output = dir.path().join("out.jsonl");
    let out = embatch(&stack.gateway, &batch_args(&input, &output)).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("failed") && stderr.contains("line 2"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_input_file_is_refused_before_anything_is_sent() {
    let (stack, stderr) = refused(
        true,
        "requests.jsonl",
        "{\"custom_id\":\"a\"}\n{\"custom_id\":\"a\"}\n",
    )
    .await;
    assert!(
        stderr.contains("line 2") && stderr.contains("repeats line 1"),
        "{stderr}"
    );
    assert!(stack.batches().await.is_empty(), "nothing submitted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_jetstream_the_error_says_so() {
    let (stack, stderr) = refused(false, "corpus.txt", "hello\n").await;
    assert!(
        stderr.contains("503") && stderr.contains("JetStream"),
        "{stderr}"
    );
    // The interactive path is untouched.
    let reply = reqwest::Client::new()
        .post(format!("{}/embed", stack.gateway))
        .json(&serde_json::json!({"inputs": "hello"}))
        .send()
        .await
        .expect("embeds");
    assert_eq!(reply.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_key_runs_its_job_and_reads_its_usage_and_no_key_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(&tenants, "[tenants.cli]\nkeys = [\"sk-cli\"]\n").expect("write");
    let stack = BulkStack::start_with(TeiConfig::instant(), true, Some(&tenants)).await;
    let input = dir.path().join("texts.txt");
    std::fs::write(&input, "first\nsecond\n").expect("write");
    let output = dir.path().join("out.jsonl");
    let args = batch_args(&input, &output);

    let out = embatch(&stack.gateway, &args).await;
    assert_ne!(out.status.code(), Some(0), "no key: refused");
    assert!(text(&out.stderr).contains("401"), "{}", text(&out.stderr));

    let mut keyed = vec!["--api-key".to_owned(), "sk-cli".to_owned()];
    keyed.extend(args);
    let out = embatch(&stack.gateway, &keyed).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(&output)
            .expect("output")
            .lines()
            .count(),
        2
    );

    let out = embatch(&stack.gateway, &["usage", "--api-key", "sk-cli"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let usage: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(usage["tenant"], "cli", "{usage}");
    assert_eq!(usage["object"], "usage", "{usage}");
}
