//! Bulk jobs over NATS alone (no gateway), on the worker binary: a service submits a batch by
//! the documented contract (object store, KV record, `validate` job), and the job completes
//! with every line exactly once after a worker is `kill -9`ed mid-job and after the NATS server
//! restarts (its JetStream store kept).

mod common;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::bulk_contract::{create, put_file, read_file, wait};
use common::metrics_text;
use embatch_bulk::BulkStore;
use embatch_local_model::Encoder;
use embatch_protocol::Input;
use embatch_protocol::bulk::{
    Batch, BatchStatus, FILES_BUCKET, JobKind, RequestCounts, events_subject,
};
use embatch_testkit::{NatsServer, TeiConfig, TeiDouble, start_tei};
use futures::StreamExt;

/// The worker binary on `nats` and `tei`, with `env` (no metrics listener unless `env` names
/// one).
fn spawn_with(nats: &NatsServer, tei: &TeiDouble, env: &[(&str, &str)]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_embatch-worker"))
        .env("NATS_URL", nats.url())
        .env("TEI_URL", &tei.url)
        .env("METRICS_ADDR", "")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("worker binary starts")
}

/// The worker binary on `nats` and `tei`, one input per bulk item, a 2 s ack wait.
fn spawn_worker(nats: &NatsServer, tei: &TeiDouble) -> Child {
    spawn_with(
        nats,
        tei,
        &[("BULK_CHUNK_INPUTS", "1"), ("BULK_ACK_WAIT", "2s")],
    )
}

fn kill_9(worker: &mut Child) {
    let _ = worker.kill(); // SIGKILL
    let _ = worker.wait();
}

/// Submits a batch of `n` `/v1/embeddings` lines the way any NATS client can (see
/// [`common::bulk_contract`]).
async fn submit(store: &BulkStore, n: usize) -> String {
    let input: String = (0..n)
        .map(|i| {
            format!(
                r#"{{"custom_id":"k-{i}","method":"POST","url":"/v1/embeddings","body":{{"input":"text {i}"}}}}"#
            ) + "\n"
        })
        .collect();
    let file_id = put_file(store, input.as_bytes()).await;
    create(store, &file_id, BatchStatus::Validating, JobKind::Validate).await
}

/// The output file's lines by `custom_id`; panics on a repeat.
async fn output(store: &BulkStore, batch: &Batch) -> HashMap<String, serde_json::Value> {
    let id = batch.output_file_id.as_deref().expect("an output file");
    let text = read_file(store, id).await;
    let mut lines = HashMap::new();
    for line in text.lines() {
        let value: serde_json::Value = serde_json::from_str(line).expect("JSON line");
        let custom_id = value["custom_id"].as_str().expect("custom_id").to_owned();
        assert!(
            lines.insert(custom_id.clone(), value).is_none(),
            "{custom_id} twice"
        );
    }
    lines
}

/// A `nats-server -js`, the TEI double as `tei` says, a client, and the bulk store on it.
async fn stand(tei: TeiConfig) -> (NatsServer, TeiDouble, async_nats::Client, BulkStore) {
    let nats = NatsServer::start_jetstream();
    let tei = start_tei(tei).await;
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let store = BulkStore::open(client.clone()).await.expect("JetStream");
    (nats, tei, client, store)
}

fn slow_tei() -> TeiConfig {
    common::tei_taking(200, 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_job_leaves_its_items_to_another_and_nothing_is_duplicated() {
    let (nats, tei, client, store) = stand(slow_tei()).await;
    let mut first = spawn_worker(&nats, &tei);
    let n = 16;
    let id = submit(&store, n).await;
    let mut events = client
        .subscribe(events_subject(&id))
        .await
        .expect("subscribe");

    // Mid-job: some lines done, the worker holding others unacked.
    wait(&store, &id, (Duration::from_secs(30), "the job"), |b| {
        b.request_counts.completed >= 3
    })
    .await;
    kill_9(&mut first);
    let mut second = spawn_worker(&nats, &tei);

    // Told by a message when it is done.
    let event = tokio::time::timeout(Duration::from_secs(60), events.next())
        .await
        .expect("a completion event")
        .expect("a message");
    let batch: Batch = serde_json::from_slice(&event.payload).expect("the batch");
    assert_eq!(batch.status, BatchStatus::Completed, "{batch:?}");
    assert_eq!(
        batch.request_counts,
        RequestCounts {
            total: n as u64,
            completed: n as u64,
            failed: 0
        }
    );
    let lines = output(&store, &batch).await;
    assert_eq!(lines.len(), n, "every line exactly once");
    kill_9(&mut second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_server_restart_mid_job_loses_nothing() {
    let (mut nats, tei, _, store) = stand(slow_tei()).await;
    let mut worker = spawn_worker(&nats, &tei);
    let n = 16;
    let id = submit(&store, n).await;
    wait(&store, &id, (Duration::from_secs(30), "the job"), |b| {
        b.request_counts.completed >= 3
    })
    .await;
    let nats = tokio::task::spawn_blocking(move || {
        nats.restart(Duration::from_millis(500));
        nats
    })
    .await
    .expect("restarted");

    let batch = wait(&store, &id, (Duration::from_secs(90), "the job"), |b| {
        b.status.is_final()
    })
    .await;
    assert_eq!(batch.status, BatchStatus::Completed, "{batch:?}");
    assert_eq!(batch.request_counts.completed, n as u64);
    assert_eq!(
        output(&store, &batch).await.len(),
        n,
        "every line exactly once"
    );
    let files = store.js.get_object_store(FILES_BUCKET).await;
    assert!(files.is_ok(), "the store survived the restart");
    kill_9(&mut worker);
    drop(nats);
}

/// The bulk lane's work shows in the worker's `/metrics`: one line embedded and one acked item
/// per line (one input per item), every input counted, and the batcher's upstream calls that
/// carried them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_job_shows_in_the_worker_metrics() {
    let (nats, tei, _, store) = stand(TeiConfig::instant()).await;
    let admin = format!("127.0.0.1:{}", embatch_testkit::free_port());
    let mut worker = spawn_with(
        &nats,
        &tei,
        &[("METRICS_ADDR", &admin), ("BULK_CHUNK_INPUTS", "1")],
    );
    let n = 5;
    let id = submit(&store, n).await;
    let batch = wait(&store, &id, (Duration::from_secs(30), "the job"), |b| {
        b.status.is_final()
    })
    .await;
    assert_eq!(batch.status, BatchStatus::Completed, "{batch:?}");
    let value = |metrics: &str, series: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    // The last item's counters are bumped just after its chunk was recorded: poll briefly.
    // Every series carries the worker's model (a global label, first).
    let acked = r#"embatch_worker_bulk_items_total{model="embatch/tei-double",outcome="ack"}"#;
    let started = Instant::now();
    let metrics = loop {
        let metrics = metrics_text(&admin).await;
        if value(&metrics, acked) == Some(n as f64) || started.elapsed() > Duration::from_secs(5) {
            break metrics;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    kill_9(&mut worker);
    let value = |series: &str| value(&metrics, series);
    assert_eq!(
        value(r#"embatch_worker_bulk_inputs_total{model="embatch/tei-double"}"#),
        Some(n as f64),
        "{metrics}"
    );
    assert_eq!(
        value(r#"embatch_worker_bulk_lines_total{model="embatch/tei-double",outcome="ok"}"#),
        Some(n as f64),
        "{metrics}"
    );
    assert!(
        value(r#"embatch_worker_upstream_calls_total{model="embatch/tei-double",outcome="ok"}"#)
            .is_some_and(|c| c >= 1.0),
        "the bulk inputs went through the batcher's calls: {metrics}"
    );
    assert_eq!(value(acked), Some(n as f64), "{metrics}");
    assert!(
        metrics.contains("embatch_worker_bulk_upstream_seconds_count"),
        "{metrics}"
    );
}

/// With the model's tokenizer, each OpenAI output line reports the tokens of its inputs in
/// `usage`, as OpenAI's Batch API reports each response's usage: the same count the tokenizer
/// gives (special tokens included), not 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_output_lines_report_the_tokens_of_their_inputs() {
    let (nats, tei, _, store) = stand(TeiConfig::instant()).await;
    let tokenizer = embatch_testkit::model_dir().join("tokenizer.json");
    let tokenizer_path = tokenizer.to_str().expect("a UTF-8 path");
    let mut worker = spawn_with(&nats, &tei, &[("TOKENIZER", tokenizer_path)]);
    let n = 12;
    let id = submit(&store, n).await;
    let batch = wait(&store, &id, (Duration::from_secs(30), "the job"), |b| {
        b.status.is_final()
    })
    .await;
    kill_9(&mut worker);
    assert_eq!(batch.status, BatchStatus::Completed, "{batch:?}");
    // The model's own tokenizer, counting independently of the worker.
    let reference = Encoder::load_file(&tokenizer, 256).expect("tokenizer");
    let lines = output(&store, &batch).await;
    assert_eq!(lines.len(), n);
    for i in 0..n {
        let line = &lines[&format!("k-{i}")];
        let input = Input::from(format!("text {i}").as_str());
        let want = reference.count(&[input], None, None).expect("counts")[0];
        let want = u64::from(want);
        let usage = &line["response"]["body"]["usage"];
        assert_eq!(usage["prompt_tokens"].as_u64(), Some(want), "{line}");
        assert_eq!(usage["total_tokens"].as_u64(), Some(want), "{line}");
    }
}
