//! The workspace's TEI double ([`embatch_tei_double`]) as tests start it, and worker arguments
//! that make its calls observable one at a time.

use std::time::Duration;

use crate::{TeiConfig, TeiDouble};

/// Starts the workspace's TEI double ([`embatch_tei_double`]) on a free loopback port (needs a
/// tokio runtime); panics if it cannot bind.
pub async fn start_tei(config: TeiConfig) -> TeiDouble {
    TeiDouble::spawn(config).await.expect("bind the TEI double")
}

/// Starts the TEI double ([`start_tei`]) answering every call after `base`, with no per-input
/// cost and no limit on calls at once that a test reaches ([`TeiConfig::instant`] otherwise):
/// an upstream that holds requests for a known time.
pub async fn start_slow_tei(base: Duration) -> TeiDouble {
    start_tei(TeiConfig {
        base,
        ..TeiConfig::instant()
    })
    .await
}

/// Worker arguments for one input per upstream call, one call at a time, sent at once
/// (`--max-batch-size 1 --max-concurrent-batches 1 --max-wait-time 1ms`): with a slow TEI
/// double, a second request waits in the worker's queue for the first call's whole duration.
pub const ONE_CALL_AT_A_TIME: [&str; 6] = [
    "--max-batch-size",
    "1",
    "--max-concurrent-batches",
    "1",
    "--max-wait-time",
    "1ms",
];
