//! The admin HTTP server (`/metrics`, `/health`) is one of the worker's tasks: it serves while
//! the worker runs and is shut down with it (its listener closed), rather than outliving it.
//! One test in this binary: it installs the process's metrics recorder.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use embatch_testkit::{NatsServer, TeiConfig, free_port, start_tei};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_server_serves_while_the_worker_runs_and_stops_with_it() {
    let nats = NatsServer::start();
    let tei = start_tei(TeiConfig::instant()).await;
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let config = embatch_worker::Config::parse_from([
        "embatch-worker",
        "--nats-url",
        &nats.url(),
        "--tei-url",
        &tei.url,
        "--metrics-addr",
        &addr.to_string(),
    ]);
    let client = embatch_worker::connect(&config)
        .await
        .expect("worker connects");
    let upstream = embatch_worker::build_upstream(&config)
        .await
        .expect("upstream ready");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(async move {
        embatch_worker::run(client, upstream, &config, async {
            let _ = stopped.await;
        })
        .await
    });

    let http = reqwest::Client::new();
    let health = format!("http://{addr}/health");
    let mut status = None;
    for _ in 0..100 {
        if let Ok(response) = http.get(&health).send().await {
            status = Some(response.status().as_u16());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status, Some(200), "/health while the worker runs");
    let metrics = http
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .expect("/metrics answers")
        .text()
        .await
        .expect("a text body");
    assert!(
        metrics.contains("embatch_worker_requests_shed_total"),
        "{metrics}"
    );

    stop.send(()).expect("the worker is running");
    tokio::time::timeout(Duration::from_secs(10), worker)
        .await
        .expect("the worker stops in time")
        .expect("worker task")
        .expect("the worker ran");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the admin server's listener is closed once the worker returned"
    );
}
