//! Starts a gateway on a free port in the test process.

use std::time::Duration;

pub mod bulk_api;
pub mod checks;
pub mod tei_routes;

use clap::Parser;
use embatch_gateway::{AppState, Config};
use embatch_testkit::{NatsServer, Stack, TeiConfig};
use metrics_exporter_prometheus::PrometheusHandle;

/// A gateway serving until the test ends; `url` is `http://127.0.0.1:PORT`.
pub struct RunningGateway {
    pub url: String,
    _task: tokio::task::JoinHandle<()>,
}

impl RunningGateway {
    /// Stops the gateway at once (its task and listener are dropped, as a crash would).
    #[allow(dead_code)] // not every test binary uses every helper
    pub async fn kill(self) {
        self._task.abort();
        let _ = self._task.await;
    }
}

/// A gateway on `nats` with the given body and input limits and `--health-timeout 500ms`.
#[allow(dead_code)] // not every test binary uses every helper
pub async fn start_gateway(
    nats: &NatsServer,
    max_body_bytes: usize,
    max_client_batch_size: usize,
) -> RunningGateway {
    let body = max_body_bytes.to_string();
    let inputs = max_client_batch_size.to_string();
    let args = [
        "--max-body-bytes",
        body.as_str(),
        "--max-client-batch-size",
        inputs.as_str(),
        "--health-timeout",
        "500ms",
    ];
    start_gateway_at(&nats.url(), &args, None).await
}

/// A [`Stack`] (the worker started with `worker_args`) and a gateway on its server, as
/// [`start_gateway`] starts it.
#[allow(dead_code)] // not every test binary uses every helper
pub async fn stack_with_gateway(
    tei: TeiConfig,
    worker_args: &[&str],
    max_body_bytes: usize,
    max_client_batch_size: usize,
) -> (Stack, RunningGateway) {
    let stack = Stack::start(tei, worker_args).await;
    let gateway = start_gateway(&stack.nats, max_body_bytes, max_client_batch_size).await;
    (stack, gateway)
}

/// The TEI double answering every call after `base` (otherwise [`TeiConfig::instant`]).
#[allow(dead_code)] // not every test binary uses every helper
pub fn tei_taking(base: Duration) -> TeiConfig {
    TeiConfig {
        base,
        ..TeiConfig::instant()
    }
}

/// `POST {url}` with the JSON `body` (`content-type: application/json`), ready to send.
#[allow(dead_code)] // not every test binary uses every helper
pub fn json_post(
    http: &reqwest::Client,
    url: &str,
    body: impl Into<reqwest::Body>,
) -> reqwest::RequestBuilder {
    http.post(url)
        .header("content-type", "application/json")
        .body(body)
}

/// Asserts that `body` is TEI's error body of type `error_type` with `needle` in its message.
#[allow(dead_code)] // not every test binary uses every helper
pub fn assert_tei_error(body: &serde_json::Value, error_type: &str, needle: &str) {
    assert_eq!(body["error_type"], error_type, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|m| m.contains(needle)),
        "{body}: the message lacks {needle:?}"
    );
}

/// A gateway on `nats_url` (a comma-separated list), configured by `args` as `embatch-gateway`
/// takes them, connected through the gateway's own `connect`.
#[allow(dead_code)] // not every test binary uses every helper
pub async fn start_gateway_at(
    nats_url: &str,
    args: &[&str],
    metrics: Option<PrometheusHandle>,
) -> RunningGateway {
    let mut argv = vec!["embatch-gateway", "--nats-url", nats_url];
    argv.extend(args);
    let config = Config::parse_from(argv);
    let client = embatch_gateway::connect(&config)
        .await
        .expect("gateway connects");
    let mut state = AppState::new(client, &config, metrics);
    if config.tenants_file.is_some() {
        // Stopped with the test process.
        let stop = tokio_util::sync::CancellationToken::new();
        let tenants = embatch_runtime::tenants::watch(config.tenants_file.as_deref(), stop)
            .expect("the tenants file loads");
        state = state.with_tenants(tenants);
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let task = tokio::spawn(async move {
        embatch_gateway::serve(listener, state, std::future::pending())
            .await
            .expect("serves");
    });
    RunningGateway { url, _task: task }
}

/// Polls `done` every 10 ms until it holds, for at most 5 s.
///
/// # Panics
/// When it does not hold by then, naming `what`.
#[allow(dead_code)] // not every test binary uses every helper
pub async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}

/// What the server sent before it closed the connection, or `None` if it kept it open past
/// `limit`. A reset counts as closed: a server that closes with our request unread makes the
/// kernel answer with RST rather than FIN, depending on timing.
///
/// # Panics
/// On any other read error.
#[allow(dead_code)] // not every test binary uses every helper
pub async fn read_to_close(stream: &mut tokio::net::TcpStream, limit: Duration) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    match tokio::time::timeout(limit, stream.read_to_end(&mut out)).await {
        Ok(Ok(_)) => Some(out),
        Ok(Err(err)) if err.kind() == std::io::ErrorKind::ConnectionReset => Some(out),
        Ok(Err(err)) => panic!("reading the connection failed: {err}"),
        Err(_) => None,
    }
}

/// Sends `{"inputs": input}` to the gateway at `url`'s `/embed` with an `x-embatch-timeout-ms` of
/// `deadline`; the HTTP status once the body is read in full (a 200 counts only then), `None`
/// without a full response.
#[allow(dead_code)] // not every test binary uses every helper
pub async fn embed_status(
    http: reqwest::Client,
    url: &str,
    input: String,
    deadline: Duration,
) -> Option<u16> {
    let response = http
        .post(format!("{url}/embed"))
        .header("content-type", "application/json")
        .header(
            embatch_gateway::routes::TIMEOUT_HEADER,
            deadline.as_millis().to_string(),
        )
        .body(serde_json::json!({ "inputs": input }).to_string())
        .send()
        .await
        .ok()?;
    let status = response.status().as_u16();
    response.bytes().await.ok()?;
    Some(status)
}
