//! The gateways' exchange of quota counts on core NATS: each publishes its counts of the
//! current window on [`SUBJECT`] when they change (at most every [`INTERVAL`], and every second
//! while it has any, so that a gateway that just started learns them), and records every other
//! gateway's. Lost messages cost accuracy for one interval, never a count: each message carries
//! the whole window's counts, not increments.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::{Counts, Quotas};

/// The subject of the gateways' quota counts (no queue group: every gateway hears every other).
/// Payload: JSON `{"gateway": "<id>", "window": <index>, "window_ms": <length>, "usage":
/// {"<tenant>": {"requests": n, "tokens": n}}}`.
pub const SUBJECT: &str = "embatch.quota.v1.usage";

/// How often a gateway publishes its changed counts: the lag after which the others count what
/// it admitted.
pub const INTERVAL: Duration = Duration::from_millis(100);

/// Publishes every [`INTERVAL`] after this many quiet ones even without a change.
const REFRESH_TICKS: u32 = 10;

/// One gateway's counts of one window.
#[derive(Debug, Serialize, Deserialize)]
struct Report {
    gateway: String,
    window: u64,
    window_ms: u64,
    usage: HashMap<String, Counts>,
}

/// Starts publishing this gateway's counts and recording its peers' on `client`, until `stop`.
/// Needs a tokio runtime.
pub fn start(client: async_nats::Client, quotas: Quotas, stop: CancellationToken) {
    let gateway = nuid::next().to_string();
    tokio::spawn(publish(
        client.clone(),
        quotas.clone(),
        gateway.clone(),
        stop.clone(),
    ));
    tokio::spawn(record(client, quotas, gateway, stop));
}

async fn publish(
    client: async_nats::Client,
    quotas: Quotas,
    gateway: String,
    stop: CancellationToken,
) {
    let window_ms = quotas.window.as_millis() as u64;
    let mut tick = tokio::time::interval(INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut quiet = 0;
    while stop.run_until_cancelled(tick.tick()).await.is_some() {
        quiet += 1;
        let Some((window, usage)) = quotas.take_changes(quiet >= REFRESH_TICKS) else {
            continue;
        };
        quiet = 0;
        let report = Report {
            gateway: gateway.clone(),
            window,
            window_ms,
            usage,
        };
        let Ok(payload) = serde_json::to_vec(&report) else {
            continue;
        };
        if let Err(err) = client.publish(SUBJECT, payload.into()).await {
            tracing::debug!(%err, "cannot publish the quota counts; the next interval will");
        }
    }
}

async fn record(
    client: async_nats::Client,
    quotas: Quotas,
    gateway: String,
    stop: CancellationToken,
) {
    let mut reports = match client.subscribe(SUBJECT).await {
        Ok(reports) => reports,
        Err(err) => {
            tracing::error!(%err, "cannot hear the other gateways' quota counts: quotas hold per gateway only");
            return;
        }
    };
    let window_ms = quotas.window.as_millis() as u64;
    while let Some(Some(message)) = stop.run_until_cancelled(reports.next()).await {
        let Ok(report) = serde_json::from_slice::<Report>(&message.payload) else {
            continue;
        };
        // Its own, or a gateway with another QUOTA_WINDOW (its windows are not ours).
        if report.gateway == gateway || report.window_ms != window_ms {
            continue;
        }
        quotas.record_peer(report.gateway, report.window, report.usage);
    }
}
