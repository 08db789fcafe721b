//! Rerank end to end over HTTP, a real nats-server and an in-process worker on the TEI double
//! (a reranker): TEI's `POST /rerank`, Cohere's `POST /v1/rerank` and `POST /v2/rerank`, the
//! rerank subject over NATS directly, errors, and pairs of concurrent callers batched into one
//! upstream call.

mod common;

use std::time::Duration;

use common::tei_routes::{
    WAIT_FOR_BATCH_MATES, assert_isolated, assert_plain_model_424, assert_the_deadline,
    bad_beside_good, direct_client, instant_double, post_json,
};
use common::{assert_tei_error, stack_with_gateway};
use embatch_protocol::Input;
use embatch_tei_double::{POISON, RecordedCall, rerank_score};
use embatch_testkit::TeiConfig;

/// The double as a reranker that answers at once.
fn reranker() -> TeiConfig {
    instant_double(|tei| tei.reranker = true)
}

/// `(index, score)` of TEI's ranks, checking they are sorted by score, highest first.
fn ranks(body: &serde_json::Value) -> Vec<(usize, f32)> {
    let ranks: Vec<(usize, f32)> = body
        .as_array()
        .expect("an array of ranks")
        .iter()
        .map(|r| {
            let index = r["index"].as_u64().expect("index") as usize;
            (index, r["score"].as_f64().expect("score") as f32)
        })
        .collect();
    assert!(ranks.windows(2).all(|w| w[0].1 >= w[1].1), "{body}");
    ranks
}

/// The pairs of the upstream calls on `route` (`/rerank` or `/predict`).
fn calls_on(calls: &[RecordedCall], route: &str) -> Vec<Vec<Input>> {
    calls
        .iter()
        .filter(|c| c.options["route"] == route)
        .map(|c| c.inputs.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tei_rerank_scores_sorts_and_echoes() {
    let (stack, gateway) = stack_with_gateway(reranker(), &[], 1 << 20, 4).await;
    let texts = ["alpha", "beta", "gamma"];
    let body = serde_json::json!({"query": "q", "texts": texts});

    let (status, sorted) = post_json(&gateway.url, "/rerank", body.clone()).await;
    assert_eq!(status, 200, "{sorted}");
    let got = ranks(&sorted);
    assert_eq!(got.len(), 3);
    for (index, score) in &got {
        assert_eq!(*score, rerank_score("q", texts[*index], false), "{sorted}");
    }
    assert!(sorted[0].get("text").is_none(), "no text unless asked");
    // One query: one call to TEI's /rerank with the three texts.
    let calls = stack.tei.calls();
    assert_eq!(calls_on(&calls, "/rerank").len(), 1, "{calls:?}");

    // `return_text` echoes each text with its rank (the scores come from the cache).
    let mut with_text = body.clone();
    with_text["return_text"] = true.into();
    let (status, echoed) = post_json(&gateway.url, "/rerank", with_text).await;
    assert_eq!(status, 200, "{echoed}");
    for rank in echoed.as_array().expect("ranks") {
        let index = rank["index"].as_u64().expect("index") as usize;
        assert_eq!(rank["text"], texts[index]);
    }
    assert_eq!(ranks(&echoed), got);

    // `raw_scores`: the logit, as TEI.
    let mut raw = body.clone();
    raw["raw_scores"] = true.into();
    let (status, logits) = post_json(&gateway.url, "/rerank", raw).await;
    assert_eq!(status, 200, "{logits}");
    for (index, score) in ranks(&logits) {
        assert_eq!(score, rerank_score("q", texts[index], true));
    }

    // TEI's errors: no texts (400 Empty), more than MAX_CLIENT_BATCH_SIZE (422), not JSON.
    let (status, err) = post_json(
        &gateway.url,
        "/rerank",
        serde_json::json!({"query": "q", "texts": []}),
    )
    .await;
    assert_eq!(status, 400);
    assert_tei_error(&err, "Empty", "`texts` cannot be empty");
    let five = serde_json::json!({"query": "q", "texts": ["a", "b", "c", "d", "e"]});
    let (status, err) = post_json(&gateway.url, "/rerank", five).await;
    assert_eq!(status, 422);
    assert_tei_error(
        &err,
        "Validation",
        "batch size 5 > maximum allowed batch size 4",
    );
    assert_tei_error(&err, "Validation", "MAX_CLIENT_BATCH_SIZE");
    let (status, err) = post_json(&gateway.url, "/rerank", serde_json::json!({"query": 1})).await;
    assert_eq!(status, 422, "{err}");
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cohere_routes_take_top_n_and_return_documents() {
    let (stack, gateway) = stack_with_gateway(reranker(), &[], 1 << 20, 4).await;
    let texts = ["one", "two", "three"];
    let v1 = serde_json::json!({
        "model": "", "query": "which?", "top_n": 2, "return_documents": true,
        "documents": ["one", {"text": "two"}, "three"],
    });
    let (status, body) = post_json(&gateway.url, "/v1/rerank", v1).await;
    assert_eq!(status, 200, "{body}");
    let results = body["results"].as_array().expect("results");
    assert_eq!(results.len(), 2, "top_n");
    let mut expected: Vec<(usize, f32)> = (0..3)
        .map(|i| (i, rerank_score("which?", texts[i], false)))
        .collect();
    expected.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (result, (index, score)) in results.iter().zip(&expected) {
        assert_eq!(result["index"], *index, "{body}");
        assert_eq!(
            result["relevance_score"].as_f64().expect("score") as f32,
            *score
        );
        assert_eq!(result["document"]["text"], texts[*index]);
    }
    assert_eq!(body["meta"]["api_version"]["version"], "1");
    assert!(
        body["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("rerank-"))
    );

    let v2 = serde_json::json!({"model": "", "query": "which?", "documents": texts});
    let (status, body) = post_json(&gateway.url, "/v2/rerank", v2).await;
    assert_eq!(status, 200, "{body}");
    let results = body["results"].as_array().expect("results");
    assert_eq!(results.len(), 3, "every document without top_n");
    assert!(
        results.iter().all(|r| r.get("document").is_none()),
        "{body}"
    );
    assert_eq!(body["meta"]["api_version"]["version"], "2");

    // Errors: no documents, too many, a model nobody serves.
    let empty = serde_json::json!({"model": "", "query": "q", "documents": []});
    let (status, err) = post_json(&gateway.url, "/v2/rerank", empty).await;
    assert_eq!(status, 400);
    assert_tei_error(&err, "Empty", "`documents` cannot be empty");
    let many = serde_json::json!({"query": "q", "documents": ["a", "b", "c", "d", "e"]});
    let (status, err) = post_json(&gateway.url, "/v1/rerank", many).await;
    assert_eq!(status, 422);
    assert_tei_error(&err, "Validation", "MAX_CLIENT_BATCH_SIZE (4)");
    let unknown = serde_json::json!({"model": "nobody", "query": "q", "documents": ["a"]});
    let (status, err) = post_json(&gateway.url, "/v2/rerank", unknown).await;
    assert_eq!(status, 404, "{err}");
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairs_of_concurrent_callers_share_one_upstream_call() {
    let (stack, gateway) = stack_with_gateway(reranker(), &WAIT_FOR_BATCH_MATES, 1 << 20, 64).await;
    let a = serde_json::json!({"query": "first query", "texts": ["a1", "a2"]});
    let b = serde_json::json!({"query": "second query", "texts": ["b1"]});
    let ((status_a, ranks_a), (status_b, ranks_b)) = tokio::join!(
        post_json(&gateway.url, "/rerank", a),
        post_json(&gateway.url, "/rerank", b),
    );
    assert_eq!((status_a, status_b), (200, 200), "{ranks_a} {ranks_b}");
    for (index, score) in ranks(&ranks_a) {
        assert_eq!(
            score,
            rerank_score("first query", ["a1", "a2"][index], false)
        );
    }
    assert_eq!(
        ranks(&ranks_b),
        [(0, rerank_score("second query", "b1", false))]
    );
    // Two queries: one call to TEI's /predict holding all three pairs.
    let calls = stack.tei.calls();
    let predicted = calls_on(&calls, "/predict");
    assert_eq!(predicted.len(), 1, "{calls:?}");
    assert_eq!(predicted[0].len(), 3, "{calls:?}");
    assert!(calls_on(&calls, "/rerank").is_empty(), "{calls:?}");

    // A bad pair fails its own request only: their shared call is refused, then the batch is
    // bisected and the good pair scored alone.
    stack.tei.calls.clear();
    let bad = serde_json::json!({"query": "q3", "texts": [format!("x {POISON}")]});
    let good = serde_json::json!({"query": "q4", "texts": ["fine"]});
    let fine = bad_beside_good(&gateway.url, "/rerank", bad, good).await;
    assert_eq!(ranks(&fine), [(0, rerank_score("q4", "fine", false))]);
    // The shared call of two queries goes to /predict, the good pair alone to /rerank.
    let calls = stack.tei.calls();
    let sizes: Vec<(usize, u16)> = calls.iter().map(|c| (c.inputs.len(), c.status)).collect();
    assert_isolated(&sizes, 2);
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rerank_subject_serves_direct_nats_callers() {
    let (stack, gateway) =
        stack_with_gateway(reranker(), &["--max-client-batch-size", "2"], 1 << 20, 64).await;
    let client = direct_client(&stack).await;
    let body = br#"{"query":"q","texts":["x","y"],"return_text":true}"#;
    let reply = client
        .rerank(bytes::Bytes::from_static(body), Duration::from_secs(10))
        .await
        .expect("ranks");
    let got: Vec<embatch_protocol::rerank::Rank> =
        serde_json::from_slice(&reply.payload).expect("TEI's ranks");
    assert_eq!(got.len(), 2);
    for rank in &got {
        let text = rank.text.as_deref().expect("return_text");
        assert_eq!(rank.score, rerank_score("q", text, false));
    }
    // The worker's own limit, named, for a caller that skips the gateway (and through it).
    let three = bytes::Bytes::from_static(br#"{"query":"q","texts":["a","b","c"]}"#);
    let err = client
        .rerank(three, Duration::from_secs(10))
        .await
        .expect_err("over the worker's limit");
    let err = embatch_protocol::EmbedError::from(err);
    assert_eq!(err.status(), 422);
    assert!(
        err.to_string().contains("MAX_CLIENT_BATCH_SIZE (2)"),
        "{err}"
    );
    let (status, _) = post_json(
        &gateway.url,
        "/rerank",
        serde_json::json!({"query": "q", "texts": ["a", "b", "c"]}),
    )
    .await;
    assert_eq!(status, 422);
    stack.worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_is_not_a_reranker_is_teis_424() {
    let body = serde_json::json!({"query": "q", "texts": ["a"]});
    let calls = assert_plain_model_424("/rerank", body, "model is not a re-ranker model").await;
    assert!(calls.is_empty(), "refused before any upstream call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerank_request_has_its_deadline() {
    assert_the_deadline(
        reranker(),
        "/v2/rerank",
        r#"{"query":"q","documents":["slow"]}"#,
    )
    .await;
}
