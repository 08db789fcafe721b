//! What each tenant uses of the embedding routes: its quota checked before a request
//! ([`crate::quota`]), its tokens charged after, its usage counted per day ([`crate::usage`]) and
//! in Prometheus counters labelled `tenant` (the tenants come from the tenants file, so the
//! label's values are bounded; an open gateway has one, `default`).

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics::Counter;

use crate::quota::{Limit, Limited, Quotas};
use crate::telemetry::names;
use crate::tenancy::{Caller, is_openai_path};
use crate::usage::{DayUsage, UsageBook};

/// A response extension the embedding routes set on a 200: the request's inputs and the tokens
/// the worker counted (0 when it counts none).
#[derive(Debug, Clone, Copy, Default)]
pub struct Used {
    /// Inputs embedded.
    pub inputs: u64,
    /// Tokens, from the reply's `Embatch-Tokens`.
    pub tokens: u64,
}

/// The metering layer's state.
#[derive(Clone)]
pub struct Meter {
    /// The quota counts, fleet-wide.
    pub quotas: Quotas,
    /// The daily usage.
    pub usage: UsageBook,
    /// The tenant counters' handles.
    pub counters: Arc<TenantCounters>,
}

/// The handles of the per-tenant counters ([`names::TENANT_REQUESTS`] by status,
/// [`names::TENANT_INPUTS`], [`names::TENANT_TOKENS`]), registered on a tenant's first
/// answer of each status: the macros build, hash and look up a key with a tenant label in the
/// recorder's registry on every call (three per request), a handle records with one atomic
/// operation. Tenants come from the tenants file and statuses are the gateway's own, so the map
/// is bounded.
#[derive(Default)]
pub struct TenantCounters {
    tenants: std::sync::Mutex<HashMap<Arc<str>, TenantHandles>>,
}

/// One tenant's handles ([`TenantCounters`]).
struct TenantHandles {
    by_status: HashMap<u16, Counter>,
    inputs: Counter,
    tokens: Counter,
}

impl TenantCounters {
    /// Counts one answer of `status` for `tenant`, with what it `used` when a 200.
    fn count(&self, tenant: &Arc<str>, status: u16, used: Used) {
        let mut tenants = self
            .tenants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let handles = tenants
            .entry(tenant.clone())
            .or_insert_with(|| TenantHandles {
                by_status: HashMap::new(),
                inputs: metrics::counter!(names::TENANT_INPUTS, "tenant" => tenant.to_string()),
                tokens: metrics::counter!(names::TENANT_TOKENS, "tenant" => tenant.to_string()),
            });
        handles
            .by_status
            .entry(status)
            .or_insert_with(|| {
                metrics::counter!(names::TENANT_REQUESTS, "tenant" => tenant.to_string(),
                    "status" => status.to_string())
            })
            .increment(1);
        if status == 200 {
            handles.inputs.increment(used.inputs);
            handles.tokens.increment(used.tokens);
        }
    }
}

/// Middleware of the embedding routes (after [`crate::tenancy::authenticate`]): refuses a
/// request over its tenant's quota with 429, and counts what the others used. The state is
/// shared (`Arc`): axum clones a middleware's state for every request.
pub async fn meter(State(meter): State<Arc<Meter>>, request: Request, next: Next) -> Response {
    let Some(Caller(tenant)) = request.extensions().get::<Caller>().cloned() else {
        return next.run(request).await;
    };
    let openai = is_openai_path(request.uri().path());
    let rate = match meter.quotas.admit(&tenant) {
        Ok(rate) => rate,
        Err(limited) => {
            count(&meter, &tenant.name, 429, Used::default());
            metrics::counter!(names::TENANT_QUOTA_REFUSED, "tenant" => tenant.name.to_string(),
                "limit" => match limited.limit { Limit::Requests => "requests", Limit::Tokens => "tokens" })
            .increment(1);
            return refused(&limited, openai);
        }
    };
    let mut response = next.run(request).await;
    let used = response
        .extensions_mut()
        .remove::<Used>()
        .unwrap_or_default();
    meter.quotas.charge(&tenant, used.tokens);
    count(&meter, &tenant.name, response.status().as_u16(), used);
    if let Some(mut rate) = rate {
        if let Some((limit, remaining)) = rate.tokens {
            rate.tokens = Some((limit, remaining.saturating_sub(used.tokens)));
        }
        rate.write(response.headers_mut());
    }
    response
}

/// Counts one answer of `status` for `tenant`: the metrics and the day's usage.
fn count(meter: &Meter, tenant: &Arc<str>, status: u16, used: Used) {
    meter.counters.count(tenant, status, used);
    meter
        .usage
        .record(tenant, DayUsage::answer(status, used.inputs, used.tokens));
}

/// The 429 of a request over its tenant's quota: OpenAI's `rate_limit_exceeded` on OpenAI's
/// routes, TEI's `overloaded` on TEI's, with `Retry-After` and the `x-ratelimit-*` headers.
fn refused(limited: &Limited, openai: bool) -> Response {
    let what = match limited.limit {
        Limit::Requests => "requests",
        Limit::Tokens => "tokens",
    };
    let message = format!(
        "Rate limit reached for {what} per minute of your tenant; retry after the window resets in {}s",
        limited.state.retry_after_secs()
    );
    let body = if openai {
        serde_json::json!({"error": {"message": message, "type": what, "param": null,
                                     "code": "rate_limit_exceeded"}})
    } else {
        serde_json::json!({"error": message, "error_type": "overloaded"})
    };
    let mut response = (
        StatusCode::TOO_MANY_REQUESTS,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        Bytes::from(body.to_string()),
    )
        .into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::RETRY_AFTER,
        HeaderValue::from(limited.state.retry_after_secs()),
    );
    limited.state.write(headers);
    response
}
