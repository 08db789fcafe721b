use super::*;

fn tenant(rpm: Option<u64>, tpm: Option<u64>) -> Tenant {
    Tenant {
        requests_per_minute: rpm,
        tokens_per_minute: tpm,
        ..Tenant::implicit("search")
    }
}

#[test]
fn a_tenant_without_limits_is_never_counted_or_refused() {
    let quotas = Quotas::new(Duration::from_secs(60));
    let free = tenant(None, None);
    for _ in 0..1000 {
        assert_eq!(quotas.admit(&free), Ok(None));
    }
    assert!(quotas.take_changes(true).is_none());
}

#[test]
fn requests_are_refused_at_the_limit_with_the_headers_of_the_window() {
    let quotas = Quotas::new(Duration::from_secs(3600));
    let limited = tenant(Some(2), None);
    // 2 per minute over a 60-minute window: 120.
    for served in 1..=120 {
        let state = quotas
            .admit(&limited)
            .expect("under the limit")
            .expect("limited");
        assert_eq!(state.requests, Some((120, 120 - served)));
    }
    let refused = quotas.admit(&limited).expect_err("at the limit");
    assert_eq!(refused.limit, Limit::Requests);
    assert_eq!(refused.state.requests, Some((120, 0)));
    let mut headers = HeaderMap::new();
    refused.state.write(&mut headers);
    assert_eq!(headers["x-ratelimit-limit-requests"], "120");
    assert_eq!(headers["x-ratelimit-remaining-requests"], "0");
    assert!(headers.contains_key("x-ratelimit-reset-requests"));
    assert!(!headers.contains_key("x-ratelimit-limit-tokens"));
    assert!((1..=3600).contains(&refused.state.retry_after_secs()));
}

#[test]
fn tokens_charged_after_the_answer_close_the_window() {
    let quotas = Quotas::new(Duration::from_secs(3600));
    let limited = tenant(None, Some(10));
    // 10 tokens per minute over an hour: 600.
    quotas.admit(&limited).expect("first");
    quotas.charge(&limited, 599);
    let state = quotas
        .admit(&limited)
        .expect("1 token left")
        .expect("limited");
    assert_eq!(state.tokens, Some((600, 1)));
    quotas.charge(&limited, 5);
    assert_eq!(
        quotas.admit(&limited).expect_err("spent").limit,
        Limit::Tokens
    );
}

#[test]
fn peers_counts_of_the_same_window_count_and_others_do_not() {
    let quotas = Quotas::new(Duration::from_secs(3600));
    let limited = tenant(Some(1), None); // 60 per window
    let (window, _) = quotas.now();
    let counts = |requests| {
        HashMap::from([(
            "search".to_owned(),
            Counts {
                requests,
                tokens: 0,
            },
        )])
    };
    quotas.record_peer("old".into(), window - 1, counts(1000));
    quotas.record_peer("b".into(), window, counts(30));
    quotas.record_peer("c".into(), window, counts(29));
    let state = quotas.admit(&limited).expect("59 used").expect("limited");
    assert_eq!(state.requests, Some((60, 0)));
    assert!(quotas.admit(&limited).is_err());
    // A newer report of a peer replaces its older one.
    quotas.record_peer("c".into(), window, counts(0));
    assert!(quotas.admit(&limited).is_ok());
}

#[test]
fn reset_is_written_as_openai_writes_it() {
    assert_eq!(format_reset(Duration::from_millis(250)), "250ms");
    assert_eq!(format_reset(Duration::from_millis(12_400)), "12s");
    assert_eq!(format_reset(Duration::from_secs(90)), "1m30s");
}
