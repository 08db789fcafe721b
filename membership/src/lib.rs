//! Queue-group membership of an embatch worker: whether it is a member of its NATS queue group,
//! and everything that keeps the group and the clients informed.
//!
//! - [`decision`]: when a worker is a member (full, upstream unhealthy, stopping), as plain
//!   decisions: data and functions, no clock reads, no channels.
//! - [`group`]: the request subjects' queue subscriptions, held or drained as the decision says.
//! - [`peers`]: what a worker knows of its peers' room (the room subject, asked only when the
//!   decision needs it) and the start and stop announcements.
//! - [`heartbeat`]: the liveness signal clients watch to resend what a lost worker held.
//! - [`reconnect`]: what a reconnect to NATS does to the worker's queue.
//! - [`micro`]: NATS micro service discovery (`$SRV.PING`, `$SRV.INFO`, `$SRV.STATS`) and the
//!   per-endpoint counters.
//! - [`names`]: the metric names recorded here.
//!
//! The worker wires these to its batcher, its intake and its upstream's `/health` probes.

pub mod decision;
pub mod group;
pub mod heartbeat;
pub mod micro;
pub mod names;
pub mod peers;
pub mod reconnect;
