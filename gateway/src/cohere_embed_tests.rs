use super::*;

fn translate(body: &str, version: &'static str) -> Result<Translated, EmbedError> {
    CohereEmbedRequest::translate(body.as_bytes(), 4, version)
}

#[test]
fn translates_into_teis_body_with_the_types_asked() {
    let t = translate(
        r#"{"model":"m","texts":["a","b"],"input_type":"search_query",
            "embedding_types":["float","int8","ubinary","base64","int8"],
            "truncate":"START","output_dimension":8,"max_tokens":9,"priority":1}"#,
        "2",
    )
    .expect("valid");
    assert_eq!(t.model.as_deref(), Some("m"));
    assert_eq!(
        serde_json::to_value(&t.request).expect("serializes"),
        serde_json::json!({"inputs": ["a", "b"], "normalize": true, "truncate": true,
                           "truncation_direction": "Left", "prompt_hint": "query",
                           "dimensions": 8, "output_dtype": ["float", "int8", "ubinary"]})
    );
    let t = translate(r#"{"texts":["a"]}"#, "1").expect("valid");
    let body = serde_json::to_value(&t.request).expect("serializes");
    assert_eq!(body["output_dtype"], serde_json::Value::Null, "floats only");
    assert_eq!(
        (
            body["truncate"].clone(),
            body["truncation_direction"].clone()
        ),
        (true.into(), "Right".into()),
        "END by default"
    );
    assert_eq!(body.get("prompt_name"), None);
    let t = translate(
        r#"{"texts":["a"],"truncate":"NONE","input_type":null}"#,
        "2",
    )
    .expect("valid");
    assert_eq!(t.request.truncate, Some(false));
}

#[test]
fn shapes_v2_by_type_and_v1_floats() {
    let t = translate(
        r#"{"texts":["a"],"embedding_types":["int8","base64","float"]}"#,
        "2",
    )
    .expect("valid");
    let reply = br#"{"float":[[1.0,-2.0]],"int8":[[127,-128]]}"#;
    let json: serde_json::Value =
        serde_json::from_slice(&t.shape.response(reply, Some(3)).expect("shaped")).expect("JSON");
    assert_eq!(json["response_type"], "embeddings_by_type");
    assert_eq!(
        json["embeddings"],
        serde_json::json!({"int8": [[127, -128]], "base64": ["AACAPwAAAMA="],
                           "float": [[1.0, -2.0]]})
    );
    assert_eq!(json["texts"], serde_json::json!(["a"]));
    assert_eq!(json["meta"]["api_version"]["version"], "2");
    assert_eq!(json["meta"]["billed_units"]["input_tokens"], 3);

    let v1 = translate(r#"{"texts":["a"]}"#, "1").expect("valid");
    let json: serde_json::Value =
        serde_json::from_slice(&v1.shape.response(b"[[0.5]]", None).expect("shaped"))
            .expect("JSON");
    assert_eq!(json["response_type"], "embeddings_floats");
    assert_eq!(json["embeddings"], serde_json::json!([[0.5]]));
    assert_eq!(json["meta"].get("billed_units"), None, "not counted");

    let v2 = translate(r#"{"texts":["a"]}"#, "2").expect("valid");
    let json: serde_json::Value =
        serde_json::from_slice(&v2.shape.response(b"[[0.5]]", None).expect("shaped"))
            .expect("JSON");
    assert_eq!(json["embeddings"], serde_json::json!({"float": [[0.5]]}));

    let missing = translate(r#"{"texts":["a"],"embedding_types":["uint8"]}"#, "2")
        .expect("valid")
        .shape
        .response(br#"{"int8":[[1]]}"#, None)
        .expect_err("no uint8 in the reply");
    assert_eq!(missing.status(), 424);
}

#[test]
fn refuses_what_is_not_served_naming_the_field() {
    let refused = |body: &str| translate(body, "2").expect_err("refused");
    let cases = [
        (r#"{"texts":[]}"#, 400, "`texts`"),
        (r#"{"model":"m"}"#, 400, "`texts`"),
        (
            r#"{"texts":["a"],"embedding_types":["int4"]}"#,
            422,
            "`base64`",
        ),
        (r#"{"texts":["a"],"embedding_types":[]}"#, 422, "`ubinary`"),
        (
            r#"{"texts":["a"],"input_type":"search"}"#,
            422,
            "`search_query`",
        ),
        (
            r#"{"texts":["a"],"input_type":"image"}"#,
            422,
            "`input_type`",
        ),
        (r#"{"texts":["a"],"truncate":"MIDDLE"}"#, 422, "`END`"),
        (r#"{"texts":["a"],"images":["data:"]}"#, 422, "`images`"),
        (
            r#"{"texts":["a"],"inputs":[{"content":[]}]}"#,
            422,
            "`inputs`",
        ),
        (r#"{"texts":["a","b","c","d","e"]}"#, 422, "at most 4"),
        (
            r#"{"texts":["a"],"output_dimension":0}"#,
            422,
            "`output_dimension`",
        ),
        ("{", 400, "JSON"),
    ];
    for (body, status, needle) in cases {
        let err = refused(body);
        assert_eq!(err.status(), status, "{body}: {err}");
        assert!(err.to_string().contains(needle), "{body}: {err}");
    }
    let json: serde_json::Value =
        serde_json::from_slice(&CohereError(refused(r#"{"texts":[]}"#)).to_json()).expect("JSON");
    assert_eq!(
        json,
        serde_json::json!({"message": "Input validation error: `texts` cannot be empty"})
    );
}
