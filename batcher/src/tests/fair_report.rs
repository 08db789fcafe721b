//! The measurements of docs/design/fair-share.md, on paused time: a noisy neighbour against a
//! light tenant, tenant-blind and with the fair share, and two tenants over capacity at 2:1.
//! Ignored (a report, not a check):
//! `cargo test --release -p embatch-worker --lib fair_report -- --ignored --nocapture`.

use std::collections::HashMap;

use tokio::sync::Mutex;

use super::*;
use crate::Share;

/// A GPU-like upstream: one call at a time, 5 ms + 20 µs per input (loadtest's simulated GPU).
struct Serial {
    gpu: Mutex<()>,
}

impl Backend for Serial {
    async fn embed(
        &self,
        inputs: &[Input],
        _options: &EmbedOptions,
    ) -> Result<Vec<Embedding>, UpstreamError> {
        let _gpu = self.gpu.lock().await;
        let cost = Duration::from_millis(5) + Duration::from_micros(20) * inputs.len() as u32;
        tokio::time::sleep(cost).await;
        Ok(inputs
            .iter()
            .map(|_| Embedding::from_json("[0]".to_string()))
            .collect())
    }

    fn max_batch_size(&self) -> usize {
        usize::MAX
    }
}

/// Inputs per second the upstream serves in full 32-input calls.
const CAPACITY: f64 = 32.0 / 0.005_64;

/// What one tenant got.
#[derive(Debug, Default)]
struct Got {
    offered: usize,
    ok: usize,
    latencies: Vec<Duration>,
}

impl Got {
    fn percentile(&mut self, p: f64) -> Duration {
        self.latencies.sort();
        let at = ((self.latencies.len() as f64 * p).ceil() as usize).saturating_sub(1);
        self.latencies.get(at).copied().unwrap_or_default()
    }
}

/// Offers each `(name, share, rate in inputs/s)` open-loop, one-input requests with a 1 s
/// deadline, for `seconds`, on the worker's default batcher settings; what each got, by name.
async fn run(load: &[(&str, Share, f64)], seconds: u64) -> HashMap<String, Got> {
    let upstream = Arc::new(Serial {
        gpu: Mutex::new(()),
    });
    let (batcher, _task) = spawn(upstream, BatcherConfig::default());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let start = Instant::now();
    let end = start + Duration::from_secs(seconds);
    let mut due: Vec<f64> = vec![0.0; load.len()];
    let mut offered: HashMap<String, usize> = HashMap::new();
    while Instant::now() < end {
        let now = (Instant::now() - start).as_secs_f64();
        for (i, (name, share, rate)) in load.iter().enumerate() {
            while due[i] <= now {
                due[i] += 1.0 / rate;
                *offered.entry((*name).to_string()).or_default() += 1;
                let sent = Instant::now();
                let submitted = batcher.submit_as(
                    share.clone(),
                    (vec![Input::from("x")], vec![1]),
                    EmbedOptions::default(),
                    sent + Duration::from_secs(1),
                );
                let tx = tx.clone();
                let name = (*name).to_string();
                tokio::spawn(async move {
                    let ok = match submitted {
                        Ok(rx) => matches!(rx.await, Ok(Ok(_))),
                        Err(_) => false,
                    };
                    let _ = tx.send((name, ok, sent.elapsed()));
                });
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(tx);
    let mut got: HashMap<String, Got> = HashMap::new();
    while let Some((name, ok, latency)) = rx.recv().await {
        let entry = got.entry(name).or_default();
        if ok {
            entry.ok += 1;
            entry.latencies.push(latency);
        }
    }
    for (name, n) in offered {
        got.entry(name).or_default().offered = n;
    }
    got
}

fn share(name: &str, weight: u32) -> Share {
    Share {
        tenant: name.into(),
        weight,
        scope: name.into(),
    }
}

#[tokio::test(start_paused = true)]
#[ignore = "a report for docs/design/fair-share.md, not a check"]
async fn fair_report() {
    println!("capacity {CAPACITY:.0} inputs/s; 3 s of open-loop one-input requests, 1 s deadlines");
    let mut alone = run(&[("b", share("b", 1), 0.2 * CAPACITY)], 3).await;
    let b_alone = alone.get_mut("b").expect("b");
    let (p50, p99) = (b_alone.percentile(0.5), b_alone.percentile(0.99));
    println!(
        "B alone at 20%: {}/{} ok, p50 {p50:?}, p99 {p99:?}",
        b_alone.ok, b_alone.offered
    );
    for (label, a, b) in [
        ("tenant-blind", Share::default(), Share::default()),
        ("fair share", share("a", 1), share("b", 1)),
    ] {
        let load = [("a", a, 3.0 * CAPACITY), ("b", b, 0.2 * CAPACITY)];
        let mut got = run(&load, 3).await;
        let mut names: Vec<String> = got.keys().cloned().collect();
        names.sort();
        for name in names {
            let Some(g) = got.get_mut(&name) else {
                continue;
            };
            let (p50, p99) = (g.percentile(0.5), g.percentile(0.99));
            println!(
                "{label}: {name}: {}/{} ok ({:.1}%), {:.0} inputs/s, p50 {p50:?}, p99 {p99:?}",
                g.ok,
                g.offered,
                100.0 * g.ok as f64 / g.offered.max(1) as f64,
                g.ok as f64 / 3.0,
            );
        }
    }
    let load = [
        ("a", share("a", 2), 2.0 * CAPACITY),
        ("b", share("b", 1), 2.0 * CAPACITY),
    ];
    let got = run(&load, 3).await;
    let (a, b) = (got["a"].ok, got["b"].ok);
    println!(
        "weights 2:1, both at 2x capacity: a {a} ok, b {b} ok, a:b = {:.2}",
        a as f64 / b.max(1) as f64
    );
}
