//! `GET /v1/usage`: the caller's tenant's usage of one day, from the bucket every gateway and
//! every worker's bulk lane add to ([`embatch_runtime::usage`]). The same figures are Prometheus
//! counters with a `tenant` label ([`crate::telemetry::names::TENANT_REQUESTS`] and the next
//! ones).

use std::time::SystemTime;

use axum::extract::{Extension, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

pub use embatch_runtime::usage::{DayUsage, UsageBook, utc_date};

use crate::tenancy::Caller;

/// `GET /v1/usage` query.
#[derive(Debug, Deserialize)]
pub struct UsageQuery {
    /// The day, `YYYY-MM-DD` (UTC); default today.
    pub date: Option<String>,
}

/// `GET /v1/usage?date=YYYY-MM-DD`: the caller's usage of that day (UTC; default today),
/// `{"object": "usage", "tenant", "date", "requests", "inputs", "tokens", "shed", "failed",
/// "bulk_lines", "bulk_inputs", "bulk_tokens"}`. 400 for a date not written `YYYY-MM-DD`, 503
/// without JetStream.
#[utoipa::path(get, path = "/v1/usage", operation_id = "usage", tag = "batch", summary = "Your tenant's usage of one day",
    description = "Embedding requests, inputs, tokens, shed (429) and failed (5xx, 424) answers of \
                   the caller's tenant on one UTC day, across every gateway, and the lines, \
                   inputs and tokens its bulk jobs embedded (counts reach the store within 5 s).",
    params(("date" = Option<String>, Query, description = "The day, `YYYY-MM-DD` (UTC); default today.")),
    responses((status = 200, description = "`{\"object\": \"usage\", \"tenant\", \"date\", \"requests\", \"inputs\", \"tokens\", \"shed\", \"failed\", \"bulk_lines\", \"bulk_inputs\", \"bulk_tokens\"}`.", body = Object),
        crate::bulk::BulkErrors))]
pub async fn route(
    State(book): State<UsageBook>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<UsageQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let date = match query {
        Ok(Query(UsageQuery { date: Some(date) })) => date,
        Ok(_) => utc_date(SystemTime::now()),
        Err(e) => return crate::bulk::ApiError::invalid("date", e.body_text()).into_response(),
    };
    if humantime::parse_rfc3339(&format!("{date}T00:00:00Z")).is_err() {
        let message = format!("`date` must be a day written YYYY-MM-DD, got {date:?}");
        return crate::bulk::ApiError::invalid("date", message).into_response();
    }
    match book.day(&caller.0.name, &date).await {
        Ok(usage) => {
            let mut body = serde_json::to_value(usage).unwrap_or_default();
            body["object"] = "usage".into();
            body["tenant"] = caller.name().into();
            body["date"] = date.into();
            (StatusCode::OK, axum::Json(body)).into_response()
        }
        Err(err) => crate::bulk::ApiError::server(503, err.to_string()).into_response(),
    }
}
