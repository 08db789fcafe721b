//! Withdrawal: a message on `<subject>.cancel` carrying a request's
//! [`headers::REQUEST_ID`](embatch_protocol::headers::REQUEST_ID) drops it (no reply, no upstream
//! work).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

/// Requests in the batcher that carry a [`headers::REQUEST_ID`], by id: cancelling one ends the
/// task waiting for its outcome without a reply, which drops its receiver, and the batcher then
/// drops the request before it costs upstream work (see `batcher`).
#[derive(Default)]
pub(crate) struct Withdrawable {
    by_id: Mutex<HashMap<Arc<str>, CancellationToken>>,
}

impl Withdrawable {
    pub(super) fn insert(&self, id: Arc<str>, handle: CancellationToken) {
        self.by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, handle);
    }

    /// Whether the request with this id is held here.
    pub(super) fn holds(&self, id: &str) -> bool {
        self.by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(id)
    }

    pub(super) fn remove(&self, id: &str) -> Option<CancellationToken> {
        self.by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id)
    }

    /// Withdraws the request with the id in `payload`, if this worker holds it.
    fn cancel(&self, payload: &[u8]) {
        let Ok(id) = std::str::from_utf8(payload) else {
            return;
        };
        if let Some(handle) = self.remove(id.trim()) {
            handle.cancel();
            metrics::counter!(crate::telemetry::names::REQUESTS, "outcome" => "cancelled")
                .increment(1);
        }
    }
}

/// A request's entry in [`Withdrawable`], made when it arrives and removed when dropped (once
/// it is answered or refused).
pub(super) struct Registration(pub(super) Option<(Arc<Withdrawable>, Arc<str>)>);

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some((registry, id)) = self.0.take() {
            registry.remove(&id);
        }
    }
}

/// Withdraws the requests named on `cancels` (the [`headers::cancel_subject`]) until `stop` is
/// cancelled or the subscription ends.
pub(crate) async fn withdraw(
    mut cancels: impl futures::Stream<Item = async_nats::Message> + Unpin,
    withdrawable: Arc<Withdrawable>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            cancel = cancels.next() => match cancel {
                Some(cancel) => withdrawable.cancel(&cancel.payload),
                None => return,
            },
            () = stop.cancelled() => return,
        }
    }
}
