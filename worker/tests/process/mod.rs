//! The worker binary as a child process, for the test binaries that signal or kill it
//! (`mod process;` in recovery.rs, shutdown.rs and memory.rs).

use std::io::{Read, Seek, SeekFrom};
use std::process::{Child, Command};

use embatch_testkit::{NatsServer, TeiDouble};

/// The end of a worker's log shown when a test fails: enough for the last minutes of
/// warnings and membership changes, bounded for a chatty one.
const LOG_TAIL_BYTES: u64 = 16 << 10;

/// A worker process, killed (SIGKILL) and reaped when dropped, and the file its log goes to.
/// When the test is failing (the drop comes from a panic), the log's last 16 KiB are printed
/// with the test's output: the worker's own view of what went wrong.
pub struct Worker(pub Child, std::fs::File);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        if std::thread::panicking() {
            // Bytes, read lossily: the cut may fall inside a character.
            let mut tail = Vec::new();
            let len = self.1.metadata().map_or(0, |m| m.len());
            let from = len.saturating_sub(LOG_TAIL_BYTES);
            if self.1.seek(SeekFrom::Start(from)).is_ok() {
                let _ = self.1.read_to_end(&mut tail);
            }
            eprintln!(
                "--- worker {} log, last {} bytes ---\n{}",
                self.0.id(),
                len - from,
                String::from_utf8_lossy(&tail)
            );
        }
    }
}

/// Starts the worker binary on `nats` and `tei` with `env` settings (its log, stdout and
/// stderr, at `info` for embatch's crates and `warn` for the rest unless `env` sets `RUST_LOG`,
/// into a temporary file shown if the test fails), and waits until `expected` workers (this one
/// included) answer a NATS micro ping on `client`.
///
/// # Panics
/// When the binary does not start or the workers are not ready (the worker is killed first).
pub async fn spawn_worker(
    nats: &NatsServer,
    tei: &TeiDouble,
    env: &[(&str, &str)],
    client: &async_nats::Client,
    expected: usize,
) -> Worker {
    let log = tempfile::tempfile().expect("a temporary file for the worker's log");
    // The worker logs to stdout; both streams go to the file.
    let handle = || log.try_clone().expect("the log file's handle");
    let worker = Worker(
        Command::new(env!("CARGO_BIN_EXE_embatch-worker"))
            .env("NATS_URL", nats.url())
            .env("TEI_URL", &tei.url)
            .env("METRICS_ADDR", "")
            .env("RUST_LOG", "warn,embatch=info")
            .envs(env.iter().copied())
            .stdout(handle())
            .stderr(handle())
            .spawn()
            .expect("worker binary starts"),
        log,
    );
    assert!(
        embatch_testkit::wait_for_workers(client, expected).await,
        "worker never became ready"
    );
    worker
}
