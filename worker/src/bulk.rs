//! The bulk lane ([`embatch_bulk`]: OpenAI-style batch jobs from NATS JetStream, behind
//! interactive traffic), wired to the worker: a batch's owner is decided by the worker's
//! tenants and counted on its per-tenant metrics, a line's tokens are counted by the worker's
//! token counter, and its inputs go to the worker's batcher.

use std::sync::Arc;

use embatch_bulk::{Counted, Host, Owner, Owners, TokenCounter};
use embatch_protocol::{EmbedError, EmbedOptions, Input};
use futures::future::BoxFuture;

use crate::batcher::{BatcherHandle, share_of};
use crate::telemetry::{Traffic, count_tenant};
use crate::tenant::TenantPolicy;
use crate::tokens::Counter;

/// What the bulk lane takes from the worker: the bulk gate of its `batcher`, the token
/// `counter` the intake uses, and the worker's `tenants`.
pub fn host(batcher: &BatcherHandle, counter: &Counter, tenants: &TenantPolicy) -> Host {
    Host {
        gate: batcher.bulk_gate(),
        tokens: Arc::new(counter.clone()),
        owners: Arc::new(tenants.clone()),
    }
}

impl Owners for TenantPolicy {
    fn batch_owner(&self, owner: &str) -> Owner {
        let caller = self.owner(owner);
        Owner {
            share: share_of(&caller.tenant),
            label: caller.label,
        }
    }

    fn count_line(&self, owner: &Owner, status: u16, counts: (usize, Option<u64>)) {
        count_tenant(&owner.label, Traffic::Bulk, status, counts);
    }
}

impl TokenCounter for Counter {
    fn count_tokens(
        &self,
        inputs: Vec<Input>,
        options: EmbedOptions,
    ) -> BoxFuture<'_, Result<Counted, EmbedError>> {
        Box::pin(async move {
            let counted = self.count(inputs, options).await?;
            Ok(Counted {
                tokens: counted.tokens(),
                inputs: counted.inputs,
                options: counted.options,
                lengths: counted.lengths,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    /// The bound docs/bulk.md gives for a cancel (and any failing job) is the one the default
    /// settings make.
    #[test]
    fn a_failing_job_ends_its_batch_within_the_documented_bound() {
        let config = crate::Config::try_parse_from(["embatch-worker"])
            .expect("the defaults parse")
            .bulk();
        assert_eq!(
            (config.max_deliver, config.ack_wait),
            (5, Duration::from_secs(30)),
            "the defaults the bound is computed from"
        );
        let bound = config.give_up_bound();
        assert_eq!(bound, Duration::from_secs(5 * (60 + 30)));
        let docs = include_str!("../../docs/bulk.md");
        assert!(
            docs.contains(&format!("{} s", bound.as_secs())),
            "docs/bulk.md states the bound, {bound:?}"
        );
    }
}
