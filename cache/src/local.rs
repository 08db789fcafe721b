//! The in-process tier: a least-recently-used map bounded by bytes (`CACHE_LOCAL_BYTES`), in
//! front of the shared bucket. A hit here costs a hash and a lock, no network.

use std::sync::Mutex;

use lru::LruCache;

use super::entry::Entry;
use super::key::Key;

/// Bytes counted per entry beyond its value: the key and the map's bookkeeping (an estimate).
const OVERHEAD: usize = 96;

/// The LRU and the bytes it holds.
struct Inner {
    map: LruCache<Key, Entry>,
    bytes: usize,
}

/// An LRU of entries holding at most `max_bytes` bytes (values plus [`OVERHEAD`] each).
pub(crate) struct Local {
    inner: Mutex<Inner>,
    max_bytes: usize,
}

impl Local {
    /// An empty LRU bounded to `max_bytes` bytes.
    pub(crate) fn new(max_bytes: usize) -> Local {
        Local {
            inner: Mutex::new(Inner {
                map: LruCache::unbounded(),
                bytes: 0,
            }),
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The entry for `key`, marked most recently used.
    pub(crate) fn get(&self, key: &Key) -> Option<Entry> {
        self.lock().map.get(key).cloned()
    }

    /// Stores `entry` as the most recently used, evicting the least recently used entries
    /// until the bytes fit (an entry larger than the whole bound is not stored).
    pub(crate) fn insert(&self, key: Key, entry: Entry) {
        let size = entry.size() + OVERHEAD;
        if size > self.max_bytes {
            return;
        }
        let mut evicted = 0u64;
        let bytes = {
            let mut inner = self.lock();
            if let Some(old) = inner.map.put(key, entry) {
                inner.bytes = inner.bytes.saturating_sub(old.size() + OVERHEAD);
            }
            inner.bytes += size;
            while inner.bytes > self.max_bytes {
                let Some((_, old)) = inner.map.pop_lru() else {
                    break;
                };
                inner.bytes = inner.bytes.saturating_sub(old.size() + OVERHEAD);
                evicted += 1;
            }
            inner.bytes
        };
        if evicted > 0 {
            crate::meters::METERS.evictions.increment(evicted);
        }
        crate::meters::METERS.bytes.set(bytes as f64);
    }

    /// Entries and bytes held.
    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.map.len(), inner.bytes)
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

    fn entry(len: usize) -> Entry {
        let mut json = vec![b'1'; len];
        json[0] = b'[';
        json[len - 1] = b']';
        Entry {
            embedding: Embedding::from_json(Bytes::from(json)),
            tokens: None,
        }
    }

    #[test]
    fn evicts_the_least_recently_used_to_stay_within_its_bytes() {
        let one = entry(100).size() + OVERHEAD;
        let local = Local::new(3 * one);
        for text in ["a", "b", "c"] {
            local.insert(key(text), entry(100));
        }
        assert!(local.get(&key("a")).is_some(), "a is now the most recent");
        local.insert(key("d"), entry(100));
        assert!(
            local.get(&key("b")).is_none(),
            "b was the least recently used"
        );
        for text in ["a", "c", "d"] {
            assert!(local.get(&key(text)).is_some(), "{text}");
        }
        assert_eq!(local.held(), (3, 3 * one));
        local.insert(key("a"), entry(100));
        assert_eq!(
            local.held(),
            (3, 3 * one),
            "replacing counts the bytes once"
        );
        local.insert(key("huge"), entry(4 * one));
        assert!(
            local.get(&key("huge")).is_none(),
            "larger than the bound: not kept"
        );
        assert_eq!(local.held().0, 3);
    }
}
