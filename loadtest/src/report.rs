//! The summary of a run: a serde struct written as JSON (`--json`) and rendered for humans.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::stats::Stats;

/// Latency percentiles of successful requests, in milliseconds (recorded with microsecond
/// precision, 3 significant digits).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// Number of samples.
    pub count: u64,
    /// Mean, ms.
    pub mean_ms: f64,
    /// Median, ms.
    pub p50_ms: f64,
    /// 90th percentile, ms.
    pub p90_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// 99.9th percentile, ms.
    pub p999_ms: f64,
    /// Maximum, ms.
    pub max_ms: f64,
}

impl LatencySummary {
    /// Extracts the percentiles from a histogram of microseconds; `None` when it is empty.
    pub fn from_histogram(hist: &Histogram<u64>) -> Option<LatencySummary> {
        if hist.is_empty() {
            return None;
        }
        let ms = |q: f64| us_to_ms(hist.value_at_quantile(q));
        Some(LatencySummary {
            count: hist.len(),
            mean_ms: hist.mean() / 1000.0,
            p50_ms: ms(0.5),
            p90_ms: ms(0.9),
            p99_ms: ms(0.99),
            p999_ms: ms(0.999),
            max_ms: us_to_ms(hist.max()),
        })
    }
}

/// Latency percentiles of failed requests that reached the target (rejections, timeouts), in ms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorLatencySummary {
    /// Number of samples.
    pub count: u64,
    /// Median, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Maximum: the longest a failed request waited, ms (0 in reports written before it existed).
    #[serde(default)]
    pub max_ms: f64,
}

impl ErrorLatencySummary {
    /// Extracts the percentiles from a histogram of microseconds; `None` when it is empty.
    pub fn from_histogram(hist: &Histogram<u64>) -> Option<ErrorLatencySummary> {
        if hist.is_empty() {
            return None;
        }
        Some(ErrorLatencySummary {
            count: hist.len(),
            p50_ms: us_to_ms(hist.value_at_quantile(0.5)),
            p99_ms: us_to_ms(hist.value_at_quantile(0.99)),
            max_ms: us_to_ms(hist.max()),
        })
    }
}

fn us_to_ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Requests and inputs per second.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// Requests per second.
    pub requests_per_s: f64,
    /// Inputs (texts, i.e. embeddings) per second.
    pub inputs_per_s: f64,
}

impl From<(f64, f64)> for Rates {
    fn from((requests_per_s, inputs_per_s): (f64, f64)) -> Rates {
        Rates {
            requests_per_s,
            inputs_per_s,
        }
    }
}

/// Request counts of the measured window. `succeeded + failed = sent + not_sent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Requests sent to the target.
    pub sent: u64,
    /// Requests answered with the expected number of embeddings.
    pub succeeded: u64,
    /// Requests that failed, of any kind (including `not_sent`).
    pub failed: u64,
}

/// Requests per second of completion time during the run (see [`crate::stats::Timeline`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PerSecond {
    /// Start of second 0, milliseconds since the Unix epoch: when the first measured request was
    /// sent (the end of the warm-up, to within a timer tick).
    pub start_unix_ms: u64,
    /// `goodput[i]`: successes within the timeout that completed in second `i`, i.e. in
    /// `[start + i s, start + (i + 1) s)` (requests per second). Seconds after the measured
    /// window hold the completions of the window's last requests.
    pub goodput: Vec<u64>,
    /// `completed[i]`: requests of any outcome except `not_sent` that completed in second `i`.
    pub completed: Vec<u64>,
}

/// What was run, for the record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// The target: a URL, or a NATS URL and subject.
    pub target: String,
    /// `closed` or `open`.
    pub load_model: String,
    /// Closed loop: the number of workers.
    pub concurrency: Option<usize>,
    /// Open loop: the arrival rate, requests/s.
    pub rate_per_s: Option<f64>,
    /// Inputs per request.
    pub inputs_per_request: usize,
    /// Per-request timeout, ms.
    pub timeout_ms: u64,
    /// Warm-up, ms (not measured).
    pub warmup_ms: u64,
    /// With `--zipf-unique`: the texts' distribution and how many distinct texts were sent
    /// (warm-up included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zipf: Option<ZipfInfo>,
}

/// The Zipf-drawn texts of a run (`--zipf-unique`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ZipfInfo {
    /// Distinct texts to draw from.
    pub unique: usize,
    /// The exponent s.
    pub s: f64,
    /// Distinct texts drawn, warm-up included.
    pub distinct_sent: usize,
}

/// The result of `embatch-loadtest run`; `--json` writes exactly this.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// What was run.
    pub run: RunInfo,
    /// Length of the measured window, seconds: the planned `--duration`, or with `--requests`
    /// from the end of the warm-up to the last measured completion.
    pub measured_s: f64,
    /// Request counts.
    pub requests: Counts,
    /// Failed requests by kind (`429`, `503 no responders`, `timeout`, `connect`, `bad_reply`,
    /// `not_sent`, `transport`, …).
    pub failures: BTreeMap<String, u64>,
    /// Completed requests (any outcome, excluding `not_sent`) per second of the window.
    pub throughput: Rates,
    /// Successful requests whose latency was within the timeout, per second of the window.
    pub goodput: Rates,
    /// Latency of successes; `null` when none succeeded.
    pub latency: Option<LatencySummary>,
    /// Latency of failures that reached the target; `null` when there were none.
    pub error_latency: Option<ErrorLatencySummary>,
    /// The same per failure kind (keys as in `failures`, without `not_sent`), so fast rejections
    /// (`429`) and slow failures (`timeout`) can be told apart.
    #[serde(default)]
    pub error_latency_by_kind: BTreeMap<String, ErrorLatencySummary>,
    /// Goodput and completions per second of the run; `null` when no measured request completed.
    #[serde(default)]
    pub per_second: Option<PerSecond>,
}

impl Report {
    /// Builds the report from the statistics of a run and its measured window.
    pub fn new(run: RunInfo, stats: &Stats, measured: Duration) -> Report {
        Report {
            run,
            measured_s: measured.as_secs_f64(),
            requests: Counts {
                sent: stats.sent,
                succeeded: stats.succeeded,
                failed: stats.failed(),
            },
            failures: stats
                .failures
                .iter()
                .map(|(kind, n)| (kind.to_string(), *n))
                .collect(),
            throughput: stats.throughput(measured).into(),
            goodput: stats.goodput(measured).into(),
            latency: LatencySummary::from_histogram(&stats.success_latency),
            error_latency: ErrorLatencySummary::from_histogram(&stats.error_latency),
            error_latency_by_kind: stats
                .failure_latency
                .iter()
                .filter_map(|(kind, hist)| {
                    ErrorLatencySummary::from_histogram(hist).map(|s| (kind.to_string(), s))
                })
                .collect(),
            per_second: stats.timeline.origin.map(|_| PerSecond {
                start_unix_ms: stats.timeline.origin_unix_ms,
                goodput: stats.timeline.goodput.clone(),
                completed: stats.timeline.completed.clone(),
            }),
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let run = &self.run;
        let load = match (run.concurrency, run.rate_per_s) {
            (_, Some(rate)) => format!("open loop at {rate} req/s"),
            (Some(c), None) => format!("closed loop, concurrency {c}"),
            (None, None) => run.load_model.clone(),
        };
        writeln!(f, "target      {}", run.target)?;
        writeln!(
            f,
            "load        {load}, {} input(s)/request, timeout {} ms, warm-up {} ms",
            run.inputs_per_request, run.timeout_ms, run.warmup_ms
        )?;
        writeln!(f, "measured    {:.2} s", self.measured_s)?;
        writeln!(
            f,
            "requests    {} sent, {} succeeded, {} failed",
            self.requests.sent, self.requests.succeeded, self.requests.failed
        )?;
        if !self.failures.is_empty() {
            let mut line = String::new();
            for (i, (kind, n)) in self.failures.iter().enumerate() {
                if i > 0 {
                    line.push_str(", ");
                }
                let _ = write!(line, "{kind}: {n}");
            }
            writeln!(f, "failures    {line}")?;
        }
        writeln!(
            f,
            "throughput  {:.1} req/s, {:.1} inputs/s (completed, any outcome)",
            self.throughput.requests_per_s, self.throughput.inputs_per_s
        )?;
        writeln!(
            f,
            "goodput     {:.1} req/s, {:.1} inputs/s (succeeded within {} ms)",
            self.goodput.requests_per_s, self.goodput.inputs_per_s, run.timeout_ms
        )?;
        match &self.latency {
            Some(l) => writeln!(
                f,
                "latency     p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms \
                 (mean {:.2} ms, n={})",
                l.p50_ms, l.p90_ms, l.p99_ms, l.p999_ms, l.max_ms, l.mean_ms, l.count
            )?,
            None => writeln!(f, "latency     no successful request")?,
        }
        if let Some(e) = &self.error_latency {
            writeln!(
                f,
                "errors      p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (n={})",
                e.p50_ms, e.p99_ms, e.max_ms, e.count
            )?;
        }
        if self.error_latency_by_kind.len() > 1 {
            for (kind, e) in &self.error_latency_by_kind {
                writeln!(
                    f,
                    "  {kind:<9} p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (n={})",
                    e.p50_ms, e.p99_ms, e.max_ms, e.count
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{FailureKind, new_histogram};
    use tokio::time::Instant;

    fn close(actual: f64, expected: f64) -> bool {
        (actual - expected).abs() <= expected * 0.001 + 1e-9
    }

    #[test]
    fn percentiles_from_the_histogram() {
        let mut hist = new_histogram();
        // 1 ms … 1000 ms, one sample each.
        for ms in 1..=1000u64 {
            hist.record(ms * 1000).expect("in range");
        }
        let s = LatencySummary::from_histogram(&hist).expect("non-empty");
        assert_eq!(s.count, 1000);
        assert!(close(s.p50_ms, 500.0), "{}", s.p50_ms);
        assert!(close(s.p90_ms, 900.0), "{}", s.p90_ms);
        assert!(close(s.p99_ms, 990.0), "{}", s.p99_ms);
        assert!(close(s.p999_ms, 999.0), "{}", s.p999_ms);
        assert!(close(s.max_ms, 1000.0), "{}", s.max_ms);
        assert!(close(s.mean_ms, 500.5), "{}", s.mean_ms);
    }

    #[test]
    fn microsecond_precision_for_small_values() {
        let mut hist = new_histogram();
        for us in [250u64, 251, 252, 1999] {
            hist.record(us).expect("in range");
        }
        let s = LatencySummary::from_histogram(&hist).expect("non-empty");
        assert_eq!(s.p50_ms, 0.251);
        assert_eq!(s.max_ms, 1.999);
        assert!(LatencySummary::from_histogram(&new_histogram()).is_none());
        assert!(ErrorLatencySummary::from_histogram(&new_histogram()).is_none());
    }

    #[test]
    fn report_from_stats_round_trips_as_json() {
        let mut stats = Stats::new(Duration::from_secs(2));
        let now = Instant::now();
        for _ in 0..8 {
            stats.record(Ok(()), Duration::from_millis(10), 4, now);
        }
        stats.record(
            Err(FailureKind::Status(429)),
            Duration::from_millis(1),
            4,
            now,
        );
        stats.record(
            Err(FailureKind::NoResponders),
            Duration::from_millis(2),
            4,
            now,
        );
        stats.sent = 10;
        let run = RunInfo {
            target: "http://127.0.0.1:1/embed".into(),
            load_model: "closed".into(),
            concurrency: Some(2),
            rate_per_s: None,
            inputs_per_request: 4,
            timeout_ms: 2000,
            warmup_ms: 0,
            zipf: None,
        };
        let report = Report::new(run, &stats, Duration::from_secs(2));
        assert_eq!(
            report.requests,
            Counts {
                sent: 10,
                succeeded: 8,
                failed: 2
            }
        );
        assert_eq!(report.failures["429"], 1);
        assert_eq!(report.failures["503 no responders"], 1);
        assert_eq!(report.goodput.requests_per_s, 4.0);
        assert_eq!(report.goodput.inputs_per_s, 16.0);
        assert_eq!(report.throughput.requests_per_s, 5.0);
        assert_eq!(report.error_latency.as_ref().map(|e| e.count), Some(2));
        assert_eq!(report.error_latency_by_kind["429"].count, 1);
        assert_eq!(
            report.error_latency_by_kind["503 no responders"].p50_ms,
            2.0
        );
        // The worst failure: the 2 ms no-responders answer (of all failures and of its kind).
        assert_eq!(report.error_latency.as_ref().map(|e| e.max_ms), Some(2.0));
        assert_eq!(
            report.error_latency_by_kind["503 no responders"].max_ms,
            2.0
        );
        assert_eq!(report.error_latency_by_kind["429"].max_ms, 1.0);

        let per_second = report.per_second.as_ref().expect("a timeline");
        assert_eq!(per_second.goodput, [8]);
        assert_eq!(per_second.completed, [10]);

        let json = serde_json::to_string(&report).expect("serializes");
        let back: Report = serde_json::from_str(&json).expect("deserializes");
        assert_eq!(back, report);

        let text = report.to_string();
        assert!(text.contains("8 succeeded, 2 failed"), "{text}");
        assert!(text.contains("429: 1, 503 no responders: 1"), "{text}");
        assert!(text.contains("p99.9"), "{text}");
        assert!(text.contains("max 2.00 ms (n=2)"), "{text}");

        // A report written before `max_ms` existed still reads (as 0).
        let mut old = serde_json::to_value(&report).expect("serializes");
        old["error_latency"]
            .as_object_mut()
            .expect("an object")
            .remove("max_ms");
        let back: Report = serde_json::from_value(old).expect("deserializes");
        assert_eq!(back.error_latency.map(|e| e.max_ms), Some(0.0));
    }
}
