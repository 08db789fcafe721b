//! The progress bar shown on stderr while a run is in progress (hidden with `--quiet` or when
//! stderr is not a terminal).

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::load::{Plan, Stop};
use crate::stats::Recorder;

/// How often the bar is refreshed.
const TICK: Duration = Duration::from_millis(200);

/// A running progress bar; [`Progress::finish`] removes it.
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
    ticker: JoinHandle<()>,
}

impl Progress {
    /// Starts the bar for `plan`: by elapsed time (duration mode) or by completed measured
    /// requests (`--requests` mode).
    pub fn start(recorder: Arc<Recorder>, plan: Plan, quiet: bool) -> Progress {
        let visible = !quiet && std::io::stderr().is_terminal();
        let (len, template) = match plan.stop {
            Stop::Duration(d) => (
                u64::try_from((plan.warmup + d).as_millis()).unwrap_or(u64::MAX),
                "{spinner} [{elapsed_precise}] {wide_bar} {msg}",
            ),
            Stop::Requests(n) => (
                n,
                "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}",
            ),
        };
        let bar = if visible {
            ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr())
        } else {
            ProgressBar::hidden()
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style);
        }
        let start = Instant::now();
        let ticker = {
            let bar = bar.clone();
            tokio::spawn(async move {
                let mut interval = tokio::time::interval(TICK);
                loop {
                    interval.tick().await;
                    let live = recorder.live();
                    let elapsed = start.elapsed();
                    match plan.stop {
                        Stop::Duration(_) => bar.set_position(
                            u64::try_from(elapsed.as_millis())
                                .unwrap_or(u64::MAX)
                                .min(len),
                        ),
                        Stop::Requests(_) => bar.set_position(live.succeeded + live.failed),
                    }
                    let phase = if elapsed < plan.warmup {
                        "warm-up, "
                    } else {
                        ""
                    };
                    bar.set_message(format!(
                        "{phase}sent {} ok {} failed {} in flight {}",
                        live.sent, live.succeeded, live.failed, live.in_flight
                    ));
                }
            })
        };
        Progress { bar, ticker }
    }

    /// Stops and clears the bar.
    pub fn finish(self) {
        self.ticker.abort();
        self.bar.finish_and_clear();
    }
}
