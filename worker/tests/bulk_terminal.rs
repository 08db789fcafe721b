//! Every batch ends. Random and corrupted input files (random bytes, cut UTF-8 sequences, NUL
//! bytes, a line over the limit, CRLF line ends, a byte-order mark, an empty file, valid lines
//! among bad ones) go through the real path: a `nats-server -js` on a temporary store, a worker's
//! bulk lane on the TEI double, batches submitted by the NATS contract (object store, KV record,
//! `validate` job), some cancelled at once. Each reaches a final status, a refused line is named
//! with its number and code, and a cancelled batch delivers each valid line once. A job that
//! keeps failing (a stored file whose bytes no longer match its digest) ends its batch `failed`
//! after `BULK_MAX_DELIVER` deliveries instead of being retried for good.
//!
//! The files come from a seeded RNG: `EMBATCH_TEST_SEED=<n>` reruns a seed (the seed is printed).

mod bulk_files;
mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::bulk_contract::{create, put_file, read_file, wait};
use embatch_bulk::BulkStore;
use embatch_protocol::bulk::{Batch, BatchStatus, FILES_BUCKET, JobKind};
use embatch_testkit::{NatsServer, RunningWorker, TeiConfig, TeiDouble, start_tei};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use bulk_files::{cases, check_validation, valid_line};

/// How long a batch may take to end here; far above what any takes (a second or two), it only
/// turns a batch that never ends into a failure instead of a hang.
const LIMIT: Duration = Duration::from_secs(90);

/// `BULK_MAX_DELIVER` of the worker under test.
const MAX_DELIVER: &str = "2";

/// A worker whose bulk lane takes jobs on `nats`, embedding on `tei`: a 1 s ack wait, two
/// deliveries of a failing job, items of 4 inputs.
async fn worker(nats: &NatsServer, tei: &TeiDouble) -> RunningWorker {
    let args = [
        "--tei-url",
        tei.url.as_str(),
        "--bulk-ack-wait",
        "1s",
        "--bulk-max-deliver",
        MAX_DELIVER,
        "--bulk-chunk-inputs",
        "4",
    ];
    RunningWorker::start(nats, &args).await
}

/// A `nats-server -js`, the TEI double, a [`worker`] on both, and the bulk store; the server
/// and the double live as long as the first two values.
async fn start() -> (NatsServer, TeiDouble, RunningWorker, BulkStore) {
    let nats = NatsServer::start_jetstream();
    let tei = start_tei(TeiConfig::instant()).await;
    let worker = worker(&nats, &tei).await;
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let store = BulkStore::open(client).await.expect("JetStream");
    (nats, tei, worker, store)
}

/// Cancels as `POST /v1/batches/{id}/cancel` does; `true` when the batch was validating or in
/// progress and is now cancelling.
async fn cancel(store: &BulkStore, id: &str) -> bool {
    let record = store.cancel_batch(id).await.expect("record updated");
    record.batch.status == BatchStatus::Cancelling
}

/// Polls the record until its status is final; panics past [`LIMIT`].
async fn final_batch(store: &BulkStore, id: &str, what: &str) -> Batch {
    wait(store, id, (LIMIT, what), |batch| batch.status.is_final()).await
}

/// The `custom_id`s of a file's lines, each with how often it appears.
async fn custom_ids(store: &BulkStore, file_id: Option<&str>) -> BTreeMap<String, usize> {
    let mut ids = BTreeMap::new();
    let Some(file_id) = file_id else {
        return ids;
    };
    for line in read_file(store, file_id).await.lines() {
        let value: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let id = value["custom_id"].as_str().expect("custom_id").to_owned();
        *ids.entry(id).or_default() += 1;
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_and_corrupted_input_files_all_reach_a_final_status() {
    let seed = std::env::var("EMBATCH_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_260_515u64);
    println!("EMBATCH_TEST_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let (_nats, _tei, worker, store) = start().await;

    let cases = cases(&mut rng);
    let mut batches = Vec::new();
    for case in &cases {
        let file_id = put_file(&store, &case.bytes).await;
        let id = create(&store, &file_id, BatchStatus::Validating, JobKind::Validate).await;
        // A third of them cancelled at once (the cancel counts when it came first).
        let cancelled = rng.random_bool(0.33) && cancel(&store, &id).await;
        batches.push((case, id, cancelled));
    }
    for (case, id, cancelled) in &batches {
        let name = format!("{} (seed {seed}, cancelled: {cancelled})", case.name);
        let batch = final_batch(&store, id, &name).await;
        let codes: Vec<_> = batch
            .errors
            .iter()
            .flat_map(|e| &e.data)
            .map(|e| (e.line, e.code.as_str()))
            .collect();
        println!(
            "{name}: {} lines, {:?} {codes:?}",
            case.lines.len(),
            batch.status
        );
        if !cancelled {
            check_validation(case, &batch);
            continue;
        }
        assert!(
            matches!(batch.status, BatchStatus::Cancelled | BatchStatus::Failed),
            "{name}: {batch:?}"
        );
        if batch.status == BatchStatus::Cancelled {
            // What finished and what never ran: each valid line once across the two files.
            let mut delivered = custom_ids(&store, batch.output_file_id.as_deref()).await;
            for (id, n) in custom_ids(&store, batch.error_file_id.as_deref()).await {
                *delivered.entry(id).or_default() += n;
            }
            let expected: BTreeMap<String, usize> =
                case.valid_ids.iter().map(|id| (id.clone(), 1)).collect();
            assert_eq!(delivered, expected, "{name}: {batch:?}");
        }
    }
    worker.stop().await;
}

/// The chunk subject of a stored file, and its message count: `$O.<bucket>.C.<nuid>`.
async fn chunks_subject(store: &BulkStore, file_id: &str) -> String {
    let info = store.files.info(file_id).await.expect("file info");
    format!("$O.{FILES_BUCKET}.C.{}", info.nuid)
}

/// Breaks a stored file for good: one more chunk after its last, so every read of it ends in
/// a digest error (a store fault that no retry mends).
async fn corrupt(store: &BulkStore, file_id: &str) {
    let subject = chunks_subject(store, file_id).await;
    store
        .js
        .publish(
            subject,
            bytes::Bytes::from_static(b"\n{\"not\": \"stored\"}\n"),
        )
        .await
        .expect("publish")
        .await
        .expect("stored");
}

fn valid_file(n: usize) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(1);
    let mut bytes = Vec::new();
    for i in 1..=n {
        bytes.extend_from_slice(&valid_line(&format!("c-{i}"), &mut rng));
        bytes.push(b'\n');
    }
    bytes
}

/// A batch of a corrupted 3-line file, created in `status` with `job`: its id and its final
/// record, which must be `failed` with one error and no output or error file.
async fn failed_batch(store: &BulkStore, (status, job): (BatchStatus, JobKind)) -> (String, Batch) {
    let file_id = put_file(store, &valid_file(3)).await;
    corrupt(store, &file_id).await;
    let id = create(store, &file_id, status, job).await;
    let batch = final_batch(store, &id, &format!("a corrupted file, {status:?}")).await;
    assert_eq!(batch.status, BatchStatus::Failed, "{batch:?}");
    let errors = &batch.errors.as_ref().expect("errors").data;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        batch.output_file_id.is_none() && batch.error_file_id.is_none(),
        "{batch:?}"
    );
    (id, batch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validation_that_keeps_failing_ends_its_batch_failed() {
    let (_nats, _tei, worker, store) = start().await;
    let (_, batch) = failed_batch(&store, (BatchStatus::Validating, JobKind::Validate)).await;
    let errors = &batch.errors.as_ref().expect("errors").data;
    assert_eq!(errors[0].code, "validation_failed");
    assert!(
        errors[0]
            .message
            .contains(&format!("delivery {MAX_DELIVER} of at most {MAX_DELIVER}"))
            && errors[0].message.contains("wrong digest"),
        "the message says how often and why: {errors:?}"
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_whose_finalization_keeps_failing_still_ends_its_batch() {
    let (_nats, _tei, worker, store) = start().await;
    // Cancelled while validating: finalize must read the input file for the lines never run.
    let (id, batch) = failed_batch(&store, (BatchStatus::Cancelling, JobKind::Finalize)).await;
    let errors = &batch.errors.as_ref().expect("errors").data;
    assert_eq!(errors[0].code, "finalization_failed");
    assert!(errors[0].message.contains("wrong digest"), "{errors:?}");
    // The files its runs began are gone.
    let suffix = id.strip_prefix("batch_").unwrap_or(&id);
    for file in [
        format!("file-{suffix}-output"),
        format!("file-{suffix}-errors"),
    ] {
        assert!(store.files.get(&file).await.is_err(), "{file} is left");
    }
    worker.stop().await;
}

/// The defect as reported: a file with a line that is not UTF-8, cancelled. Finalize skips the
/// line (it has no `custom_id` to name) and lists every other line as never run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_batch_with_a_non_utf8_line_ends_cancelled() {
    let (_nats, _tei, worker, store) = start().await;
    let mut rng = StdRng::seed_from_u64(1);
    let mut bytes = Vec::new();
    for line in [
        valid_line("c-1", &mut rng),
        valid_line("c-2", &mut rng),
        b"{\"custom_id\":\"bad\",\"url\":\"/v1/embeddings\",\"body\":{\"input\":\"caf\xC3\"}}"
            .to_vec(),
        valid_line("c-3", &mut rng),
    ] {
        bytes.extend_from_slice(&line);
        bytes.push(b'\n');
    }
    let file_id = put_file(&store, &bytes).await;

    let id = create(&store, &file_id, BatchStatus::Cancelling, JobKind::Finalize).await;
    let batch = final_batch(&store, &id, "a cancel of a file with a non-UTF-8 line").await;
    assert_eq!(batch.status, BatchStatus::Cancelled, "{batch:?}");
    assert_eq!(batch.output_file_id, None, "nothing ran");
    let never_run = custom_ids(&store, batch.error_file_id.as_deref()).await;
    let expected: BTreeMap<String, usize> = ["c-1", "c-2", "c-3"]
        .into_iter()
        .map(|id| (id.to_owned(), 1))
        .collect();
    assert_eq!(never_run, expected);
    assert_eq!(batch.request_counts.failed, 3, "{batch:?}");
    worker.stop().await;
}

/// An input file deleted after its batch was created: a cancel still ends `cancelled` (nothing
/// ran, and the lines never run cannot be listed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_batch_whose_input_file_is_gone_ends_cancelled() {
    let (_nats, _tei, worker, store) = start().await;
    let file_id = put_file(&store, &valid_file(3)).await;
    store.files.delete(&file_id).await.expect("deleted");

    let id = create(&store, &file_id, BatchStatus::Cancelling, JobKind::Finalize).await;
    let batch = final_batch(&store, &id, "a cancel of a deleted file").await;
    assert_eq!(batch.status, BatchStatus::Cancelled, "{batch:?}");
    assert_eq!(
        (batch.output_file_id, batch.error_file_id),
        (None, None),
        "nothing ran, nothing to list"
    );
    worker.stop().await;
}
