//! The batcher ([`embatch_batcher`]: queue, admission, batch shaping, fault isolation, fair
//! share), wired to the worker: its spans join the worker's traces, and a tenant's [`Share`]
//! comes from the worker's tenants.

use std::sync::Arc;

pub use embatch_batcher::*;
use embatch_runtime::tenants::Tenant;
use tokio::task::JoinHandle;

/// Starts the batcher for `upstream` ([`embatch_batcher::spawn_traced`]), its spans in the
/// worker's traces (`crate::trace`).
///
/// The task ends after every [`BatcherHandle`] clone is dropped and every accepted request is
/// answered (or cancelled).
pub fn spawn<B: Backend>(
    upstream: Arc<B>,
    config: BatcherConfig,
) -> (BatcherHandle, JoinHandle<()>) {
    embatch_batcher::spawn_traced(upstream, config, crate::trace::BATCHER)
}

/// The batcher's share of `tenant`: its name, weight and cache scope.
pub fn share_of(tenant: &Tenant) -> Share {
    Share::new(
        tenant.name.clone(),
        tenant.weight,
        tenant.cache_scope.clone(),
    )
}
