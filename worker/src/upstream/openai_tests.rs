use super::*;
use bytes::Bytes;

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
fn the_envelope_is_walked_not_parsed_but_its_shape_is_checked() {
    // Whitespace anywhere, fields before and after, strings holding brackets, quotes and
    // escapes, nested objects and arrays, `null` values and exponents are all taken.
    let body = Bytes::from_static(
        br#" { "model" : "m]\"}{[" , "extra": {"a": [1, {"b": "]"}], "c": null} ,
            "data" : [ { "object" : "emb\\", "embedding" : [ 1.5e-3 , null ] , "index" : 1 } ,
                       {"index":0,"x":[[],{}],"embedding":[]} ] ,
            "usage":{"prompt_tokens":3,"total_tokens":3} }
        "#,
    );
    let embeddings = split_reply(&body, 2).expect("OpenAI's shape");
    assert_eq!(texts(&embeddings), ["[]", "[ 1.5e-3 , null ]"]);
    for (body, what) in [
        (r#"{"model":"m"}"#, "no `data`"),
        (r#"{"data":[],"data":[]}"#, "`data` twice"),
        (
            r#"{"data":[{"index":0}]}"#,
            "without `index` or `embedding`",
        ),
        (
            r#"{"data":[{"index":0,"index":0,"embedding":[1]}]}"#,
            "field twice",
        ),
        (r#"{"data":[{"index":-1,"embedding":[1]}]}"#, "non-negative"),
        (
            r#"{"data":[{"index":0.5,"embedding":[1]}]}"#,
            "non-negative",
        ),
        (
            r#"{"data":[{"index":"0","embedding":[1]}]}"#,
            "non-negative",
        ),
        (r#"{"data":[{"embedding":[1}],"index":0}]}"#, "an embedding"),
        (r#"{"data":[{"index":0,"embedding":[1]}]} x"#, "bytes after"),
        (
            r#"{"data":[{"index":0,"embedding":[1]}],"m":"open}"#,
            "string",
        ),
        (
            r#"{"data":[{"index":0,"embedding":[1]}],"u":{"a":[}]}"#,
            "unbalanced",
        ),
        (
            r#"{"data":[{"index":0,"embedding":[1]}],"u":{"a":[1]"#,
            "truncated",
        ),
        (r#"{"data":[{"index":0,"embedding":[1]}],"u":}"#, "missing"),
        (r#"{"data" [{"index":0,"embedding":[1]}]}"#, "expected `:`"),
    ] {
        let err = split_reply(&Bytes::from(body), 1).expect_err(body);
        assert!(
            matches!(&err, UpstreamError::Malformed(m) if m.contains(what)),
            "{body}: {err}"
        );
    }
}

#[test]
fn a_long_reply_cuts_as_serde_json_reads_it() {
    let (_, openai, vectors) = replies_32x384();
    let embeddings = split_reply(&openai, 32).expect("OpenAI's shape");
    for (embedding, vector) in embeddings.iter().zip(&vectors) {
        let read: Vec<f32> = serde_json::from_slice(embedding.json()).expect("numbers");
        assert_eq!(&read, vector);
    }
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

/// A reply of 32 distinct vectors of 384 floats, in TEI's shape (`serde_json`'s f32 digits)
/// and in OpenAI's (as `serde_json::json!` writes them: f64 digits, reverse order), with the
/// vectors.
fn replies_32x384() -> (Bytes, Bytes, Vec<Vec<f32>>) {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    };
    let vectors: Vec<Vec<f32>> = (0..32)
        .map(|_| (0..384).map(|_| next()).collect())
        .collect();
    let tei = Bytes::from(serde_json::to_vec(&vectors).expect("JSON"));
    let data: Vec<serde_json::Value> = vectors
        .iter()
        .enumerate()
        .rev()
        .map(
            |(index, v)| serde_json::json!({"object": "embedding", "index": index, "embedding": v}),
        )
        .collect();
    let openai = serde_json::json!({
        "object": "list", "data": data, "model": "m",
        "usage": {"prompt_tokens": 320, "total_tokens": 320},
    });
    let openai = Bytes::from(serde_json::to_vec(&openai).expect("JSON"));
    (tei, openai, vectors)
}

/// Times cutting a 32 × 384 reply in TEI's shape and in OpenAI's, printing µs per cut (best
/// and median of 7 rounds of 500 cuts). Run by hand, in release:
/// `cargo test --release -p embatch-worker --lib cut_timing -- --ignored --nocapture`.
/// Asserts nothing about time (the figures are in docs/design/upstreams.md).
#[test]
#[ignore = "a timing harness, run by hand in release"]
fn cut_timing() {
    let (tei, openai, _) = replies_32x384();
    let per_cut = |cut: &dyn Fn() -> usize| {
        let mut rounds: Vec<f64> = (0..7)
            .map(|_| {
                let start = std::time::Instant::now();
                for _ in 0..500 {
                    assert_eq!(std::hint::black_box(cut()), 32);
                }
                start.elapsed().as_secs_f64() * 1e6 / 500.0
            })
            .collect();
        rounds.sort_by(f64::total_cmp);
        (rounds[0], rounds[3])
    };
    let tei_cut = || Embedding::split_reply(&tei).map_or(0, |v| v.len());
    let openai_cut = || split_reply(&openai, 32).map_or(0, |v| v.len());
    let (tei_best, tei_median) = per_cut(&tei_cut);
    let (openai_best, openai_median) = per_cut(&openai_cut);
    println!(
        "TEI reply ({} bytes): best {tei_best:.1} µs, median {tei_median:.1} µs per cut",
        tei.len()
    );
    println!(
        "OpenAI reply ({} bytes): best {openai_best:.1} µs, median {openai_median:.1} µs per cut",
        openai.len()
    );
}
