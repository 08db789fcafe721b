//! The open-file limit and the connection cap it allows.
//!
//! Every HTTP connection holds one file descriptor, so `MAX_CONNECTIONS` above the process's
//! `RLIMIT_NOFILE` does not bound anything: `accept` fails with "Too many open files" first (and
//! so does everything else that opens a descriptor), and a new client waits in the backlog for
//! a slot. At start the gateway therefore:
//! 1. raises its soft `RLIMIT_NOFILE` to the hard limit (what `ulimit -Sn` may go up to without
//!    privileges; the `rlimit` crate, as the workspace forbids unsafe code);
//! 2. caps connections at that limit less [`FD_HEADROOM`] when `MAX_CONNECTIONS` is above it, and
//!    logs which of the two is in effect (`connection cap` at info level, or a warning when
//!    capped).

/// File descriptors left for everything but client connections: standard streams, tokio's
/// epoll and waker, the listening socket, NATS connections (one, more while reconnecting), the
/// connection accepted only to be closed at once beyond the cap, DNS lookups and files read at
/// start (credentials, CA bundles). About 15 are open in a running gateway; the rest is margin.
pub const FD_HEADROOM: u64 = 64;

/// The connection cap in effect for `max_connections` (`MAX_CONNECTIONS`) when the process may
/// hold `open_files` descriptors (the soft `RLIMIT_NOFILE`): the smaller of `max_connections`
/// and `open_files - FD_HEADROOM`, at least 1.
pub fn cap(max_connections: usize, open_files: u64) -> usize {
    let room = usize::try_from(open_files.saturating_sub(FD_HEADROOM)).unwrap_or(usize::MAX);
    max_connections.min(room).max(1)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns the connection cap in effect
/// ([`cap`]), logging both. When the limit cannot be read or raised (a platform without it, a
/// refused `setrlimit`), `max_connections` stays in effect, with a warning.
pub fn raise_and_cap(max_connections: usize) -> usize {
    let before = rlimit::Resource::NOFILE.get();
    let open_files = match rlimit::increase_nofile_limit(rlimit::INFINITY) {
        Ok(limit) => limit,
        Err(err) => {
            tracing::warn!(%err, max_connections, "cannot raise the open-file limit (RLIMIT_NOFILE); MAX_CONNECTIONS in effect as configured");
            return max_connections;
        }
    };
    let (soft_before, hard) = before.unwrap_or((open_files, open_files));
    let in_effect = cap(max_connections, open_files);
    if in_effect < max_connections {
        tracing::warn!(
            max_connections,
            open_file_limit = open_files,
            soft_limit_before = soft_before,
            hard_limit = hard,
            headroom = FD_HEADROOM,
            connection_cap = in_effect,
            "connection cap: MAX_CONNECTIONS is above the open-file limit less headroom; the limit's cap is in effect"
        );
    } else {
        tracing::info!(
            max_connections,
            open_file_limit = open_files,
            soft_limit_before = soft_before,
            hard_limit = hard,
            connection_cap = in_effect,
            "connection cap: MAX_CONNECTIONS is in effect"
        );
    }
    in_effect
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_the_smaller_of_the_setting_and_the_limit_less_headroom() {
        assert_eq!(cap(4096, 1024), 1024 - 64);
        assert_eq!(cap(4096, 1_048_576), 4096);
        assert_eq!(cap(100, 1024), 100);
        assert_eq!(cap(4096, rlimit::INFINITY), 4096);
        assert_eq!(cap(4096, 10), 1, "never zero: the gateway still serves");
    }
}
