//! Tenants: who may call embatch, with which API keys, at what weight and within which limits.
//!
//! Read from `TENANTS_FILE` (TOML), shared by the gateway (keys, quotas) and the worker (weights,
//! NATS accounts, cache groups), and reloaded while running ([`watch`]):
//!
//! ```toml
//! [tenants.search]
//! keys = ["sk-search-1", "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]
//! weight = 2                    # share of upstream capacity under contention (default 1)
//! requests_per_minute = 6000    # optional, fleet-wide
//! tokens_per_minute = 2000000   # optional, fleet-wide
//! nats_account = "SEARCH"       # optional: direct NATS callers of this account are this tenant
//! cache_group = "acme"          # optional: tenants of one group share cache entries
//! ```
//!
//! A key is kept only as its SHA-256 digest and compared in constant time ([`subtle`]); neither
//! a key nor its digest reaches a log or a `Debug` print. Without a file the service is open:
//! every caller is [`DEFAULT_TENANT`](embatch_protocol::headers::DEFAULT_TENANT).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use embatch_protocol::headers::{DEFAULT_TENANT, valid_tenant};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::watch as channel;
use tokio_util::sync::CancellationToken;

/// How often [`watch`] reads the file for changes: a revoked key stops working within this
/// plus one request (under the 5 s the docs promise). Polled rather than notified, so that a
/// Kubernetes ConfigMap (a symlink swapped under the file) reloads as a plain file does.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// Why a tenants file was refused: the message names the file, the tenant and the field.
#[derive(Debug, thiserror::Error)]
pub enum TenantsError {
    /// The file could not be read.
    #[error("cannot read the tenants file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not TOML of the documented shape.
    #[error("the tenants file is not valid: {0}")]
    Syntax(#[from] toml::de::Error),
    /// A tenant's entry breaks a rule (the message names tenant, field and rule).
    #[error("tenant `{tenant}`: {field} {problem}")]
    Invalid {
        /// The tenant's name.
        tenant: String,
        /// The field, e.g. `keys`.
        field: &'static str,
        /// What is wrong, e.g. `is empty`.
        problem: String,
    },
}

/// The file's shape: `[tenants.<name>]` tables.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileShape {
    #[serde(default)]
    tenants: BTreeMap<String, TenantShape>,
}

/// One `[tenants.<name>]` table, as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantShape {
    #[serde(default)]
    keys: Vec<String>,
    #[serde(default = "one")]
    weight: u32,
    requests_per_minute: Option<u64>,
    tokens_per_minute: Option<u64>,
    nats_account: Option<String>,
    cache_group: Option<String>,
}

fn one() -> u32 {
    1
}

/// One tenant, as the services use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// Its name: the `Embatch-Tenant` header's value and the `tenant` label of metrics.
    pub name: Arc<str>,
    /// Its share of upstream capacity under contention, relative to the others' (≥ 1).
    pub weight: u32,
    /// Most requests per minute, fleet-wide (`None`: unlimited).
    pub requests_per_minute: Option<u64>,
    /// Most tokens per minute, fleet-wide (`None`: unlimited).
    pub tokens_per_minute: Option<u64>,
    /// The NATS account whose direct requests are this tenant's, when it has one.
    pub nats_account: Option<String>,
    /// The scope of its cache entries: its `cache_group`, or its own name.
    pub cache_scope: Arc<str>,
}

impl Tenant {
    /// The implicit tenant of an open service: weight 1, no limits, its own cache scope.
    pub fn implicit(name: &str) -> Tenant {
        Tenant {
            name: name.into(),
            weight: 1,
            requests_per_minute: None,
            tokens_per_minute: None,
            nats_account: None,
            cache_scope: name.into(),
        }
    }
}

/// The tenants in force: empty and open when there is no file.
#[derive(Clone, Default)]
pub struct Tenants {
    /// `Some` when a tenants file is in force; `None`: open.
    closed: Option<Closed>,
}

#[derive(Clone)]
struct Closed {
    by_name: HashMap<Arc<str>, Arc<Tenant>>,
    /// Every key's SHA-256 digest and its tenant.
    keys: Vec<([u8; 32], Arc<Tenant>)>,
    by_account: HashMap<String, Arc<Tenant>>,
}

impl std::fmt::Debug for Tenants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.closed {
            None => f.write_str("Tenants(open)"),
            Some(closed) => f
                .debug_struct("Tenants")
                .field("tenants", &closed.by_name.len())
                .field("keys", &closed.keys.len())
                .finish(),
        }
    }
}

impl Tenants {
    /// No tenants file: every caller is the implicit [`DEFAULT_TENANT`].
    pub fn open() -> Tenants {
        Tenants::default()
    }

    /// Whether the service is open (no tenants file).
    pub fn is_open(&self) -> bool {
        self.closed.is_none()
    }

    /// How many tenants are configured (0 when open).
    pub fn len(&self) -> usize {
        self.closed.as_ref().map_or(0, |c| c.by_name.len())
    }

    /// Whether no tenant is configured.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The tenants of a file's text.
    ///
    /// # Errors
    /// [`TenantsError::Syntax`] for TOML that is not the documented shape;
    /// [`TenantsError::Invalid`] for a bad name, an empty or repeated key, a malformed
    /// `sha256:` digest, a weight of 0, a limit of 0, or an account named twice.
    pub fn parse(text: &str) -> Result<Tenants, TenantsError> {
        let shape: FileShape = toml::from_str(text)?;
        let mut closed = Closed {
            by_name: HashMap::new(),
            keys: Vec::new(),
            by_account: HashMap::new(),
        };
        for (name, spec) in shape.tenants {
            let tenant = Arc::new(check(&name, &spec)?);
            for key in &spec.keys {
                let digest = digest_of(&name, key)?;
                if closed.keys.iter().any(|(d, _)| d == &digest) {
                    return Err(invalid(&name, "keys", "repeats a key already given"));
                }
                closed.keys.push((digest, tenant.clone()));
            }
            if let Some(account) = &tenant.nats_account
                && closed
                    .by_account
                    .insert(account.clone(), tenant.clone())
                    .is_some()
            {
                return Err(invalid(&name, "nats_account", "is another tenant's too"));
            }
            closed.by_name.insert(tenant.name.clone(), tenant);
        }
        Ok(Tenants {
            closed: Some(closed),
        })
    }

    /// The tenants of the file at `path`.
    ///
    /// # Errors
    /// [`TenantsError::Read`], or those of [`Tenants::parse`].
    pub fn load(path: &Path) -> Result<Tenants, TenantsError> {
        let text = std::fs::read_to_string(path).map_err(|source| TenantsError::Read {
            path: path.to_owned(),
            source,
        })?;
        Tenants::parse(&text)
    }

    /// The tenant whose key is `key` (an API key as presented, e.g. a bearer token): its SHA-256
    /// is compared with every configured digest in constant time, so the time taken tells
    /// nothing of which key, or how much of one, matched. An open service answers the implicit
    /// tenant for any key or none (`key` ignored). `None`: no such key.
    pub fn authenticate(&self, key: Option<&str>) -> Option<Arc<Tenant>> {
        let Some(closed) = &self.closed else {
            // One shared value: an open gateway answers it for every request.
            static IMPLICIT: std::sync::LazyLock<Arc<Tenant>> =
                std::sync::LazyLock::new(|| Arc::new(Tenant::implicit(DEFAULT_TENANT)));
            return Some(IMPLICIT.clone());
        };
        let presented: [u8; 32] = Sha256::digest(key?.as_bytes()).into();
        let mut found = None;
        for (digest, tenant) in &closed.keys {
            if bool::from(digest.ct_eq(&presented)) {
                found = Some(tenant.clone());
            }
        }
        found
    }

    /// The tenant named `name`; an open service knows every valid name (as an implicit tenant
    /// of weight 1), a closed one only its own.
    pub fn by_name(&self, name: &str) -> Option<Arc<Tenant>> {
        match &self.closed {
            None => valid_tenant(name).then(|| Arc::new(Tenant::implicit(name))),
            Some(closed) => closed.by_name.get(name).cloned(),
        }
    }

    /// The tenant whose `nats_account` is `account`, if any.
    pub fn by_account(&self, account: &str) -> Option<Arc<Tenant>> {
        self.closed.as_ref()?.by_account.get(account).cloned()
    }

    /// Every configured tenant, by name (none when open).
    pub fn all(&self) -> Vec<Arc<Tenant>> {
        let mut all: Vec<_> = self
            .closed
            .iter()
            .flat_map(|c| c.by_name.values().cloned())
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }
}

/// A tenant's entry as the services use it, or the rule it breaks.
fn check(name: &str, spec: &TenantShape) -> Result<Tenant, TenantsError> {
    if !valid_tenant(name) {
        return Err(invalid(name, "name", "must be 1-64 of A-Z a-z 0-9 _ -"));
    }
    if spec.weight == 0 {
        return Err(invalid(name, "weight", "must be at least 1"));
    }
    if spec.requests_per_minute == Some(0) {
        return Err(invalid(name, "requests_per_minute", "must be at least 1"));
    }
    if spec.tokens_per_minute == Some(0) {
        return Err(invalid(name, "tokens_per_minute", "must be at least 1"));
    }
    let cache_scope = spec.cache_group.as_deref().unwrap_or(name);
    if !valid_tenant(cache_scope) {
        return Err(invalid(
            name,
            "cache_group",
            "must be 1-64 of A-Z a-z 0-9 _ -",
        ));
    }
    Ok(Tenant {
        name: name.into(),
        weight: spec.weight,
        requests_per_minute: spec.requests_per_minute,
        tokens_per_minute: spec.tokens_per_minute,
        nats_account: spec.nats_account.clone(),
        cache_scope: cache_scope.into(),
    })
}

/// The digest a key is kept as: `sha256:<64 hex digits>` as written, or a plain key's SHA-256.
fn digest_of(tenant: &str, key: &str) -> Result<[u8; 32], TenantsError> {
    if key.is_empty() {
        return Err(invalid(tenant, "keys", "has an empty key"));
    }
    let Some(hex) = key.strip_prefix("sha256:") else {
        return Ok(Sha256::digest(key.as_bytes()).into());
    };
    let bad = || {
        invalid(
            tenant,
            "keys",
            "has a `sha256:` key that is not 64 hex digits",
        )
    };
    if hex.len() != 64 || !hex.is_ascii() {
        return Err(bad());
    }
    let mut digest = [0u8; 32];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(digest)
}

fn invalid(tenant: &str, field: &'static str, problem: impl Into<String>) -> TenantsError {
    TenantsError::Invalid {
        tenant: tenant.to_owned(),
        field,
        problem: problem.into(),
    }
}

/// The tenants in force, live: [`TenantsWatch::current`] is the file's last valid content.
#[derive(Clone, Debug)]
pub struct TenantsWatch {
    rx: channel::Receiver<Arc<Tenants>>,
}

impl TenantsWatch {
    /// A fixed set (tests, and the open service).
    pub fn fixed(tenants: Tenants) -> TenantsWatch {
        let (_tx, rx) = channel::channel(Arc::new(tenants));
        TenantsWatch { rx }
    }

    /// The tenants in force now.
    pub fn current(&self) -> Arc<Tenants> {
        self.rx.borrow().clone()
    }
}

/// Loads `path` (open when `None`) and, until `stop`, reads it again every [`RELOAD_INTERVAL`]:
/// a changed file that parses replaces the tenants in force, with the log line `tenants
/// reloaded`; one that does not, or a file gone, keeps them, with an error line. Logs at start
/// whether the service is open. Needs a tokio runtime when `path` is `Some`.
///
/// # Errors
/// Those of [`Tenants::load`], at start only.
pub fn watch(path: Option<&Path>, stop: CancellationToken) -> Result<TenantsWatch, TenantsError> {
    let Some(path) = path else {
        tracing::warn!(
            "no TENANTS_FILE: open to every caller, as the one implicit tenant `{DEFAULT_TENANT}`"
        );
        return Ok(TenantsWatch::fixed(Tenants::open()));
    };
    let text = std::fs::read(path).map_err(|source| TenantsError::Read {
        path: path.to_owned(),
        source,
    })?;
    let tenants = Tenants::parse(&String::from_utf8_lossy(&text))?;
    tracing::info!(tenants = tenants.len(), file = %path.display(), "tenants loaded");
    let (tx, rx) = channel::channel(Arc::new(tenants));
    tokio::spawn(reload(path.to_owned(), text, tx, stop));
    Ok(TenantsWatch { rx })
}

/// [`watch`]'s loop: re-reads the file and swaps in what changed and parses.
async fn reload(
    path: PathBuf,
    mut last: Vec<u8>,
    tx: channel::Sender<Arc<Tenants>>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(RELOAD_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while stop.run_until_cancelled(tick.tick()).await.is_some() {
        let text = match tokio::fs::read(&path).await {
            Ok(text) => text,
            Err(err) => {
                tracing::error!(%err, file = %path.display(), "cannot read the tenants file; the tenants in force stay");
                continue;
            }
        };
        if text == last {
            continue;
        }
        match Tenants::parse(&String::from_utf8_lossy(&text)) {
            Ok(tenants) => {
                tracing::info!(tenants = tenants.len(), file = %path.display(), "tenants reloaded");
                tx.send_replace(Arc::new(tenants));
            }
            Err(err) => {
                tracing::error!(%err, file = %path.display(), "the tenants file is not valid; the tenants in force stay");
            }
        }
        last = text;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
        [tenants.search]
        keys = ["sk-search-1", "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]
        weight = 2
        requests_per_minute = 6000
        tokens_per_minute = 2000000
        nats_account = "SEARCH"

        [tenants.ads]
        keys = ["sk-ads"]
        cache_group = "acme"
    "#;

    #[test]
    fn keys_plain_and_hashed_name_their_tenant() {
        let tenants = Tenants::parse(FILE).expect("valid");
        let by_plain = tenants
            .authenticate(Some("sk-search-1"))
            .expect("plain key");
        assert_eq!(&*by_plain.name, "search");
        assert_eq!(by_plain.weight, 2);
        assert_eq!(by_plain.requests_per_minute, Some(6000));
        // sha256("test") is the digest in the file.
        let by_hash = tenants.authenticate(Some("test")).expect("hashed key");
        assert_eq!(&*by_hash.name, "search");
        let ads = tenants.authenticate(Some("sk-ads")).expect("ads");
        assert_eq!((ads.weight, &*ads.cache_scope), (1, "acme"));
        assert_eq!(tenants.authenticate(Some("sk-ads ")), None);
        assert_eq!(tenants.authenticate(None), None);
        assert_eq!(
            tenants.by_account("SEARCH").map(|t| t.name.clone()),
            Some(by_plain.name.clone())
        );
        assert!(tenants.by_name("nobody").is_none());
    }

    #[test]
    fn open_service_answers_the_implicit_tenant() {
        let open = Tenants::open();
        assert!(open.is_open());
        let tenant = open.authenticate(None).expect("open");
        assert_eq!(&*tenant.name, DEFAULT_TENANT);
        assert_eq!(open.by_name("team-a").map(|t| t.weight), Some(1));
        assert!(open.by_name("a.b").is_none());
    }

    #[test]
    fn each_rule_names_tenant_and_field() {
        let cases = [
            (
                "[tenants.a]\nkeys = [\"\"]",
                "tenant `a`: keys has an empty key",
            ),
            (
                "[tenants.a]\nkeys = [\"sha256:abc\"]",
                "tenant `a`: keys has a `sha256:`",
            ),
            (
                "[tenants.a]\nweight = 0",
                "tenant `a`: weight must be at least 1",
            ),
            (
                "[tenants.a]\nrequests_per_minute = 0",
                "requests_per_minute must be",
            ),
            (
                "[tenants.\"a.b\"]\nkeys = [\"k\"]",
                "tenant `a.b`: name must be",
            ),
            (
                "[tenants.a]\nkeys = [\"k\"]\n[tenants.b]\nkeys = [\"k\"]",
                "repeats a key",
            ),
        ];
        for (text, expected) in cases {
            let err = Tenants::parse(text).expect_err(text).to_string();
            assert!(err.contains(expected), "{text}: {err}");
        }
        let err = Tenants::parse("[tenants.a]\nkey = [\"k\"]").expect_err("unknown field");
        assert!(err.to_string().contains("unknown field `key`"), "{err}");
    }

    #[test]
    fn the_shipped_example_is_valid_and_its_hashed_key_matches() {
        let tenants = Tenants::parse(include_str!("../../examples/tenants.toml")).expect("valid");
        assert_eq!(tenants.len(), 2);
        let ads = tenants
            .authenticate(Some("sk-ads-example"))
            .expect("hashed key");
        assert_eq!(&*ads.name, "ads");
        let search = tenants
            .authenticate(Some("sk-search-example"))
            .expect("key");
        assert_eq!(search.weight, 2);
    }

    #[test]
    fn debug_prints_no_key() {
        let tenants = Tenants::parse(FILE).expect("valid");
        let printed = format!("{tenants:?}");
        assert!(!printed.contains("sk-"), "{printed}");
        assert!(!printed.contains("9f86d0"), "{printed}");
    }

    #[tokio::test]
    async fn a_changed_file_is_reloaded_and_a_broken_one_ignored() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tenants.toml");
        std::fs::write(&path, "[tenants.a]\nkeys = [\"k1\"]").expect("write");
        let stop = CancellationToken::new();
        let watch = watch(Some(&path), stop.clone()).expect("loads");
        assert!(watch.current().authenticate(Some("k1")).is_some());

        std::fs::write(&path, "[tenants.a]\nkeys = [\"k2\"]").expect("write");
        let revoked = tokio::time::timeout(Duration::from_secs(5), async {
            while watch.current().authenticate(Some("k1")).is_some() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(revoked.is_ok(), "k1 still accepted after 5 s");
        assert!(watch.current().authenticate(Some("k2")).is_some());

        std::fs::write(&path, "[tenants.a]\nkeys = [").expect("write");
        tokio::time::sleep(RELOAD_INTERVAL * 2).await;
        assert!(watch.current().authenticate(Some("k2")).is_some(), "kept");
        stop.cancel();
    }
}
