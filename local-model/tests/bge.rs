//! The second real model, BAAI/bge-small-en-v1.5 (CLS pooling, 512-token inputs), against ONNX
//! Runtime's answers computed from the unconverted ONNX file
//! (`testdata/bge-small-reference-embeddings.json`, made by `testdata/make-bge-reference.py`).
//!
//! Needs the model: `scripts/fetch-model.sh --model bge-small-en-v1.5` (or
//! `EMBATCH_BGE_MODEL_DIR` pointing at its directory).

#[macro_use]
mod common;

use common::{RealModel, cosine, long_input, model};
use embatch_protocol::{EmbedOptions, Input};

/// The reference computes GeLU exactly (erf); this crate, like TEI, with the tanh approximation.
const MIN_COSINE: f32 = 0.999;

/// The model under test.
const REAL: RealModel = RealModel {
    var: "EMBATCH_BGE_MODEL_DIR",
    name: "bge-small-en-v1.5",
    fetch: "scripts/fetch-model.sh --model bge-small-en-v1.5 (or set EMBATCH_BGE_MODEL_DIR)",
    reference: ("bge-small-reference-embeddings.json", "ONNX Runtime"),
    min_cosine: MIN_COSINE,
    limits: (384, 512),
};

real_model_tests!();

/// The reference is CLS-pooled; the same weights with mean pooling give other vectors, so the
/// match above shows that the model's `1_Pooling/config.json` is the one applied.
#[test]
fn pooling_is_the_cls_token_as_its_pooling_config_says() {
    let pooling = r#"{"word_embedding_dimension": 384, "pooling_mode_cls_token": false,
            "pooling_mode_mean_tokens": true}"#;
    let (_dir, mean_pooled) =
        common::variant("bge-mean-pooled", ("1_Pooling/config.json", pooling));

    let case = &REAL.reference().cases[0];
    let inputs: Vec<Input> = case.request.inputs.as_slice()[..8].to_vec();
    let options = EmbedOptions::default();
    let cls = model().embed(&inputs, &options).expect("embeds");
    let mean = mean_pooled.embed(&inputs, &options).expect("embeds");
    for (i, want) in case.embeddings[..8].iter().enumerate() {
        assert!(cosine(&cls[i], want) >= MIN_COSINE, "input {i}: CLS");
        let cos = cosine(&mean[i], want);
        assert!(cos < 0.99, "input {i}: mean pooling is as close ({cos})");
    }
}

/// bge-small-en-v1.5 takes 512 tokens (its `max_seq_length`), twice MiniLM's 256.
#[test]
fn long_input_is_cut_at_512_tokens_or_refused() {
    let long = long_input();
    let options = EmbedOptions {
        truncate: Some(false),
        ..EmbedOptions::default()
    };
    let err = model()
        .embed(&[Input::from(long.as_str())], &options)
        .expect_err("over 512 tokens");
    assert_eq!(err.status(), 422);
    let message = err.to_string();
    assert!(
        message.contains("`inputs` must have less than 512 tokens. Given: "),
        "{message}"
    );

    let ids = Input::Ids([101].into_iter().chain([7592; 400]).chain([102]).collect());
    let got = model()
        .embed(&[ids], &options)
        .expect("402 ids are within 512");
    assert_eq!(got[0].len(), 384);
}
