//! `embatch_runtime::tracing_otel` with tracing on (its own process: it installs the global
//! subscriber): a remote parent is adopted, the context sent downstream continues its trace, a
//! timed span and a local parent are accepted. The exporter points at a closed port; what it
//! fails to send is dropped, as in production when the receiver is down.

use embatch_client::TraceContext;
use embatch_runtime::LogFormat;
use embatch_runtime::tracing_otel::{self, OtelArgs, OtlpProtocol};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[tokio::test]
async fn spans_continue_the_callers_trace_and_send_their_own_context() {
    let args = OtelArgs {
        otlp_endpoint: Some("http://127.0.0.1:9".into()),
        otlp_protocol: OtlpProtocol::HttpProtobuf,
    };
    let tracing = tracing_otel::init(LogFormat::Text, &args, "embatch-test").expect("set up");
    assert!(tracing_otel::enabled());

    let incoming = TraceContext::new(PARENT, Some("congo=t61rcWkgMzE")).expect("valid");
    let span = tracing::info_span!(target: "embatch_test", "request");
    tracing_otel::set_remote_parent(&span, Some(&incoming));
    let sent = tracing_otel::context_of(&span).expect("an exported span has a context");
    assert_eq!(sent.trace_id(), TRACE_ID, "the caller's trace continues");
    assert_ne!(sent.traceparent(), PARENT, "with this span's own id");
    assert!(
        sent.traceparent().ends_with("-01"),
        "sampled, as the caller said"
    );
    assert_eq!(sent.tracestate(), Some("congo=t61rcWkgMzE"));

    let child = tracing::info_span!(target: "embatch_test", parent: None, "batch");
    tracing_otel::set_parent(&child, &span);
    let child_sent = tracing_otel::context_of(&child).expect("context");
    assert_eq!(
        child_sent.trace_id(),
        TRACE_ID,
        "a local child joins the same trace"
    );

    let now = std::time::Instant::now();
    tracing_otel::record_interval(&span, "queue_wait", (now, now), Vec::new());

    let elsewhere = tracing::info_span!(target: "hyper", "not ours");
    assert_eq!(
        tracing_otel::context_of(&elsewhere),
        None,
        "other crates' spans are not exported"
    );
    drop((child, span));
    tracing.shutdown().await;
}
