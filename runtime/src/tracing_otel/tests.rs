use super::*;

#[test]
fn off_by_default_and_free() {
    // Nothing here installs tracing: every entry point is a no-op.
    assert!(!enabled());
    let span = tracing::info_span!("embatch_test");
    assert_eq!(context_of(&span), None);
    let parent = TraceContext::new(
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        None,
    );
    set_remote_parent(&span, parent.as_ref());
    set_parent(&span, &tracing::Span::none());
    let now = Instant::now();
    record_interval(&span, "queue_wait", (now, now), Vec::new());
}

#[test]
fn only_the_embatch_crates_spans_and_their_warnings_are_exported() {
    use tracing::Level;
    use tracing::callsite::Identifier;
    use tracing::field::FieldSet;
    use tracing::metadata::Kind;
    struct Callsite;
    impl tracing::callsite::Callsite for Callsite {
        fn set_interest(&self, _: tracing::subscriber::Interest) {}
        fn metadata(&self) -> &tracing::Metadata<'_> {
            unreachable!()
        }
    }
    static CALLSITE: Callsite = Callsite;
    let meta = |target: &'static str, level: Level, kind: Kind| {
        tracing::Metadata::new(
            "x",
            target,
            level,
            None,
            None,
            None,
            FieldSet::new(&[], Identifier(&CALLSITE)),
            kind,
        )
    };
    assert!(exported(&meta(
        "embatch_worker::batcher",
        Level::DEBUG,
        Kind::SPAN
    )));
    assert!(!exported(&meta(
        "embatch_worker::batcher",
        Level::TRACE,
        Kind::SPAN
    )));
    assert!(!exported(&meta("hyper::proto", Level::INFO, Kind::SPAN)));
    assert!(exported(&meta("embatch_gateway", Level::WARN, Kind::EVENT)));
    assert!(!exported(&meta(
        "embatch_gateway",
        Level::INFO,
        Kind::EVENT
    )));
}

#[test]
fn an_endpoint_must_be_an_http_url() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _inside = runtime.enter();
    for (endpoint, protocol) in [
        ("localhost:4317", OtlpProtocol::Grpc),
        ("ftp://collector:4318", OtlpProtocol::HttpProtobuf),
        ("not a url", OtlpProtocol::HttpProtobuf),
    ] {
        let err = provider(endpoint, protocol, "embatch-test").expect_err(endpoint);
        assert!(
            matches!(err, OtelError::Endpoint { .. }),
            "{endpoint}: {err}"
        );
    }
    for protocol in [OtlpProtocol::Grpc, OtlpProtocol::HttpProtobuf] {
        let provider = provider("http://127.0.0.1:9", protocol, "embatch-test").expect("built");
        let _ = provider.shutdown_with_timeout(Duration::from_millis(100));
    }
}
