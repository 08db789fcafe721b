//! Single-flight: one upstream computation per key among the requests a worker holds.
//!
//! The first request that needs a key's vector and finds it neither cached nor in flight
//! [leads](Lead) it: it alone sends the input upstream. A request that needs the same key
//! meanwhile (another request, or a later position of the same request) waits for the leader's
//! result instead, and gets its own copy of it. The leader publishes the result with
//! [`Lead::resolve`]; a leader dropped without a result (its call failed, its request was
//! withdrawn, expired or shed) abandons the key: its waiters learn it at once
//! ([`Wait::result`] is `None`) and send the input themselves, so no waiter inherits an error
//! that was its leader's alone (another input of the leader's request, the leader's deadline).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::entry::Entry;
use super::key::Key;

/// The keys in flight, each with the channel its result will be published on.
#[derive(Default)]
pub(crate) struct Flights {
    map: Mutex<HashMap<Key, watch::Receiver<Option<Entry>>>>,
}

/// What a request gets for a key: to lead it, or to wait for its leader.
pub(crate) enum Joined {
    /// No one computes this key: the caller does, and must resolve or drop the lead.
    Lead(Lead),
    /// Another request computes it.
    Wait(Wait),
}

/// The duty to compute one key; dropping it unresolved abandons the key.
pub(crate) struct Lead {
    key: Key,
    tx: watch::Sender<Option<Entry>>,
    flights: Arc<Flights>,
}

/// A wait for another request's result for one key.
pub(crate) struct Wait(watch::Receiver<Option<Entry>>);

impl Flights {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, watch::Receiver<Option<Entry>>>> {
        self.map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Leads `key` when no one else does, else waits for its leader.
    pub(crate) fn join(self: &Arc<Self>, key: Key) -> Joined {
        let mut map = self.lock();
        if let Some(rx) = map.get(&key)
            && rx.has_changed().is_ok()
        {
            return Joined::Wait(Wait(rx.clone()));
        }
        let (tx, rx) = watch::channel(None);
        map.insert(key, rx);
        Joined::Lead(Lead {
            key,
            tx,
            flights: Arc::clone(self),
        })
    }

    /// A lead of `key` that no one else can join or wait for: for a request that bypasses the
    /// cache, whose results must be its own upstream work.
    pub(crate) fn private(self: &Arc<Self>, key: Key) -> Lead {
        let (tx, _) = watch::channel(None);
        Lead {
            key,
            tx,
            flights: Arc::clone(self),
        }
    }

    /// Keys in flight.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

impl Lead {
    /// The key led.
    pub(crate) fn key(&self) -> Key {
        self.key
    }

    /// Publishes the key's result to its waiters and ends the flight.
    pub(crate) fn resolve(self, entry: Entry) {
        self.tx.send_replace(Some(entry));
        // Drop removes the key from the map.
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        let mut map = self.flights.lock();
        if map
            .get(&self.key)
            .is_some_and(|rx| rx.same_channel(&self.tx.subscribe()))
        {
            map.remove(&self.key);
        }
    }
}

impl Wait {
    /// The leader's result; `None` when the leader abandoned the key (see the module docs).
    pub(crate) async fn result(mut self) -> Option<Entry> {
        self.0
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|r| r.clone())
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::key::test_key;
    use embatch_batcher::Embedding;

    fn key(text: &str) -> Key {
        test_key(text)
    }

    fn entry() -> Entry {
        Entry {
            embedding: Embedding::from_json(Bytes::from_static(b"[1,2]")),
            tokens: Some(3),
        }
    }

    #[tokio::test]
    async fn waiters_get_the_leaders_result_and_the_key_is_free_again() {
        let flights = Arc::new(Flights::default());
        let Joined::Lead(lead) = flights.join(key("a")) else {
            panic!("the first request leads");
        };
        let Joined::Wait(first) = flights.join(key("a")) else {
            panic!("the second waits");
        };
        let Joined::Wait(second) = flights.join(key("a")) else {
            panic!("the third waits");
        };
        assert!(
            matches!(flights.join(key("b")), Joined::Lead(_)),
            "another key"
        );
        let waiting = tokio::spawn(first.result());
        lead.resolve(entry());
        assert_eq!(waiting.await.expect("joins"), Some(entry()));
        assert_eq!(
            second.result().await,
            Some(entry()),
            "a late waiter still gets it"
        );
        assert_eq!(flights.len(), 0, "b's lead was dropped, a's resolved");
        assert!(
            matches!(flights.join(key("a")), Joined::Lead(_)),
            "a leads anew"
        );
    }

    #[tokio::test]
    async fn a_private_lead_is_not_joined_and_leaves_the_flight_alone() {
        let flights = Arc::new(Flights::default());
        let Joined::Lead(public) = flights.join(key("a")) else {
            panic!("leads");
        };
        let private = flights.private(key("a"));
        drop(private);
        assert_eq!(flights.len(), 1, "the public lead is still in flight");
        assert!(matches!(flights.join(key("a")), Joined::Wait(_)));
        drop(public);
        assert_eq!(flights.len(), 0);
    }

    #[tokio::test]
    async fn an_abandoned_lead_tells_its_waiters_at_once() {
        let flights = Arc::new(Flights::default());
        let Joined::Lead(lead) = flights.join(key("a")) else {
            panic!("leads");
        };
        let Joined::Wait(wait) = flights.join(key("a")) else {
            panic!("waits");
        };
        let waiting = tokio::spawn(wait.result());
        drop(lead);
        assert_eq!(waiting.await.expect("joins"), None);
        assert_eq!(flights.len(), 0);
        assert!(matches!(flights.join(key("a")), Joined::Lead(_)));
    }
}
