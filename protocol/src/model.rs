//! Many models behind one subject prefix (contract v1.1, additive): how a model's name becomes a
//! NATS subject, and back.
//!
//! A worker serves one model. Its *model name* is its `MODEL_ALIAS` when set, else the model id
//! (TEI's `/info` `model_id`, or the built-in model's id, e.g.
//! `sentence-transformers/all-MiniLM-L6-v2`). Requests for that model are sent on the *model
//! subject* `<subject>.<token>` ([`model_subject`]), where `<token>` is the name with the
//! characters NATS gives a meaning in subjects percent-encoded ([`model_token`]):
//!
//! | character | encoded |
//! |---|---|
//! | `%` | `%25` |
//! | `.` (the token separator) | `%2E` |
//! | `*`, `>` (wildcards) | `%2A`, `%3E` |
//! | whitespace, control characters, anything not ASCII | each UTF-8 byte as `%XX` |
//!
//! Hex digits are uppercase; every other character (letters, digits, `/`, `-`, `_`, `:`, `@`,
//! ...) stays as it is, so `BAAI/bge-small-en-v1.5` is `embed.BAAI/bge-small-en-v1%2E5`. The
//! encoding is reversible ([`model_name`]) and a token is always one valid NATS subject token
//! (non-empty, no separator, no wildcard, no whitespace).
//!
//! A model subject is a v1 subject in full: its derived subjects are those of the plain
//! subject with the model subject as their base (`<subject>.<token>.info`,
//! `<subject>.<token>.cancel`, `<subject>.<token>.alive`), in the same queue group name, and
//! a v1 client pointed at the model subject works unchanged. Queue groups are per subject in
//! NATS, so each model's workers form their own group and scale apart.
//!
//! The *default model* still answers on the plain `<subject>` (see `EMBATCH_DEFAULT_MODEL`), so
//! clients of the v1 contract keep working. Model names whose token would be one of the plain
//! subject's own suffixes ([`RESERVED_TOKENS`]) are refused.

use std::fmt;

/// Tokens the plain subject already uses for its own derived subjects (`<subject>.cancel`,
/// `.info`, `.members`, `.alive`, `.room`, and the routes' subjects: `.rerank` of v1.2, `.embed_sparse`,
/// `.tokenize` and `.decode` of v1.3, `.predict`, `.embed_all` and `.similarity` of v1.4): a
/// model whose token is one of them would collide, and a worker refuses to start with it.
pub const RESERVED_TOKENS: &[&str] = &[
    "cancel",
    "info",
    "members",
    "alive",
    "room",
    "rerank",
    "embed_sparse",
    "tokenize",
    "decode",
    "predict",
    "embed_all",
    "similarity",
];

/// The subject token of model `name`: see the module docs for the encoding. Empty for an empty
/// name (which [`check_name`] refuses).
pub fn model_token(name: &str) -> String {
    let mut token = String::with_capacity(name.len());
    for c in name.chars() {
        let plain = c.is_ascii_graphic() && !matches!(c, '%' | '.' | '*' | '>');
        if plain {
            token.push(c);
        } else {
            let mut bytes = [0u8; 4];
            for byte in c.encode_utf8(&mut bytes).bytes() {
                token.push('%');
                token.push(hex_digit(byte >> 4));
                token.push(hex_digit(byte & 0x0F));
            }
        }
    }
    token
}

fn hex_digit(nibble: u8) -> char {
    char::from(b"0123456789ABCDEF"[usize::from(nibble & 0x0F)])
}

/// The subject requests for model `name` are sent on: `<subject>.<token>` (see
/// [`model_token`]), e.g. `embed.BAAI/bge-small-en-v1%2E5`.
pub fn model_subject(subject: &str, name: &str) -> String {
    format!("{subject}.{}", model_token(name))
}

/// Why a model name or token is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelNameError {
    /// The name is empty.
    #[error("a model name cannot be empty")]
    Empty,
    /// The name's token is one of [`RESERVED_TOKENS`].
    #[error(
        "the model name `{0}` collides with the subject `<subject>.{0}` the workers already use; \
         set MODEL_ALIAS to another name"
    )]
    Reserved(String),
    /// The token is not one [`model_token`] makes (a bad or lowercase `%XX`, a character that
    /// should have been encoded, or bytes that are not UTF-8).
    #[error("`{0}` is not a model token")]
    BadToken(String),
}

/// Checks that `name` can be served: not empty, and its token is not reserved.
///
/// # Errors
/// [`ModelNameError::Empty`] or [`ModelNameError::Reserved`].
pub fn check_name(name: &str) -> Result<(), ModelNameError> {
    if name.is_empty() {
        return Err(ModelNameError::Empty);
    }
    let token = model_token(name);
    if RESERVED_TOKENS.contains(&token.as_str()) {
        return Err(ModelNameError::Reserved(token));
    }
    Ok(())
}

/// The model name of a subject token: the inverse of [`model_token`].
///
/// # Errors
/// [`ModelNameError::BadToken`] when `token` is not exactly what [`model_token`] makes of some
/// name (so a name has one token, and a token one name); [`ModelNameError::Empty`] for `""`.
pub fn model_name(token: &str) -> Result<String, ModelNameError> {
    if token.is_empty() {
        return Err(ModelNameError::Empty);
    }
    let bad = || ModelNameError::BadToken(token.to_owned());
    let mut bytes = Vec::with_capacity(token.len());
    let mut rest = token.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        if first == b'%' {
            let [hi, lo, ..] = tail else {
                return Err(bad());
            };
            let hex = |d: u8| match d {
                b'0'..=b'9' => Some(d - b'0'),
                b'A'..=b'F' => Some(d - b'A' + 10),
                _ => None,
            };
            let (Some(hi), Some(lo)) = (hex(*hi), hex(*lo)) else {
                return Err(bad());
            };
            bytes.push((hi << 4) | lo);
            rest = &tail[2..];
        } else {
            bytes.push(first);
            rest = tail;
        }
    }
    let name = String::from_utf8(bytes).map_err(|_| bad())?;
    if model_token(&name) != token {
        return Err(bad());
    }
    Ok(name)
}

/// The model name of `subject` when it is a model subject under `prefix`
/// (`<prefix>.<token>`, exactly one token more); `None` otherwise.
pub fn parse_model_subject(prefix: &str, subject: &str) -> Option<String> {
    let token = subject.strip_prefix(prefix)?.strip_prefix('.')?;
    if token.contains('.') {
        return None;
    }
    model_name(token).ok()
}

/// A model served by a worker, as it announces it (`$SRV.INFO` metadata and membership
/// announcements): the name it is routed by and the revision of its weights.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ModelId {
    /// The model name (`MODEL_ALIAS`, else the model id).
    pub name: String,
    /// The revision: TEI's `model_sha`, or the built-in model's; `None` when unknown.
    pub revision: Option<String>,
}

impl fmt::Display for ModelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.revision {
            Some(revision) => write!(f, "{}@{revision}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// How often workers of earlier releases repeat their [`Announcement`]: 500 ms. Workers now
/// announce once at start and once at stop (see [`crate::headers::members_subject`]); kept for
/// readers of mixed fleets.
pub const ANNOUNCEMENT_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);

/// How long earlier releases count a worker's last [`Announcement`] (three intervals): 1.5 s.
/// Kept for readers of mixed fleets; the gateway now keeps a worker until discovery misses it
/// (docs/design/control-plane.md).
pub const ANNOUNCEMENT_EXPIRY: std::time::Duration = std::time::Duration::from_millis(1500);

/// Metadata key of the workers' `$SRV.INFO`/`$SRV.PING` answers: the model name they serve.
pub const MODEL_METADATA: &str = "model";
/// Metadata key: the revision of the model served (absent when unknown).
pub const MODEL_REVISION_METADATA: &str = "model_revision";
/// Metadata key: `true` when the worker also answers the plain subject (it serves the default
/// model), else `false`.
pub const DEFAULT_METADATA: &str = "default_model";
/// Metadata key (contract v1.4): what the worker's model does, from its upstream's `/info`
/// `model_type`, comma-separated among [`CAPABILITIES`]: `embed` (`/embed`, `/embed_all`,
/// `/similarity`), `sparse` (`/embed_sparse`), `rerank` (`/rerank`), `classify` (`/predict`).
/// Absent from a worker that predates v1.4.
pub const CAPABILITIES_METADATA: &str = "capabilities";
/// The capabilities a worker may announce ([`CAPABILITIES_METADATA`]), in this order.
pub const CAPABILITIES: [&str; 4] = ["embed", "sparse", "rerank", "classify"];

/// A worker's announcement on [`crate::headers::members_subject`] (JSON), which the gateway's
/// model table reads:
///
/// ```json
/// {"id": "<service id>", "membership": "joined", "room": true,
///  "model": "BAAI/bge-small-en-v1.5", "model_revision": "5c38ec7c", "default_model": false}
/// ```
/// Published once when the worker starts (`joined`) and once when it stops (`stopping`);
/// earlier releases repeated it every 0.5 s. `model`, `model_revision` and `default_model`
/// are new in contract v1.1: an announcement without them comes from a v1 worker, which serves
/// the plain subject only.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Announcement {
    /// The worker's service id (as `$SRV.INFO` reports it).
    pub id: String,
    /// Its membership: [`crate::headers::membership`]'s values.
    pub membership: String,
    /// Whether it is a member whose typical queue wait is under half its bound.
    #[serde(default)]
    pub room: bool,
    /// The model name it serves (absent: a v1 worker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The model's revision, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_revision: Option<String>,
    /// Whether it also answers the plain subject (absent: a v1 worker, which does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_model: Option<bool>,
    /// What its model does ([`CAPABILITIES`]; absent: a worker that predates v1.4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Vec<String>>,
}

impl Announcement {
    /// Whether the worker answers the plain subject.
    pub fn serves_plain(&self) -> bool {
        self.default_model.unwrap_or(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_dots_and_slashes_become_one_token() {
        assert_eq!(
            model_subject("embed", "BAAI/bge-small-en-v1.5"),
            "embed.BAAI/bge-small-en-v1%2E5"
        );
        assert_eq!(
            model_token("sentence-transformers/all-MiniLM-L6-v2"),
            "sentence-transformers/all-MiniLM-L6-v2"
        );
        assert_eq!(model_token("100%"), "100%25");
        assert_eq!(model_token("a*b>c"), "a%2Ab%3Ec");
        assert_eq!(model_token("two words\t"), "two%20words%09");
        assert_eq!(model_token("modèle"), "mod%C3%A8le");
        assert_eq!(model_token("a\u{7f}"), "a%7F");
    }

    #[test]
    fn every_token_is_a_valid_nats_subject_token() {
        for name in [
            "a.b.c",
            "*",
            ">",
            " ",
            "x\ny",
            "ünï.cödé ✓",
            "%2E",
            "a/b:c@d",
        ] {
            let token = model_token(name);
            assert!(!token.is_empty());
            assert!(
                token
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && b != b'.' && b != b'*' && b != b'>'),
                "{name:?} -> {token:?}"
            );
        }
    }

    #[test]
    fn tokens_round_trip_and_only_canonical_tokens_decode() {
        for name in [
            "BAAI/bge-small-en-v1.5",
            "100%",
            "%2E",
            "a*b>c",
            "ünï.cödé ✓",
            "x\ny",
            "plain",
        ] {
            assert_eq!(model_name(&model_token(name)).as_deref(), Ok(name));
        }
        for bad in ["a%2e", "a%2", "a%ZZ", "a%FF", "a.b", "a b", "%41"] {
            assert!(model_name(bad).is_err(), "{bad:?} should not decode");
        }
        assert_eq!(model_name(""), Err(ModelNameError::Empty));
    }

    #[test]
    fn model_subjects_parse_back() {
        let subject = model_subject("embed", "BAAI/bge-small-en-v1.5");
        assert_eq!(
            parse_model_subject("embed", &subject).as_deref(),
            Some("BAAI/bge-small-en-v1.5")
        );
        assert_eq!(parse_model_subject("embed", "embed"), None);
        assert_eq!(parse_model_subject("embed", "embed.m.info"), None);
        assert_eq!(parse_model_subject("embed", "embedx.m"), None);
        assert_eq!(parse_model_subject("embed", "other.m"), None);
    }

    #[test]
    fn v1_announcements_parse_as_plain_subject_workers() {
        let v1: Announcement =
            serde_json::from_str(r#"{"id":"a","membership":"joined","room":true}"#).expect("v1");
        assert_eq!((v1.model.as_deref(), v1.serves_plain()), (None, true));
        let v11 = Announcement {
            id: "b".into(),
            membership: "full".into(),
            room: false,
            model: Some("m".into()),
            model_revision: None,
            default_model: Some(false),
            capabilities: None,
        };
        let json = serde_json::to_string(&v11).expect("encodes");
        assert_eq!(
            json,
            r#"{"id":"b","membership":"full","room":false,"model":"m","default_model":false}"#
        );
        assert!(
            !serde_json::from_str::<Announcement>(&json)
                .expect("parses")
                .serves_plain()
        );
    }

    #[test]
    fn reserved_and_empty_names_are_refused() {
        for reserved in RESERVED_TOKENS {
            assert_eq!(
                check_name(reserved),
                Err(ModelNameError::Reserved((*reserved).to_owned()))
            );
        }
        assert_eq!(check_name(""), Err(ModelNameError::Empty));
        assert_eq!(check_name("info.v2"), Ok(()), "`info%2Ev2` is not `info`");
        assert_eq!(check_name("Cancel"), Ok(()), "subjects are case-sensitive");
    }
}
