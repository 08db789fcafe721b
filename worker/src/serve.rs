//! The worker as a task tree: [`start`] spawns every long-lived task onto one [`TaskTracker`]
//! under one [`CancellationToken`], and [`Running::serve_until`] stops them in one ordered sequence.
//!
//! The tree:
//! - `stop` (the root token) ends the discovery responder (`$SRV.PING`/`INFO`/`STATS`,
//!   [`crate::micro`]), the heartbeat ([`crate::heartbeat`]; it beats while requests are held,
//!   until every accepted request is answered, so a graceful stop never looks like a death), the withdrawal of
//!   cancelled requests (`<subject>.cancel`) and the admin HTTP server (`/metrics`, `/health` and
//!   the metrics recorder's upkeep, [`crate::http`]);
//! - `intake` (a child of `stop`: cancelling the root cancels it too) ends what takes messages:
//!   the intake, which holds the queue-group membership ([`crate::group`]) and drains its
//!   subscription, the `info` endpoint ([`crate::info`]), the upstream `/health` probes and the
//!   bulk lane ([`embatch_bulk`]; the items it holds are NAKed for another worker).
//!
//! Two kinds of task are not long-lived and are waited on by the sequence instead: the
//! batcher's actor, which ends when the intake drops the last [`crate::batcher::BatcherHandle`]
//! and it has answered what it holds, and the reply tasks, one per accepted request, on their
//! own tracker.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::upstream::Upstream;
use crate::{Config, WorkerError, model};

mod identity;
mod parts;
mod shutdown;
mod subjects;

use parts::Parts;

/// A started worker: the tree's tokens and tasks, and what its shutdown waits on.
pub(crate) struct Running {
    /// The root: cancelling it stops every task of the tree.
    stop: CancellationToken,
    /// A child of `stop`: cancelling it stops taking messages.
    intake_stop: CancellationToken,
    /// Every long-lived task.
    tasks: TaskTracker,
    /// The intake's task, also on `tasks`: it ends when it has drained the request subscription,
    /// or at once when the connection closes.
    intake: JoinHandle<()>,
    /// The batcher's actor: it ends after the intake, once it has answered what it holds.
    batcher: JoinHandle<()>,
    /// The reply tasks of accepted requests.
    replies: TaskTracker,
    client: async_nats::Client,
    shutdown_grace: Duration,
}

/// Joins the queue group on `client` with `upstream` under `config` and spawns the worker's
/// tasks; it serves until [`Running::serve_until`].
///
/// # Errors
/// [`WorkerError::Service`] when a subscription cannot be made, [`WorkerError::Metrics`] or
/// [`WorkerError::Http`] when the admin server (`--metrics-addr`) cannot start,
/// [`WorkerError::Tenants`] when `TENANTS_FILE` cannot be read or is not valid.
pub(crate) async fn start<U: Upstream>(
    client: async_nats::Client,
    upstream: U,
    config: &Config,
    served: model::Served,
) -> Result<Running, WorkerError> {
    let stop = CancellationToken::new();
    let tasks = TaskTracker::new();
    // Read before anything is joined: a broken file stops the worker at start.
    let tenants = crate::tenant::TenantPolicy::new(
        embatch_runtime::tenants::watch(config.tenants_file.as_deref(), stop.clone())?,
        config.trusted_account.clone(),
    );
    let upstream = Arc::new(upstream);
    let parts = Parts::build(&client, &upstream, config, &served, (&stop, &tasks)).await?;
    tracing::info!(
        model = %served.model,
        subjects = ?served.subjects,
        queue_group = %config.queue_group,
        membership = %config.membership,
        upstream_max_batch = upstream.max_batch_size(),
        "worker ready"
    );
    Ok(parts.spawn(client, config, (served, tenants), (stop, tasks)))
}
