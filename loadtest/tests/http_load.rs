//! Integration: a short closed-loop load through the HTTP target against the fake upstream.

use std::time::Duration;

use clap::Parser;
use embatch_loadtest::cli::{Cli, Command};
use embatch_loadtest::run;
use embatch_tei_double::{Config, TeiDouble};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_against_the_fake_upstream() {
    let upstream = TeiDouble::spawn(Config {
        base: Duration::from_millis(1),
        per_input: Duration::from_micros(10),
        concurrency: 4,
        dim: 32,
        ..Config::default()
    })
    .await
    .expect("spawn the TEI double");

    let url = upstream.embed_url();
    let cli = Cli::try_parse_from([
        "embatch-loadtest",
        "run",
        "--url",
        &url,
        "--concurrency",
        "8",
        "--requests",
        "200",
        "--inputs-per-request",
        "2",
        "--timeout",
        "5s",
        "--quiet",
    ])
    .expect("valid arguments");
    let Command::Run(args) = cli.command else {
        panic!("run subcommand");
    };
    let config = args.into_config().expect("valid config");
    let report = run::run(&config).await.expect("run completes");

    assert_eq!(report.requests.sent, 200, "{report}");
    assert_eq!(report.requests.succeeded, 200, "{report}");
    assert_eq!(report.requests.failed, 0, "{report}");
    assert!(report.failures.is_empty(), "{report}");
    let latency = report.latency.as_ref().expect("latency of successes");
    assert_eq!(latency.count, 200);
    assert!(
        latency.p50_ms >= 1.0,
        "each call costs at least 1 ms: {report}"
    );
    assert!(latency.p50_ms <= latency.p99_ms && latency.p99_ms <= latency.max_ms);
    assert!(report.error_latency.is_none());
    assert!(report.goodput.requests_per_s > 0.0);
    assert!(
        (report.goodput.inputs_per_s - 2.0 * report.goodput.requests_per_s).abs() < 1e-6,
        "{report}"
    );

    // The upstream saw exactly the measured requests (no warm-up), 2 inputs each.
    let calls = upstream.calls();
    assert_eq!(calls.len(), 200);
    assert!(calls.iter().all(|c| c.inputs.len() == 2 && c.status == 200));

    let json = serde_json::to_value(&report).expect("serializes");
    assert_eq!(json["requests"]["succeeded"], 200);
    assert_eq!(json["run"]["load_model"], "closed");
}
