//! The double's `/predict` (classifier and reranker) and `/embed_all` against its HTTP API.

use embatch_protocol::Input;
use embatch_protocol::predict::Prediction;

use crate::tests::post_to as post;
use crate::{CLASSIFIER_LABELS, Config, TeiDouble, predictions, token_embeddings};

fn classifier() -> Config {
    Config {
        classifier: true,
        max_client_batch_size: 3,
        ..Config::instant()
    }
}

#[tokio::test]
async fn a_classifier_scores_every_label_in_teis_shapes() {
    let tei = TeiDouble::spawn(classifier()).await.expect("spawn");
    let info = reqwest::get(format!("{}/info", tei.url))
        .await
        .expect("info");
    let info: serde_json::Value = info.json().await.expect("json");
    assert_eq!(
        info["model_type"]["classifier"]["id2label"]["2"],
        "positive"
    );

    let (status, single) = post(&tei, "predict", serde_json::json!({"inputs": "good"})).await;
    assert_eq!(status, 200, "{single}");
    let single: Vec<Prediction> = serde_json::from_value(single).expect("one list");
    assert_eq!(single.len(), CLASSIFIER_LABELS.len());
    assert!(
        single.windows(2).all(|w| w[0].score >= w[1].score),
        "sorted"
    );
    let sum: f32 = single.iter().map(|p| p.score).sum();
    assert!((sum - 1.0).abs() < 1e-5, "softmax: {sum}");
    let text = Input::Text("good".into());
    assert_eq!(single, predictions(&classifier(), &text, false));

    let batch = serde_json::json!({"inputs": [["good"], ["q", "t"]], "raw_scores": true});
    let (status, lists) = post(&tei, "predict", batch).await;
    assert_eq!(status, 200, "{lists}");
    let lists: Vec<Vec<Prediction>> = serde_json::from_value(lists).expect("a list per sequence");
    let pair = Input::Pair("q".into(), "t".into());
    assert_eq!(lists[1], predictions(&classifier(), &pair, true));
    assert_ne!(lists[0], single, "raw scores are logits");

    let four = serde_json::json!({"inputs": [["a"], ["b"], ["c"], ["d"]]});
    assert_eq!(post(&tei, "predict", four).await.0, 422);
    let (status, err) = post(&tei, "embed_all", serde_json::json!({"inputs": "a"})).await;
    assert_eq!(
        (status, err["error"].as_str()),
        (424, Some("Model is not an embedding model"))
    );
    let calls = tei.calls();
    assert_eq!(calls[1].inputs, [text, pair], "{calls:?}");
    assert_eq!(calls[1].options["route"], "/predict");
}

#[tokio::test]
async fn an_embedding_model_answers_token_vectors_and_refuses_predict() {
    let tei = TeiDouble::spawn(Config::instant()).await.expect("spawn");
    let (status, lists) = post(
        &tei,
        "embed_all",
        serde_json::json!({"inputs": ["hello world", [101, 102]]}),
    )
    .await;
    assert_eq!(status, 200, "{lists}");
    let lists: Vec<Vec<Vec<f32>>> = serde_json::from_value(lists).expect("TEI's shape");
    let text = Input::Text("hello world".into());
    assert_eq!(lists[0], token_embeddings(&text, 8));
    assert_eq!(lists[0].len(), 5, "3 tokens of text and 2 special ones");
    assert_eq!(lists[1].len(), 2, "token ids count exactly");
    assert_ne!(lists[0][0], lists[0][1], "a vector per token");
    let (status, err) = post(&tei, "predict", serde_json::json!({"inputs": "a"})).await;
    assert_eq!(
        (status, err["error"].as_str()),
        (424, Some("Model is not a classifier model"))
    );
    let splade = Config {
        splade: true,
        ..Config::instant()
    };
    let splade = TeiDouble::spawn(splade).await.expect("spawn");
    let (status, err) = post(&splade, "embed_all", serde_json::json!({"inputs": "a"})).await;
    assert_eq!(status, 424, "{err}");
}
