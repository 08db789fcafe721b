//! The tenant of a request: who it is served for, from NATS's own account of the caller.
//!
//! A request reaches a worker one of two ways:
//! - **from the worker's own NATS account** (the gateway, services of the platform team): the
//!   message carries no [`headers::REQUEST_INFO`]. Such callers are trusted: the tenant is the one
//!   their [`headers::TENANT`] header names, [`headers::DEFAULT_TENANT`] without one;
//! - **through a service import from another account** (a tenant's own services, see
//!   `nats/accounts.conf`): nats-server adds [`headers::REQUEST_INFO`], a JSON `ClientInfo`
//!   whose `acc` names the requester's account (nats-server's `server/client.go`,
//!   `processServiceImport`, writes it on every request crossing an import, replacing a header
//!   of that name the client sent; releases before 2.11.16 / 2.12.7 could be made to pass a
//!   forged one on, CVE-2026-33223: run the release `nats/VERSION` pins). When `acc` is the
//!   worker's `TRUSTED_ACCOUNT` (a
//!   gateway in an account of its own), the header is taken as above; otherwise the tenant is
//!   the one whose `nats_account` is `acc` in `TENANTS_FILE`, whatever [`headers::TENANT`] says.
//!
//! Decisions (docs/tenants.md, "Direct NATS callers and accounts"):
//! - without `TENANTS_FILE` (open), a caller from another account is the tenant named like its
//!   account (weight 1), when the name is a valid tenant name ([`headers::valid_tenant`]);
//!   otherwise 403. With a file, an account no tenant names is refused 403: an account is never
//!   served as a tenant the operator did not map it to;
//! - with a file, a trusted caller naming a tenant the file lacks gets 403 (a gateway and a
//!   worker reading different files), except [`headers::DEFAULT_TENANT`], which a trusted caller
//!   without the header always is (weight 1, its own cache scope, unless the file configures it);
//! - a [`headers::TENANT`] value that is not a tenant name is 400 naming the header; a
//!   [`headers::REQUEST_INFO`] that is not nats-server's JSON (only a trusted client could send
//!   one) is 400 too.
//!
//! The metrics label of a caller ([`Caller::label`]) is bounded by the configuration: the
//! tenant's name with a file, or without one for the default tenant and for account tenants
//! (accounts come from the server's configuration); [`OTHER_LABEL`] for the names trusted callers
//! make up on an open worker.

use std::sync::Arc;

use async_nats::HeaderMap;
use embatch_protocol::{EmbedError, headers};
use embatch_runtime::tenants::{Tenant, Tenants, TenantsWatch};

/// The `tenant` label of the metrics of a tenant named only by a trusted caller's header on a
/// worker without `TENANTS_FILE` (not a valid tenant name, so it never collides with one).
pub const OTHER_LABEL: &str = "(other)";

/// Why a request's tenant could not be decided.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantError {
    /// [`headers::TENANT`] is not 1-64 of `A-Z a-z 0-9 _ -` (400).
    #[error(
        "header `{header}` must be a tenant name, 1 to 64 of A-Z a-z 0-9 _ -. Given: {given:?}",
        header = headers::TENANT
    )]
    InvalidName {
        /// The value, cut to 80 characters.
        given: String,
    },
    /// [`headers::REQUEST_INFO`] is not the JSON nats-server writes, with the account in `acc`
    /// (400).
    #[error("header `{header}` is not nats-server's client info: {why}", header = headers::REQUEST_INFO)]
    InvalidRequestInfo {
        /// What is wrong with it.
        why: String,
    },
    /// A trusted caller named a tenant `TENANTS_FILE` does not configure (403).
    #[error("tenant `{0}` is not configured on this worker (TENANTS_FILE)")]
    UnknownTenant(String),
    /// A caller from a NATS account no tenant of `TENANTS_FILE` names as its `nats_account`, or,
    /// without a file, an account whose name is not a tenant name (403).
    #[error(
        "NATS account `{0}` is not a tenant's: name it in a tenant's `nats_account` (TENANTS_FILE)"
    )]
    UnknownAccount(String),
}

impl From<TenantError> for EmbedError {
    fn from(err: TenantError) -> EmbedError {
        match err {
            TenantError::InvalidName { .. } | TenantError::InvalidRequestInfo { .. } => {
                EmbedError::InvalidHeader(err.to_string())
            }
            TenantError::UnknownTenant(_) | TenantError::UnknownAccount(_) => {
                EmbedError::Forbidden(err.to_string())
            }
        }
    }
}

/// A request's tenant as the worker serves it.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The tenant: its weight for the fair share, its cache scope.
    pub tenant: Arc<Tenant>,
    /// Its `tenant` label on the worker's metrics (bounded, see the module docs).
    pub label: Arc<str>,
}

impl Caller {
    /// The implicit [`headers::DEFAULT_TENANT`] (tests, and callers that name no tenant).
    pub fn default_tenant() -> Caller {
        let tenant = Arc::new(Tenant::implicit(headers::DEFAULT_TENANT));
        Caller {
            label: tenant.name.clone(),
            tenant,
        }
    }
}

/// What decides a request's tenant: the tenants in force and the account trusted to name one.
#[derive(Clone, Debug)]
pub struct TenantPolicy {
    tenants: TenantsWatch,
    /// `TRUSTED_ACCOUNT`: the NATS account (the gateway's) whose [`headers::TENANT`] is taken
    /// although its requests cross a service import.
    trusted_account: Option<Arc<str>>,
    /// The implicit default tenant, allocated once.
    default: Caller,
    /// [`OTHER_LABEL`], allocated once.
    other: Arc<str>,
}

/// The `Nats-Request-Info` fields the worker reads.
#[derive(serde::Deserialize)]
struct RequestInfo {
    /// The requester's account.
    acc: Option<String>,
}

impl TenantPolicy {
    /// The policy for `tenants` (live from `TENANTS_FILE`, or open) and `trusted_account`
    /// (`TRUSTED_ACCOUNT`; `None` or empty: only the worker's own account is trusted).
    pub fn new(tenants: TenantsWatch, trusted_account: Option<String>) -> TenantPolicy {
        TenantPolicy {
            tenants,
            trusted_account: trusted_account.filter(|a| !a.is_empty()).map(Arc::from),
            default: Caller::default_tenant(),
            other: Arc::from(OTHER_LABEL),
        }
    }

    /// An open worker trusting only its own account (tests).
    pub fn open() -> TenantPolicy {
        TenantPolicy::new(TenantsWatch::fixed(Tenants::open()), None)
    }

    /// The tenants in force now.
    pub fn tenants(&self) -> Arc<Tenants> {
        self.tenants.current()
    }

    /// The tenant of a request with `message_headers` (see the module docs).
    ///
    /// # Errors
    /// [`TenantError`]: 400 for a malformed header, 403 for a tenant or account this worker
    /// does not serve.
    pub fn resolve(&self, message_headers: Option<&HeaderMap>) -> Result<Caller, TenantError> {
        let get = |name| embatch_client::header_in(message_headers, name);
        self.decide(get(headers::REQUEST_INFO), get(headers::TENANT))
    }

    /// [`TenantPolicy::resolve`] on the two header values.
    fn decide(
        &self,
        request_info: Option<&str>,
        named: Option<&str>,
    ) -> Result<Caller, TenantError> {
        let tenants = self.tenants.current();
        let Some(info) = request_info else {
            return self.named(&tenants, named);
        };
        let info: RequestInfo =
            serde_json::from_str(info).map_err(|err| TenantError::InvalidRequestInfo {
                why: err.to_string(),
            })?;
        let account = info.acc.ok_or_else(|| TenantError::InvalidRequestInfo {
            why: "no `acc`".into(),
        })?;
        if self.trusted_account.as_deref() == Some(account.as_str()) {
            return self.named(&tenants, named);
        }
        if let Some(tenant) = tenants.by_account(&account) {
            return Ok(Caller {
                label: tenant.name.clone(),
                tenant,
            });
        }
        match tenants.is_open() {
            true => tenants.by_name(&account),
            false => None,
        }
        .map(|tenant| Caller {
            label: tenant.name.clone(),
            tenant,
        })
        .ok_or(TenantError::UnknownAccount(account))
    }

    /// The tenant that owns a bulk batch (`owner`, its record's `tenant`, written by the
    /// gateway that authenticated it): the configured tenant of that name, else an implicit one
    /// of weight 1 (a batch of a tenant removed since, or of a direct NATS caller), labelled
    /// [`OTHER_LABEL`] unless it is the default tenant.
    pub fn owner(&self, owner: &str) -> Caller {
        let tenants = self.tenants.current();
        if owner == headers::DEFAULT_TENANT {
            return match tenants.by_name(owner).filter(|_| !tenants.is_open()) {
                Some(tenant) => Caller {
                    label: tenant.name.clone(),
                    tenant,
                },
                None => self.default.clone(),
            };
        }
        match tenants.by_name(owner) {
            Some(tenant) if !tenants.is_open() => Caller {
                label: tenant.name.clone(),
                tenant,
            },
            _ => Caller {
                tenant: Arc::new(Tenant::implicit(owner)),
                label: self.other.clone(),
            },
        }
    }

    /// The tenant a trusted caller names (`named`, the [`headers::TENANT`] value).
    fn named(&self, tenants: &Tenants, named: Option<&str>) -> Result<Caller, TenantError> {
        let name = named.unwrap_or(headers::DEFAULT_TENANT);
        if !headers::valid_tenant(name) {
            return Err(TenantError::InvalidName {
                given: name.chars().take(80).collect(),
            });
        }
        if tenants.is_open() {
            if name == headers::DEFAULT_TENANT {
                return Ok(self.default.clone());
            }
            let tenant = tenants
                .by_name(name)
                .ok_or_else(|| TenantError::UnknownTenant(name.to_owned()))?;
            return Ok(Caller {
                tenant,
                label: self.other.clone(),
            });
        }
        match tenants.by_name(name) {
            Some(tenant) => Ok(Caller {
                label: tenant.name.clone(),
                tenant,
            }),
            None if name == headers::DEFAULT_TENANT => Ok(self.default.clone()),
            None => Err(TenantError::UnknownTenant(name.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
        [tenants.search]
        keys = ["sk-search"]
        weight = 2
        nats_account = "SEARCH"
        cache_group = "acme"

        [tenants.ads]
        keys = ["sk-ads"]
        nats_account = "ADS"
    "#;

    fn closed(trusted: Option<&str>) -> TenantPolicy {
        let tenants = Tenants::parse(FILE).expect("valid");
        TenantPolicy::new(TenantsWatch::fixed(tenants), trusted.map(str::to_owned))
    }

    fn info(account: &str) -> String {
        // The shape nats-server 2.15 writes for an import without `share` details.
        format!(r#"{{"acc":"{account}","rtt":1234567}}"#)
    }

    fn name(caller: Result<Caller, TenantError>) -> (String, String) {
        let caller = caller.expect("a tenant");
        (caller.tenant.name.to_string(), caller.label.to_string())
    }

    #[test]
    fn a_trusted_caller_is_the_tenant_its_header_names() {
        let policy = closed(None);
        assert_eq!(
            name(policy.decide(None, Some("ads"))),
            ("ads".into(), "ads".into())
        );
        let search = policy.decide(None, Some("search")).expect("search");
        assert_eq!(
            (search.tenant.weight, &*search.tenant.cache_scope),
            (2, "acme")
        );
        assert_eq!(
            name(policy.decide(None, None)),
            ("default".into(), "default".into()),
            "no header: the default tenant, configured or not"
        );
    }

    #[test]
    fn a_caller_from_another_account_is_that_accounts_tenant_whatever_it_says() {
        let policy = closed(Some("GATEWAY"));
        let spoofed = policy.decide(Some(&info("SEARCH")), Some("ads"));
        assert_eq!(name(spoofed), ("search".into(), "search".into()));
        let ads = policy.decide(Some(&info("ADS")), Some("not a name!"));
        assert_eq!(name(ads), ("ads".into(), "ads".into()), "header ignored");
        assert_eq!(
            name(policy.decide(Some(&info("GATEWAY")), Some("ads"))),
            ("ads".into(), "ads".into()),
            "the trusted account names the tenant"
        );
        assert_eq!(
            policy.decide(Some(&info("OTHER")), None).map(|c| c.tenant),
            Err(TenantError::UnknownAccount("OTHER".into()))
        );
    }

    #[test]
    fn an_open_worker_serves_accounts_as_tenants_and_bounds_its_labels() {
        let policy = TenantPolicy::open();
        assert_eq!(
            name(policy.decide(Some(&info("SEARCH")), Some("ads"))),
            ("SEARCH".into(), "SEARCH".into())
        );
        assert_eq!(
            name(policy.decide(None, Some("team-7"))),
            ("team-7".into(), OTHER_LABEL.into()),
            "a name a trusted caller makes up is served but not a label of its own"
        );
        assert_eq!(
            name(policy.decide(None, None)),
            ("default".into(), "default".into())
        );
        assert!(matches!(
            policy.decide(Some(&info("$G")), None),
            Err(TenantError::UnknownAccount(_))
        ));
    }

    #[test]
    fn a_bulk_batch_is_its_owners_with_a_bounded_label() {
        let policy = closed(None);
        let search = policy.owner("search");
        assert_eq!((&*search.label, search.tenant.weight), ("search", 2));
        assert_eq!(&*policy.owner("gone").label, OTHER_LABEL);
        assert_eq!(&*policy.owner("default").label, "default");
        assert_eq!(&*TenantPolicy::open().owner("x").label, OTHER_LABEL);
    }

    #[test]
    fn malformed_headers_are_400_and_unknown_tenants_403() {
        let policy = closed(None);
        let bad = policy.decide(None, Some("a.b")).expect_err("not a name");
        let err = EmbedError::from(bad);
        assert_eq!(err.status(), 400);
        assert!(err.to_string().contains(headers::TENANT), "{err}");
        let unknown = EmbedError::from(policy.decide(None, Some("nobody")).expect_err("unknown"));
        assert_eq!(unknown.status(), 403);
        assert!(unknown.to_string().contains("`nobody`"), "{unknown}");
        for broken in ["{", r#"{"rtt":1}"#] {
            let err = EmbedError::from(policy.decide(Some(broken), None).expect_err(broken));
            assert_eq!(err.status(), 400);
            assert!(err.to_string().contains(headers::REQUEST_INFO), "{err}");
        }
        let account = EmbedError::from(
            policy
                .decide(Some(&info("NOBODY")), None)
                .expect_err("unmapped"),
        );
        assert_eq!(account.status(), 403);
    }
}
