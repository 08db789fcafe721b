//! Admission in the actor: a request admitted (or refused) and queued, and the room a full
//! queue makes for a tenant under its share by shedding the tenant furthest over its own.

use std::sync::Arc;

use embatch_protocol::EmbedError;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::answer::{Pending, ReplyTo, answer, relay};
use super::{Actor, BULK_DEADLINE, count_shed};
use crate::Backend;
use crate::admission::{Ask, Shed, ShedReason};
use crate::fair::{Share, units};
use crate::names;
use crate::queue::{Arrival, Removed};
use crate::{BulkJob, Job, Outcome, Refused};

impl<U: Backend> Actor<U> {
    /// Admits `job` (answering the refusal, and counting it, when not) and queues it.
    pub(super) fn enqueue(&mut self, job: Job) {
        let Job {
            inputs,
            lengths,
            bytes,
            options,
            share,
            deadline,
            accepted,
            reply,
            admission,
            span,
        } = job;
        let tokens = lengths.iter().map(|&t| u64::from(t)).sum();
        let cost = self.shared.limits.budget.cost;
        let ask = Ask {
            inputs: inputs.len(),
            tokens,
            bytes,
            deadline,
            ahead: self
                .queue
                .ahead(&share, units(cost, inputs.len(), tokens), cost),
        };
        self.received += ask.inputs;
        self.last_interactive = Some(Instant::now());
        self.take_pending_credits();
        let admitted = self.admit(&share, ask).map_err(|shed| {
            count_shed(shed.reason);
            Refused {
                error: shed.error,
                retry_after: shed.retry_after,
            }
        });
        let Some(reply) = self.settle(admission, admitted, reply, ask) else {
            return;
        };
        let id = self.next_id;
        self.next_id += 1;
        let n = inputs.len();
        let held = self.held.entry(share.tenant.clone()).or_insert((0, 1));
        *held = (held.0 + n, share.weight.max(1));
        let tenant = share.tenant.clone();
        self.queue.push(
            id,
            Arrival {
                inputs,
                lengths,
                options,
                share,
                accepted,
                deadline,
            },
        );
        let (tx, rx) = oneshot::channel();
        self.relays.push(relay(id, rx, reply));
        self.requests.insert(
            id,
            Pending::new(n, accepted, ReplyTo::Interactive(tx), span).of(bytes, tenant),
        );
    }

    /// Tells the submitter the admission decision (through `admission` when it waits for one,
    /// else by answering a refusal on `reply`). Returns `reply` when the request is to be served:
    /// admitted, and its submitter still there (else its share of the ledger is freed).
    fn settle(
        &mut self,
        admission: Option<oneshot::Sender<Result<(), Refused>>>,
        admitted: Result<(), Refused>,
        reply: oneshot::Sender<Outcome>,
        ask: Ask,
    ) -> Option<oneshot::Sender<Outcome>> {
        match (admission, admitted) {
            (Some(admission), admitted) => {
                let ok = admitted.is_ok();
                if admission.send(admitted).is_err() && ok {
                    // The submitter went away before the answer: nothing to serve.
                    self.ledger.release(ask.inputs, ask.bytes);
                    self.unqueue(Removed {
                        inputs: ask.inputs,
                        tokens: ask.tokens,
                    });
                    return None;
                }
                ok.then_some(reply)
            }
            (None, Err(refused)) => {
                metrics::counter!(names::REQUESTS, "outcome" => refused.error.kind()).increment(1);
                let _ = reply.send(Err(refused.error));
                None
            }
            (None, Ok(())) => Some(reply),
        }
    }

    /// Takes the admission credits the handles left for the actor: a backlog window after a
    /// reconnect, and resent copies' inputs.
    fn take_pending_credits(&mut self) {
        if let Some(until) = self
            .shared
            .backlog_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            self.ledger.absorb_backlog_until(until);
        }
        if let Some((inputs, at)) = self
            .shared
            .resent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            self.ledger
                .excuse_resent(inputs, at, embatch_protocol::headers::RESEND_BACKLOG_WINDOW);
        }
    }

    /// The ledger's admission of `ask`; when the queue is full, first sheds queued work of the
    /// tenants furthest over their share, while they are further over than `share`'s tenant
    /// would be with this request ([`Actor::make_room`]).
    fn admit(&mut self, share: &Share, ask: Ask) -> Result<(), Shed> {
        loop {
            match self.ledger.admit(&self.shared.limits, ask, Instant::now()) {
                Err(shed) if shed.reason.is_full() && self.make_room(share, ask) => continue,
                admitted => return admitted,
            }
        }
    }

    /// Sheds (429) the newest queued request, none of whose inputs was sent, of the tenant
    /// holding the most inputs for its weight, if it holds more for its weight than `share`'s
    /// tenant would with `ask`'s. Returns whether it shed one.
    fn make_room(&mut self, share: &Share, ask: Ask) -> bool {
        let weight = |w: u32| f64::from(w.max(1));
        let own = self.held.get(&share.tenant).map_or(0, |(n, _)| *n);
        let own = (own + ask.inputs) as f64 / weight(share.weight);
        let mut over: Vec<(f64, Arc<str>)> = self
            .held
            .iter()
            .filter(|(tenant, _)| **tenant != share.tenant)
            .map(|(tenant, &(n, w))| (n as f64 / weight(w), tenant.clone()))
            .filter(|(held, _)| *held > own)
            .collect();
        over.sort_by(|a, b| b.0.total_cmp(&a.0));
        let Some((tenant, id)) = over
            .into_iter()
            .find_map(|(_, tenant)| Some((tenant.clone(), self.queue.newest_unstarted(&tenant)?)))
        else {
            return false;
        };
        let removed = self.queue.remove(id);
        self.unqueue(removed);
        let retry = self.ledger.retry_after(&self.shared.limits, Instant::now());
        if let Some(request) = self.take(id) {
            count_shed(ShedReason::FairShare);
            let message = format!(
                "shed for a tenant under its share: tenant `{tenant}` holds the most of this \
                 worker's queue for its weight; retry in ~{} ms",
                retry.as_millis()
            );
            answer(&self.meters, request, Err(EmbedError::Overloaded(message)));
        }
        true
    }

    /// Queues a bulk request apart from the interactive queue: no admission, no share of the
    /// bounds, no deadline (the bulk lane drops its receiver to cancel it).
    pub(super) fn enqueue_bulk(&mut self, job: BulkJob) {
        let BulkJob {
            inputs,
            lengths,
            options,
            share,
            reply,
        } = job;
        let id = self.next_id;
        self.next_id += 1;
        let n = inputs.len();
        let now = Instant::now();
        self.bulk.push(
            id,
            Arrival {
                inputs,
                lengths,
                options,
                share,
                accepted: now,
                deadline: now + BULK_DEADLINE,
            },
        );
        let (tx, rx) = oneshot::channel();
        self.relays.push(relay(id, rx, reply));
        self.requests.insert(
            id,
            Pending::new(n, now, ReplyTo::Bulk(tx), tracing::Span::none()),
        );
    }
}
