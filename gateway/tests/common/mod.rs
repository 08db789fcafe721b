//! Starts a gateway on a free port in the test process.

use std::time::Duration;

use embatch_gateway::AppState;
use embatch_testkit::NatsServer;

/// A gateway serving until the test ends; `url` is `http://127.0.0.1:PORT`.
pub struct RunningGateway {
    pub url: String,
    _task: tokio::task::JoinHandle<()>,
}

pub async fn start_gateway(
    nats: &NatsServer,
    max_body_bytes: usize,
    max_client_batch_size: usize,
) -> RunningGateway {
    let client = async_nats::connect(nats.url())
        .await
        .expect("gateway connects");
    let state = AppState {
        client,
        subject: embatch_protocol::DEFAULT_SUBJECT.to_string(),
        request_timeout: Duration::from_secs(30),
        max_client_batch_size,
        max_body_bytes,
        health_timeout: Duration::from_millis(500),
        metrics: None,
    };
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
