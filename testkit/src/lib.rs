//! Test support shared by embatch's test suites (a dev-dependency only).
//!
//! - [`NatsServer`]: a real `nats-server` process on a free loopback port, stopped on drop
//!   ([`NatsServer::start_jetstream`]: with JetStream on a temporary store).
//! - [`NatsCluster`]: three of them forming a cluster from `nats/cluster/*.conf` ([`cluster`]).
//! - [`Supercluster`]: two one-server regions joined by NATS gateways, from
//!   `nats/regions/region-{a,b}.conf`, and an edge site's leaf node of region A ([`regions`]).
//! - [`TeiDouble`]: the workspace's TEI double ([`embatch_tei_double`], re-exported), started
//!   with [`start_tei`]; it records every call and can be told to fail ([`Faults`]).
//! - [`model_dir`] / [`testdata`]: where the real model and the reference data live.
//!
//! Finding `nats-server`: `$NATS_SERVER_BIN`, then `<repo>/.bin/nats-server` (what
//! `scripts/install-nats-server.sh` installs), then `$HOME/go/bin/nats-server`, then `PATH`.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

pub mod cluster;
pub mod pki;
pub mod regions;
mod tei;
pub use cluster::{MetaGroup, MetaPeer, NatsCluster};
pub use embatch_tei_double::{Config as TeiConfig, Faults, POISON, TeiDouble, embedding_of};
pub use pki::{Pki, TlsProxy};
pub use regions::{Region, Supercluster};
pub use tei::{ONE_CALL_AT_A_TIME, start_slow_tei, start_tei};

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

/// `toml` as a tenants file (`TENANTS_FILE`) in a temporary directory, kept while the returned
/// guard lives; and the file's path.
///
/// # Panics
/// When the directory or the file cannot be written.
pub fn tenants_file(toml: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tenants.toml");
    std::fs::write(&path, toml).expect("write the tenants file");
    (dir, path.to_string_lossy().into_owned())
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
    /// The extra command-line arguments it was started with (kept for [`NatsServer::restart`]).
    args: Vec<String>,
    /// The server's own temporary directory, removed on drop (a restart keeps it, as a server
    /// restarted on its volume would): the JetStream store of [`NatsServer::start_jetstream`],
    /// the config file of [`NatsServer::start_with_max_payload`].
    dir: Option<TempDir>,
}

impl NatsServer {
    /// Starts `nats-server` on a free port and waits until it accepts connections.
    pub fn start() -> NatsServer {
        NatsServer::start_with_args(&[])
    }

    /// Starts `nats-server` on a free port with extra command-line arguments.
    pub fn start_with_args(args: &[&str]) -> NatsServer {
        // A free port can be taken by another test between `free_port` and the server's bind:
        // the port then answers, but not this server, which has exited. Try another port.
        for _ in 0..5 {
            let port = free_port();
            let mut child = spawn_server(port, args);
            match child.try_wait() {
                Ok(None) => {
                    return NatsServer {
                        child,
                        port,
                        args: args.iter().map(|a| (*a).to_owned()).collect(),
                        dir: None,
                    };
                }
                _ => continue, // it exited: the port was someone else's
            }
        }
        panic!("nats-server did not stay up on any of 5 free ports");
    }

    /// Starts `nats-server -js` on a free port with its JetStream store in a fresh temporary
    /// directory (`-sd`), removed when the server is dropped.
    pub fn start_jetstream() -> NatsServer {
        let store = tempfile::tempdir().expect("a temporary JetStream store directory");
        let dir = store.path().to_string_lossy().into_owned();
        let mut server = NatsServer::start_with_args(&["-js", "-sd", &dir]);
        server.dir = Some(store);
        server
    }

    /// Starts `nats-server` on a free port with `max_payload` (a size as its config file takes
    /// it: `4096` bytes, `8MB`), from a config file in a temporary directory removed when the
    /// server is dropped.
    pub fn start_with_max_payload(max_payload: &str) -> NatsServer {
        NatsServer::start_with_config(&format!("max_payload: {max_payload}\n"))
    }

    /// Starts `nats-server` on a free port with `config` (lines of its config file, such as
    /// `max_pending: 256MB`) written to a config file in a temporary directory removed when the
    /// server is dropped.
    pub fn start_with_config(config: &str) -> NatsServer {
        let dir = tempfile::tempdir().expect("a temporary config directory");
        let conf = dir.path().join("nats.conf");
        std::fs::write(&conf, config).expect("writes the config");
        let mut server = NatsServer::start_with_args(&["-c", &conf.to_string_lossy()]);
        server.dir = Some(dir);
        server
    }

    /// Kills the server (as a crash would), waits `down`, and starts it again on the same port
    /// with the same arguments (a fresh process: no subscriptions, no messages in flight).
    /// Blocking: call it from `spawn_blocking` while clients run.
    ///
    /// # Panics
    /// When the new process does not stay up (the port was taken meanwhile).
    pub fn restart(&mut self, down: Duration) {
        self.kill();
        std::thread::sleep(down);
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let mut child = spawn_server(self.port, &args);
        assert!(
            matches!(child.try_wait(), Ok(None)),
            "nats-server did not come back on port {}",
            self.port
        );
        self.child = child;
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

/// Starts `nats-server` on 127.0.0.1:`port` with `args` and waits until the port answers (and
/// 50 ms more, so a process that lost the port to another has exited).
fn spawn_server(port: u16, args: &[&str]) -> Child {
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
    std::thread::sleep(Duration::from_millis(50));
    child
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The vector a [`TeiDouble`] started with [`TeiConfig::instant`] answers for `text` with default
/// options (normalized, full dimension): what a test expects back for that input.
pub fn double_vector(text: &str) -> Vec<f32> {
    embatch_tei_double::embedding(text, TeiConfig::instant().dim, None, true)
}

/// The cosine similarity of `a` and `b` (of one length), summed in f64 so that a test's
/// tolerance is about the vectors, not the sum's rounding; NaN when either is a zero vector.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    (dot / (norm(a) * norm(b))) as f32
}

/// Bad request bodies that every entry point (gateway HTTP, direct NATS) refuses before any
/// upstream work, with a limit of 3 inputs per request: `(body, status, error_type, a part of
/// the message)`. Statuses and bodies follow TEI 1.9.3.
pub const BAD_REQUESTS: &[(&str, u16, &str, &str)] = &[
    (
        "{oops",
        400,
        "Validation",
        "Failed to parse the request body as JSON",
    ),
    (r#"{"inputs":[]}"#, 400, "Empty", "`inputs` cannot be empty"),
    (
        r#"{"inputs":[1,"a"]}"#,
        422,
        "Validation",
        "cannot mix numbers",
    ),
    (r#"{"inputs":["a",[]]}"#, 400, "Empty", "input 1 is empty"),
    (r#"{"inputs":[-1]}"#, 422, "Validation", "`inputs[0]`"),
    (
        r#"{"inputs":"a","truncate":"no"}"#,
        422,
        "Validation",
        "`truncate`",
    ),
    (
        r#"{"inputs":"a","normalize":"yes"}"#,
        422,
        "Validation",
        "`normalize`",
    ),
    (
        r#"{"inputs":"a","dimensions":0}"#,
        422,
        "Validation",
        "`dimensions`",
    ),
    (
        r#"{"normalize":true}"#,
        422,
        "Validation",
        "missing field `inputs`",
    ),
    (
        r#"{"inputs":["a","b","c","d"]}"#,
        422,
        "Validation",
        "at most 3 elements. Given: 4",
    ),
    (r#"{"inputs":["a",""]}"#, 400, "Empty", "input 1 is empty"),
    (r#"["a"]"#, 422, "Validation", "JSON object"),
];

/// Bodies that are not JSON at all, which TEI 1.9.3 (axum's `Json` extractor) answers 400 "Failed
/// to parse the request body as JSON: ..." and every entry point of embatch answers 400
/// `Validation` with that message: empty, whitespace only, truncated, not JSON, a UTF-8
/// byte-order mark, single quotes, invalid UTF-8, a raw control character in a string, trailing
/// characters.
pub const MALFORMED_JSON: &[&[u8]] = &[
    b"",
    b"  \n",
    br#"{"inputs":["a","b"#,
    b"inputs=hello",
    b"\xEF\xBB\xBF{\"inputs\":\"a\"}",
    b"{'inputs':'a'}",
    b"{\"inputs\":\"caf\xE9\"}",
    b"{\"inputs\":\"tab\there\"}",
    b"{\"inputs\":\"line\nbreak\"}",
    br#"{"inputs":"a"}}"#,
];

/// The status, `error_type` and a part of the message every entry point answers each body of
/// [`MALFORMED_JSON`] with.
pub const MALFORMED_JSON_ANSWER: (u16, &str, &str) = (
    400,
    "Validation",
    "Failed to parse the request body as JSON: ",
);

/// A real nats-server, the TEI double and an in-process worker on both: where most tests start.
pub struct Stack {
    /// The server; stopped when the stack is dropped.
    pub nats: NatsServer,
    /// The worker's upstream.
    pub tei: TeiDouble,
    /// The worker (`--tei-url` set to the double, then the caller's arguments).
    pub worker: RunningWorker,
}

impl Stack {
    /// Starts the three: the double as `tei`, the worker with `worker_args` after `--tei-url`.
    pub async fn start(tei: TeiConfig, worker_args: &[&str]) -> Stack {
        let nats = NatsServer::start();
        let tei = start_tei(tei).await;
        let mut argv = vec!["--tei-url", tei.url.as_str()];
        argv.extend(worker_args);
        let worker = RunningWorker::start(&nats, &argv).await;
        Stack { nats, tei, worker }
    }
}

/// An embatch worker running inside the test process until [`RunningWorker::stop`].
pub struct RunningWorker {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningWorker {
    /// Starts a worker on `nats` with the command-line `args` (as `embatch-worker` takes them;
    /// `--nats-url` is added, and `--metrics-addr ""` unless `args` set it: the metrics recorder
    /// is one per process), and waits until it answers NATS micro
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
        let mut argv = vec!["embatch-worker", "--nats-url", url];
        if !args.contains(&"--metrics-addr") {
            argv.extend(["--metrics-addr", ""]);
        }
        argv.extend(args);
        let config = embatch_worker::Config::parse_from(argv);
        let probe_nats = config.nats.clone();
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
        // The probe connects as the worker does (same servers, credentials and TLS settings).
        let probe = probe_nats
            .connect("embatch-testkit-probe", async_nats::ConnectOptions::new())
            .await
            .expect("probe connects");
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

/// How many workers answer a NATS micro ping (`$SRV.PING.embatch`) within 200 ms of each other.
pub async fn workers_answering(client: &async_nats::Client) -> usize {
    use futures::StreamExt;
    let inbox = client.new_inbox();
    let Ok(mut replies) = client.subscribe(inbox.clone()).await else {
        return 0;
    };
    if client
        .publish_with_reply("$SRV.PING.embatch", inbox, bytes::Bytes::new())
        .await
        .is_err()
    {
        return 0;
    }
    let mut count = 0;
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(200), replies.next()).await {
        count += 1;
    }
    count
}

/// Pings up to 50 times (at least 10 s) until `expected` workers or more answer
/// ([`workers_answering`]); `false` when they never did.
pub async fn wait_for_workers(client: &async_nats::Client, expected: usize) -> bool {
    for _ in 0..50 {
        if workers_answering(client).await >= expected {
            return true;
        }
    }
    false
}
