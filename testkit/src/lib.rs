//! Test support shared by embatch's test suites (a dev-dependency only).
//!
//! - [`NatsServer`]: a real `nats-server` process on a free loopback port, stopped on drop.
//! - [`NatsCluster`]: three of them forming a cluster from `nats/cluster/*.conf` ([`cluster`]).
//! - [`TeiDouble`]: an in-process HTTP test double of text-embeddings-inference's `/embed` and
//!   `/info` that records every call and can be told to fail.
//! - [`model_dir`] / [`testdata`]: where the real model and the reference data live.
//!
//! Finding `nats-server`: `$NATS_SERVER_BIN`, then `<repo>/.bin/nats-server` (what
//! `scripts/install-nats-server.sh` installs), then `$HOME/go/bin/nats-server`, then `PATH`.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

pub mod cluster;
pub use cluster::NatsCluster;

/// The repository root (this crate lives in `<repo>/testkit`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// `<repo>/testdata`: reference inputs and embeddings from a real TEI server (see its README).
pub fn testdata() -> PathBuf {
    repo_root().join("testdata")
}

/// The built-in model's directory: `$EMBATCH_MODEL_DIR`, else `<repo>/models/all-MiniLM-L6-v2`.
///
/// # Panics
/// When the directory holds no `model.safetensors`: run `scripts/fetch-model.sh` first.
pub fn model_dir() -> PathBuf {
    let dir = std::env::var_os("EMBATCH_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("models").join("all-MiniLM-L6-v2"));
    assert!(
        dir.join("model.safetensors").is_file(),
        "no model at {}: run scripts/fetch-model.sh (or set EMBATCH_MODEL_DIR)",
        dir.display()
    );
    dir
}

/// Path of the `nats-server` binary (see the crate docs for the search order).
///
/// # Panics
/// When none is found: run `scripts/install-nats-server.sh`.
pub fn nats_server_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("NATS_SERVER_BIN") {
        return PathBuf::from(bin);
    }
    let mut candidates = vec![repo_root().join(".bin").join("nats-server")];
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(
            PathBuf::from(home)
                .join("go")
                .join("bin")
                .join("nats-server"),
        );
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|p| p.join("nats-server")));
    }
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "nats-server not found: run scripts/install-nats-server.sh or set NATS_SERVER_BIN"
            )
        })
}

/// A free TCP port on 127.0.0.1 (bound and released; good enough for tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Waits until something accepts TCP connections on `addr`.
///
/// # Panics
/// After `timeout`.
pub fn wait_for_port(addr: SocketAddr, timeout: Duration) {
    let started = Instant::now();
    while TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
        assert!(
            started.elapsed() < timeout,
            "nothing listens on {addr} after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A real `nats-server` process, killed when dropped.
pub struct NatsServer {
    child: Child,
    /// Client port on 127.0.0.1.
    pub port: u16,
}

impl NatsServer {
    /// Starts `nats-server` on a free port and waits until it accepts connections.
    pub fn start() -> NatsServer {
        NatsServer::start_with_args(&[])
    }

    /// Starts `nats-server` on a free port with extra command-line arguments.
    pub fn start_with_args(args: &[&str]) -> NatsServer {
        let port = free_port();
        let child = Command::new(nats_server_bin())
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server starts");
        wait_for_port(
            SocketAddr::from(([127, 0, 0, 1], port)),
            Duration::from_secs(10),
        );
        NatsServer { child, port }
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Kills the server now (as a crash would).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One call the [`TeiDouble`] received on `/embed`.
#[derive(Debug, Clone)]
pub struct RecordedCall {
    /// The inputs of the call, in order.
    pub inputs: Vec<String>,
    /// The whole JSON body (inputs and options).
    pub body: Value,
    /// When the double received the call.
    pub at: std::time::Instant,
    /// The `Authorization` header, if any.
    pub authorization: Option<String>,
}

/// How the [`TeiDouble`] answers `/embed`.
#[derive(Debug, Clone)]
pub struct Behaviour {
    /// Added to every call (tokio time: paused clocks apply).
    pub delay: Duration,
    /// `Some(code)`: answer every call with this status and a TEI error body.
    pub fail_with: Option<u16>,
    /// Reported by `/info`; calls with more inputs get 413, as TEI does.
    pub max_client_batch_size: usize,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            delay: Duration::ZERO,
            fail_with: None,
            max_client_batch_size: 512,
        }
    }
}

/// Inputs containing this marker are rejected by the [`TeiDouble`] with 422, like an input TEI
/// cannot process.
pub const POISON: &str = "__poison__";

/// Dimension of the [`TeiDouble`]'s vectors.
pub const DOUBLE_DIM: usize = 4;

/// The vector the [`TeiDouble`] returns for `text`: deterministic, different for different texts,
/// so a test can check that every caller got its own input's vector.
pub fn double_vector(text: &str) -> Vec<f32> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (0..DOUBLE_DIM)
        .map(|i| ((h >> (i * 16)) & 0xffff) as f32 / 65536.0)
        .collect()
}

#[derive(Clone)]
struct DoubleState {
    calls: Arc<Mutex<Vec<RecordedCall>>>,
    behaviour: Arc<Mutex<Behaviour>>,
}

/// An HTTP test double of TEI on a free loopback port, serving until dropped.
pub struct TeiDouble {
    /// Base URL, e.g. `http://127.0.0.1:PORT`.
    pub url: String,
    state: DoubleState,
    task: tokio::task::JoinHandle<()>,
}

impl TeiDouble {
    /// Starts the double with `behaviour` (needs a tokio runtime).
    pub async fn start(behaviour: Behaviour) -> TeiDouble {
        let state = DoubleState {
            calls: Arc::default(),
            behaviour: Arc::new(Mutex::new(behaviour)),
        };
        let app = Router::new()
            .route("/embed", post(embed))
            .route("/info", get(info))
            .route("/health", get(|| async { StatusCode::OK }))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the TEI double");
        let url = format!("http://{}", listener.local_addr().expect("local addr"));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        TeiDouble { url, state, task }
    }

    /// Every `/embed` call so far, in arrival order.
    pub fn calls(&self) -> Vec<RecordedCall> {
        self.state.calls.lock().expect("calls lock").clone()
    }

    /// Changes how later calls are answered.
    pub fn set_behaviour(&self, behaviour: Behaviour) {
        *self.state.behaviour.lock().expect("behaviour lock") = behaviour;
    }
}

impl Drop for TeiDouble {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn info(State(state): State<DoubleState>) -> Json<Value> {
    let max = state
        .behaviour
        .lock()
        .expect("behaviour lock")
        .max_client_batch_size;
    Json(json!({"model_id": "tei-double", "max_client_batch_size": max, "max_input_length": 256}))
}

async fn embed(
    State(state): State<DoubleState>,
    headers: axum::http::HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let inputs: Vec<String> = match &body["inputs"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    };
    let behaviour = state.behaviour.lock().expect("behaviour lock").clone();
    state.calls.lock().expect("calls lock").push(RecordedCall {
        authorization: headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        inputs: inputs.clone(),
        body: body.clone(),
        at: std::time::Instant::now(),
    });
    tokio::time::sleep(behaviour.delay).await;
    let error = |code: u16, message: &str, kind: &str| {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(json!({"error": message, "error_type": kind}))).into_response()
    };
    if let Some(code) = behaviour.fail_with {
        return error(code, "injected failure", "Backend");
    }
    if inputs.len() > behaviour.max_client_batch_size {
        return error(413, "batch too large", "Validation");
    }
    if inputs.iter().any(|i| i.contains(POISON)) {
        return error(422, "poisoned input", "Validation");
    }
    Json(inputs.iter().map(|i| double_vector(i)).collect::<Vec<_>>()).into_response()
}

/// An embatch worker running inside the test process until [`RunningWorker::stop`].
pub struct RunningWorker {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningWorker {
    /// Starts a worker on `nats` with the command-line `args` (as `embatch-worker` takes them;
    /// `--nats-url` and `--metrics-addr ""` are added), and waits until it answers NATS micro
    /// pings, so requests cannot race its subscription. The upstream is TEI when `--tei-url` is
    /// among `args`, else the built-in model from `--model-dir`.
    pub async fn start(nats: &NatsServer, args: &[&str]) -> RunningWorker {
        RunningWorker::start_at(&nats.url(), args).await
    }

    /// As [`RunningWorker::start`], on the NATS server(s) at `url`: one URL or a comma-separated
    /// list, as `--nats-url` takes it (e.g. [`NatsCluster::urls_preferring`]). With several
    /// workers on a cluster, "answers a ping" may be another worker's answer: wait for the
    /// interest to reach the publisher's node too ([`NatsCluster::remote_interest`]).
    pub async fn start_at(url: &str, args: &[&str]) -> RunningWorker {
        use clap::Parser;
        let mut argv = vec!["embatch-worker", "--nats-url", url, "--metrics-addr", ""];
        argv.extend(args);
        let config = embatch_worker::Config::parse_from(argv);
        let client = embatch_worker::connect(&config)
            .await
            .expect("worker connects");
        let upstream = embatch_worker::build_upstream(&config)
            .await
            .expect("upstream ready");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            embatch_worker::run(client, upstream, &config, async {
                let _ = stopped.await;
            })
            .await
            .expect("worker runs");
        });
        let servers: Vec<&str> = url.split(',').map(str::trim).collect();
        let probe = async_nats::connect(servers).await.expect("probe connects");
        let mut ready = false;
        for _ in 0..200 {
            if probe
                .request("$SRV.PING.embatch", bytes::Bytes::new())
                .await
                .is_ok()
            {
                ready = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(ready, "worker never answered a ping");
        RunningWorker {
            stop: Some(stop),
            task,
        }
    }

    /// Stops the worker gracefully and waits for it (at most 10 s).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .expect("worker stops in time")
            .expect("worker task");
    }
}
