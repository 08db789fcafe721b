//! The worker binary as a child process, for the test binaries that signal or kill it
//! (`mod process;` in recovery.rs and shutdown.rs).

use std::process::{Child, Command, Stdio};

use embatch_testkit::{NatsServer, TeiDouble};

/// A worker process, killed (SIGKILL) and reaped when dropped.
pub struct Worker(pub Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the worker binary on `nats` and `tei` with `env` settings (stdout and stderr
/// discarded, `RUST_LOG=warn`), and waits until `expected` workers (this one included) answer a
/// NATS micro ping on `client`.
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
    let worker = Worker(
        Command::new(env!("CARGO_BIN_EXE_embatch-worker"))
            .env("NATS_URL", nats.url())
            .env("TEI_URL", &tei.url)
            .env("METRICS_ADDR", "")
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("worker binary starts"),
    );
    assert!(
        embatch_testkit::wait_for_workers(client, expected).await,
        "worker never became ready"
    );
    worker
}
