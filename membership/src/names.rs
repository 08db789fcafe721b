//! The metric names the membership records (prefix `embatch_worker_`): the worker's, which
//! re-exports them among its own (dashboards and alerts read these names). The worker installs
//! the recorder and the HELP texts.

/// Gauge: 1 while the worker is a member of the queue group (takes requests), else 0.
pub const MEMBER: &str = "embatch_worker_queue_group_member";
/// Counter, labels `event` (`joined`, `left`, or `changed` when only the reason changed) and
/// `state` (the new state: `joined`, `full`, `upstream_unhealthy`, `stopping`): changes of
/// queue-group membership.
pub const MEMBERSHIP_CHANGES: &str = "embatch_worker_membership_changes_total";
