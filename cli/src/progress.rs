//! The progress bar on stderr (indicatif): inputs done of the job's inputs, inputs/s and the
//! ETA, from the batch's `request_counts`. Hidden with `--quiet` or when stderr is not a
//! terminal; then one line per status change is printed instead.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::api::{BatchStatus, RequestCounts};

/// The bar's template: `[00:01:02] ####---- 61,440/100,000 inputs  2,048/s  ETA 19s  in_progress`.
const TEMPLATE: &str = "[{elapsed_precise}] {wide_bar} {human_pos}/{human_len} inputs  \
                        {per_sec}  ETA {eta}  {msg}";

/// Inputs done, estimated from requests done: the API counts requests (input lines), a line
/// may carry several inputs, and lines are assumed to carry the job's average.
pub fn inputs_done(counts: RequestCounts, total_requests: u64, total_inputs: u64) -> u64 {
    let done = counts.completed.saturating_add(counts.failed);
    let total = counts.total.max(total_requests).max(1);
    let estimate = u128::from(done) * u128::from(total_inputs) / u128::from(total);
    u64::try_from(estimate)
        .unwrap_or(u64::MAX)
        .min(total_inputs)
}

/// The bar of one job.
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
    total_requests: u64,
    total_inputs: u64,
    visible: bool,
    last_status: Option<BatchStatus>,
}

impl Progress {
    /// A bar of `total_inputs` inputs in `total_requests` requests.
    pub fn new(total_requests: u64, total_inputs: u64, quiet: bool) -> Progress {
        let visible = !quiet && std::io::stderr().is_terminal();
        let bar = if visible {
            ProgressBar::with_draw_target(Some(total_inputs), ProgressDrawTarget::stderr())
        } else {
            ProgressBar::hidden()
        };
        if let Ok(style) = ProgressStyle::with_template(TEMPLATE) {
            bar.set_style(style);
        }
        Progress {
            bar,
            total_requests,
            total_inputs,
            visible,
            last_status: None,
        }
    }

    /// Shows the batch's latest state. On a resumed job the first update jumps to what is
    /// already done; indicatif's rate counts from there.
    pub fn update(&mut self, status: BatchStatus, counts: RequestCounts) {
        let done = inputs_done(counts, self.total_requests, self.total_inputs);
        if self.last_status.is_none() && done > 0 {
            self.bar.reset_elapsed();
            self.bar.reset_eta();
        }
        self.bar.set_position(done);
        let failed = if counts.failed > 0 {
            format!(" ({} requests failed)", counts.failed)
        } else {
            String::new()
        };
        self.bar.set_message(format!("{}{failed}", status.as_str()));
        if !self.visible && self.last_status != Some(status) {
            eprintln!(
                "batch {}: {done}/{} inputs{failed}",
                status.as_str(),
                self.total_inputs
            );
        }
        self.last_status = Some(status);
    }

    /// Prints a line above the bar (or on stderr when hidden).
    pub fn note(&self, line: &str) {
        if self.visible {
            self.bar.println(line);
        } else {
            eprintln!("{line}");
        }
    }

    /// Leaves the bar's last state on screen.
    pub fn finish(&self) {
        self.bar.abandon();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(total: u64, completed: u64, failed: u64) -> RequestCounts {
        RequestCounts {
            total,
            completed,
            failed,
        }
    }

    #[test]
    fn inputs_scale_with_requests_and_never_pass_the_total() {
        assert_eq!(inputs_done(counts(100, 50, 0), 100, 100), 50);
        // Four inputs per request on average.
        assert_eq!(inputs_done(counts(100, 25, 25), 100, 400), 200);
        // Before validation the server's total may still be 0.
        assert_eq!(inputs_done(counts(0, 0, 0), 100, 400), 0);
        assert_eq!(inputs_done(counts(10, 20, 0), 10, 10), 10);
    }
}
