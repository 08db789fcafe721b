//! Distributed tracing: the process's spans exported over OTLP (gRPC or HTTP/protobuf) to an
//! OpenTelemetry receiver, and W3C trace contexts ([`TraceContext`]) turned into span parents and
//! back.
//!
//! Off unless an endpoint is configured ([`OtelArgs`]: `--otlp-endpoint`,
//! `OTEL_EXPORTER_OTLP_ENDPOINT`). Off, [`init`] installs exactly the log subscriber of
//! [`crate::init_logging`] and nothing else, and every function here returns at once after one
//! relaxed atomic load ([`enabled`]): the binaries create their spans only when it is `true`.
//! On, a [`tracing_opentelemetry`] layer beside the log layer turns the embatch crates' spans
//! (targets `embatch*`, `DEBUG` and above, whatever `RUST_LOG` says; their `WARN` and `ERROR`
//! events become span events) into OpenTelemetry spans, batched and exported on a thread of the
//! SDK's own.
//!
//! The SDK reads the standard variables itself: `OTEL_SERVICE_NAME` (default: the binary's
//! name), `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`
//! (default `parentbased_always_on`), `OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (a full URL, which wins
//! over the endpoint), and the `OTEL_BSP_*` batch settings.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use embatch_client::TraceContext;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{
    Span as _, SpanKind, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracerProvider, Tracer};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::LogFormat;

/// An attribute of a span written with [`record_interval`].
pub use opentelemetry::KeyValue;

mod http_client;

/// Whether spans are exported: set once by [`init`], read on every request.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// The tracer of the spans written directly ([`record_interval`]), set by [`init`].
static TRACER: OnceLock<Tracer> = OnceLock::new();

/// How long [`Tracing::shutdown`] waits for the last spans to be exported: 5 s.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// The OTLP transport (`--otlp-protocol`, `OTEL_EXPORTER_OTLP_PROTOCOL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OtlpProtocol {
    /// OTLP over gRPC (a receiver's port 4317).
    #[value(name = "grpc")]
    Grpc,
    /// OTLP over HTTP with protobuf bodies (a receiver's port 4318), the specification's default.
    #[value(name = "http/protobuf")]
    HttpProtobuf,
}

/// The tracing settings every binary shares (flattened into its clap `Config`).
#[derive(Debug, Clone, clap::Args)]
pub struct OtelArgs {
    /// OTLP receiver to export spans to (`http://host:4318` for `http/protobuf`, where
    /// `/v1/traces` is appended; `http://host:4317` for `grpc`; `https://` for TLS with the
    /// system's roots). Unset: tracing off (a `traceparent` is still passed on as it came).
    #[arg(long = "otlp-endpoint", env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// OTLP transport: `http/protobuf` or `grpc`.
    #[arg(
        long = "otlp-protocol",
        env = "OTEL_EXPORTER_OTLP_PROTOCOL",
        value_enum,
        default_value = "http/protobuf"
    )]
    pub otlp_protocol: OtlpProtocol,
}

/// Why tracing could not be set up: the binary stops with it at start.
#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    /// `--otlp-endpoint` is not an `http://` or `https://` URL.
    #[error(
        "--otlp-endpoint (OTEL_EXPORTER_OTLP_ENDPOINT) {endpoint:?} is not an http:// or https:// URL: {reason}"
    )]
    Endpoint {
        /// The value given.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The OTLP exporter could not be built.
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    /// The HTTP client of the `http/protobuf` exporter could not be built.
    #[error("cannot build the OTLP HTTP client: {0}")]
    HttpClient(#[from] reqwest::Error),
}

/// The tracer provider of a process with tracing on; [`Tracing::shutdown`] exports what is left.
#[derive(Debug, Default)]
#[must_use = "call `shutdown` at exit, or the last spans are lost"]
pub struct Tracing {
    provider: Option<SdkTracerProvider>,
}

impl Tracing {
    /// Exports the spans not yet sent and stops the exporter (at most [`SHUTDOWN_TIMEOUT`]),
    /// off the async threads; nothing to do with tracing off.
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        ENABLED.store(false, Ordering::Relaxed);
        let done =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT))
                .await;
        match done {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(%err, "cannot export the last spans"),
            Err(err) => tracing::warn!(%err, "the span exporter's shutdown failed"),
        }
    }
}

/// Installs the global subscriber: the log output of [`crate::init_logging`] (`format`,
/// `RUST_LOG`), and with an endpoint in `args` the OpenTelemetry layer and its exporter, the
/// service named `service` unless `OTEL_SERVICE_NAME` (or `service.name` in
/// `OTEL_RESOURCE_ATTRIBUTES`) names it. Call it once, inside the tokio runtime (the exporter's
/// connections run on it).
///
/// # Errors
/// An endpoint that is not an `http://`/`https://` URL; an exporter that cannot be built.
pub fn init(format: LogFormat, args: &OtelArgs, service: &str) -> Result<Tracing, OtelError> {
    let Some(endpoint) = args
        .otlp_endpoint
        .as_deref()
        .filter(|e| !e.trim().is_empty())
    else {
        crate::init_logging(format);
        return Ok(Tracing::default());
    };
    // Logs come first, so that the binary can say why tracing failed.
    let provider = provider(endpoint.trim(), args.otlp_protocol, service)
        .inspect_err(|_| crate::init_logging(format))?;
    let tracer = provider.tracer("embatch");
    let _ = TRACER.set(tracer.clone());
    let otel = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_context_activation(false)
        .with_tracked_inactivity(false)
        .with_threads(false)
        .with_location(false)
        .with_level(false)
        .with_target(false)
        .with_filter(tracing_subscriber::filter::filter_fn(exported));
    let installed = tracing_subscriber::registry()
        .with(log_layer(format).with_filter(crate::log_filter()))
        .with(otel)
        .try_init();
    if installed.is_err() {
        tracing::debug!("a tracing subscriber was already installed");
    }
    ENABLED.store(true, Ordering::Relaxed);
    tracing::info!(endpoint, protocol = ?args.otlp_protocol, "tracing: exporting spans over OTLP");
    Ok(Tracing {
        provider: Some(provider),
    })
}

/// The log output of [`crate::init_logging`], as a layer.
fn log_layer(
    format: LogFormat,
) -> Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync + 'static> {
    use std::io::IsTerminal;
    let layer = tracing_subscriber::fmt::layer().with_ansi(std::io::stdout().is_terminal());
    match format {
        LogFormat::Text => layer.boxed(),
        LogFormat::Json => layer.json().boxed(),
    }
}

/// What the OpenTelemetry layer sees: the embatch crates' spans at `DEBUG` and above, and their
/// `WARN` and `ERROR` events (as span events).
fn exported(metadata: &tracing::Metadata<'_>) -> bool {
    let level = *metadata.level();
    metadata.target().starts_with("embatch")
        && if metadata.is_span() {
            level <= tracing::Level::DEBUG
        } else {
            level <= tracing::Level::WARN
        }
}

/// The tracer provider exporting to `endpoint` over `protocol`.
fn provider(
    endpoint: &str,
    protocol: OtlpProtocol,
    service: &str,
) -> Result<SdkTracerProvider, OtelError> {
    let url = reqwest::Url::parse(endpoint).map_err(|e| OtelError::Endpoint {
        endpoint: endpoint.to_owned(),
        reason: e.to_string(),
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(OtelError::Endpoint {
            endpoint: endpoint.to_owned(),
            reason: format!("the scheme is {}", url.scheme()),
        });
    }
    // A signal-specific endpoint, when set, is the SDK's to read (it wins, per the spec).
    let signal_endpoint = std::env::var_os("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some();
    let exporter = match protocol {
        OtlpProtocol::Grpc => {
            let mut builder = opentelemetry_otlp::SpanExporter::builder().with_tonic();
            if !signal_endpoint {
                builder = builder.with_endpoint(endpoint);
            }
            if url.scheme() == "https" {
                use opentelemetry_otlp::tonic_types::transport::ClientTlsConfig;
                builder = builder.with_tls_config(ClientTlsConfig::new().with_enabled_roots());
            }
            builder.build()?
        }
        OtlpProtocol::HttpProtobuf => {
            let mut builder = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_http_client(http_client::OnRuntime::new()?);
            if !signal_endpoint {
                // As the SDK does for OTEL_EXPORTER_OTLP_ENDPOINT: the base plus the signal's path.
                builder =
                    builder.with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')));
            }
            builder.build()?
        }
    };
    let mut resource = opentelemetry_sdk::Resource::builder();
    let named_by_env = std::env::var_os("OTEL_SERVICE_NAME").is_some()
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|a| a.contains("service.name="));
    if !named_by_env {
        resource = resource.with_service_name(service.to_owned());
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}

/// Whether spans are exported (tracing on). One relaxed atomic load: callers test it before
/// they create a span, so tracing off costs nothing else.
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// W3C Trace Context, the one propagation format.
static PROPAGATOR: OnceLock<TraceContextPropagator> = OnceLock::new();

fn propagator() -> &'static TraceContextPropagator {
    PROPAGATOR.get_or_init(TraceContextPropagator::new)
}

/// Makes `span` a child of the remote span of `parent` (from a `traceparent` the request
/// carried), when tracing is on; a span without one starts a trace of its own. Call it before
/// `span` is first entered.
pub fn set_remote_parent(span: &tracing::Span, parent: Option<&TraceContext>) {
    let Some(parent) = parent.filter(|_| enabled()) else {
        return;
    };
    let cx = propagator().extract(&Carrier::Read(parent));
    if let Err(err) = span.set_parent(cx) {
        tracing::debug!(%err, "cannot set a span's remote parent");
    }
}

/// Makes `span` a child of `parent`, another span of this process, when tracing is on (e.g. a
/// batch's span under the first of its requests). Call it before `span` is first entered.
pub fn set_parent(span: &tracing::Span, parent: &tracing::Span) {
    if !enabled() || parent.is_disabled() {
        return;
    }
    if let Err(err) = span.set_parent(parent.context()) {
        tracing::debug!(%err, "cannot set a span's parent");
    }
}

/// The W3C context of `span`, to send downstream (`traceparent`, `tracestate`); `None` with
/// tracing off or for a span that is not exported.
pub fn context_of(span: &tracing::Span) -> Option<TraceContext> {
    if !enabled() || span.is_disabled() {
        return None;
    }
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut fields = Fields::default();
    propagator().inject_context(&cx, &mut Carrier::Write(&mut fields));
    TraceContext::new(fields.traceparent.as_deref()?, fields.tracestate.as_deref())
}

/// Exports a span `name` that ran from `start` to `end` as a child of `parent` (which must be
/// exported), with `attributes`: a phase timed by the caller rather than held as a span, such as
/// a request's wait in the queue. Nothing with tracing off.
pub fn record_interval(
    parent: &tracing::Span,
    name: &'static str,
    (start, end): (Instant, Instant),
    attributes: Vec<opentelemetry::KeyValue>,
) {
    if !enabled() || parent.is_disabled() {
        return;
    }
    let Some(tracer) = TRACER.get() else {
        return;
    };
    let parent = parent.context();
    if !parent.span().span_context().is_sampled() {
        // Not recorded (its trace was sampled out): the sampler would say so too, later.
        return;
    }
    let now = (Instant::now(), SystemTime::now());
    let at = |instant: Instant| now.1 - now.0.saturating_duration_since(instant);
    let mut span = tracer
        .span_builder(name)
        .with_kind(SpanKind::Internal)
        .with_start_time(at(start))
        .with_attributes(attributes)
        .start_with_context(tracer, &parent);
    span.end_with_timestamp(at(end));
}

/// A `traceparent`/`tracestate` pair being written.
#[derive(Default)]
struct Fields {
    traceparent: Option<String>,
    tracestate: Option<String>,
}

/// The propagator's view of a [`TraceContext`] (read) or of the [`Fields`] it writes.
enum Carrier<'a> {
    Read(&'a TraceContext),
    Write(&'a mut Fields),
}

impl Extractor for Carrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match (self, key) {
            (Carrier::Read(context), "traceparent") => Some(context.traceparent()),
            (Carrier::Read(context), "tracestate") => context.tracestate(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent", "tracestate"]
    }
}

impl Injector for Carrier<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let Carrier::Write(fields) = self {
            match key {
                "traceparent" => fields.traceparent = Some(value),
                "tracestate" if !value.is_empty() => fields.tracestate = Some(value),
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests;
