//! The HTTP server loop, sized for a proxy under hostile or overloading clients.
//!
//! `axum::serve` has no bound on connections and no header-read timeout; this loop adds both on
//! the same hyper stack (hyper's HTTP/1 connection with tokio IO, axum's router as the service):
//! - a listen backlog of `LISTEN_BACKLOG` (the kernel caps it at `net.core.somaxconn`), so a burst
//!   of new connections waits in the kernel instead of being dropped into SYN retries;
//! - at most `MAX_CONNECTIONS` open connections: beyond it a new connection is closed at once
//!   (counted in `embatch_gateway_connections_refused_total`), so the process never runs out of
//!   file descriptors and memory stays bounded;
//! - `HEADER_READ_TIMEOUT` to receive a request's headers (slowloris clients are closed);
//! - graceful shutdown: stop accepting, let in-flight requests finish (hyper-util's
//!   `GracefulShutdown`), bounded by `SHUTDOWN_GRACE`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::telemetry::names;

/// Connection limits of the HTTP server (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    /// Most open connections; more are closed at once.
    pub max_connections: usize,
    /// Longest time to receive a request's headers.
    pub header_read_timeout: Duration,
    /// Longest wait for in-flight requests after shutdown is asked for.
    pub shutdown_grace: Duration,
}

/// Binds `addr` with a listen backlog of `backlog` connections (`SO_REUSEADDR` set).
///
/// # Errors
/// When the address cannot be bound.
pub fn bind(addr: std::net::SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// Serves `router` on `listener` under `limits` until `shutdown` resolves, then waits for the
/// open connections' in-flight requests (at most `limits.shutdown_grace`).
pub async fn run(
    listener: TcpListener,
    router: Router,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()>,
) {
    let connections = Arc::new(Semaphore::new(
        limits.max_connections.clamp(1, Semaphore::MAX_PERMITS),
    ));
    let graceful = GracefulShutdown::new();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    // EMFILE/ENFILE and friends: back off instead of spinning on accept.
                    tracing::warn!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
            metrics::counter!(names::CONNECTIONS_REFUSED).increment(1);
            drop(stream);
            continue;
        };
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!(%err, "cannot set TCP_NODELAY");
        }
        let connection = graceful.watch(http.serve_connection(
            TokioIo::new(stream),
            TowerToHyperService::new(router.clone()),
        ));
        metrics::gauge!(names::CONNECTIONS).increment(1.0);
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(%err, "connection ended with an error");
            }
            metrics::gauge!(names::CONNECTIONS).decrement(1.0);
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(grace = ?limits.shutdown_grace, "shutdown grace over; closing connections with requests in flight");
    }
}
