//! A cached value: one input's embedding exactly as the upstream wrote it, and its token count.
//!
//! The worker never decodes a float (see [`embatch_batcher::Embedding`]): a reply is the
//! upstream's own JSON text of each vector, joined. Storing that text, byte for byte, is what
//! makes a hit answer exactly what a miss would; decoding to `f32`s and writing them again
//! could round differently than the upstream did. The token count is kept beside it so that a
//! reply made of hits still reports its tokens ([`embatch_protocol::headers::TOKENS`]) without
//! running the tokenizer (or TEI's `/tokenize`) again.
//!
//! Encoding in the shared bucket ([`Entry::encode`]): one format byte `1`, the token count as
//! a little-endian `u32` (`u32::MAX`: not counted), then the embedding's JSON text.

use bytes::{BufMut, Bytes, BytesMut};

use embatch_batcher::Embedding;

/// The encoding's format byte.
const FORMAT: u8 = 1;
/// Bytes before the JSON text.
const HEADER: usize = 5;
/// The encoded token count of an input whose tokens were not counted.
const UNCOUNTED: u32 = u32::MAX;

/// One input's cached result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The embedding, as the upstream wrote it.
    pub embedding: Embedding,
    /// The input's tokens as the worker's tokenizer counted them; `None` without a tokenizer.
    pub tokens: Option<u32>,
}

impl Entry {
    /// Bytes this entry holds (the JSON text and its header), for the LRU's byte bound.
    pub(crate) fn size(&self) -> usize {
        self.embedding.json().len() + HEADER
    }

    /// This entry in an allocation of its own, and its value for the shared bucket: one copy,
    /// the bucket's encoding ([`Entry::encode`]), whose JSON text the returned entry is a slice
    /// of. An embedding fresh from a reply is a slice of the whole upstream response body
    /// (every vector of its call); kept in the LRU as it is, one entry would hold that body
    /// alive, so the LRU's byte bound would count a fraction of the memory it keeps (up to the
    /// batch size times more), and the process would take fresh pages from the system for
    /// every reply instead of reusing freed ones.
    pub(crate) fn compact(&self) -> (Entry, Bytes) {
        let encoded = self.encode();
        let entry = Entry {
            embedding: Embedding::from_json(encoded.slice(HEADER..)),
            tokens: self.tokens,
        };
        (entry, encoded)
    }

    /// The value stored in the shared bucket (see the module docs).
    pub(crate) fn encode(&self) -> Bytes {
        let json = self.embedding.json();
        let mut value = BytesMut::with_capacity(HEADER + json.len());
        value.put_u8(FORMAT);
        value.put_u32_le(self.tokens.unwrap_or(UNCOUNTED));
        value.put_slice(json);
        value.freeze()
    }

    /// Reads a value of the shared bucket; `None` when it is not one this worker wrote (another
    /// format, or too short to hold a vector).
    pub(crate) fn decode(value: Bytes) -> Option<Entry> {
        if value.len() < HEADER + 2 || value[0] != FORMAT {
            return None;
        }
        let tokens = u32::from_le_bytes([value[1], value[2], value[3], value[4]]);
        let json = value.slice(HEADER..);
        if json.first() != Some(&b'[') || json.last() != Some(&b']') {
            return None;
        }
        Some(Entry {
            embedding: Embedding::from_json(json),
            tokens: (tokens != UNCOUNTED).then_some(tokens),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_the_upstreams_text_byte_for_byte() {
        for tokens in [Some(7), None] {
            let entry = Entry {
                embedding: Embedding::from_json(Bytes::from_static(b"[0.10000000149,-2e-3, 1E+2]")),
                tokens,
            };
            assert_eq!(Entry::decode(entry.encode()), Some(entry));
        }
        assert_eq!(Entry::decode(Bytes::from_static(b"\x02\0\0\0\0[1]")), None);
        assert_eq!(Entry::decode(Bytes::from_static(b"\x01\0\0\0\0x")), None);
    }

    #[test]
    fn a_compact_entry_holds_a_copy_not_the_whole_reply() {
        let body = Bytes::from(b"[[1.5,2],[3,4]]".to_vec());
        let entry = Entry {
            embedding: Embedding::from_json(body.slice(1..8)),
            tokens: Some(3),
        };
        let (compact, encoded) = entry.compact();
        assert_eq!(compact, entry, "the same text and tokens");
        assert_eq!(encoded, entry.encode(), "and the bucket's value");
        assert!(
            !body
                .as_ptr_range()
                .contains(&compact.embedding.json().as_ptr()),
            "the copy is not inside the reply's allocation"
        );
    }
}
