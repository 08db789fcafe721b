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
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;

use super::entry::Entry;
use super::key::Key;

/// The keys in flight, each with the channel its result will be published on, made when the
/// first waiter comes: most keys never get a waiter, so most leads cost one map entry and no
/// channel, no wake-up. A key's entry is its one lead's from [`Flights::join`] until that lead
/// ends (no one else can lead the key meanwhile), so ending a lead removes the key's entry.
#[derive(Default)]
pub(crate) struct Flights {
    map: Mutex<Map>,
}

/// The channel of each key in flight; `None` until a waiter comes.
type Map = HashMap<Key, Option<watch::Sender<Option<Entry>>>>;

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
    /// The flights it is in; `None` for a private lead (which no one can wait for), and once
    /// the lead has ended.
    flights: Option<Arc<Flights>>,
}

/// A wait for another request's result for one key.
pub(crate) struct Wait(watch::Receiver<Option<Entry>>);

impl Flights {
    fn lock(&self) -> MutexGuard<'_, Map> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Leads `key` when no one else does, else waits for its leader.
    pub(crate) fn join(self: &Arc<Self>, key: Key) -> Joined {
        let mut map = self.lock();
        if let Some(tx) = map.get_mut(&key) {
            let tx = tx.get_or_insert_with(|| watch::Sender::new(None));
            return Joined::Wait(Wait(tx.subscribe()));
        }
        map.insert(key, None);
        Joined::Lead(Lead {
            key,
            flights: Some(Arc::clone(self)),
        })
    }

    /// A lead of `key` that no one else can join or wait for: for a request that bypasses the
    /// cache, whose results must be its own upstream work.
    pub(crate) fn private(self: &Arc<Self>, key: Key) -> Lead {
        Lead { key, flights: None }
    }

    /// Ends the flight of `key`: no one can join it any more. Returns its channel when it had
    /// waiters.
    fn end(&self, key: &Key) -> Option<watch::Sender<Option<Entry>>> {
        self.lock().remove(key).flatten()
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
    pub(crate) fn resolve(mut self, entry: Entry) {
        if let Some(tx) = self.flights.take().and_then(|f| f.end(&self.key)) {
            tx.send_replace(Some(entry));
        }
    }
}

impl Drop for Lead {
    /// Abandons the key: its waiters' channel closes without a result.
    fn drop(&mut self) {
        if let Some(flights) = self.flights.take() {
            flights.end(&self.key);
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
    async fn a_channel_is_made_only_for_a_key_someone_waits_for() {
        let flights = Arc::new(Flights::default());
        let Joined::Lead(alone) = flights.join(key("a")) else {
            panic!("leads a");
        };
        let Joined::Lead(_awaited) = flights.join(key("b")) else {
            panic!("leads b");
        };
        let Joined::Wait(_wait) = flights.join(key("b")) else {
            panic!("waits for b");
        };
        let channels = |k: &str| flights.lock().get(&key(k)).map(Option::is_some);
        assert_eq!(channels("a"), Some(false), "no waiter, no channel");
        assert_eq!(channels("b"), Some(true));
        alone.resolve(entry());
        assert_eq!(channels("a"), None, "resolved: the key is free again");
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
