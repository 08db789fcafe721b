//! Gateway settings: every one is a CLI flag and an environment variable of the same name.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use embatch_runtime::{JetStreamArgs, NatsArgs};

use crate::telemetry::LogFormat;

/// embatch gateway: TEI-compatible `POST /embed` over HTTP, forwarded as NATS requests to the
/// embatch workers.
#[derive(Debug, Clone, Parser)]
#[command(name = "embatch-gateway", version)]
pub struct Config {
    /// NATS servers and credentials (`--nats-url`, `--nats-creds`, `--nats-tls-ca`, ...).
    #[command(flatten)]
    pub nats: NatsArgs,

    /// Replicas of what the gateway creates in JetStream (`--jetstream-replicas`).
    #[command(flatten)]
    pub jetstream: JetStreamArgs,

    /// Address to serve HTTP on (IP:PORT).
    #[arg(long, env = "LISTEN_ADDR", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,

    /// Subject requests are published on (must match the workers').
    #[arg(long, env = "EMBATCH_SUBJECT", default_value = embatch_protocol::DEFAULT_SUBJECT)]
    pub subject: String,

    /// Longest a request may take end to end (e.g. 30s): sent to the worker as the request's
    /// deadline; answered 504 when it passes. A client may shorten it per request with the
    /// `x-embatch-timeout-ms` header.
    #[arg(long, env = "REQUEST_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,

    /// Largest request body in bytes (answered 413 beyond; TEI's default payload limit is 2 MB).
    #[arg(long, env = "MAX_BODY_BYTES", default_value_t = 2 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Most inputs in one request (mirrors TEI's max_client_batch_size; answered 422 beyond, as TEI 1.9.3).
    #[arg(long, env = "MAX_CLIENT_BATCH_SIZE", default_value_t = 512)]
    pub max_client_batch_size: usize,

    /// How long `/health` waits for a worker to answer a NATS micro ping (e.g. 1s).
    #[arg(long, env = "HEALTH_TIMEOUT", default_value = "1s", value_parser = humantime::parse_duration)]
    pub health_timeout: Duration,

    /// Most open HTTP connections; a new connection beyond it is closed at once. At start the
    /// gateway raises its soft open-file limit (`ulimit -Sn`) to the hard one (`ulimit -Hn`);
    /// when this setting is above that limit less 64 descriptors of headroom (NATS, the
    /// listener, files), the limit's cap is in effect instead. The log line `connection cap`
    /// says which. The default is twice `MAX_IN_FLIGHT`'s, so that with one request per
    /// HTTP/1.1 connection the in-flight bound (a 429 with `Retry-After`) binds before a
    /// closed connection does, with room for idle keep-alive connections: requests held
    /// through a NATS outage (5 s at 1,000 req/s is 5,000 open requests) wait instead of
    /// being refused.
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = 16384)]
    pub max_connections: usize,

    /// Most `/embed` requests in flight; beyond it a request is answered 429 `Overloaded` at
    /// once (load shedding at the edge; the workers shed by their own queues first).
    #[arg(long, env = "MAX_IN_FLIGHT", default_value_t = 8192)]
    pub max_in_flight: usize,

    /// Pending-connection queue of the listening socket (capped by the kernel's
    /// net.core.somaxconn).
    #[arg(long, env = "LISTEN_BACKLOG", default_value_t = 4096)]
    pub listen_backlog: u32,

    /// Longest time to receive a request's headers (e.g. 10s); slower clients are disconnected.
    #[arg(long, env = "HEADER_READ_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub header_read_timeout: Duration,

    /// Longest time to receive a whole request body once its headers are in (e.g. 30s),
    /// counted for the whole body, not per read: a client that stalls or trickles is answered
    /// 408 Request Timeout and disconnected. The default lets a body of the default
    /// `MAX_BODY_BYTES` (2 MiB) arrive at 70 kB/s. TEI 1.9.3 has no such timeout.
    #[arg(long, env = "BODY_READ_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub body_read_timeout: Duration,

    /// On SIGTERM/SIGINT: how long to let in-flight requests finish before exiting (e.g. 30s).
    #[arg(long, env = "SHUTDOWN_GRACE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,

    /// Largest input file `POST /v1/files` accepts, in bytes (OpenAI's 200 MB by default;
    /// answered 413 beyond).
    #[arg(long, env = "BULK_MAX_FILE_BYTES", default_value_t = 200 * 1024 * 1024)]
    pub bulk_max_file_bytes: usize,

    /// Most bytes all files together may take in NATS (inputs, outputs and error files: the
    /// `OBJ_EMBATCH_FILES` stream's `max_bytes`, set at start; 0: no budget). An upload that
    /// would not fit is refused: 413 when the file is larger than the whole budget, 507 while
    /// other files take the room. The default, 4 GiB, leaves room under nats/nats.conf's 10 GiB
    /// for the cache bucket and the running jobs' results (docs/operations.md, "Storage budget").
    /// Give every gateway the same value.
    #[arg(long, env = "BULK_FILES_MAX_BYTES", default_value_t = embatch_bulk::FILES_MAX_BYTES_DEFAULT)]
    pub bulk_files_max_bytes: u64,

    /// The `completion_window` values `POST /v1/batches` accepts, comma-separated durations
    /// (OpenAI accepts only `24h`, the default). A batch not finished within its window expires:
    /// what finished is delivered, the rest goes to the error file.
    #[arg(long, env = "BULK_COMPLETION_WINDOWS", default_value = "24h", value_parser = crate::bulk::parse_windows)]
    pub bulk_completion_windows: std::vec::Vec<(String, Duration)>,

    /// The tenants file (TOML; see docs/tenants.md): tenants, their API keys, weights and
    /// per-minute quotas. With it, every route but `/health`, `/metrics` and the OpenAPI
    /// document needs `Authorization: Bearer <key>` (401 otherwise), and bulk files and batches
    /// are scoped to their tenant. Read again every second: a changed key works, or stops
    /// working, without a restart. Unset: open to every caller, as the tenant `default`.
    #[arg(long, env = "TENANTS_FILE")]
    pub tenants_file: Option<std::path::PathBuf>,

    /// The window tenants' quotas are counted in (e.g. 60s): `requests_per_minute` and
    /// `tokens_per_minute` are scaled to it, and a window's counts start from zero when it ends
    /// (windows are aligned to Unix time, so every gateway shares them). A shorter window
    /// spreads a tenant's minute more evenly; give every gateway the same value.
    #[arg(long, env = "QUOTA_WINDOW", default_value = "60s", value_parser = humantime::parse_duration)]
    pub quota_window: Duration,

    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// Distributed tracing over OTLP (`--otlp-endpoint`, `--otlp-protocol`); off by default.
    #[command(flatten)]
    pub otel: embatch_runtime::tracing_otel::OtelArgs,

    /// The stack's default model (same setting as the workers'): where TEI's routes and OpenAI
    /// requests without a `model` go, on its model subject. Unset: the plain subject, answered
    /// by every worker that serves the default model (all of them when the workers leave it
    /// unset too).
    #[arg(long, env = "EMBATCH_DEFAULT_MODEL")]
    pub default_model: Option<String>,
}
