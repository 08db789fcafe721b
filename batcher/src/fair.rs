//! Fair share: the upstream's capacity shared between tenants by weight, decided when a batch
//! forms.
//!
//! Start-time fair queueing over the batcher's own unit of work (a token, or an input when the
//! batch cost counts inputs only): each tenant of a queue has a virtual *served* mark, the work
//! sent upstream for it divided by its weight. When a batch forms, the tenant with the lowest
//! mark (the most owed) gives the batch its head, and the batch's other places go to the waiting
//! inputs in the order a simulation of the marks gives (a tenant of weight 2 takes two units for
//! every one of a tenant of weight 1); then every input sent is charged to its tenant's mark. A
//! tenant that starts waiting again after an idle spell gets the virtual time, the mark of the
//! last batch's head, if its own is lower: idle time banks no credit. Work-conserving: a tenant
//! alone gets every place, and a queue of one tenant forms batches exactly as before (see
//! `queue`). The design, its bounds and what was measured: docs/design/fair-share.md.

use std::collections::HashMap;
use std::sync::Arc;

use embatch_protocol::headers::DEFAULT_TENANT;

use super::shape::BatchCost;

/// Who a request is for, as the batcher shares the upstream between tenants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// The tenant's name.
    pub tenant: Arc<str>,
    /// Its weight, relative to the other tenants' (at least 1).
    pub weight: u32,
    /// Its cache scope: equal inputs of one upstream call are sent once only within one scope.
    pub scope: Arc<str>,
}

impl Share {
    /// The share of the tenant named `tenant`, of `weight` (at least 1) and cache `scope`.
    pub fn new(tenant: Arc<str>, weight: u32, scope: Arc<str>) -> Share {
        Share {
            tenant,
            weight: weight.max(1),
            scope,
        }
    }
}

impl Default for Share {
    /// The default tenant: weight 1, its own scope.
    fn default() -> Share {
        let name: Arc<str> = Arc::from(DEFAULT_TENANT);
        Share {
            tenant: name.clone(),
            weight: 1,
            scope: name,
        }
    }
}

/// The units of work `inputs` inputs of `tokens` tokens count for: tokens, or inputs when the
/// batch cost counts inputs only (no tokenizer).
pub(super) fn units(cost: BatchCost, inputs: usize, tokens: u64) -> u64 {
    match cost {
        BatchCost::Inputs => inputs as u64,
        BatchCost::Padded | BatchCost::Unpadded => tokens,
    }
}

/// One tenant of a queue.
#[derive(Debug, Clone, Copy)]
struct Account {
    /// Units sent upstream for it, divided by its weight (a virtual time).
    served: f64,
    weight: u32,
    /// Its inputs waiting in the queue, and their tokens.
    inputs: usize,
    tokens: u64,
}

/// The queue's work by tenant ahead of a new request, and beside its own inputs, under the fair
/// share (see [`Fair::ahead`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Ahead {
    /// Inputs sent before the request's first one: its tenant's own waiting inputs and the
    /// other tenants' share of the same virtual time.
    pub inputs: usize,
    /// Their tokens.
    pub tokens: u64,
    /// Inputs of other tenants sent while the request's own are (their share of its work).
    pub alongside_inputs: usize,
    /// Their tokens.
    pub alongside_tokens: u64,
}

/// The tenants of one queue and their served marks.
#[derive(Debug, Default)]
pub(super) struct Fair {
    accounts: HashMap<Arc<str>, Account>,
    /// The virtual time: the mark of the last batch's head before it was charged.
    now: f64,
    /// Tenants with inputs waiting.
    waiting: usize,
}

impl Fair {
    /// `inputs` inputs of `tokens` tokens of `share`'s tenant start waiting.
    pub fn arrive(&mut self, share: &Share, inputs: usize, tokens: u64) {
        if inputs == 0 {
            return;
        }
        let now = self.now;
        let account = self
            .accounts
            .entry(share.tenant.clone())
            .or_insert(Account {
                served: now,
                weight: share.weight,
                inputs: 0,
                tokens: 0,
            });
        if account.inputs == 0 {
            account.served = account.served.max(now);
            self.waiting += 1;
        }
        account.weight = share.weight.max(1);
        account.inputs += inputs;
        account.tokens += tokens;
    }

    /// `inputs` inputs of `tokens` tokens of `tenant` left the queue (sent, expired, removed).
    pub fn leave(&mut self, tenant: &str, inputs: usize, tokens: u64) {
        let Some(account) = self.accounts.get_mut(tenant) else {
            return;
        };
        let was_waiting = account.inputs > 0;
        account.inputs = account.inputs.saturating_sub(inputs);
        account.tokens = account.tokens.saturating_sub(tokens);
        if was_waiting && account.inputs == 0 {
            self.waiting -= 1;
            // At or behind the virtual time it would be lifted to it on its return anyway.
            if account.served <= self.now {
                self.accounts.remove(tenant);
            }
        }
        if self.waiting == 0 {
            // Nobody waits: nobody is owed anything.
            self.accounts.clear();
            self.now = 0.0;
            return;
        }
        if self.accounts.len() > 2 * self.waiting + 64 {
            let now = self.now;
            self.accounts.retain(|_, a| a.inputs > 0 || a.served > now);
        }
    }

    /// `tenant`'s batch head leaves now: its mark becomes the virtual time.
    pub fn mark_head(&mut self, tenant: &str) {
        if let Some(account) = self.accounts.get(tenant) {
            self.now = self.now.max(account.served);
        }
    }

    /// Charges `units` units sent upstream to `tenant`.
    pub fn charge(&mut self, tenant: &str, units: u64) {
        if let Some(account) = self.accounts.get_mut(tenant) {
            account.served += units as f64 / f64::from(account.weight);
        }
    }

    /// Whether more than one tenant has inputs waiting: only then does the order of the queue
    /// change (a queue of one tenant forms batches in arrival order, as without tenants).
    pub fn contended(&self) -> bool {
        self.waiting > 1
    }

    /// `tenant`'s served mark and weight (the virtual time and 1 for a tenant unknown here).
    pub fn mark(&self, tenant: &str) -> (f64, u32) {
        self.accounts
            .get(tenant)
            .map_or((self.now, 1), |a| (a.served, a.weight))
    }

    /// The lowest mark of a waiting tenant: the most owed one's.
    pub fn most_owed(&self) -> Option<f64> {
        self.accounts
            .values()
            .filter(|a| a.inputs > 0)
            .map(|a| a.served)
            .min_by(f64::total_cmp)
    }

    /// The work of this queue a new request of `share` with `units_asked` units would find
    /// ahead of it and beside it (see [`Ahead`]); `None` when no other tenant waits (then
    /// everything queued is ahead of it, as without tenants). Under the fair share the request
    /// starts once its tenant's mark, past its own waiting work, is reached: by then every other
    /// tenant has been served up to that mark (or has run dry).
    pub fn ahead(&self, share: &Share, units_asked: u64, cost: BatchCost) -> Option<Ahead> {
        let others = self.waiting - usize::from(self.waiting_for(&share.tenant));
        if others == 0 {
            return None;
        }
        let (own_inputs, own_tokens, served) = match self.accounts.get(&share.tenant) {
            Some(a) if a.inputs > 0 => (a.inputs, a.tokens, a.served),
            Some(a) => (0, 0, a.served.max(self.now)),
            None => (0, 0, self.now),
        };
        let weight = f64::from(share.weight.max(1));
        let own_units = units(cost, own_inputs, own_tokens) as f64;
        let starts_at = served + own_units / weight;
        let ends_at = starts_at + units_asked as f64 / weight;
        let mut ahead = Ahead {
            inputs: own_inputs,
            tokens: own_tokens,
            ..Ahead::default()
        };
        for (tenant, other) in &self.accounts {
            if other.inputs == 0 || **tenant == *share.tenant {
                continue;
            }
            let waiting = units(cost, other.inputs, other.tokens).max(1) as f64;
            let by = |mark: f64| {
                ((mark - other.served) * f64::from(other.weight) / waiting).clamp(0.0, 1.0)
            };
            let (before, beside) = (by(starts_at), by(ends_at));
            ahead.inputs += (other.inputs as f64 * before).ceil() as usize;
            ahead.tokens += (other.tokens as f64 * before).ceil() as u64;
            ahead.alongside_inputs += (other.inputs as f64 * (beside - before)).ceil() as usize;
            ahead.alongside_tokens += (other.tokens as f64 * (beside - before)).ceil() as u64;
        }
        Some(ahead)
    }

    /// Whether `tenant` has inputs waiting.
    fn waiting_for(&self, tenant: &str) -> bool {
        self.accounts.get(tenant).is_some_and(|a| a.inputs > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(name: &str, weight: u32) -> Share {
        Share {
            tenant: name.into(),
            weight,
            scope: name.into(),
        }
    }

    #[test]
    fn a_tenant_back_from_an_idle_spell_keeps_a_lead_and_banks_no_credit() {
        let mut fair = Fair::default();
        fair.arrive(&share("c", 1), 1, 1);
        let a = share("a", 1);
        fair.arrive(&a, 10, 10);
        for _ in 0..10 {
            fair.mark_head("a");
            fair.charge("a", 1);
        }
        fair.leave("a", 10, 10);
        fair.arrive(&a, 1, 1);
        assert_eq!(
            fair.mark("a").0,
            10.0,
            "going idle for a moment wipes no lead"
        );
        fair.arrive(&share("b", 1), 1, 1);
        assert_eq!(
            fair.mark("b").0,
            9.0,
            "a newcomer starts at the virtual time"
        );
        assert_eq!(fair.most_owed(), Some(0.0), "c, never served");
        assert!(fair.contended());
    }

    #[test]
    fn a_light_tenant_has_only_its_share_of_the_others_work_ahead() {
        let mut fair = Fair::default();
        fair.arrive(&share("heavy", 1), 100, 100);
        assert_eq!(fair.ahead(&share("heavy", 1), 1, BatchCost::Unpadded), None);
        let light = share("light", 1);
        let ahead = fair
            .ahead(&light, 4, BatchCost::Unpadded)
            .expect("contended");
        assert_eq!((ahead.inputs, ahead.tokens), (0, 0), "it goes next");
        assert_eq!(ahead.alongside_inputs, 4, "heavy's equal share beside it");
        let double = fair
            .ahead(&share("light", 2), 4, BatchCost::Unpadded)
            .expect("contended");
        assert_eq!(
            double.alongside_inputs, 2,
            "weight 2: half as much beside it"
        );
    }

    #[test]
    fn idle_accounts_are_forgotten() {
        let mut fair = Fair::default();
        for i in 0..1000 {
            let tenant = format!("t{i}");
            fair.arrive(&share(&tenant, 1), 1, 1);
            fair.mark_head(&tenant);
            fair.charge(&tenant, 1);
            fair.leave(&tenant, 1, 1);
        }
        assert!(fair.accounts.is_empty(), "{}", fair.accounts.len());
        assert!(!fair.contended());
    }
}
