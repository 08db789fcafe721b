use super::*;

fn texts(embeddings: &[Embedding]) -> Vec<String> {
    embeddings
        .iter()
        .map(|e| String::from_utf8_lossy(e.json()).into_owned())
        .collect()
}

#[test]
fn the_reply_is_cut_in_index_order_as_written() {
    let body = Bytes::from_static(
        br#"{"object":"list","data":[
            {"object":"embedding","index":1,"embedding":[3.5E+2, -4]},
            {"object":"embedding","embedding":[0.1,-2e-3,null],"index":0}],
            "model":"m","usage":{"prompt_tokens":3,"total_tokens":3}}"#,
    );
    let embeddings = split_reply(&body, 2).expect("OpenAI's shape");
    assert_eq!(texts(&embeddings), ["[0.1,-2e-3,null]", "[3.5E+2, -4]"]);
    // A slice of the reply, not a copy.
    let at = body
        .windows(4)
        .position(|w| w == b"[0.1")
        .expect("in the body");
    assert_eq!(embeddings[0].json().as_ptr(), body[at..].as_ptr());
}

#[test]
fn replies_not_of_openais_shape_are_malformed() {
    for (body, what) in [
        (r#"[[1,2]]"#, "not an OpenAI embeddings reply"),
        (
            r#"{"data":[{"index":0,"embedding":"AACAPw=="}]}"#,
            "not an array of numbers",
        ),
        (
            r#"{"data":[{"index":0,"embedding":[[1]]}]}"#,
            "not an array of numbers",
        ),
        (
            r#"{"data":[{"index":0,"embedding":[true]}]}"#,
            "not an array of numbers",
        ),
        (
            r#"{"data":[{"index":0,"embedding":[1,"a"]}]}"#,
            "not an array of numbers",
        ),
        (
            r#"{"data":[{"index":0,"embedding":[1]},{"index":0,"embedding":[2]}]}"#,
            "repeated",
        ),
        (
            r#"{"data":[{"index":0,"embedding":[1]},{"index":2,"embedding":[2]}]}"#,
            "index 2 of 2",
        ),
        (
            r#"{"data":[{"index":0,"embedding":[1]}"#,
            "not an OpenAI embeddings reply",
        ),
    ] {
        let sent = if body.contains("index\":2") || body.contains("[2]") {
            2
        } else {
            1
        };
        let err = split_reply(&Bytes::from(body), sent).expect_err(body);
        assert!(
            matches!(&err, UpstreamError::Malformed(m) if m.contains(what)),
            "{body}: {err}"
        );
    }
    let one = Bytes::from_static(br#"{"data":[{"index":0,"embedding":[1]}]}"#);
    assert_eq!(
        split_reply(&one, 2).expect_err("one of two"),
        UpstreamError::CountMismatch { sent: 2, got: 1 }
    );
}

#[test]
fn errors_blame_the_input_the_server_or_the_configuration() {
    let openai = br#"{"error":{"message":"input too long","type":"invalid_request_error"}}"#;
    let vllm = br#"{"object":"error","message":"context length is 512","code":400}"#;
    for (status, body, message) in [
        (400, &openai[..], "input too long"),
        (422, &vllm[..], "context length is 512"),
        (413, &b"too big"[..], "too big"),
    ] {
        let err = status_error(status, body);
        assert!(err.blames_input(), "{status}");
        assert!(err.to_string().contains(message), "{err}");
    }
    let busy = status_error(429, br#"{"detail":"rate limited"}"#);
    assert!(!busy.blames_input() && !busy.is_unhealthy());
    assert_eq!(EmbedError::from(busy).status(), 429);
    let failing = status_error(500, b"boom");
    assert!(failing.is_unhealthy() && !failing.blames_input());
    assert_eq!(EmbedError::from(failing).status(), 424);
    let key = status_error(401, br#"{"error":{"message":"bad key"}}"#);
    assert!(
        key.is_unhealthy() && key.to_string().contains("OPENAI_API_KEY"),
        "{key}"
    );
    assert_eq!(EmbedError::from(key).status(), 503);
    assert_eq!(error_message("é".repeat(400).as_bytes()).len(), 512);
}

#[test]
fn options_the_api_cannot_honour_are_named() {
    let default = EmbedOptions::default();
    assert_eq!(refusal(&default, false), None);
    let with = |f: fn(&mut EmbedOptions)| {
        let mut options = EmbedOptions::default();
        f(&mut options);
        options
    };
    let honoured = [
        with(|o| o.dimensions = Some(64)),
        with(|o| o.truncate = Some(true)),
        with(|o| o.truncation_direction = Some(TruncationDirection::Right)),
    ];
    for options in &honoured {
        assert_eq!(refusal(options, false), None, "{options:?}");
    }
    for (options, named) in [
        (with(|o| o.normalize = false), "`normalize: false`"),
        (
            with(|o| o.prompt_name = Some("query".into())),
            "`prompt_name`",
        ),
        (
            with(|o| o.truncation_direction = Some(TruncationDirection::Left)),
            "`truncation_direction: left`",
        ),
        (with(|o| o.truncate = Some(false)), "`truncate: false`"),
    ] {
        let refused = refusal(&options, false).expect("refused");
        assert!(refused.contains(named), "{refused}");
    }
    let strict = with(|o| o.truncate = Some(false));
    assert_eq!(refusal(&strict, true), None, "checked by the token count");
}

#[test]
fn the_request_body_is_openais() {
    let (a, ids) = (Input::Text("a \"q\"".into()), Input::Ids(vec![101, 102]));
    let body = |input: &[&Input], dimensions| {
        let request = Request {
            model: "m",
            input,
            encoding_format: "float",
            dimensions,
        };
        serde_json::to_string(&request).expect("JSON")
    };
    assert_eq!(
        body(&[&a], None),
        r#"{"model":"m","input":["a \"q\""],"encoding_format":"float"}"#
    );
    assert_eq!(
        body(&[&ids, &ids], Some(8)),
        r#"{"model":"m","input":[[101,102],[101,102]],"encoding_format":"float","dimensions":8}"#
    );
}
