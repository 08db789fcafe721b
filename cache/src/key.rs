//! The cache key: a SHA-256 of the model, the options that change the vector, and the input.
//!
//! Two requests may share an entry only when the upstream would answer them with the same
//! vector. The digest covers, each field length-prefixed and tagged so that no two different
//! tuples encode to the same bytes:
//! - a format tag ([`FORMAT`]): a new key layout never meets an old entry;
//! - the model's identity ([`ModelIdentity`]): `model_id`, `model_sha`, `model_dtype`,
//!   `model_type` (the pooling) and `version` from the upstream's TEI-shaped `/info`, and the
//!   operator's `CACHE_REVISION` (for weights that change under the same name and report no
//!   `model_sha`, like the built-in model's directory);
//! - every option of [`EmbedOptions`]: `normalize`, `truncate`, `truncation_direction`,
//!   `prompt_name`, `dimensions` (an absent option and its default are different keys: the
//!   upstream's default may change);
//! - the exact input: the text's UTF-8 bytes, or the token ids (a text and the ids of the same
//!   characters are different inputs);
//! - the tenant's cache scope (its `cache_group`, or its own name; see docs/tenants.md), except
//!   for the scope [`DEFAULT_TENANT`]: its keys are those of the layout before tenants, so an
//!   open deployment keeps its cache across the upgrade. Entries of one scope are never
//!   answered, nor shared in flight, for another.

use embatch_protocol::headers::DEFAULT_TENANT;
use embatch_protocol::{EmbedOptions, Input, Task, TruncationDirection};
use sha2::{Digest, Sha256};

/// The key layout's version, hashed first.
const FORMAT: &[u8] = b"embatch-cache/1";

/// A cache key: 32 bytes of SHA-256.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key([u8; 32]);

impl Key {
    /// Lower-case hex, 64 characters: a valid JetStream KV key.
    pub(crate) fn hex(&self) -> String {
        use std::fmt::Write;
        let mut hex = String::with_capacity(64);
        for byte in self.0 {
            let _ = write!(hex, "{byte:02x}");
        }
        hex
    }
}

/// What a worker's model is, as far as its vectors go: the fields of the upstream's `/info`
/// that name the weights and the code computing them, and the operator's `CACHE_REVISION`.
#[derive(Debug, Clone)]
pub(crate) struct ModelIdentity {
    /// The canonical text hashed into every key (also logged at start).
    text: String,
}

/// The `/info` fields of a [`ModelIdentity`], in hashing order.
const IDENTITY_FIELDS: [&str; 5] = [
    "model_id",
    "model_sha",
    "model_dtype",
    "model_type",
    "version",
];

impl ModelIdentity {
    /// The identity of the model described by `info` (TEI's `/info` document, or the built-in
    /// model's document in its shape) and the operator's `revision` (empty when unset). `None`
    /// when `info` names no `model_id`: an unnamed model must not share entries.
    pub(crate) fn from_info(info: &serde_json::Value, revision: &str) -> Option<ModelIdentity> {
        info.get("model_id")?.as_str()?;
        let mut text = String::new();
        for field in IDENTITY_FIELDS {
            // serde_json writes object keys sorted: the text is canonical.
            let value = info.get(field).unwrap_or(&serde_json::Value::Null);
            text.push_str(field);
            text.push('=');
            text.push_str(&value.to_string());
            text.push(';');
        }
        text.push_str("revision=");
        text.push_str(&serde_json::Value::from(revision).to_string());
        Some(ModelIdentity { text })
    }

    /// The identity of a model the upstream did not name: keys only the single-flight of one
    /// worker (whose upstream serves one model), never the cache.
    pub(crate) fn unknown(revision: &str) -> ModelIdentity {
        ModelIdentity {
            text: format!(
                "model_id=null;revision={}",
                serde_json::Value::from(revision)
            ),
        }
    }

    /// The canonical text hashed into every key.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// The hasher every key of a request with `options` in the cache scope `scope` starts
    /// from: the format, this model, the scope (none for [`DEFAULT_TENANT`]) and the options;
    /// [`Prefix::key`] adds one input.
    pub(crate) fn prefix(&self, options: &EmbedOptions, scope: &str) -> Prefix {
        let mut hasher = Sha256::new();
        field(&mut hasher, b'F', FORMAT);
        field(&mut hasher, b'M', self.text.as_bytes());
        if scope != DEFAULT_TENANT {
            field(&mut hasher, b'S', scope.as_bytes());
        }
        field(&mut hasher, b'n', &[u8::from(options.normalize)]);
        let truncate = match options.truncate {
            None => 0,
            Some(false) => 1,
            Some(true) => 2,
        };
        field(&mut hasher, b't', &[truncate]);
        let direction = match options.truncation_direction {
            None => 0,
            Some(TruncationDirection::Left) => 1,
            Some(TruncationDirection::Right) => 2,
        };
        field(&mut hasher, b'd', &[direction]);
        match &options.prompt_name {
            None => field(&mut hasher, b'p', &[]),
            Some(name) => field(&mut hasher, b'P', name.as_bytes()),
        }
        match options.dimensions {
            None => field(&mut hasher, b'm', &[]),
            Some(dimensions) => field(&mut hasher, b'D', &(dimensions as u64).to_le_bytes()),
        }
        // Only another task adds a field: the keys of embeddings stay those of earlier workers.
        match options.task {
            Task::Embed => {}
            Task::Rerank { raw_scores } => field(&mut hasher, b'R', &[u8::from(raw_scores)]),
            // A sparse embedding of a text is not its dense one: a namespace of its own.
            Task::Sparse => field(&mut hasher, b'Z', &[]),
            // Predictions and token vectors: namespaces of their own, as sparse's.
            Task::Predict { raw_scores } => field(&mut hasher, b'C', &[u8::from(raw_scores)]),
            Task::EmbedAll => field(&mut hasher, b'A', &[]),
        }
        Prefix(hasher)
    }
}

/// A hasher fed with a model and options (see [`ModelIdentity::prefix`]).
#[derive(Clone)]
pub(crate) struct Prefix(Sha256);

impl Prefix {
    /// The key of `input` under this prefix's model and options.
    pub(crate) fn key(&self, input: &Input) -> Key {
        let mut hasher = self.0.clone();
        match input {
            Input::Text(text) => field(&mut hasher, b'T', text.as_bytes()),
            Input::Ids(ids) => {
                hasher.update([b'I']);
                hasher.update((ids.len() as u64).to_le_bytes());
                for id in ids {
                    hasher.update(id.to_le_bytes());
                }
            }
            Input::Pair(query, text) => {
                field(&mut hasher, b'Q', query.as_bytes());
                field(&mut hasher, b'X', text.as_bytes());
            }
        }
        Key(hasher.finalize().into())
    }
}

/// Feeds one tagged, length-prefixed field.
fn field(hasher: &mut Sha256, tag: u8, bytes: &[u8]) {
    hasher.update([tag]);
    hasher.update((bytes.len() as u64).to_le_bytes());
    hasher.update(bytes);
}

/// A key for `text` under a model `m` with the default options (tests of the cache's tiers).
#[cfg(test)]
pub(crate) fn test_key(text: &str) -> Key {
    let info = serde_json::json!({"model_id": "m"});
    ModelIdentity::from_info(&info, "")
        .expect("named")
        .prefix(&embatch_protocol::EmbedOptions::default(), DEFAULT_TENANT)
        .key(&embatch_protocol::Input::Text(text.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(sha: &str, revision: &str) -> ModelIdentity {
        let info =
            serde_json::json!({"model_id": "org/model", "model_sha": sha, "version": "1.9.3"});
        ModelIdentity::from_info(&info, revision).expect("named")
    }

    fn key(identity: &ModelIdentity, options: &EmbedOptions, input: &Input) -> Key {
        identity.prefix(options, DEFAULT_TENANT).key(input)
    }

    #[test]
    fn every_option_the_model_and_the_input_change_the_key() {
        let model = identity("abc", "");
        let text = Input::Text("hello".into());
        let base = key(&model, &EmbedOptions::default(), &text);
        assert_eq!(base, key(&model, &EmbedOptions::default(), &text), "stable");
        assert_eq!(base.hex().len(), 64);
        let variants = [
            EmbedOptions {
                normalize: false,
                ..EmbedOptions::default()
            },
            EmbedOptions {
                truncate: Some(true),
                ..EmbedOptions::default()
            },
            EmbedOptions {
                truncate: Some(false),
                ..EmbedOptions::default()
            },
            EmbedOptions {
                truncation_direction: Some(TruncationDirection::Left),
                ..EmbedOptions::default()
            },
            EmbedOptions {
                truncation_direction: Some(TruncationDirection::Right),
                ..EmbedOptions::default()
            },
            EmbedOptions {
                prompt_name: Some("query".into()),
                ..EmbedOptions::default()
            },
            EmbedOptions {
                prompt_name: Some(String::new()),
                ..EmbedOptions::default()
            },
            EmbedOptions {
                dimensions: Some(4),
                ..EmbedOptions::default()
            },
            // A sparse embedding: not the dense one of the same options.
            EmbedOptions {
                normalize: false,
                task: Task::Sparse,
                ..EmbedOptions::default()
            },
        ];
        let mut seen = std::collections::HashSet::from([base]);
        for options in &variants {
            assert!(seen.insert(key(&model, options, &text)), "{options:?}");
        }
        for other in [identity("abd", ""), identity("abc", "2")] {
            assert!(seen.insert(key(&other, &EmbedOptions::default(), &text)));
        }
        for input in [
            Input::Text("hello ".into()),
            Input::Text("Hello".into()),
            Input::Ids(vec![104, 101, 108, 108, 111]),
            Input::Ids(vec![104, 101, 108, 108]),
        ] {
            assert!(
                seen.insert(key(&model, &EmbedOptions::default(), &input)),
                "{input:?}"
            );
        }
    }

    #[test]
    fn an_unnamed_model_has_no_identity() {
        assert!(ModelIdentity::from_info(&serde_json::json!({"model_sha": "x"}), "").is_none());
        let info =
            serde_json::json!({"model_id": "a", "model_type": {"embedding": {"pooling": "cls"}}});
        let text = ModelIdentity::from_info(&info, "r1")
            .expect("named")
            .text()
            .to_owned();
        assert!(
            text.contains(r#"model_type={"embedding":{"pooling":"cls"}}"#),
            "{text}"
        );
        assert!(text.ends_with(r#"revision="r1""#), "{text}");
    }

    #[test]
    fn each_cache_scope_has_its_own_keys_and_the_default_keeps_the_old_ones() {
        let model = identity("abc", "");
        let text = Input::Text("hello".into());
        let options = EmbedOptions::default();
        let scoped = |scope| model.prefix(&options, scope).key(&text);
        assert_ne!(scoped("search"), scoped("ads"));
        assert_eq!(scoped("acme"), scoped("acme"));
        assert_ne!(scoped("search"), scoped(DEFAULT_TENANT));
        // The layout before tenants: format, model, options, input (no scope field).
        let mut hasher = Sha256::new();
        field(&mut hasher, b'F', FORMAT);
        field(&mut hasher, b'M', model.text().as_bytes());
        field(&mut hasher, b'n', &[1]);
        field(&mut hasher, b't', &[0]);
        field(&mut hasher, b'd', &[0]);
        field(&mut hasher, b'p', &[]);
        field(&mut hasher, b'm', &[]);
        field(&mut hasher, b'T', b"hello");
        assert_eq!(scoped(DEFAULT_TENANT), Key(hasher.finalize().into()));
    }
}
