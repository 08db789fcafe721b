//! The worker's memory with large inputs, on the real worker binary: with clients keeping large
//! single-input requests in flight (2 MiB texts, `truncate: true`, each distinct: the worker
//! de-duplicates equal inputs), the worker's peak RSS stays within 4 × `MAX_QUEUE_BYTES` (its
//! default, 64 MiB) above its idle RSS, without a tokenizer and with the model's. The scenario
//! of `loadtest/memory.py` at half its length: 100 requests in flight, 200 in all. Where the
//! worker used to keep copies of every request it held (the message body beside the parsed
//! text, a copy of the text for the batcher, the tokenizer's encoding of 128,000 characters, the
//! upstream call's body), and later let requests pile up in its NATS connection's read buffers
//! before its intake could refuse them, it peaked over the bound here; what is left is mostly
//! the NATS client's buffers and the allocator's (`docs/benchmarks.md`, "Memory with large
//! inputs").
//!
//! A resource bound, asserted; the figures are printed (`-- --nocapture`).

mod process;

use std::time::Duration;

use bytes::Bytes;
use embatch_protocol::headers;
use embatch_testkit::{NatsServer, TeiConfig, model_dir, start_tei};
use futures::StreamExt;

use process::spawn_worker;

/// The worker's `MAX_QUEUE_BYTES` here: its default, 64 MiB.
const MAX_QUEUE_BYTES: usize = 64 << 20;
/// Bytes of text per request: 2 MiB less 64 bytes, so that a request of one input fits the TEI
/// double's body limit (2 MiB, axum's default, as TEI's own `--payload-limit`).
const INPUT_BYTES: usize = (2 << 20) - 64;
/// Requests in flight at a time: 100, three times as many bytes as `MAX_QUEUE_BYTES`: most of
/// them wait in the worker's NATS connection or are refused, which is what a bound must survive.
const IN_FLIGHT: usize = 100;
/// Requests in all: 200 (the peak comes with the first ones, while the queue fills).
const REQUESTS: usize = 200;

/// Held by the running scenario.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `VmHWM`), in bytes.
fn status_bytes(pid: u32, field: &str) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
    let line = status
        .lines()
        .find(|line| line.starts_with(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    let kib: usize = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    kib * 1024
}

/// Resets the process's peak RSS (`VmHWM`) to its current RSS (Linux 4.0+).
fn reset_peak(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset the peak RSS");
}

/// `count` distinct texts of `size` bytes of lower-case words: windows at distinct offsets of
/// one buffer of pseudo-random words (xorshift, fixed seed).
fn texts(count: usize, size: usize) -> Vec<String> {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let stride = 1009;
    let mut buffer = String::with_capacity(size + stride * count + 16);
    while buffer.len() < size + stride * count {
        let letters = 2 + next() % 9;
        for _ in 0..letters {
            buffer.push(char::from(b'a' + (next() % 26) as u8));
        }
        buffer.push(' ');
    }
    (0..count)
        .map(|i| buffer[i * stride..i * stride + size].to_owned())
        .collect()
}

/// Sends the scenario to the worker on `client`: every request answered; returns the replies by
/// status (200, or the error header's code).
async fn send_scenario(client: &async_nats::Client) -> std::collections::BTreeMap<u16, usize> {
    let bodies: Vec<Bytes> = texts(REQUESTS, INPUT_BYTES)
        .into_iter()
        .map(|text| Bytes::from(serde_json::json!({"inputs": text, "truncate": true}).to_string()))
        .collect();
    let statuses: Vec<u16> = futures::stream::iter(bodies)
        .map(|body| async move {
            let mut request_headers = async_nats::HeaderMap::new();
            request_headers.insert(headers::DEADLINE_MS, "60000");
            let reply = tokio::time::timeout(
                Duration::from_secs(90),
                client.request_with_headers(
                    embatch_protocol::DEFAULT_SUBJECT,
                    request_headers,
                    body,
                ),
            )
            .await
            .expect("a reply within 90 s")
            .expect("a reply");
            reply
                .headers
                .as_ref()
                .and_then(|h| h.get(headers::SERVICE_ERROR_CODE))
                .map_or(200, |code| code.as_str().parse().expect("a status code"))
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let mut counts = std::collections::BTreeMap::new();
    for status in statuses {
        *counts.entry(status).or_insert(0) += 1;
    }
    counts
}

/// Waits until the worker takes requests: discovery answers before the worker has joined the
/// queue group (it loads a tokenizer first, say), so a request sent at once may find no
/// responders. An empty body is refused at once (400), which proves the subscription.
async fn in_queue_group(client: &async_nats::Client) {
    for _ in 0..200 {
        match client
            .request(
                embatch_protocol::DEFAULT_SUBJECT,
                bytes::Bytes::from_static(b"{}"),
            )
            .await
        {
            Ok(_) => return,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    panic!("the worker never joined the queue group");
}

/// Starts a worker with `settings` on a fresh nats-server and the TEI double, sends the scenario
/// and asserts the worker's peak RSS above idle.
async fn peak_within_bound(settings: &[(&str, &str)]) {
    // One scenario at a time: each one's worker alone on the CPUs.
    let _alone = ALONE.lock().await;
    // The shipped nats/nats.conf's connection limits: a request of 2 MiB needs more than the
    // default max_payload, and with the default max_pending (64 MiB, 32 such requests) a worker
    // that lags behind the burst on a slow machine is cut off as a slow consumer, and the
    // requests sent while it reconnects find no responders.
    let nats = NatsServer::start_with_config(
        "max_payload: 8MB\nmax_pending: 256MB\nwrite_deadline: \"10s\"\n",
    );
    let tei = start_tei(TeiConfig::instant()).await;
    let client = async_nats::ConnectOptions::new()
        .subscription_capacity(4 * REQUESTS)
        // Requests wait behind others for the upstream (by its deadline header, 60 s).
        .request_timeout(Some(Duration::from_secs(90)))
        .connect(nats.url())
        .await
        .expect("client connects");
    let max_queue_bytes = MAX_QUEUE_BYTES.to_string();
    let mut env = vec![
        ("MAX_QUEUE_BYTES", max_queue_bytes.as_str()),
        ("MEMBERSHIP", "static"),
        ("HF_HUB_OFFLINE", "1"),
    ];
    env.extend_from_slice(settings);
    let worker = spawn_worker(&nats, &tei, &env, &client, 1).await;
    let pid = worker.0.id();
    in_queue_group(&client).await;
    // Settled: the start's allocations done (a NATS round trip and a moment).
    client.flush().await.expect("flush");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = status_bytes(pid, "VmRSS");
    reset_peak(pid);

    let replies = send_scenario(&client).await;

    let peak = status_bytes(pid, "VmHWM");
    let above = peak.saturating_sub(idle);
    let bound = 4 * MAX_QUEUE_BYTES;
    println!(
        "{settings:?}: idle {} KiB, peak {} KiB, peak - idle {} KiB (bound {} KiB); replies {replies:?}",
        idle / 1024,
        peak / 1024,
        above / 1024,
        bound / 1024
    );
    // Every request was answered (`send_scenario`); a batch of several inputs is over the
    // double's body limit, so many end in 429 or the upstream's refusal: the load is the point.
    assert!(
        replies.get(&200).is_some_and(|&ok| ok > 0),
        "some requests are served: {replies:?}"
    );
    assert!(
        above <= bound,
        "the worker's peak RSS is {} KiB above idle, over 4 x MAX_QUEUE_BYTES = {} KiB",
        above / 1024,
        bound / 1024
    );
}

/// Without a tokenizer (the TEI double's model has none: inputs are counted, not tokens).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_inputs_stay_within_four_times_max_queue_bytes() {
    peak_within_bound(&[]).await;
}

/// With the model's tokenizer counting every input's tokens before the batcher (as a worker in
/// front of TEI finds its model's tokenizer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_inputs_counted_by_a_tokenizer_stay_within_four_times_max_queue_bytes() {
    let tokenizer = model_dir().join("tokenizer.json");
    let tokenizer = tokenizer.to_string_lossy().into_owned();
    peak_within_bound(&[("TOKENIZER", tokenizer.as_str())]).await;
}
