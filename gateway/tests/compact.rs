//! Compact outputs end to end over HTTP, a real nats-server and an in-process worker on the TEI
//! double: `output_dtype` on `POST /embed`, Voyage's `output_dtype` on `POST /v1/embeddings`,
//! Cohere's `embedding_types` on `POST /v2/embed` and `POST /v1/embed`, and the contract's
//! `output_dtype` over NATS directly; each answer equals the double's vector quantized by
//! `embatch_protocol::compact`, the upstream sees floats only (a float and an int8 request share
//! one call, and one cache entry), and bad values are refused in each API's error shape.

mod common;

use base64::Engine as _;
use common::tei_routes::{direct_client, post_json, send_direct};
use common::{assert_tei_error, stack_with_gateway};
use embatch_client::Operation;
use embatch_protocol::compact::{Dtype, Quantized};
use embatch_testkit::{TeiConfig, double_vector};

/// The double's vector of `text` in `dtype`, as JSON.
fn quantized(text: &str, dtype: Dtype) -> serde_json::Value {
    let vector = double_vector(text);
    match dtype.quantize(&vector) {
        Some(values) => serde_json::to_value(values).expect("serializes"),
        // As the reply writes f32s (shortest text), not as f64s.
        None => serde_json::from_str(&serde_json::to_string(&vector).expect("serializes"))
            .expect("JSON"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_answers_the_types_asked_from_one_float_call() {
    // The first request waits (no dispatch while idle) for the other to join its batch.
    let args = ["--max-wait-time", "400ms", "--dispatch-when-idle", "false"];
    let (stack, gateway) = stack_with_gateway(TeiConfig::instant(), &args, 1 << 20, 64).await;
    let int8 = serde_json::json!({"inputs": ["a", "b"], "output_dtype": "int8"});
    let float = serde_json::json!({"inputs": "c"});
    let ((status_a, body_a), (status_b, body_b)) = tokio::join!(
        post_json(&gateway.url, "/embed", int8),
        post_json(&gateway.url, "/embed", float),
    );
    assert_eq!((status_a, status_b), (200, 200), "{body_a} {body_b}");
    let expected = serde_json::json!([quantized("a", Dtype::Int8), quantized("b", Dtype::Int8)]);
    assert_eq!(body_a, expected);
    assert_eq!(body_b, serde_json::json!([quantized("c", Dtype::Float)]));
    let calls = stack.tei.calls();
    assert_eq!(calls.len(), 1, "one upstream call for both: {calls:?}");
    assert_eq!(calls[0].inputs.len(), 3);

    // Voyage's `output_dtype` on OpenAI's route; the floats are cached, so no upstream call.
    let body = serde_json::json!({"input": ["a"], "output_dtype": "ubinary",
                                  "encoding_format": "float"});
    let (status, json) = post_json(&gateway.url, "/v1/embeddings", body).await;
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["data"][0]["embedding"], quantized("a", Dtype::Ubinary));
    let body = serde_json::json!({"input": "b", "output_dtype": "int8",
                                  "encoding_format": "base64"});
    let (status, json) = post_json(&gateway.url, "/v1/embeddings", body).await;
    assert_eq!(status, 200, "{json}");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(json["data"][0]["embedding"].as_str().expect("base64"))
        .expect("valid base64");
    let Some(values) = Dtype::Int8.quantize(&double_vector("b")) else {
        panic!("int8 quantizes")
    };
    assert_eq!(bytes, values.to_bytes(), "one byte per value");
    assert!(matches!(values, Quantized::Signed(_)));
    assert_eq!(stack.tei.calls().len(), 1, "answered from the cache");
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cohere_embed_answers_by_type_with_the_prompt_of_its_input_type() {
    let (stack, gateway) = stack_with_gateway(TeiConfig::instant(), &[], 1 << 20, 64).await;
    let body = serde_json::json!({"model": "", "texts": ["q1", "q2"],
                                  "input_type": "search_query",
                                  "embedding_types": ["float", "int8", "uint8", "binary",
                                                      "ubinary", "base64"]});
    let (status, json) = post_json(&gateway.url, "/v2/embed", body).await;
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["response_type"], "embeddings_by_type");
    assert_eq!(json["texts"], serde_json::json!(["q1", "q2"]));
    assert_eq!(json["meta"]["api_version"]["version"], "2");
    for dtype in [
        Dtype::Float,
        Dtype::Int8,
        Dtype::Uint8,
        Dtype::Binary,
        Dtype::Ubinary,
    ] {
        let expected = serde_json::json!([quantized("q1", dtype), quantized("q2", dtype)]);
        assert_eq!(
            json["embeddings"][dtype.name()],
            expected,
            "{}",
            dtype.name()
        );
    }
    let b64 = json["embeddings"]["base64"][0].as_str().expect("base64");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("valid base64");
    let floats: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(floats, double_vector("q1"));
    let calls = stack.tei.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].options["prompt_name"], "query");

    // v1 without `embedding_types`: Cohere v1's floats.
    let (status, json) = post_json(&gateway.url, "/v1/embed", r#"{"texts":["d"]}"#).await;
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["response_type"], "embeddings_floats");
    assert_eq!(
        json["embeddings"],
        serde_json::json!([quantized("d", Dtype::Float)])
    );
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_nats_a_list_of_types_is_an_object_by_type() {
    let (stack, _gateway) = stack_with_gateway(TeiConfig::instant(), &[], 1 << 20, 64).await;
    let client = direct_client(&stack).await;
    let body = br#"{"inputs":["x"],"output_dtype":["binary","float"]}"#;
    let reply = send_direct(&client, Operation::Embed, body)
        .await
        .expect("a reply");
    let json: serde_json::Value = serde_json::from_slice(&reply.payload).expect("JSON");
    assert_eq!(
        json,
        serde_json::json!({"binary": [quantized("x", Dtype::Binary)],
                           "float": [quantized("x", Dtype::Float)]})
    );
    // Vectors that are not unit length quantize over their own range too.
    let body = br#"{"inputs":"x","normalize":false,"output_dtype":"uint8"}"#;
    let reply = send_direct(&client, Operation::Embed, body)
        .await
        .expect("a reply");
    let raw = embatch_tei_double::embedding("x", TeiConfig::instant().dim, None, false);
    let expected = embatch_protocol::compact::uint8(&raw);
    let json: serde_json::Value = serde_json::from_slice(&reply.payload).expect("JSON");
    assert_eq!(json, serde_json::json!([expected]));
    // Refused by the worker itself, before any upstream call.
    let body = br#"{"inputs":["y"],"output_dtype":[]}"#;
    let err = send_direct(&client, Operation::Embed, body)
        .await
        .expect_err("no type");
    assert!(err.to_string().contains("lists no type"), "{err}");
    assert_eq!(stack.tei.calls().len(), 2);
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_values_are_refused_in_each_apis_shape() {
    let (stack, gateway) = stack_with_gateway(TeiConfig::instant(), &[], 1 << 20, 64).await;
    let url = &gateway.url;
    let (status, json) = post_json(url, "/embed", r#"{"inputs":"a","output_dtype":"int4"}"#).await;
    assert_eq!(status, 422, "{json}");
    assert_tei_error(&json, "Validation", "`output_dtype`");
    let body = r#"{"inputs":"a","output_dtype":[]}"#;
    let (status, json) = post_json(url, "/embed", body).await;
    assert_eq!(status, 422, "{json}");
    assert_tei_error(&json, "Validation", "lists no type");

    let body = r#"{"input":"a","output_dtype":"int4"}"#;
    let (status, json) = post_json(url, "/v1/embeddings", body).await;
    assert_eq!(status, 422, "{json}");
    assert_eq!(json["error"]["param"], "output_dtype");
    let message = json["error"]["message"].as_str().expect("a message");
    assert!(message.contains("`ubinary`"), "{message}");

    let body = r#"{"texts":["a"],"embedding_types":["float","int4"]}"#;
    let (status, json) = post_json(url, "/v2/embed", body).await;
    assert_eq!(status, 422, "{json}");
    let message = json["message"].as_str().expect("Cohere's {\"message\"}");
    assert!(
        message.contains("`embedding_types[1]`") && message.contains("`base64`"),
        "{message}"
    );
    let (status, json) = post_json(url, "/v2/embed", r#"{"texts":[]}"#).await;
    assert_eq!(status, 400, "{json}");
    assert!(
        json["message"]
            .as_str()
            .is_some_and(|m| m.contains("`texts`")),
        "{json}"
    );
    assert!(stack.tei.calls().is_empty(), "no upstream call");
    stack.worker.stop().await;
}
