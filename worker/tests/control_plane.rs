//! The control plane over a real nats-server: a full worker asks its peers for room instead of
//! listening to them (it leaves while one has room, and rejoins when none has), and an idle
//! fleet publishes nothing at all (no heartbeats, no membership announcements).

mod common;

use std::time::Duration;

use embatch_client::{EmbedClient, RequestError};
use embatch_protocol::headers::membership;
use embatch_testkit::{
    Faults, NatsServer, ONE_CALL_AT_A_TIME, RunningWorker, TeiConfig, TeiDouble, start_slow_tei,
    start_tei,
};
use futures::StreamExt;

mod discovery;

use discovery::{connect, embed};

/// The `membership` of every worker answering `$SRV.INFO.embatch` within 200 ms, sorted.
async fn all_states(client: &async_nats::Client) -> Vec<String> {
    let mut states = discovery::states(client, usize::MAX, Duration::from_millis(200)).await;
    states.sort();
    states
}

fn flood(
    client: &EmbedClient,
    n: usize,
) -> Vec<tokio::task::JoinHandle<Result<u16, RequestError>>> {
    (0..n)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { embed(&client, &format!("flood {i}")).await })
        })
        .collect()
}

/// Polls [`states`] every 20 ms until `done` holds, for at most 5 s; the states then.
async fn wait_for(
    client: &async_nats::Client,
    done: impl Fn(&[String]) -> bool,
) -> Result<Vec<String>, Vec<String>> {
    let started = std::time::Instant::now();
    loop {
        let now = all_states(client).await;
        if done(&now) {
            return Ok(now);
        }
        if started.elapsed() > Duration::from_secs(5) {
            return Err(now);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_worker_stays_out_while_a_peer_has_room_and_rejoins_when_none_has() {
    let nats = NatsServer::start();
    // A: one input per call, one call at a time, 600 ms each: three queued requests put it over
    // its admission bound (2 × 600 ms + 1 ms of expected wait).
    let slow = start_tei(common::tei_taking(600, 1)).await;
    let mut slow_args = vec!["--tei-url", slow.url.as_str()];
    slow_args.extend(ONE_CALL_AT_A_TIME);
    let a = RunningWorker::start(&nats, &slow_args).await;
    let raw = connect(&nats).await;
    let client = EmbedClient::new(raw.clone(), "embed");
    assert_eq!(embed(&client, "measure").await, Ok(200));
    // Alone, A stays a member however full: no peer has room.
    for task in flood(&client, 6) {
        assert!(matches!(task.await.expect("task"), Ok(200 | 429)));
    }
    assert_eq!(all_states(&raw).await, [membership::JOINED]);
    // B: an instant upstream, and a queue bound (1 s) that a burst of 20 does not come near:
    // room to spare.
    let fast = start_tei(TeiConfig::instant()).await;
    let fast_args = ["--tei-url", fast.url.as_str(), "--max-queue-delay", "1s"];
    let b = RunningWorker::start(&nats, &fast_args).await;

    // From now on A cannot drain: its next upstream call takes 4.6 s (under the 6 s after which
    // its calls would count as stalled), and the burst below queues behind it. Whatever brings
    // it back before that is its peer's answer, not its own queue. (Set before the burst: set
    // after A left, the call then in flight could still end at 600 ms and take A back under
    // its bound, a room of its own.)
    slow.set_faults(Faults {
        delay: Duration::from_secs(4),
        ..Faults::default()
    });
    let tasks = flood(&client, 20);
    let full = |s: &[String]| s.iter().any(|s| s == membership::FULL);
    let seen = wait_for(&raw, full).await;
    assert!(seen.is_ok(), "A left the group for B: {seen:?}");
    let calls_when_stuck = slow.calls().len();
    // Out for longer than an answer counts: it asked again, and B still had room.
    // (Polled, not read once: on a loaded machine a room answer can miss its 100 ms, and A
    // comes back in until its next question finds B.)
    tokio::time::sleep(Duration::from_millis(700)).await;
    let now = wait_for(&raw, full).await;
    assert!(now.is_ok(), "A stays out while B has room: {now:?}");

    // B's upstream fails: two failed calls and it leaves, losing its room.
    fast.set_faults(Faults::failing_with(500));
    for i in 0..2 {
        assert_eq!(embed(&client, &format!("fails on b {i}")).await, Ok(424));
    }
    let rejoined =
        |s: &[String]| s == [membership::JOINED, membership::UPSTREAM_UNHEALTHY].map(str::to_owned);
    let seen = wait_for(&raw, rejoined).await;
    let calls_at_rejoin = slow.calls().len();
    assert!(seen.is_ok(), "A rejoined once no peer had room: {seen:?}");
    assert!(
        calls_at_rejoin <= calls_when_stuck + 1,
        "A rejoined without draining its queue: {calls_when_stuck} calls answered when it \
         got stuck (one more was in flight), {calls_at_rejoin} when it rejoined"
    );
    slow.set_faults(Faults::default());
    for task in tasks {
        let answer = task.await.expect("task");
        assert!(
            matches!(answer, Ok(200 | 429) | Err(RequestError::Saturated { .. })),
            "served, or shed with 429, never lost: {answer:?}"
        );
    }
    a.stop().await;
    b.stop().await;
}

/// Messages by subject.
type Counts = std::collections::BTreeMap<String, usize>;

/// Counts the messages on every subject (`>`), by subject, and the acknowledgements among them,
/// from [`Spy::start`] until [`Spy::stop`].
struct Spy {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<(Counts, usize)>,
}

impl Spy {
    async fn start(nats: &NatsServer) -> Spy {
        let spy = connect(nats).await;
        let mut all = spy.subscribe(">").await.expect("subscribe");
        spy.flush().await.expect("flush");
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _connection = spy;
            let (mut counts, mut acks) = (Counts::new(), 0);
            loop {
                let message = tokio::select! {
                    Some(message) = all.next() => message,
                    _ = &mut stopped => return (counts, acks),
                };
                let accepted_by = embatch_protocol::headers::ACCEPTED_BY;
                let headers = message.headers.as_ref();
                if message.payload.is_empty()
                    && headers.is_some_and(|h| h.get(accepted_by).is_some())
                {
                    acks += 1;
                }
                *counts.entry(message.subject.to_string()).or_insert(0) += 1;
            }
        });
        Spy { stop, task }
    }

    /// The messages by subject, and the acknowledgements.
    async fn stop(self) -> (Counts, usize) {
        let _ = self.stop.send(());
        self.task.await.expect("spy")
    }
}

/// Counts the messages on every subject (`>`) over `window`, by subject.
async fn messages_over(nats: &NatsServer, window: Duration) -> Counts {
    let spy = Spy::start(nats).await;
    tokio::time::sleep(window).await;
    spy.stop().await.0
}

/// Three workers of `tei`'s model, without cache or bulk lane.
async fn three_workers(nats: &NatsServer, tei: &TeiDouble) -> [RunningWorker; 3] {
    let args = [
        "--tei-url",
        tei.url.as_str(),
        "--bulk",
        "false",
        "--cache",
        "false",
    ];
    [
        RunningWorker::start(nats, &args).await,
        RunningWorker::start(nats, &args).await,
        RunningWorker::start(nats, &args).await,
    ]
}

/// The heartbeats among `counts` (messages by subject).
fn beats(counts: &Counts) -> usize {
    counts
        .iter()
        .filter(|(subject, _)| subject.ends_with(".alive"))
        .map(|(_, n)| n)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_fleet_publishes_nothing_and_a_busy_worker_beats() {
    let nats = NatsServer::start();
    let tei = start_slow_tei(Duration::from_millis(800)).await;
    let workers = three_workers(&nats, &tei).await;
    let client = EmbedClient::new(connect(&nats).await, "embed");

    // Busy: requests held for 800 ms each, acknowledged after 20 ms; the workers holding them
    // beat from 100 to 200 ms after the acknowledgement on.
    let tasks = flood(&client, 6);
    let busy = messages_over(&nats, Duration::from_millis(700)).await;
    for task in tasks {
        assert_eq!(task.await.expect("task"), Ok(200));
    }
    assert!(beats(&busy) > 0, "busy workers beat: {busy:?}");
    // Only to the client that waits (its own subject, `Embatch-Heartbeat-To`): not on the shared
    // `embed.alive`, nor on the model's subject.
    let to: Vec<&String> = busy.keys().filter(|s| s.ends_with(".alive")).collect();
    assert!(
        to.len() == 1 && to[0].starts_with("_INBOX."),
        "beats on the client's own subject only: {busy:?}"
    );

    // Idle: nothing at all, for two seconds.
    let idle = messages_over(&nats, Duration::from_secs(2)).await;
    assert!(idle.is_empty(), "an idle fleet published {idle:?}");
    for worker in workers {
        worker.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_answered_soon_after_their_acknowledgement_cost_no_beat() {
    let nats = NatsServer::start();
    // Held about 30 ms: acknowledged after 20 ms, answered 10 ms later, well within the
    // interval (a beat is due for a request still held 100 ms after its acknowledgement).
    let tei = start_slow_tei(Duration::from_millis(30)).await;
    let workers = three_workers(&nats, &tei).await;
    let client = EmbedClient::new(connect(&nats).await, "embed");
    let spy = Spy::start(&nats).await;
    for round in 0..5 {
        for task in flood(&client, 6) {
            assert_eq!(task.await.expect("task"), Ok(200), "round {round}");
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (counts, acks) = spy.stop().await;
    assert!(acks > 0, "the requests were acknowledged: {counts:?}");
    assert_eq!(beats(&counts), 0, "no beat: {counts:?}");
    for worker in workers {
        worker.stop().await;
    }
}
