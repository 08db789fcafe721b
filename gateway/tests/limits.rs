//! The gateway's bounds on what a client or the OS can make it hold, over real sockets: a request
//! body that never finishes arriving is answered 408 at `BODY_READ_TIMEOUT` and its connection
//! closed; the gateway binary under a low open-file limit raises it, caps its connections below
//! it and keeps serving instead of failing `accept` with "Too many open files".

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{json_post, read_to_close, start_gateway_at};
use embatch_testkit::{NatsServer, Stack, TeiConfig, free_port, wait_for_port};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Connects to `addr` and sends `path`'s request headers with `Content-Length: 100`, then the
/// first 14 bytes of a 100-byte JSON body.
async fn stalled_post(addr: &str, path: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("connects");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.expect("headers");
    stream
        .write_all(br#"{"inputs":"ab"#)
        .await
        .expect("14 bytes");
    stream
}

/// The status line and JSON body of a raw HTTP/1.1 response.
fn parse(response: &[u8]) -> (String, String, serde_json::Value) {
    let text = String::from_utf8_lossy(response);
    let (head, body) = text.split_once("\r\n\r\n").expect("a complete response");
    let status = head.lines().next().unwrap_or_default().to_owned();
    let body = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
    (status, head.to_ascii_lowercase(), body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_or_trickling_body_is_answered_408_and_closed_at_the_body_read_timeout() {
    let stack = Stack::start(TeiConfig::instant(), &[]).await;
    let timeout = Duration::from_millis(600);
    let gateway =
        start_gateway_at(&stack.nats.url(), &["--body-read-timeout", "600ms"], None).await;
    let addr = gateway.url.trim_start_matches("http://").to_owned();

    // Headers and 14 of 100 body bytes, then nothing: TEI's route and OpenAI's.
    for (path, error_field) in [("/embed", "error"), ("/v1/embeddings", "message")] {
        let started = Instant::now();
        let mut stream = stalled_post(&addr, path).await;
        let response = read_to_close(&mut stream, Duration::from_secs(10))
            .await
            .expect("the connection is closed, not held");
        let waited = started.elapsed();
        let (status, head, body) = parse(&response);
        assert_eq!(status, "HTTP/1.1 408 Request Timeout", "{path}");
        assert!(head.contains("connection: close"), "{path}: {head}");
        let message = if path == "/embed" {
            assert_eq!(body["error_type"], "Timeout", "{body}");
            &body[error_field]
        } else {
            assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
            &body["error"][error_field]
        };
        assert!(
            message
                .as_str()
                .is_some_and(|m| m.contains("BODY_READ_TIMEOUT")),
            "{body}"
        );
        assert!(
            waited >= timeout && waited < timeout + Duration::from_secs(5),
            "{path}: answered after {waited:?}, the timeout is {timeout:?}"
        );
    }

    // A byte every 150 ms (each read well inside the timeout): the deadline is for the whole
    // body, so a trickle is cut at the same time as a stall.
    let started = Instant::now();
    let mut stream = stalled_post(&addr, "/embed").await;
    let (mut reader, mut writer) = stream.split();
    let trickle = async {
        for _ in 0..80 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            if writer.write_all(b" ").await.is_err() {
                break;
            }
        }
    };
    let read = async {
        let mut out = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(10), reader.read_to_end(&mut out)).await;
        (read, out)
    };
    let ((read, response), ()) = tokio::join!(read, trickle);
    let waited = started.elapsed();
    assert!(read.is_ok(), "a trickling client was not cut off");
    assert_eq!(parse(&response).0, "HTTP/1.1 408 Request Timeout");
    assert!(
        waited < timeout + Duration::from_secs(2),
        "the trickle held the connection {waited:?}"
    );

    // A body that arrives in time, even in pieces, is served.
    let response = json_post(
        &reqwest::Client::new(),
        &format!("{}/embed", gateway.url),
        r#"{"inputs":"hello"}"#,
    )
    .send()
    .await
    .expect("HTTP response");
    assert_eq!(response.status().as_u16(), 200);
    let mut stream = TcpStream::connect(&addr).await.expect("connects");
    let body = br#"{"inputs":"in pieces"}"#;
    let head = format!(
        "POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.expect("headers");
    for piece in body.chunks(8) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        stream.write_all(piece).await.expect("a piece");
    }
    let response = read_to_close(&mut stream, Duration::from_secs(10))
        .await
        .expect("answered and closed");
    assert_eq!(parse(&response).0, "HTTP/1.1 200 OK");
    stack.worker.stop().await;
}

/// The gateway binary started by `sh -c '<ulimit> && exec gateway ...'` on `nats`, its stdout
/// (the log) collected line by line; killed when dropped.
struct GatewayProcess {
    child: Child,
    addr: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl GatewayProcess {
    fn start(nats: &NatsServer, ulimit: &str) -> GatewayProcess {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!("{ulimit} && exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_embatch-gateway"))
            .args(["--nats-url", &nats.url(), "--listen", &addr])
            .env("RUST_LOG", "info")
            .env("LOG_FORMAT", "text")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("sh starts the gateway");
        let log = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().expect("piped stdout");
        let lines = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                lines.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            }
        });
        wait_for_port(
            addr.parse().expect("a socket address"),
            Duration::from_secs(20),
        );
        GatewayProcess { child, addr, log }
    }

    /// The log lines containing `needle`.
    fn lines_with(&self, needle: &str) -> Vec<String> {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.iter().filter(|l| l.contains(needle)).cloned().collect()
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET /openapi.json` (answered by the gateway alone): its status.
async fn openapi_status(addr: &str) -> u16 {
    reqwest::Client::new()
        .get(format!("http://{addr}/openapi.json"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

/// This machine's hard open-file limit, as `sh` reports it.
fn hard_open_file_limit() -> u64 {
    let out = Command::new("sh")
        .args(["-c", "ulimit -Hn"])
        .output()
        .expect("sh runs");
    let text = String::from_utf8_lossy(&out.stdout);
    match text.trim() {
        "unlimited" => u64::MAX,
        n => n.parse().expect("a number"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_low_open_file_limit_the_gateway_raises_it_or_caps_connections_below_it() {
    let nats = NatsServer::start();

    // A low soft limit under a higher hard one: raised to the hard limit at start.
    let hard = hard_open_file_limit();
    let gateway = GatewayProcess::start(&nats, "ulimit -Sn 256");
    assert_eq!(openapi_status(&gateway.addr).await, 200);
    let expected = 16384.min(hard.saturating_sub(64)).max(1);
    let line = gateway.lines_with("connection cap");
    assert_eq!(line.len(), 1, "one `connection cap` line: {line:?}");
    assert!(
        line[0].contains(&format!("connection_cap={expected}"))
            && line[0].contains("soft_limit_before=256"),
        "{line:?}"
    );
    drop(gateway);

    // Soft and hard limit 256: MAX_CONNECTIONS (16384) is capped at 256 - 64 = 192.
    let gateway = GatewayProcess::start(&nats, "ulimit -n 256");
    let line = gateway.lines_with("connection cap");
    assert!(
        line.len() == 1
            && line[0].contains("connection_cap=192")
            && line[0].contains("max_connections=16384")
            && line[0].contains("WARN"),
        "{line:?}"
    );
    // 300 idle connections, more than the limit allows: the gateway holds 192 and closes the
    // others at once, instead of running out of descriptors.
    let mut held = Vec::new();
    for _ in 0..300 {
        held.push(
            TcpStream::connect(&gateway.addr)
                .await
                .expect("the kernel accepts"),
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(held);
    let started = Instant::now();
    let mut status = 0;
    while status != 200 && started.elapsed() < Duration::from_secs(5) {
        status = openapi_status(&gateway.addr).await;
    }
    assert_eq!(status, 200, "serves again once the connections are gone");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "served after {:?}",
        started.elapsed()
    );
    let exhausted = gateway.lines_with("Too many open files");
    assert!(
        exhausted.is_empty(),
        "{} lines: {exhausted:?}",
        exhausted.len()
    );
}
