//! `POST /v1/files` leaves nothing in JetStream when it refuses or loses an upload, the sweeper
//! removes what failed uploads left, and the files keep to their budget: a real
//! `nats-server -js` on a temporary store, the object store's stream read before and after.

mod common;

use std::time::{Duration, SystemTime};

use async_nats::jetstream;
use bytes::Bytes;
use common::{RunningGateway, start_gateway_at};
use embatch_bulk::{BulkStore, FILES_STREAM};
use embatch_gateway::bulk::sweep::{Swept, chunk_prefix, sweep};
use embatch_testkit::NatsServer;
use futures::TryStreamExt;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MIB: usize = 1 << 20;
const BOUNDARY: &str = "embatch-test-boundary";

/// A JetStream server and a gateway on it with `args`, its bulk store bound; a JetStream
/// context of the test's own.
async fn setup(args: &[&str]) -> (NatsServer, RunningGateway, jetstream::Context) {
    let nats = NatsServer::start_jetstream();
    let gateway = start_gateway_at(&nats.url(), args, None).await;
    // Any bulk route binds the store (and sets the budget) before it answers.
    let listed = reqwest::get(format!("{}/v1/files", gateway.url))
        .await
        .expect("GET /v1/files");
    assert_eq!(listed.status().as_u16(), 200);
    let client = async_nats::connect(nats.url()).await.expect("connect");
    (nats, gateway, jetstream::new(client))
}

/// The files' stream: bytes and messages stored.
async fn stored(js: &jetstream::Context) -> (u64, u64) {
    let info = js
        .get_stream(FILES_STREAM)
        .await
        .expect("the files' stream")
        .get_info()
        .await
        .expect("stream info");
    (info.state.bytes, info.state.messages)
}

/// The files' stream's `max_bytes` (-1: none).
async fn budget(js: &jetstream::Context) -> i64 {
    let stream = js
        .get_stream(FILES_STREAM)
        .await
        .expect("the files' stream");
    stream.cached_info().config.max_bytes
}

/// Polls the files' stream until it holds `want`, for at most 30 s.
async fn wait_stored(js: &jetstream::Context, want: (u64, u64), what: &str) {
    let mut now = stored(js).await;
    for _ in 0..300 {
        if now == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        now = stored(js).await;
    }
    panic!("{what}: the files' stream holds {now:?} (bytes, messages), not {want:?}");
}

/// The multipart form up to the file's bytes, and what follows them.
fn form_around_file() -> (String, String) {
    let head = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
         --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    );
    (head, format!("\r\n--{BOUNDARY}--\r\n"))
}

/// The request head of `POST /v1/files` with `framing` (a `Content-Length` or
/// `Transfer-Encoding` header line).
fn request_head(framing: &str) -> String {
    format!(
        "POST /v1/files HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\
         Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n{framing}\r\n\r\n"
    )
}

/// A connection to `gateway`.
async fn connect(gateway: &RunningGateway) -> TcpStream {
    let addr = gateway.url.trim_start_matches("http://");
    TcpStream::connect(addr).await.expect("connect")
}

/// Reads one answer (its head and its `Content-Length` of body), for at most 30 s: its status
/// and JSON body. The gateway may keep reading the rest of a refused body meanwhile.
async fn answer(stream: &mut TcpStream) -> (u16, Value) {
    let read = async {
        let mut raw = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&raw).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().to_owned())
                    })
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or_else(|| panic!("no Content-Length in {head:?}"));
                if body.len() >= length {
                    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok());
                    let status = status.unwrap_or_else(|| panic!("no status in {head:?}"));
                    return (status, serde_json::from_str(body).unwrap_or(Value::Null));
                }
            }
            let n = stream.read(&mut buf).await.expect("read the answer");
            assert!(
                n > 0,
                "the gateway closed the connection without an answer: {text:?}"
            );
            raw.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("the gateway answers within 30 s")
}

/// The multipart upload of `file` through reqwest (with its `Content-Length`).
async fn upload(gateway: &RunningGateway, file: Vec<u8>) -> (u16, Value) {
    let form = reqwest::multipart::Form::new()
        .text("purpose", "batch")
        .part(
            "file",
            reqwest::multipart::Part::bytes(file).file_name("input.jsonl"),
        );
    let response = reqwest::Client::new()
        .post(format!("{}/v1/files", gateway.url))
        .multipart(form)
        .send()
        .await
        .expect("POST /v1/files");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn assert_too_large(status: u16, body: &Value, setting: &str) {
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["param"], "file", "{body}");
    assert_eq!(body["error"]["code"], "file_too_large", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(setting), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_length_over_the_limit_is_413_before_the_body_and_stores_nothing() {
    let (_nats, gateway, js) = setup(&["--bulk-max-file-bytes", "1048576"]).await;
    let before = stored(&js).await;

    // The head alone: the answer comes without any of the body.
    let mut stream = connect(&gateway).await;
    let head = request_head(&format!("Content-Length: {}", 3 * MIB));
    stream.write_all(head.as_bytes()).await.expect("send");
    let (status, body) = answer(&mut stream).await;
    assert_too_large(status, &body, "BULK_MAX_FILE_BYTES");
    assert_eq!(stored(&js).await, before, "nothing stored");

    // One byte over, with its Content-Length: read up to the limit, refused, nothing kept.
    let (status, body) = upload(&gateway, vec![b'x'; MIB + 1]).await;
    assert_too_large(status, &body, "BULK_MAX_FILE_BYTES");
    assert_eq!(stored(&js).await, before, "nothing stored");
    // At the limit exactly, the file is stored.
    let (status, file) = upload(&gateway, vec![b'x'; MIB]).await;
    assert_eq!(status, 200, "{file}");
    assert_eq!(file["bytes"].as_u64(), Some(MIB as u64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_upload_over_the_limit_is_413_and_stores_nothing() {
    let (_nats, gateway, js) = setup(&["--bulk-max-file-bytes", "1048576"]).await;
    let before = stored(&js).await;
    let (head, tail) = form_around_file();
    let mut body = head.into_bytes();
    body.extend(vec![b'y'; MIB + 1]);
    body.extend(tail.into_bytes());

    let mut stream = connect(&gateway).await;
    let mut request = request_head("Transfer-Encoding: chunked").into_bytes();
    for piece in body.chunks(64 * 1024) {
        request.extend(format!("{:x}\r\n", piece.len()).into_bytes());
        request.extend(piece);
        request.extend(b"\r\n");
    }
    request.extend(b"0\r\n\r\n");
    stream.write_all(&request).await.expect("send");
    let (status, body) = answer(&mut stream).await;
    assert_too_large(status, &body, "BULK_MAX_FILE_BYTES");
    assert_eq!(stored(&js).await, before, "nothing stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_the_client_abandons_leaves_nothing() {
    let (_nats, gateway, js) = setup(&["--bulk-max-file-bytes", "4194304"]).await;
    let before = stored(&js).await;
    let (head, _) = form_around_file();
    let mut stream = connect(&gateway).await;
    let length = head.len() + 3 * MIB;
    let request = request_head(&format!("Content-Length: {length}")) + &head;
    stream.write_all(request.as_bytes()).await.expect("send");
    stream.write_all(&vec![b'z'; MIB]).await.expect("send");
    stream.flush().await.expect("flush");
    // Chunks are being stored: the upload is under way when the client goes.
    let mut now = stored(&js).await;
    for _ in 0..300 {
        if now.1 > before.1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        now = stored(&js).await;
    }
    assert!(now.1 > before.1, "no chunk stored while the body arrived");
    drop(stream);
    wait_stored(&js, before, "after the client went away").await;
}

/// Publishes `n` chunks of 1 KiB on the chunk subject of `nuid`, as an upload would; the time
/// nats-server stamped on the last.
async fn publish_chunks(js: &jetstream::Context, nuid: &str, n: usize) -> SystemTime {
    let subject = format!("{}{nuid}", chunk_prefix());
    for _ in 0..n {
        js.publish(subject.clone(), Bytes::from(vec![b'c'; 1024]))
            .await
            .expect("publish")
            .await
            .expect("ack");
    }
    let stream = js.get_stream(FILES_STREAM).await.expect("stream");
    let last = stream
        .get_last_raw_message_by_subject(&subject)
        .await
        .expect("the chunk");
    SystemTime::from(last.time)
}

async fn chunk_subjects(store: &BulkStore) -> Vec<String> {
    let mut subjects: Vec<String> = store
        .files_stream
        .info_with_subjects(format!("{}>", chunk_prefix()))
        .await
        .expect("subjects")
        .map_ok(|(subject, _)| subject)
        .try_collect()
        .await
        .expect("subjects");
    subjects.sort();
    subjects
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_removes_only_old_chunks_that_no_file_owns() {
    let nats = NatsServer::start_jetstream();
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let store = BulkStore::open(client).await.expect("JetStream");
    let js = store.js.clone();
    let data = vec![b'l'; 300_000];
    let mut content = data.as_slice();
    let live = store
        .files
        .put("file-live", &mut content)
        .await
        .expect("put");
    let old = publish_chunks(&js, "ORPHANOLD", 3).await;
    // The fresh orphan must be stamped after the old one: the cutoff falls between them.
    let mut fresh = old;
    while fresh <= old {
        fresh = publish_chunks(&js, "ORPHANFRESH", 1).await;
    }
    let before = chunk_subjects(&store).await;
    assert_eq!(before.len(), 3, "{before:?}");

    // Two sweepers at once (two gateways): both succeed, the old orphan goes once.
    let other = BulkStore::open(async_nats::connect(nats.url()).await.expect("connect"))
        .await
        .expect("JetStream");
    let (a, b) = tokio::join!(sweep(&store, fresh), sweep(&other, fresh));
    let (a, b) = (a.expect("sweep"), b.expect("sweep"));
    assert!(
        a.subjects + b.subjects >= 1 && a.subjects <= 1 && b.subjects <= 1,
        "{a:?} {b:?}"
    );
    let prefix = chunk_prefix();
    let fresh_subject = before
        .iter()
        .find(|s| s.ends_with("ORPHANFRESH"))
        .expect("fresh");
    let mut kept = vec![format!("{prefix}{}", live.nuid), fresh_subject.clone()];
    kept.sort();
    assert_eq!(chunk_subjects(&store).await, kept);
    assert_eq!(
        sweep(&store, fresh).await.expect("sweep"),
        Swept::default(),
        "nothing more to sweep"
    );
    let mut read = Vec::new();
    let mut object = store.files.get("file-live").await.expect("the live file");
    tokio::io::AsyncReadExt::read_to_end(&mut object, &mut read)
        .await
        .expect("read");
    assert_eq!(read.len(), 300_000, "the live file is whole");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_keep_to_the_files_budget_and_a_refused_one_leaves_nothing() {
    let (_nats, gateway, js) = setup(&[
        "--bulk-max-file-bytes",
        "3000000",
        "--bulk-files-max-bytes",
        "1000000",
    ])
    .await;
    assert_eq!(budget(&js).await, 1_000_000);
    let empty = stored(&js).await;

    // Larger than the whole budget: 413, at once from the Content-Length.
    let (status, body) = upload(&gateway, vec![b'x'; 1_500_000]).await;
    assert_too_large(status, &body, "BULK_FILES_MAX_BYTES");
    assert_eq!(stored(&js).await, empty, "nothing stored");

    // Fits the budget, not the room the first file leaves: 507, nothing kept of it.
    let (status, first) = upload(&gateway, vec![b'a'; 600_000]).await;
    assert_eq!(status, 200, "{first}");
    let with_first = stored(&js).await;
    let (status, body) = upload(&gateway, vec![b'b'; 600_000]).await;
    assert_eq!(status, 507, "{body}");
    assert_eq!(body["error"]["code"], "insufficient_storage", "{body}");
    assert_eq!(stored(&js).await, with_first, "nothing stored");

    // Deleting the first makes room for the second.
    let id = first["id"].as_str().expect("id");
    let deleted = reqwest::Client::new()
        .delete(format!("{}/v1/files/{id}", gateway.url))
        .send()
        .await
        .expect("DELETE");
    assert_eq!(deleted.status().as_u16(), 200);
    let (status, second) = upload(&gateway, vec![b'b'; 600_000]).await;
    assert_eq!(status, 200, "{second}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lowering_the_budget_below_what_is_stored_drops_nothing() {
    let nats = NatsServer::start_jetstream();
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let store = BulkStore::open(client).await.expect("JetStream");
    for name in ["file-a", "file-b"] {
        let data = vec![b'd'; 300_000];
        let mut content = data.as_slice();
        store.files.put(name, &mut content).await.expect("put");
    }
    let before = store.files_usage().await.expect("usage");
    store.set_files_budget(100_000).await.expect("budget");
    let after = store.files_usage().await.expect("usage");
    assert_eq!((after.bytes, after.budget), (before.bytes, Some(100_000)));
    for name in ["file-a", "file-b"] {
        let mut read = Vec::new();
        let mut object = store.files.get(name).await.expect("stored file");
        tokio::io::AsyncReadExt::read_to_end(&mut object, &mut read)
            .await
            .expect("read");
        assert_eq!(read.len(), 300_000, "{name} is whole");
    }
    store.set_files_budget(0).await.expect("no budget");
    assert_eq!(store.files_usage().await.expect("usage").budget, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_the_server_cannot_reserve_leaves_the_files_routes_serving() {
    // nats-server reserves a stream's max_bytes out of max_file_store: 4 GiB cannot be, 500 MB can.
    let dir = std::env::temp_dir().join(format!("embatch-small-store-{}", nuid::next()));
    std::fs::create_dir_all(&dir).expect("store dir");
    let conf = dir.join("nats.conf");
    let store_dir = dir.join("store");
    std::fs::write(
        &conf,
        format!(
            "jetstream {{ store_dir: {:?}, max_file_store: 1GB }}\n",
            store_dir.to_string_lossy()
        ),
    )
    .expect("config");
    let nats = NatsServer::start_with_args(&["-c", &conf.to_string_lossy()]);
    let gateway = start_gateway_at(&nats.url(), &[], None).await;
    let (status, file) = upload(&gateway, b"{}\n".to_vec()).await;
    assert_eq!(status, 200, "{file}");
    let js = jetstream::new(async_nats::connect(nats.url()).await.expect("connect"));
    assert_eq!(budget(&js).await, -1, "created without a budget");

    let other = start_gateway_at(&nats.url(), &["--bulk-files-max-bytes", "500000000"], None).await;
    let (status, file) = upload(&other, b"{}\n".to_vec()).await;
    assert_eq!(status, 200, "{file}");
    assert_eq!(
        budget(&js).await,
        500_000_000,
        "a budget the server can reserve is set"
    );
    drop(nats);
    let _ = std::fs::remove_dir_all(&dir);
}
