//! The worker's ordered stop ([`Running::serve_until`]).

use std::future::Future;
use std::time::Duration;

use super::Running;

/// Longest the tasks of the tree may take to stop once cancelled (the admin server's open
/// requests), and longest the last flush of the connection may take, each.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

impl Running {
    /// Serves until `signal` resolves (or the intake ends by itself: the connection closed),
    /// then shuts down in order:
    /// 1. stop taking messages: the intake drains its queue-group subscription and admits what
    ///    the server routed before the UNSUB; the `info` endpoint and the probes stop;
    /// 2. answer every accepted request, for at most `--shutdown-grace`: the intake dropped the
    ///    last batcher handle, so the batcher sends all it holds upstream and ends;
    /// 3. stop discovery, the heartbeat, withdrawals and the admin server, and wait for every task of the tree;
    /// 4. flush the connection, so the last replies leave.
    pub(crate) async fn serve_until(self, signal: impl Future<Output = ()>) {
        let Running {
            stop,
            intake_stop,
            tasks,
            mut intake,
            batcher,
            replies,
            client,
            shutdown_grace,
        } = self;
        let ended = tokio::select! {
            () = signal => None,
            ended = &mut intake => {
                tracing::warn!("the intake ended: the NATS connection closed");
                Some(ended)
            }
        };

        // 1. Stop taking messages.
        intake_stop.cancel();
        let ended = match ended {
            Some(ended) => ended,
            None => intake.await,
        };
        if let Err(err) = ended {
            tracing::error!(%err, "intake task failed");
        }

        // 2. Answer every accepted request, within the grace period.
        replies.close();
        let answered = async {
            if let Err(err) = batcher.await {
                tracing::error!(%err, "batcher task failed");
            }
            replies.wait().await;
        };
        if tokio::time::timeout(shutdown_grace, answered)
            .await
            .is_err()
        {
            tracing::warn!(grace = ?shutdown_grace, "shutdown grace period over; exiting with requests unanswered");
        }

        // 3. Stop discovery, the heartbeat, withdrawals and the admin server.
        stop.cancel();
        tasks.close();
        if tokio::time::timeout(STOP_TIMEOUT, tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("worker tasks still running after 5 s; exiting without them");
        }

        // 4. Flush the connection. Bounded: flushing waits for the server's PONG, which never
        // comes while disconnected.
        match tokio::time::timeout(STOP_TIMEOUT, client.flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(%err, "cannot flush replies"),
            Err(_) => tracing::warn!("cannot flush replies: NATS did not answer within 5 s"),
        }
        tracing::info!("worker stopped");
    }
}
