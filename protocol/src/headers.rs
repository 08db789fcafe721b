//! NATS header names of the contract and the deadline header's encoding.
//!
//! Header names are case-sensitive in NATS; use these constants.

use std::time::Duration;

/// Request header: the caller's remaining time budget in whole milliseconds, relative to the
/// moment the message is published (relative, so that clocks of different hosts need not agree).
/// A worker answers 504 without any upstream work once this budget has passed, and answers 429 at
/// once when its queue cannot finish the request within it. Absent: the worker's
/// `--default-deadline` (`DEFAULT_DEADLINE`) applies.
pub const DEADLINE_MS: &str = "Embatch-Deadline-Ms";

/// Request header (optional): an id the caller picks for this request, unique among its requests
/// in flight (e.g. its reply inbox or a UUID). Publishing the same id as the payload of a message
/// on [`cancel_subject`] withdraws the request: a worker that still holds it in its queue drops
/// it without upstream work and sends no reply.
pub const REQUEST_ID: &str = "Embatch-Request-Id";

/// The subject on which callers withdraw requests they no longer wait for (payload: the
/// [`REQUEST_ID`] value): `<subject>.cancel`. Every worker listens on it (no queue group), so the
/// one holding the request drops it.
pub fn cancel_subject(subject: &str) -> String {
    format!("{subject}.cancel")
}

/// The subject of the workers' `info` endpoint: `<subject>.info`, in the workers' queue group.
/// An empty request is answered with the upstream's TEI-shaped `/info` JSON (mirrors TEI's
/// `GET /info`), or an error reply.
pub fn info_subject(subject: &str) -> String {
    format!("{subject}.info")
}

/// `<subject>.members`: where a worker announces itself once when it starts (`joined`) and once
/// when it stops (`stopping`): `{"id": "<service id>", "membership": "...", "room": true,
/// "model": "...", ...}` ([`crate::model::Announcement`]). Nothing is repeated: a gateway keeps its
/// model table from NATS micro discovery and uses these two events to see a worker come and go
/// at once. Workers and gateways only; clients need not know it. Why: docs/design/control-plane.md.
pub fn members_subject(subject: &str) -> String {
    format!("{subject}.members")
}

/// `<model subject>.room`: the workers of a model that have room for a peer's share are the
/// members of its queue group (the same group name as the request subject) while they do. A
/// full worker asks there (a NATS request, [`ROOM_ASK_TIMEOUT`]) before it leaves the request
/// subject's queue group: a reply `{"id": "<service id>", "room": true}` from another worker means
/// a peer has room; "no responders" or no reply in time means none has. Workers only.
pub fn room_subject(subject: &str) -> String {
    format!("{subject}.room")
}

/// How long a worker waits for a reply on [`room_subject`]: 100 ms. No reply in time counts as
/// "no peer has room" (the worker then stays in the queue group, as a lone worker does).
pub const ROOM_ASK_TIMEOUT: Duration = Duration::from_millis(100);

/// Request header (optional): `1` asks the worker that receives the request to acknowledge it
/// when it still holds it [`ACK_DELAY`] after reading it: a message on the request's reply
/// subject with [`ACCEPTED_BY`] set to the worker's service id and an empty body, then the final
/// reply as usual (two messages in all). A request answered within [`ACK_DELAY`] gets only its
/// reply; either message tells the client that a worker read the request, and the reply
/// carries [`ACK_DELAY_MS`] in both cases. A client that sends it can tell a request that reached a worker from one
/// lost on the way (nats-server delivers at most once), and resend the request when the worker
/// holding it stops publishing on [`heartbeat_subject`]. A copy of a request the worker already
/// holds (a client's resend) is acknowledged at once. Without this header the worker sends
/// exactly one reply, so a plain `request` of any NATS client works unchanged.
pub const ACK: &str = "Embatch-Ack";

/// How long a worker holds a request that asked for an acknowledgement ([`ACK`]) before it sends
/// one: 20 ms. Most requests are answered sooner at light and moderate load, so they cost no
/// extra message (the acknowledgement was +5 to +20 µs of CPU per request in each process when
/// sent at once, benchmark 4's setup). A client must wait longer than this plus a round trip
/// before it takes a request for lost.
pub const ACK_DELAY: Duration = Duration::from_millis(20);

/// Reply header of the acknowledgement a request carrying [`ACK`] gets: the service id (a NUID,
/// as `$SRV.INFO` reports it) of the worker that holds the request. The message has an empty
/// body and is not the reply; the final reply follows on the same subject.
pub const ACCEPTED_BY: &str = "Embatch-Accepted-By";

/// Header of a worker's acknowledgements ([`ACCEPTED_BY`]) and heartbeats
/// ([`heartbeat_subject`]): how many times the worker has connected to NATS (1 on its first
/// connection, a whole number). A reply the worker published just before its NATS server went
/// away can be lost with that server, while the worker, reconnected elsewhere within
/// [`HEARTBEAT_EXPIRY`], beats on: a client that sees a larger count on a heartbeat than on the
/// acknowledgement of a request it still waits for resends that request (the worker answers a
/// copy it still holds on the first reply subject, and computes one it answered again).
pub const WORKER_CONNECTS: &str = "Embatch-Worker-Connects";

/// Reply header on every final reply to a request that asked for an acknowledgement ([`ACK`]):
/// the worker's acknowledgement delay in whole ms ([`ACK_DELAY`]). It tells the client that the
/// worker acknowledges (a reply without an acknowledgement merely came first, or the
/// acknowledgement was lost, e.g. while the client was disconnected) and how long it waits
/// before it does; a worker that predates acknowledgements sends neither this nor
/// [`ACCEPTED_BY`].
pub const ACK_DELAY_MS: &str = "Embatch-Ack-Delay-Ms";

/// `<subject>.alive`: where a worker publishes its service id (the body, UTF-8) every
/// [`HEARTBEAT_INTERVAL`] while it holds a request it acknowledged more than one interval ago,
/// so a client knows that the worker holding its request (named by [`ACCEPTED_BY`]) is alive.
/// A client counts the acknowledgement and each heartbeat as word from the worker: it hears one
/// within 200 ms of an acknowledgement and every 100 ms after, until the reply. A worker that
/// holds a client's acknowledged request and is not heard for [`HEARTBEAT_EXPIRY`] is gone
/// (killed, partitioned): the client resends what it held. A worker is silent while it is idle
/// and while it answers what it holds within an interval of acknowledging it: a client watches
/// a worker only while it holds one of its requests (from the acknowledgement on).
pub fn heartbeat_subject(subject: &str) -> String {
    format!("{subject}.alive")
}

/// Request header (optional, since contract 1.6): the subject on which this client wants the
/// heartbeats of the worker that holds the request, instead of [`heartbeat_subject`]: a subject
/// of its own (the Rust client uses a fresh inbox, `_INBOX.<nuid>.alive`). The worker then beats
/// there, with the same body and headers, once per interval for all the requests of that client
/// it holds, and not on the shared subject: a beat reaches only the client that waits for it,
/// instead of every client listening on [`heartbeat_subject`] (docs/design/control-plane.md).
/// It must be a NATS subject without wildcards, at most [`HEARTBEAT_TO_MAX`] bytes
/// ([`valid_heartbeat_to`]); otherwise the request is refused (422). A client that sets it may
/// still listen on [`heartbeat_subject`] for workers that predate the header.
pub const HEARTBEAT_TO: &str = "Embatch-Heartbeat-To";

/// Longest [`HEARTBEAT_TO`] value a worker takes: 256 bytes.
pub const HEARTBEAT_TO_MAX: usize = 256;

/// Whether `subject` may be a [`HEARTBEAT_TO`] value: 1 to [`HEARTBEAT_TO_MAX`] bytes, tokens
/// separated by `.`, none empty, none `*` or `>`, no white space or control character.
pub fn valid_heartbeat_to(subject: &str) -> bool {
    (1..=HEARTBEAT_TO_MAX).contains(&subject.len())
        && subject.split('.').all(|token| {
            !token.is_empty()
                && token != "*"
                && token != ">"
                && !token.chars().any(|c| c.is_whitespace() || c.is_control())
        })
}

/// How often a worker that holds a request acknowledged over an interval ago publishes on
/// [`heartbeat_subject`] (or the request's [`HEARTBEAT_TO`]): 100 ms.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(100);

/// How long after its last word (acknowledgement or heartbeat) a worker that holds a client's
/// acknowledged request counts as gone: 500 ms (at least three intervals after the first beat is
/// due, so a process stalled for a few hundred ms on a loaded host is not taken for dead).
pub const HEARTBEAT_EXPIRY: Duration = Duration::from_millis(500);

/// Request header (optional): on a copy of a request that its client resends (the same
/// [`REQUEST_ID`]), the number of this copy, `2` and up. A worker that does not hold the request
/// yet admits as many inputs as the resent copies hold by deadline alone, without
/// `MAX_QUEUE_DELAY`, within [`RESEND_BACKLOG_WINDOW`], and leaves them out of the queue-delay
/// check of the requests behind them: resends come in bursts (the requests a lost worker held,
/// all at once), and a queue-delay bound would refuse part of a burst, and the requests right
/// behind it, although their callers' deadlines allow the burst to drain.
pub const ATTEMPT: &str = "Embatch-Attempt";

/// How long the credit that resent copies ([`ATTEMPT`]) open in a worker lasts after the last
/// of them reached it: 1 s.
pub const RESEND_BACKLOG_WINDOW: Duration = Duration::from_secs(1);

/// Request header (optional): the contract version the client speaks, e.g. `1`.
pub const VERSION: &str = "Embatch-Version";

/// Metadata key of the workers' `$SRV.PING` and `$SRV.INFO` answers (NATS micro discovery) that
/// carries a worker's live queue-group membership: [`membership::JOINED`] (takes requests),
/// [`membership::FULL`] (left the queue group while its backlog drains: saturated, not absent),
/// [`membership::UPSTREAM_UNHEALTHY`] (left while its upstream fails) or
/// [`membership::STOPPING`]. A client that gets "no responders" asks discovery: any `full` worker
/// means 429 (retry later); otherwise an `upstream_unhealthy` one means 503 (unhealthy), and
/// only `joined` (re-subscribing) or `stopping` ones, or none at all, mean 503 (no worker), as
/// `embatch_client::fleet::verdict` decides.
pub const MEMBERSHIP_METADATA: &str = "membership";

/// The values of [`MEMBERSHIP_METADATA`].
pub mod membership {
    /// A member of the queue group: takes requests.
    pub const JOINED: &str = "joined";
    /// Left the queue group: its backlog is over its `MAX_QUEUE_DELAY` (where it would shed
    /// with 429); rejoins when it has drained to half of that.
    pub const FULL: &str = "full";
    /// Left the queue group: its upstream fails (refused, 5xx, timeouts, a failing `/health`);
    /// rejoins when the upstream's `/health` answers again.
    pub const UPSTREAM_UNHEALTHY: &str = "upstream_unhealthy";
    /// Left the queue group for good: shutting down.
    pub const STOPPING: &str = "stopping";
}

/// Reply header: milliseconds the request waited in the worker before its upstream call started
/// (mirrors TEI's `x-queue-time`).
pub const QUEUE_TIME_MS: &str = "Embatch-Queue-Time-Ms";

/// Reply header: milliseconds the upstream call(s) for this request took (mirrors TEI's
/// `x-inference-time`).
pub const INFERENCE_TIME_MS: &str = "Embatch-Inference-Time-Ms";

/// Reply header of a success: the request's tokens, summed over its inputs as the worker's
/// tokenizer counts them (the model's own `tokenizer.json`: special tokens included, after the
/// prompt and after truncation), e.g. `42`. What the OpenAI route reports as `usage`. Absent
/// when the worker has no tokenizer for its model (it then counts inputs, not tokens).
pub const TOKENS: &str = "Embatch-Tokens";

/// Reply header on errors: the HTTP-style status code (`413`, `422`, `424`, `429`, `503`, `504`, …),
/// as in the NATS micro protocol.
pub const SERVICE_ERROR_CODE: &str = "Nats-Service-Error-Code";

/// Reply header on errors: the human-readable error message, as in the NATS micro protocol.
pub const SERVICE_ERROR: &str = "Nats-Service-Error";

/// Request header (optional): how this request uses the worker's embeddings cache, in the
/// words of HTTP's `Cache-Control` request directives (comma-separated, case-insensitive):
/// `no-cache` answers every input from the upstream (the fresh results are still stored);
/// `no-store` neither reads nor writes the cache. Other directives, or none, use the cache. The
/// gateway passes an HTTP request's `Cache-Control` header on as this one. Either way the
/// request's inputs are its own upstream work: they are not shared with equal inputs in flight
/// for other requests. Added in v1 as an optional header: a worker that predates it ignores it.
pub const CACHE_CONTROL: &str = "Embatch-Cache-Control";

/// Reply header of a success from a worker whose cache is on: how many of the request's inputs
/// were answered from the cache (its in-process LRU or the shared JetStream KV bucket), e.g.
/// `3` of 5; the others were embedded by the upstream (or shared with an equal input in
/// flight). Absent when the worker's cache is off, and from workers that predate it. The
/// gateway copies it to the HTTP response header `x-embatch-cache-hits`.
pub const CACHE_HITS: &str = "Embatch-Cache-Hits";

/// Request header (optional): the tenant a request is served for, e.g. `search` (1-64 of
/// `A-Z a-z 0-9 _ -`, see [`valid_tenant`]). The gateway sets it to the tenant whose API key
/// authenticated the HTTP request. A worker takes it only from callers it trusts: those in its
/// own NATS account (no `Nats-Request-Info` header) and those in the account named by its
/// `TRUSTED_ACCOUNT` setting. A request that reaches the worker through a service import from
/// another account is that account's tenant, whatever this header says (docs/tenants.md).
/// Absent: [`DEFAULT_TENANT`]. It scopes the cache and the fair share of the upstream.
pub const TENANT: &str = "Embatch-Tenant";

/// Request header (optional): the W3C Trace Context `traceparent` of the caller's span
/// (`00-<trace id>-<parent span id>-<flags>`), as HTTP carries it, lower-case as the W3C
/// specification writes it. A worker with tracing on starts its spans for the request as children
/// of it, and sends its own on to TEI; without tracing it is ignored. The gateway sends the
/// context of its own request span, or, with its tracing off, the HTTP request's `traceparent` as
/// it came. Added in v1 as an optional header: a worker that predates it ignores it.
pub const TRACEPARENT: &str = "traceparent";

/// Request header (optional): the W3C Trace Context `tracestate` that goes with
/// [`TRACEPARENT`] (vendor-specific key=value pairs), passed on unchanged.
pub const TRACESTATE: &str = "tracestate";

/// The tenant of requests that name none: an open gateway's one implicit tenant.
pub const DEFAULT_TENANT: &str = "default";

/// Header that nats-server adds to a request crossing a service import with `share: true`
/// (JSON; its `acc` field names the requester's account).
pub const REQUEST_INFO: &str = "Nats-Request-Info";

/// Whether `name` may name a tenant: 1 to 64 ASCII letters, digits, `_` or `-`, so that it is a
/// valid NATS subject token, KV key and Prometheus label value as it is.
pub fn valid_tenant(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Encodes a remaining budget for [`DEADLINE_MS`] (whole milliseconds, rounded down, at least 0).
pub fn encode_deadline(remaining: Duration) -> String {
    remaining.as_millis().to_string()
}

/// Parses a [`DEADLINE_MS`] value. `None` when it is not a non-negative integer of milliseconds.
pub fn parse_deadline(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_millis)
}

/// Parses an optional milliseconds header such as [`QUEUE_TIME_MS`]; `None` when absent or invalid.
pub fn parse_millis(value: Option<&str>) -> Option<u64> {
    value.and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_round_trips_in_whole_milliseconds() {
        let encoded = encode_deadline(Duration::from_micros(1_500_900));
        assert_eq!(encoded, "1500");
        assert_eq!(parse_deadline(&encoded), Some(Duration::from_millis(1500)));
    }

    #[test]
    fn heartbeat_to_is_a_subject_without_wildcards() {
        assert!(valid_heartbeat_to("_INBOX.abc.alive"));
        assert!(valid_heartbeat_to("x"));
        for bad in ["", "a..b", ".a", "a.", "a.*", "a.>", "a b", "a\tb"] {
            assert!(!valid_heartbeat_to(bad), "{bad:?}");
        }
        assert!(valid_heartbeat_to(&"a".repeat(HEARTBEAT_TO_MAX)));
        assert!(!valid_heartbeat_to(&"a".repeat(HEARTBEAT_TO_MAX + 1)));
    }

    #[test]
    fn tenant_names_are_subject_tokens() {
        assert!(valid_tenant("search-team_2"));
        assert!(!valid_tenant(""));
        assert!(!valid_tenant("a.b"));
        assert!(!valid_tenant("a b"));
        assert!(!valid_tenant(&"x".repeat(65)));
    }

    #[test]
    fn deadline_rejects_garbage_and_negatives() {
        assert_eq!(parse_deadline("soon"), None);
        assert_eq!(parse_deadline("-5"), None);
        assert_eq!(parse_deadline(" 7 "), Some(Duration::from_millis(7)));
    }
}
