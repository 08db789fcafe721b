//! Interactive load through the gateway: one `POST /embed` every [`PERIOD`], each with its own
//! deadline, from start until stopped; every outcome is kept.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// A request is sent every `PERIOD` (100 per second).
pub const PERIOD: Duration = Duration::from_millis(10);

/// Each request's deadline (`x-embatch-timeout-ms`): the gateway answers 504 when it passes.
pub const DEADLINE: Duration = Duration::from_secs(2);

/// One request: when it was sent and answered, and how (`None`: no HTTP response).
pub struct Outcome {
    pub index: usize,
    pub sent: Instant,
    pub done: Instant,
    pub status: Option<u16>,
}

/// The load while it runs.
pub struct Load {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Vec<Outcome>>,
}

impl Load {
    /// Starts sending to the gateway at `url`.
    pub fn start(url: &str) -> Load {
        let http = reqwest::Client::builder()
            .timeout(DEADLINE * 3)
            .build()
            .expect("HTTP client");
        let url: Arc<str> = Arc::from(url);
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(http, url, stop.clone()));
        Load { stop, task }
    }

    /// Stops sending and waits for every request's answer.
    pub async fn finish(self) -> Vec<Outcome> {
        self.stop.cancel();
        self.task.await.expect("load task")
    }
}

async fn run(http: reqwest::Client, url: Arc<str>, stop: CancellationToken) -> Vec<Outcome> {
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = Vec::new();
    for index in 0.. {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        tasks.push(tokio::spawn(send(http.clone(), Arc::clone(&url), index)));
    }
    let mut outcomes = Vec::with_capacity(tasks.len());
    for task in tasks {
        outcomes.push(task.await.expect("request task"));
    }
    outcomes
}

async fn send(http: reqwest::Client, url: Arc<str>, index: usize) -> Outcome {
    let sent = Instant::now();
    let status =
        crate::common::embed_status(http, &url, format!("interactive {index}"), DEADLINE).await;
    Outcome {
        index,
        sent,
        done: Instant::now(),
        status,
    }
}

/// What a load's outcomes add up to.
pub struct Summary {
    pub sent: usize,
    pub failed: usize,
    pub by_status: BTreeMap<String, usize>,
    pub slowest: Duration,
}

impl Summary {
    pub fn of(outcomes: &[Outcome]) -> Summary {
        let mut by_status = BTreeMap::new();
        let mut failed = 0;
        for outcome in outcomes {
            let key = outcome
                .status
                .map_or_else(|| "no response".to_owned(), |s| s.to_string());
            *by_status.entry(key).or_default() += 1;
            failed += usize::from(outcome.status != Some(200));
        }
        Summary {
            sent: outcomes.len(),
            failed,
            by_status,
            slowest: outcomes
                .iter()
                .map(|o| o.done - o.sent)
                .max()
                .unwrap_or_default(),
        }
    }
}
