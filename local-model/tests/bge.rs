//! The second real model, BAAI/bge-small-en-v1.5 (CLS pooling, 512-token inputs), against ONNX
//! Runtime's answers computed from the unconverted ONNX file
//! (`testdata/bge-small-reference-embeddings.json`, made by `testdata/make-bge-reference.py`).
//!
//! Needs the model: `scripts/fetch-model.sh --model bge-small-en-v1.5` (or
//! `EMBATCH_BGE_MODEL_DIR` pointing at its directory).

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use common::{Reference, cosine, long_input};
use embatch_local_model::LocalModel;
use embatch_protocol::{EmbedOptions, Input};

/// The reference computes GeLU exactly (erf); this crate, like TEI, with the tanh approximation.
const MIN_COSINE: f32 = 0.999;

fn model_dir() -> PathBuf {
    common::model_dir("EMBATCH_BGE_MODEL_DIR", "bge-small-en-v1.5")
}

/// The model, loaded once for all tests of this binary.
fn model() -> &'static LocalModel {
    static MODEL: OnceLock<LocalModel> = OnceLock::new();
    MODEL.get_or_init(|| {
        common::load_model(
            &model_dir(),
            "scripts/fetch-model.sh --model bge-small-en-v1.5 (or set EMBATCH_BGE_MODEL_DIR)",
        )
    })
}

fn reference() -> Reference {
    common::reference("bge-small-reference-embeddings.json")
}

#[test]
fn matches_onnx_runtime_reference_embeddings() {
    let lowest = common::assert_matches(model(), reference(), MIN_COSINE);
    eprintln!("minimum cosine similarity with ONNX Runtime: {lowest}");
}

#[test]
fn limits_and_dimensions_are_reported() {
    let model = model();
    assert_eq!(model.dim(), 384);
    assert_eq!(model.max_input_length(), 512);
    assert_eq!(model.model_id(), "bge-small-en-v1.5");
}

/// The reference is CLS-pooled; the same weights with mean pooling give other vectors, so the
/// match above shows that the model's `1_Pooling/config.json` is the one applied.
#[test]
fn pooling_is_the_cls_token_as_its_pooling_config_says() {
    let source = model_dir();
    let _ = model(); // fails with the fetch hint when the model is missing
    let dir = tempfile::tempdir().expect("temp dir");
    let copy = dir.path().join("bge-mean-pooled");
    std::fs::create_dir_all(copy.join("1_Pooling")).expect("mkdir");
    for file in [
        "config.json",
        "tokenizer.json",
        "model.safetensors",
        "sentence_bert_config.json",
    ] {
        std::os::unix::fs::symlink(
            source.join(file).canonicalize().expect(file),
            copy.join(file),
        )
        .expect("symlink");
    }
    std::fs::write(
        copy.join("1_Pooling/config.json"),
        r#"{"word_embedding_dimension": 384, "pooling_mode_cls_token": false,
            "pooling_mode_mean_tokens": true}"#,
    )
    .expect("write");
    let mean_pooled = LocalModel::load(&copy).expect("loads");

    let case = &reference().cases[0];
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
