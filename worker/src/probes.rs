//! The upstream `/health` probes that feed the membership decision
//! ([`embatch_membership::group::Group`]).

use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::membership::{MemberState, PROBE_INTERVAL, PROBE_INTERVAL_UNHEALTHY, PROBE_TIMEOUT};
use crate::upstream::Upstream;
#[allow(unused_imports)] // the docs' link
use embatch_membership::group::Group;

/// The upstream `/health` probes: every [`PROBE_INTERVAL`] ([`PROBE_INTERVAL_UNHEALTHY`] while
/// the worker is out because its upstream is unhealthy), each bounded by [`PROBE_TIMEOUT`]; each
/// result goes to the queue group's [`Group`] (the receiver [`Probes::new`] returns).
pub(crate) struct Probes<U> {
    upstream: Arc<U>,
    state: watch::Receiver<MemberState>,
    results: mpsc::Sender<bool>,
}

impl<U: Upstream> Probes<U> {
    /// Probes of `upstream` paced by the worker's membership `state`, and the receiver of their
    /// results (for [`Group::join`]).
    pub(crate) fn new(
        upstream: Arc<U>,
        state: watch::Receiver<MemberState>,
    ) -> (Probes<U>, mpsc::Receiver<bool>) {
        let (results, rx) = mpsc::channel(1);
        let probes = Probes {
            upstream,
            state,
            results,
        };
        (probes, rx)
    }

    /// Probes until `stop` is cancelled or the receiver is dropped.
    pub(crate) async fn run(mut self, stop: CancellationToken) {
        loop {
            let interval = if *self.state.borrow() == MemberState::UpstreamUnhealthy {
                PROBE_INTERVAL_UNHEALTHY
            } else {
                PROBE_INTERVAL
            };
            // A change of state (e.g. to unhealthy) restarts the wait at the new interval.
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                changed = self.state.changed() => match changed {
                    Ok(()) => continue,
                    Err(_) => return, // the worker is gone
                },
                () = stop.cancelled() => return,
            }
            let probe = tokio::time::timeout(PROBE_TIMEOUT, self.upstream.health());
            let ok = tokio::select! {
                result = probe => match result {
                    Ok(Ok(())) => true,
                    Ok(Err(err)) => {
                        tracing::debug!(%err, "upstream health probe failed");
                        false
                    }
                    Err(_) => {
                        tracing::debug!("upstream health probe timed out");
                        false
                    }
                },
                () = stop.cancelled() => return,
            };
            if self.results.send(ok).await.is_err() {
                return;
            }
        }
    }
}
