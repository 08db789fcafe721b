//! The admin HTTP server (`/metrics`, `/health`) is one of the worker's tasks: it serves while
//! the worker runs and is shut down with it (its listener closed), rather than outliving it.
//! One test in this binary: it installs the process's metrics recorder.

use std::net::SocketAddr;

use embatch_testkit::{NatsServer, RunningWorker, TeiConfig, free_port, start_tei};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_server_serves_while_the_worker_runs_and_stops_with_it() {
    let nats = NatsServer::start();
    let tei = start_tei(TeiConfig::instant()).await;
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let admin = addr.to_string();
    let worker =
        RunningWorker::start(&nats, &["--tei-url", &tei.url, "--metrics-addr", &admin]).await;

    let http = reqwest::Client::new();
    let get = |path: &str| http.get(format!("http://{addr}{path}")).send();
    let health = get("/health").await.expect("/health answers");
    assert_eq!(
        health.status().as_u16(),
        200,
        "/health while the worker runs"
    );
    let metrics = get("/metrics")
        .await
        .expect("/metrics answers")
        .text()
        .await
        .expect("a text body");
    assert!(
        metrics.contains("embatch_worker_requests_shed_total"),
        "{metrics}"
    );

    // Waits for the worker's `run` to return (at most 10 s; the admin server may take 5).
    worker.stop().await;
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the admin server's listener is closed once the worker returned"
    );
}
