//! Worker settings: every one is a CLI flag and an environment variable of the same name.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use embatch_runtime::{JetStreamArgs, NatsArgs, OptionalAddr, Replicas, Secret};

use crate::batcher::{
    BUILTIN_MAX_BATCH_TOKENS, BatchCost, BatcherConfig, QueueDelay, TEI_DEFAULT_MAX_BATCH_TOKENS,
    TokenBudget,
};
use crate::telemetry::LogFormat;

mod tei_urls;
use tei_urls::parse_tei_urls;
pub use tei_urls::{TeiUrlError, TeiUrls, TeiUrlsError};

/// embatch worker: joins the NATS queue group, collects requests into batches and calls the
/// upstream model once per batch.
#[derive(Debug, Clone, Parser)]
#[command(name = "embatch-worker", version)]
pub struct Config {
    /// NATS servers and credentials (`--nats-url`, `--nats-creds`, `--nats-tls-ca`, ...).
    #[command(flatten)]
    pub nats: NatsArgs,

    /// Replicas of what the worker creates in JetStream (`--jetstream-replicas`).
    #[command(flatten)]
    pub jetstream: JetStreamArgs,

    /// Subject the requests arrive on (must match the gateway's).
    #[arg(long, env = "EMBATCH_SUBJECT", default_value = embatch_protocol::DEFAULT_SUBJECT)]
    pub subject: String,

    /// NATS queue group shared by all workers: each request goes to exactly one of them.
    #[arg(long, env = "EMBATCH_QUEUE_GROUP", default_value = embatch_protocol::DEFAULT_QUEUE_GROUP)]
    pub queue_group: String,

    /// Base URL of a text-embeddings-inference server (e.g. http://tei:80, or https://... for
    /// TLS), or several separated by commas: replicas of one model, each call to the one with
    /// the fewest calls in flight. Unset, and no OPENAI_URL: the built-in CPU model from
    /// --model-dir.
    #[arg(long, env = "TEI_URL", value_parser = parse_tei_urls)]
    pub tei_url: Option<TeiUrls>,

    /// Bearer token sent to TEI (TEI's `--api-key`, or a hosted endpoint's token). Never logged.
    #[arg(long, env = "TEI_API_KEY", hide_env_values = true)]
    pub tei_api_key: Option<Secret>,

    /// PEM file of the CA that signed TEI's certificate, for an `https://` TEI_URL under a
    /// private CA (the system's roots are trusted without it).
    #[arg(long, env = "TEI_TLS_CA")]
    pub tei_tls_ca: Option<PathBuf>,

    /// Base URL of an OpenAI-compatible embeddings API up to its version (vLLM, Infinity,
    /// SGLang, Ollama, LiteLLM or a hosted API, e.g. http://vllm:8000/v1), or several separated
    /// by commas: replicas of one model, each call to the one with the fewest calls in flight.
    /// The worker posts batches to `{url}/embeddings` and probes `GET {url}/models` for health. Needs
    /// OPENAI_MODEL; not with TEI_URL or MODEL_ID. Such a server has no /info: its limits are
    /// OPENAI_MAX_INPUTS and OPENAI_MAX_INPUT_TOKENS.
    #[arg(
        long,
        env = "OPENAI_URL",
        value_parser = parse_tei_urls,
        requires = "openai_model",
        conflicts_with_all = ["tei_url", "model_id"]
    )]
    pub openai_url: Option<TeiUrls>,

    /// The `model` field sent to OPENAI_URL (e.g. BAAI/bge-small-en-v1.5); also the name the
    /// model is served by unless MODEL_ALIAS.
    #[arg(long, env = "OPENAI_MODEL", requires = "openai_url")]
    pub openai_model: Option<String>,

    /// Bearer token sent to OPENAI_URL (a hosted API's key, vLLM's `--api-key`). Never logged.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub openai_api_key: Option<Secret>,

    /// Most inputs the OPENAI_URL server takes in one call (inputs). 2,048 is OpenAI's own
    /// limit; batches are MAX_BATCH_SIZE below it, so lower this only for a server that takes
    /// fewer than MAX_BATCH_SIZE.
    #[arg(long, env = "OPENAI_MAX_INPUTS", default_value_t = crate::upstream::openai::DEFAULT_MAX_INPUTS)]
    pub openai_max_inputs: usize,

    /// The OPENAI_URL model's input limit (tokens, e.g. 512). With it the worker counts tokens
    /// with the model's tokenizer (TOKENIZER, or OPENAI_MODEL's in the Hugging Face cache),
    /// batches by tokens, and refuses an input over it that says `truncate: false` (422, as
    /// TEI). Unset: inputs are counted, and `truncate: false` is refused.
    #[arg(long, env = "OPENAI_MAX_INPUT_TOKENS")]
    pub openai_max_input_tokens: Option<usize>,

    /// Directory of a sentence-transformers BERT-family model for the built-in CPU upstream
    /// (config.json, tokenizer.json, model.safetensors, 1_Pooling/config.json). Used when
    /// neither --tei-url nor --openai-url is set; `scripts/fetch-model.sh` fills the default.
    #[arg(long, env = "MODEL_DIR", default_value = "models/all-MiniLM-L6-v2")]
    pub model_dir: PathBuf,

    /// Hugging Face Hub model id for the built-in CPU upstream (e.g.
    /// sentence-transformers/all-MiniLM-L6-v2), fetched into the Hugging Face cache (HF_HOME) at
    /// start. Used when --tei-url is unset; takes precedence over --model-dir. Needs the `hub`
    /// feature (on by default) and a reachable hub.
    #[arg(long, env = "MODEL_ID")]
    pub model_id: Option<String>,

    /// A `tokenizer.json` of the TEI model (with TEI_URL), to count tokens in the worker. Unset:
    /// the one of the `model_id` TEI's /info names, from the Hugging Face cache (HF_HOME),
    /// fetched from the hub when it can be reached (`HF_HUB_OFFLINE=1`: the cache alone); else
    /// TEI's POST /tokenize; else inputs are counted. The built-in model always uses its own.
    #[arg(long, env = "TOKENIZER")]
    pub tokenizer: Option<PathBuf>,

    /// Most inputs (not requests) in one upstream call. Larger batches raise throughput on a GPU
    /// until it saturates; capped by the upstream's own max_client_batch_size.
    #[arg(long, env = "MAX_BATCH_SIZE", default_value_t = 32)]
    pub max_batch_size: usize,

    /// Most tokens one upstream call may cost (counted as BATCH_COST says); an input over the
    /// whole budget is sent alone. Unset: TEI's own `max_batch_tokens` from its /info (16,384
    /// when /info does not say); for the built-in model MAX_BATCH_SIZE x the model's input limit
    /// (32 x 256 = 8,192 tokens for all-MiniLM-L6-v2).
    #[arg(long, env = "MAX_BATCH_TOKENS")]
    pub max_batch_tokens: Option<usize>,

    /// How a batch's cost grows with its inputs' lengths, as TEI's router counts it. `padded`:
    /// longest input x inputs (every input padded to the longest of its batch: TEI's candle CPU
    /// backend, the built-in model); batches are then shaped by length. `unpadded`: the sum of
    /// tokens (TEI's flash-attention GPU backends). `auto`: padded for the built-in model; for
    /// TEI, from the `model_dtype` its /info reports: `float32` (TEI's CPU backends) padded,
    /// `float16`/`bfloat16` (its CUDA backends) unpadded, anything else padded. `inputs`: ignore
    /// lengths (batches of the oldest MAX_BATCH_SIZE inputs in arrival order, no token budget:
    /// batching by input counts only).
    #[arg(long, env = "BATCH_COST", value_enum, default_value = "auto")]
    pub batch_cost: BatchCostSetting,

    /// Longest a batch that is not full waits for more inputs after its first request arrived
    /// while a call slot for it is free (e.g. 5ms). With DISPATCH_WHEN_IDLE it applies only while
    /// a call is in flight (an idle upstream takes a lone request at once).
    #[arg(long, env = "MAX_WAIT_TIME", default_value = "5ms", value_parser = humantime::parse_duration)]
    pub max_wait_time: Duration,

    /// Most upstream calls in flight at once from this worker to each upstream replica (the
    /// worker's total is this times the URLs in `TEI_URL`). 2 keeps a GPU process busy while
    /// its next batch is being filled; more only adds queueing inside the upstream.
    #[arg(long, env = "MAX_CONCURRENT_BATCHES", default_value_t = 2)]
    pub max_concurrent_batches: usize,

    /// A batch that is not full (fewer than MAX_BATCH_SIZE inputs) is sent only while fewer than
    /// this many upstream calls are in flight; beyond it only full batches take a slot. Unset:
    /// the worker's calls in flight (MAX_CONCURRENT_BATCHES × replicas) - 1 (at least 1), so while a call runs, a batch that waited
    /// MAX_WAIT_TIME keeps filling in the worker instead of queueing inside the busy upstream,
    /// and the last slot is kept for a full batch. MAX_CONCURRENT_BATCHES: any due batch takes
    /// any free slot.
    #[arg(long, env = "PARTIAL_BATCH_SLOTS")]
    pub partial_batch_slots: Option<usize>,

    /// Most inputs accepted and not yet answered; beyond it requests are answered 429 at once.
    /// Bounds the worker's memory; keep it below NATS' subscription buffer (65,536 messages).
    #[arg(long, env = "QUEUE_CAP", default_value_t = 4096)]
    pub queue_cap: usize,

    /// Most bytes of input text accepted and not yet answered; beyond it requests are answered
    /// 429 at once, and a single request larger than this is answered 413. Bounds the worker's
    /// memory when inputs are long (64 MiB by default).
    #[arg(long, env = "MAX_QUEUE_BYTES", default_value_t = 64 << 20)]
    pub max_queue_bytes: usize,

    /// Longest expected queue wait (acceptance to first upstream call) a request that fits one
    /// upstream call is admitted with, whatever its deadline; beyond it 429 at once. It keeps
    /// the queue short for callers whose own timeout the worker cannot see. A request that
    /// needs several calls (more inputs than MAX_BATCH_SIZE) is bounded by its deadline,
    /// QUEUE_CAP and MAX_QUEUE_BYTES instead. `auto`: 2 x the measured upstream call time +
    /// MAX_WAIT_TIME (the queue that keeps the upstream busy, plus as much slack), but at least
    /// 500 ms while fewer than 512 requests are held; or a duration (e.g. 200ms).
    #[arg(long, env = "MAX_QUEUE_DELAY", default_value = "auto")]
    pub max_queue_delay: QueueDelay,

    /// While no upstream call is in flight, send a waiting batch at once instead of after
    /// MAX_WAIT_TIME (requests arriving during a call still batch, see PARTIAL_BATCH_SLOTS).
    /// Cuts low-load latency by up to MAX_WAIT_TIME; `true` or `false` (then a batch always
    /// waits MAX_WAIT_TIME or until full).
    #[arg(long, env = "DISPATCH_WHEN_IDLE", default_value_t = true, action = clap::ArgAction::Set)]
    pub dispatch_when_idle: bool,

    /// Queue-group membership. `adaptive`: the worker leaves the queue group while its backlog
    /// is over MAX_QUEUE_DELAY (where it would shed) and another member has room, or while its
    /// upstream fails (2 failed calls or /health probes in a row); it rejoins when drained to
    /// half of that, when no member has room, or when /health answers again. `static`: always
    /// a member (an equal share each; what a worker cannot serve is shed with 429).
    #[arg(long, env = "MEMBERSHIP", default_value = "adaptive")]
    pub membership: crate::membership::Mode,

    /// Most inputs in one request (mirrors TEI's max_client_batch_size; answered 422 beyond, as TEI 1.9.3).
    #[arg(long, env = "MAX_CLIENT_BATCH_SIZE", default_value_t = 512)]
    pub max_client_batch_size: usize,

    /// Deadline of a request that carries no Embatch-Deadline-Ms header (e.g. 30s).
    #[arg(long, env = "DEFAULT_DEADLINE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub default_deadline: Duration,

    /// Timeout of one upstream HTTP call (e.g. 30s); a call that exceeds it fails its requests
    /// with 424.
    #[arg(long, env = "UPSTREAM_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub upstream_timeout: Duration,

    /// On SIGTERM/SIGINT: how long to keep answering already accepted requests before exiting.
    #[arg(long, env = "SHUTDOWN_GRACE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,

    /// Address (IP:PORT) of the worker's small HTTP server for /metrics (Prometheus) and
    /// /health. Empty string: no HTTP server.
    #[arg(long, env = "METRICS_ADDR", default_value = "0.0.0.0:9091")]
    pub metrics_addr: OptionalAddr,

    /// Take bulk (batch) work from NATS JetStream (OpenAI's Batch API; see docs/bulk.md):
    /// `true` or `false`. Without JetStream on the server the lane waits for it and the
    /// interactive path is unaffected.
    #[arg(long, env = "BULK", default_value_t = true, action = clap::ArgAction::Set)]
    pub bulk: bool,

    /// Inputs per bulk work item: a batch's lines are grouped until a chunk holds at least this
    /// many inputs (a line is never split). Unset: MAX_BATCH_SIZE, so one item fills one full
    /// upstream call.
    #[arg(long, env = "BULK_CHUNK_INPUTS")]
    pub bulk_chunk_inputs: Option<usize>,

    /// Most bytes of input lines per bulk work item (256 KiB by default), so an item and its
    /// results stay under the NATS server's max_payload (1 MB by default).
    #[arg(long, env = "BULK_CHUNK_BYTES", default_value_t = 256 * 1024)]
    pub bulk_chunk_bytes: usize,

    /// Most upstream calls in flight under which a batch of bulk inputs alone may start, once
    /// no interactive request arrived for 10 upstream call times (while they arrive: only on
    /// an idle upstream, so a bulk backlog adds at most one call to interactive latency). Bulk
    /// inputs also fill the room interactive batches leave, whatever this says. 1: never more
    /// than one bulk call ahead of an interactive request; 2 (the default, with 2
    /// MAX_CONCURRENT_BATCHES): a bulk job alone keeps the upstream busy back to back.
    #[arg(long, env = "BULK_CALLS", default_value_t = 2)]
    pub bulk_calls: usize,

    /// Deliveries of a bulk work item whose upstream call keeps failing (NAKed with a delay
    /// doubling from 1 s to 30 s) before its lines go to the error file as `upstream_failed`;
    /// and of a bulk job (validation, finalization, a cancel's) that keeps failing before its
    /// batch ends `failed` with the reason in its `errors`.
    #[arg(long, env = "BULK_MAX_DELIVER", default_value_t = 5)]
    pub bulk_max_deliver: i64,

    /// How long a bulk message may go unacknowledged before JetStream redelivers it to another
    /// worker (e.g. 30s); in-progress acks are sent every third of it while a worker holds it.
    #[arg(long, env = "BULK_ACK_WAIT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub bulk_ack_wait: Duration,

    /// Most requests (lines) in one batch input file (OpenAI's 50,000).
    #[arg(long, env = "BULK_MAX_REQUESTS", default_value_t = 50_000)]
    pub bulk_max_requests: u64,

    /// Most inputs in one batch line (OpenAI's 2,048 per embeddings request).
    #[arg(long, env = "BULK_MAX_LINE_INPUTS", default_value_t = 2048)]
    pub bulk_max_line_inputs: usize,

    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// Distributed tracing over OTLP (`--otlp-endpoint`, `--otlp-protocol`); off by default.
    #[command(flatten)]
    pub otel: embatch_runtime::tracing_otel::OtelArgs,

    /// The name this worker's model is served and routed by (the OpenAI `model` field, the
    /// model subject `<subject>.<name>`, `/v1/models`). Unset: the model id, TEI's `/info`
    /// `model_id` or the built-in model's (e.g. sentence-transformers/all-MiniLM-L6-v2).
    #[arg(long, env = "MODEL_ALIAS")]
    pub model_alias: Option<String>,

    /// The stack's default model: the one that answers the plain subject (TEI's routes and v1
    /// NATS clients, which name no model). Same setting on the gateway. Unset: every worker
    /// also answers the plain subject (a single-model fleet, as before models were named); set:
    /// only the workers whose model name is this one do.
    #[arg(long, env = "EMBATCH_DEFAULT_MODEL")]
    pub default_model: Option<String>,

    /// The embeddings cache: an in-process LRU in front of a JetStream KV bucket shared by the
    /// workers, keyed by the model, the options and the exact input (see docs/design/cache.md).
    /// `false` turns both off (equal inputs in flight are still sent upstream once).
    #[arg(long, env = "CACHE", default_value_t = true, action = clap::ArgAction::Set)]
    pub cache: bool,

    /// Most bytes of embeddings the in-process LRU holds (bytes; the least recently used are
    /// evicted beyond it). 0: no in-process tier.
    #[arg(long, env = "CACHE_LOCAL_BYTES", default_value_t = 64 << 20)]
    pub cache_local_bytes: usize,

    /// The JetStream KV bucket shared by the workers (created when absent; the NATS server
    /// needs JetStream). Empty: no shared tier.
    #[arg(long, env = "CACHE_BUCKET", default_value = "embatch_cache")]
    pub cache_bucket: String,

    /// Most bytes the shared bucket holds when this worker creates it (bytes; the oldest
    /// entries are dropped beyond it).
    #[arg(long, env = "CACHE_SHARED_BYTES", default_value_t = 1 << 30)]
    pub cache_shared_bytes: u64,

    /// Age after which the shared bucket drops an entry, when this worker creates it (e.g.
    /// `24h`).
    #[arg(long, env = "CACHE_MAX_AGE", default_value = "24h", value_parser = humantime::parse_duration)]
    pub cache_max_age: Duration,

    /// Longest one JetStream KV call of the cache may take (e.g. `50ms`); a read past it is a
    /// miss, so a KV outage adds at most this to a request.
    #[arg(long, env = "CACHE_KV_TIMEOUT", default_value = "50ms", value_parser = humantime::parse_duration)]
    pub cache_kv_timeout: Duration,

    /// The model's revision in the cache key, beside the upstream's own `model_id`,
    /// `model_sha` and `version`: set it (e.g. to a date or a hash) when the weights change
    /// under the same name without a new `model_sha` (the built-in model's directory, a TEI
    /// serving a local path).
    #[arg(long, env = "CACHE_REVISION")]
    pub cache_revision: Option<String>,

    /// The tenants file (TOML, the gateway's; see docs/tenants.md): each tenant's weight (its
    /// share of the upstream under contention), NATS account and cache group. Read again every
    /// second. With it, a tenant it does not name is refused (403), except `default`. Unset:
    /// every tenant has weight 1 and its own cache scope, and a caller from another NATS account
    /// is the tenant named like the account.
    #[arg(long, env = "TENANTS_FILE")]
    pub tenants_file: Option<PathBuf>,

    /// The NATS account of the gateway when it is not the worker's own: requests from it that
    /// cross a service import may name their tenant (`Embatch-Tenant`). Requests from the
    /// worker's own account always may; those from any other account are that account's
    /// tenant. Unset: only the worker's own account is trusted.
    #[arg(long, env = "TRUSTED_ACCOUNT")]
    pub trusted_account: Option<String>,
}

/// `BATCH_COST`: a [`BatchCost`], or `auto` (from the upstream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BatchCostSetting {
    /// Padded for the built-in model; for TEI, by the `model_dtype` of its /info.
    Auto,
    /// `longest × inputs`.
    Padded,
    /// The sum of tokens.
    Unpadded,
    /// Input counts only.
    Inputs,
}

impl Config {
    /// The batcher's share of the settings. `upstream_info` is the upstream's TEI-shaped /info
    /// document (`None` when it could not be read): `MAX_BATCH_TOKENS` and `BATCH_COST` default
    /// from it.
    pub fn batcher(&self, upstream_info: Option<&serde_json::Value>) -> BatcherConfig {
        BatcherConfig {
            max_batch_size: self.max_batch_size,
            tokens: self.token_budget(upstream_info),
            max_wait: self.max_wait_time,
            max_concurrent_batches: self.concurrent_batches(),
            partial_batch_slots: self.partial_batch_slots,
            queue_cap: self.queue_cap,
            max_queue_bytes: self.max_queue_bytes,
            max_queue_delay: self.max_queue_delay,
            dispatch_when_idle: self.dispatch_when_idle,
        }
    }
}

impl Config {
    /// The worker's upstream calls in flight: `MAX_CONCURRENT_BATCHES` per upstream replica
    /// (one, but for a `TEI_URL` list), so a replica listed is a replica kept busy.
    pub fn concurrent_batches(&self) -> usize {
        let replicas = self.tei_url.as_ref().map_or(1, |urls| urls.urls().len());
        self.max_concurrent_batches.saturating_mul(replicas.max(1))
    }

    /// `MAX_BATCH_TOKENS` and `BATCH_COST`, their defaults resolved from the upstream's /info.
    pub fn token_budget(&self, upstream_info: Option<&serde_json::Value>) -> TokenBudget {
        let builtin = self.tei_url.is_none() && self.openai_url.is_none();
        let field = |name: &str| upstream_info.and_then(|info| info.get(name));
        let max_batch_tokens = self.max_batch_tokens.unwrap_or_else(|| {
            let reported = field("max_batch_tokens")
                .and_then(serde_json::Value::as_u64)
                .and_then(|n| usize::try_from(n).ok());
            let input_limit = field("max_input_length")
                .and_then(serde_json::Value::as_u64)
                .and_then(|n| usize::try_from(n).ok());
            match (builtin, reported, input_limit) {
                (_, Some(reported), _) => reported,
                (true, None, Some(limit)) => self.max_batch_size.max(1).saturating_mul(limit),
                (true, None, None) => BUILTIN_MAX_BATCH_TOKENS,
                (false, None, _) => TEI_DEFAULT_MAX_BATCH_TOKENS,
            }
        });
        let cost = match self.batch_cost {
            BatchCostSetting::Padded => BatchCost::Padded,
            BatchCostSetting::Unpadded => BatchCost::Unpadded,
            BatchCostSetting::Inputs => BatchCost::Inputs,
            BatchCostSetting::Auto if builtin => BatchCost::Padded,
            BatchCostSetting::Auto => {
                match field("model_dtype").and_then(serde_json::Value::as_str) {
                    Some("float16" | "bfloat16") => BatchCost::Unpadded,
                    _ => BatchCost::Padded,
                }
            }
        };
        TokenBudget {
            max_batch_tokens: u64::try_from(max_batch_tokens).unwrap_or(u64::MAX),
            cost,
        }
    }

    /// The cache's share of the settings.
    pub fn cache(&self) -> crate::cache::CacheConfig {
        crate::cache::CacheConfig {
            enabled: self.cache,
            local_bytes: self.cache_local_bytes,
            bucket: self.cache_bucket.clone(),
            shared_bytes: self.cache_shared_bytes,
            max_age: self.cache_max_age,
            kv_timeout: self.cache_kv_timeout,
            revision: self.cache_revision.clone().unwrap_or_default(),
            replicas: self.replicas(),
        }
    }

    /// The bulk lane's share of the settings (its `model` is set once the model is known; an
    /// empty `default_model` means the served model).
    pub fn bulk(&self) -> embatch_bulk::BulkConfig {
        embatch_bulk::BulkConfig {
            enabled: self.bulk,
            chunk_inputs: self.bulk_chunk_inputs.unwrap_or(self.max_batch_size).max(1),
            chunk_bytes: self.bulk_chunk_bytes.max(1),
            calls: self.bulk_calls.max(1),
            max_deliver: self.bulk_max_deliver.max(1),
            ack_wait: self.bulk_ack_wait,
            limits: embatch_bulk::LineLimits {
                max_requests: self.bulk_max_requests,
                max_line_inputs: self.bulk_max_line_inputs,
            },
            model: String::new(),
            default_model: self
                .default_model
                .clone()
                .filter(|d| !d.is_empty())
                .unwrap_or_default(),
            subject: self.subject.clone(),
            replicas: self.replicas(),
        }
    }

    /// `JETSTREAM_REPLICAS`.
    pub fn replicas(&self) -> Replicas {
        self.jetstream.jetstream_replicas
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Config {
        Config::try_parse_from(std::iter::once("embatch-worker").chain(args.iter().copied()))
            .expect("parses")
    }

    #[test]
    fn a_tei_url_must_be_an_http_or_https_url() {
        assert_eq!(
            parse(&["--tei-url", "https://tei:8443"])
                .tei_url
                .map(|urls| urls.to_string()),
            Some("https://tei:8443/".to_owned())
        );
        for (url, message) in [
            ("ftp://tei", "the scheme must be http or https, not ftp"),
            ("tei:80", "the scheme must be http or https, not tei"),
            ("//tei", "not a URL: relative URL without a base"),
        ] {
            let err = Config::try_parse_from(["embatch-worker", "--tei-url", url])
                .expect_err(url)
                .to_string();
            assert!(err.contains(message), "{url}: {err}");
        }
    }

    #[test]
    fn a_tei_url_list_names_replicas_and_its_bad_item() {
        let urls = parse(&["--tei-url", "http://tei-a:8080, http://tei-b:8080/"])
            .tei_url
            .expect("a list");
        let urls: Vec<&str> = urls.urls().iter().map(reqwest::Url::as_str).collect();
        assert_eq!(urls, ["http://tei-a:8080/", "http://tei-b:8080/"]);
        for (list, message) in [
            (
                "http://a,ftp://b",
                r#"TEI_URL item 2 ("ftp://b"): the scheme must be http or https, not ftp"#,
            ),
            (
                "http://a,,http://c",
                "TEI_URL item 2 is empty (the list is URLs separated by commas)",
            ),
            ("http://a,", "TEI_URL item 2 is empty"),
            ("", "TEI_URL item 1 is empty"),
            (
                "tei:80,http://b",
                r#"TEI_URL item 1 ("tei:80"): the scheme"#,
            ),
        ] {
            let err = Config::try_parse_from(["embatch-worker", "--tei-url", list])
                .expect_err(list)
                .to_string();
            assert!(err.contains(message), "{list}: {err}");
            assert!(err.contains("--tei-url"), "names the field: {err}");
        }
    }

    #[test]
    fn max_concurrent_batches_counts_per_replica() {
        let calls = |args: &[&str]| parse(args).batcher(None).max_concurrent_batches;
        assert_eq!(calls(&[]), 2, "the built-in model");
        assert_eq!(calls(&["--tei-url", "http://a"]), 2);
        assert_eq!(calls(&["--tei-url", "http://a,http://b,http://c"]), 6);
        let three = ["--tei-url", "http://a,http://b,http://c"];
        assert_eq!(
            calls(&[&three[..], &["--max-concurrent-batches", "1"]].concat()),
            3
        );
    }

    #[test]
    fn exactly_one_upstream_is_configured() {
        let openai = ["--openai-url", "http://vllm:8000/v1", "--openai-model", "m"];
        let config = parse(&openai);
        assert_eq!(config.openai_model.as_deref(), Some("m"));
        assert_eq!(
            config.token_budget(None),
            TokenBudget::default(),
            "not the built-in model's budget"
        );
        for (args, message) in [
            (
                &["--openai-url", "http://vllm:8000/v1"][..],
                "--openai-model <OPENAI_MODEL>",
            ),
            (&["--openai-model", "m"][..], "--openai-url <OPENAI_URL>"),
            (
                &[
                    "--tei-url",
                    "http://tei",
                    "--openai-url",
                    "http://v/v1",
                    "--openai-model",
                    "m",
                ][..],
                "cannot be used with",
            ),
            (
                &[
                    "--model-id",
                    "x/y",
                    "--openai-url",
                    "http://v/v1",
                    "--openai-model",
                    "m",
                ][..],
                "cannot be used with",
            ),
            (
                &["--openai-url", "ftp://v", "--openai-model", "m"][..],
                "scheme must be http",
            ),
        ] {
            let err = Config::try_parse_from(
                std::iter::once("embatch-worker").chain(args.iter().copied()),
            )
            .expect_err(message)
            .to_string();
            assert!(err.contains(message), "{args:?}: {err}");
        }
    }

    #[test]
    fn the_token_budget_defaults_from_the_upstreams_info() {
        let builtin = serde_json::json!({"max_input_length": 256, "max_batch_tokens": null});
        assert_eq!(
            parse(&[]).token_budget(Some(&builtin)),
            TokenBudget {
                max_batch_tokens: 32 * 256,
                cost: BatchCost::Padded
            },
            "built-in model: MAX_BATCH_SIZE x its input limit, padded"
        );
        let tei = ["--tei-url", "http://tei:80"];
        let gpu = serde_json::json!({"max_batch_tokens": 32768, "model_dtype": "float16"});
        assert_eq!(
            parse(&tei).token_budget(Some(&gpu)),
            TokenBudget {
                max_batch_tokens: 32768,
                cost: BatchCost::Unpadded
            },
            "TEI on a GPU: its own budget, unpadded"
        );
        let cpu = serde_json::json!({"max_batch_tokens": 16384, "model_dtype": "float32"});
        assert_eq!(parse(&tei).token_budget(Some(&cpu)).cost, BatchCost::Padded);
        assert_eq!(
            parse(&tei).token_budget(None),
            TokenBudget::default(),
            "no /info: TEI's default budget, padded"
        );
        let set = [
            "--tei-url",
            "http://tei:80",
            "--max-batch-tokens",
            "2048",
            "--batch-cost",
            "inputs",
        ];
        assert_eq!(
            parse(&set).token_budget(Some(&gpu)),
            TokenBudget {
                max_batch_tokens: 2048,
                cost: BatchCost::Inputs
            },
            "the settings win"
        );
    }
}
