//! Token embeddings and sentence similarity end to end over HTTP, a real nats-server and an
//! in-process worker on the TEI double: TEI's `POST /embed_all` and `POST /similarity`, inputs of
//! concurrent callers in one upstream call, the cache, TEI's errors, a classifier's 424, the
//! deadline and the subjects over NATS.

mod common;

use common::tei_routes::{
    WAIT_FOR_BATCH_MATES, assert_capabilities, assert_refused_before_any_call, assert_the_deadline,
    direct_client, instant_double, post_json, repeat_from_cache, route_calls, send_direct,
};
use common::{assert_tei_error, stack_with_gateway};
use embatch_client::Operation;
use embatch_protocol::Input;
use embatch_tei_double::{POISON, embedding, token_embeddings};
use embatch_testkit::{TeiConfig, cosine};

/// The double's token vectors of `text` (its dimension is `TeiConfig::instant`'s).
fn tokens(text: &str) -> Vec<Vec<f32>> {
    token_embeddings(&Input::Text(text.to_owned()), TeiConfig::instant().dim)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_vectors_of_concurrent_callers_share_one_upstream_call() {
    let tei = TeiConfig::instant();
    let (stack, gateway) = stack_with_gateway(tei, &WAIT_FOR_BATCH_MATES, 1 << 20, 64).await;
    let a = serde_json::json!({"inputs": ["one text", "another"]});
    let b = serde_json::json!({"inputs": "third"});
    let ((status_a, body_a), (status_b, body_b)) = tokio::join!(
        post_json(&gateway.url, "/embed_all", a.clone()),
        post_json(&gateway.url, "/embed_all", b),
    );
    assert_eq!((status_a, status_b), (200, 200), "{body_a} {body_b}");
    let got_a: Vec<Vec<Vec<f32>>> = serde_json::from_value(body_a).expect("TEI's shape");
    assert_eq!(got_a, [tokens("one text"), tokens("another")]);
    let got_b: Vec<Vec<Vec<f32>>> = serde_json::from_value(body_b).expect("TEI's shape");
    assert_eq!(
        got_b,
        [tokens("third")],
        "a single input is a list of one, as TEI"
    );
    let calls = stack.tei.calls();
    assert_eq!(route_calls(&calls, "/embed_all"), [(3, 200)], "{calls:?}");
    assert_eq!(calls.len(), 1, "no /embed call: {calls:?}");

    // A repeat is answered from the cache, apart from the dense embeddings of the same text.
    let (status, repeat) = post_json(&gateway.url, "/embed_all", a).await;
    assert_eq!(status, 200);
    let repeat: Vec<Vec<Vec<f32>>> = serde_json::from_value(repeat).expect("TEI's shape");
    assert_eq!(repeat, [tokens("one text"), tokens("another")]);
    let (status, dense) = post_json(
        &gateway.url,
        "/embed",
        serde_json::json!({"inputs": "another"}),
    )
    .await;
    assert_eq!(status, 200, "{dense}");
    assert_eq!(
        dense[0].as_array().map(Vec::len),
        Some(TeiConfig::instant().dim)
    );
    assert_eq!(
        stack.tei.calls().len(),
        2,
        "the repeat cost nothing, /embed a call"
    );

    // A bad input fails its own request only.
    stack.tei.calls.clear();
    let (status, err) = post_json(
        &gateway.url,
        "/embed_all",
        serde_json::json!({"inputs": ["fine", format!("x {POISON}")]}),
    )
    .await;
    assert_eq!(status, 422, "{err}");
    assert_tei_error(&err, "Validation", POISON);
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn similarity_is_the_cosine_of_the_doubles_embeddings() {
    let tei = TeiConfig::instant();
    let (stack, gateway) = stack_with_gateway(tei, &WAIT_FOR_BATCH_MATES, 1 << 20, 64).await;
    let a = serde_json::json!({"inputs": {"source_sentence": "s", "sentences": ["x", "y"]}});
    let b = serde_json::json!({"inputs": {"source_sentence": "t", "sentences": ["x"]},
                               "parameters": {"truncate": true}});
    let c = serde_json::json!({"inputs": {"source_sentence": "u", "sentences": ["u"]},
                               "parameters": {"truncate": true}});
    let ((status_a, body_a), (status_b, body_b), (status_c, body_c)) = tokio::join!(
        post_json(&gateway.url, "/similarity", a.clone()),
        post_json(&gateway.url, "/similarity", b),
        post_json(&gateway.url, "/similarity", c),
    );
    assert_eq!(
        (status_a, status_b, status_c),
        (200, 200, 200),
        "{body_a} {body_b}"
    );
    let dim = TeiConfig::instant().dim;
    let vector = |t: &str| embedding(t, dim, None, false);
    let got_a: Vec<f32> = serde_json::from_value(body_a).expect("a float per sentence");
    let want_a = [
        cosine(&vector("s"), &vector("x")),
        cosine(&vector("s"), &vector("y")),
    ];
    for (got, want) in got_a.iter().zip(want_a) {
        assert!((got - want).abs() < 1e-6, "{got_a:?} {want_a:?}");
    }
    let got_b: Vec<f32> = serde_json::from_value(body_b).expect("a float per sentence");
    assert!((got_b[0] - cosine(&vector("t"), &vector("x"))).abs() < 1e-6);
    let got_c: Vec<f32> = serde_json::from_value(body_c).expect("a float per sentence");
    assert!(
        (got_c[0] - 1.0).abs() < 1e-6,
        "a sentence is itself: {got_c:?}"
    );
    // Embedded as TEI's /similarity does: /embed with `normalize: false`; the callers of one
    // `truncate` share a call (`u` twice in a request is embedded once).
    let calls = stack.tei.calls();
    let embeds: Vec<_> = calls
        .iter()
        .filter(|c| c.options["normalize"] == false)
        .collect();
    assert_eq!(embeds.len(), 2, "one call per batching key: {calls:?}");
    let mut sizes: Vec<usize> = calls.iter().map(|c| c.inputs.len()).collect();
    sizes.sort_unstable();
    assert_eq!(sizes, [3, 3], "s x y | t x u: {calls:?}");

    // A repeat is answered from the cache (its three embeddings), the same cosines.
    let repeat = repeat_from_cache(&stack, &gateway.url, "/similarity", &a, "3").await;
    let repeat: Vec<f32> = serde_json::from_value(repeat).expect("a float per sentence");
    assert_eq!(repeat, got_a);
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teis_errors_and_a_classifiers_424() {
    let (stack, gateway) = stack_with_gateway(TeiConfig::instant(), &[], 1 << 20, 3).await;
    let cases = vec![
        (
            "/similarity",
            serde_json::json!({"inputs": {"source_sentence": "s", "sentences": []}}),
            400,
            "Empty",
            "`inputs.sentences` cannot be empty",
        ),
        (
            "/similarity",
            serde_json::json!({"inputs": {"source_sentence": "s", "sentences": ["a", "b", "c"]}}),
            422,
            "Validation",
            "batch size 4 > maximum allowed batch size 3",
        ),
        (
            "/similarity",
            serde_json::json!({"inputs": ["s"]}),
            422,
            "Validation",
            "inputs",
        ),
        (
            "/embed_all",
            serde_json::json!({"inputs": []}),
            400,
            "Empty",
            "cannot be empty",
        ),
        (
            "/embed_all",
            serde_json::json!({"inputs": ["a", "b", "c", "d"]}),
            422,
            "Validation",
            "batch size 4 > maximum allowed batch size 3",
        ),
    ];
    assert_refused_before_any_call(&stack, &gateway.url, cases).await;
    assert_capabilities(&gateway.url, &["embed"]).await;
    let path = "/models/embatch%2Ftei-double/similarity";
    let body = serde_json::json!({"inputs": {"source_sentence": "s", "sentences": ["s"]}});
    let (status, body) = post_json(&gateway.url, path, body).await;
    assert_eq!(status, 200, "{body}");
    stack.worker.stop().await;

    let classifier = instant_double(|tei| tei.classifier = true);
    let (stack, gateway) = stack_with_gateway(classifier, &[], 1 << 20, 64).await;
    for (path, body) in [
        ("/embed", serde_json::json!({"inputs": "a"})),
        ("/embed_all", serde_json::json!({"inputs": "a"})),
        (
            "/similarity",
            serde_json::json!({"inputs": {"source_sentence": "s", "sentences": ["a"]}}),
        ),
    ] {
        let (status, err) = post_json(&gateway.url, path, body).await;
        assert_eq!(status, 424, "{path}: {err}");
        assert_tei_error(&err, "Backend", "Model is not an embedding model");
    }
    let splade = instant_double(|tei| tei.splade = true);
    let (splade_stack, splade_gateway) = stack_with_gateway(splade, &[], 1 << 20, 64).await;
    let (status, err) = post_json(
        &splade_gateway.url,
        "/embed_all",
        serde_json::json!({"inputs": "a"}),
    )
    .await;
    assert_eq!(status, 424, "{err}");
    assert_tei_error(
        &err,
        "Backend",
        "`embed_all` is not available for SPLADE models",
    );
    assert!(stack.tei.calls().is_empty() && splade_stack.tei.calls().is_empty());
    stack.worker.stop().await;
    splade_stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_routes_have_their_deadline() {
    assert_the_deadline(TeiConfig::instant(), "/embed_all", r#"{"inputs":"slow"}"#).await;
    let body = r#"{"inputs":{"source_sentence":"slow","sentences":["slower"]}}"#;
    assert_the_deadline(TeiConfig::instant(), "/similarity", body).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subjects_serve_direct_nats_callers() {
    let (stack, _gateway) = stack_with_gateway(TeiConfig::instant(), &[], 1 << 20, 64).await;
    let client = direct_client(&stack).await;
    let reply = send_direct(&client, Operation::EmbedAll, br#"{"inputs":"x"}"#)
        .await
        .expect("token vectors");
    let got: Vec<Vec<Vec<f32>>> = serde_json::from_slice(&reply.payload).expect("TEI's shape");
    assert_eq!(got, [tokens("x")]);
    let body = br#"{"inputs":{"source_sentence":"x","sentences":["x"]}}"#;
    let reply = send_direct(&client, Operation::Similarity, body)
        .await
        .expect("similarities");
    let got: Vec<f32> = serde_json::from_slice(&reply.payload).expect("TEI's shape");
    assert_eq!(got.len(), 1);
    assert!((got[0] - 1.0).abs() < 1e-6, "{got:?}");
    stack.worker.stop().await;
}
