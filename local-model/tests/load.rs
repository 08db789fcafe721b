//! Loading: errors name the file at fault, and a tiny random BERT with CLS pooling runs end to end.
//! Needs no downloaded model.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use embatch_local_model::{LoadError, LocalModel};
use embatch_protocol::{EmbedError, EmbedOptions, Input};

const HIDDEN: usize = 8;
const INTERMEDIATE: usize = 16;
const VOCAB: [&str; 8] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "b", "c", "d"];

fn config_json(hidden_act: &str) -> String {
    format!(
        r#"{{"model_type": "bert", "vocab_size": {vocab}, "hidden_size": {HIDDEN},
            "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": {INTERMEDIATE},
            "hidden_act": "{hidden_act}", "hidden_dropout_prob": 0.1, "max_position_embeddings": 16,
            "type_vocab_size": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12,
            "pad_token_id": 0}}"#,
        vocab = VOCAB.len()
    )
}

/// A word-level tokenizer over [`VOCAB`] that adds `[CLS]` and `[SEP]`.
fn tokenizer_json() -> String {
    let vocab: serde_json::Map<String, serde_json::Value> = VOCAB
        .iter()
        .enumerate()
        .map(|(id, token)| (token.to_string(), id.into()))
        .collect();
    serde_json::json!({
        "version": "1.0",
        "truncation": {"max_length": 3, "strategy": "LongestFirst", "stride": 0},
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {
                "[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}
            }
        },
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    })
    .to_string()
}

/// Random weights with the tensor names of a Hugging Face BERT checkpoint.
fn write_weights(path: &Path) {
    let device = Device::Cpu;
    let layer = |name: &str| format!("encoder.layer.0.{name}");
    let mut shapes: Vec<(String, Vec<usize>)> = [
        ("word_embeddings", vec![VOCAB.len(), HIDDEN]),
        ("position_embeddings", vec![16, HIDDEN]),
        ("token_type_embeddings", vec![2, HIDDEN]),
    ]
    .into_iter()
    .map(|(table, shape)| (format!("embeddings.{table}.weight"), shape))
    .collect();
    shapes.push(("embeddings.LayerNorm.weight".into(), vec![HIDDEN]));
    shapes.push(("embeddings.LayerNorm.bias".into(), vec![HIDDEN]));
    // Dense layers: a weight (out × in) and a bias (out); the output layer's bias is zeros below.
    for (dense, out_dim, in_dim) in [
        ("attention.self.query", HIDDEN, HIDDEN),
        ("attention.self.key", HIDDEN, HIDDEN),
        ("attention.self.value", HIDDEN, HIDDEN),
        ("attention.output.dense", HIDDEN, HIDDEN),
        ("intermediate.dense", INTERMEDIATE, HIDDEN),
        ("output.dense", HIDDEN, INTERMEDIATE),
    ] {
        shapes.push((layer(&format!("{dense}.weight")), vec![out_dim, in_dim]));
        if dense != "output.dense" {
            shapes.push((layer(&format!("{dense}.bias")), vec![out_dim]));
        }
    }
    let mut tensors: HashMap<String, Tensor> = shapes
        .into_iter()
        .map(|(name, shape)| {
            let t = Tensor::randn(0f32, 0.5, shape, &device).expect("randn");
            (name, t)
        })
        .collect();
    for (name, ones) in [
        ("encoder.layer.0.attention.output.LayerNorm.weight", true),
        ("encoder.layer.0.attention.output.LayerNorm.bias", false),
        ("encoder.layer.0.output.dense.bias", false),
        ("encoder.layer.0.output.LayerNorm.weight", true),
        ("encoder.layer.0.output.LayerNorm.bias", false),
    ] {
        let t = if ones {
            Tensor::ones(HIDDEN, DType::F32, &device)
        } else {
            Tensor::zeros(HIDDEN, DType::F32, &device)
        };
        tensors.insert(name.to_string(), t.expect("tensor"));
    }
    candle_core::safetensors::save(&tensors, path).expect("save weights");
}

/// A complete tiny model directory with CLS pooling and an 8-token limit.
fn tiny_model(dir: &Path) {
    std::fs::create_dir_all(dir.join("1_Pooling")).expect("mkdir");
    std::fs::write(dir.join("config.json"), config_json("gelu")).expect("write");
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json()).expect("write");
    std::fs::write(
        dir.join("1_Pooling/config.json"),
        format!(r#"{{"word_embedding_dimension": {HIDDEN}, "pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}}"#),
    )
    .expect("write");
    std::fs::write(
        dir.join("sentence_bert_config.json"),
        r#"{"max_seq_length": 8, "do_lower_case": false}"#,
    )
    .expect("write");
    write_weights(&dir.join("model.safetensors"));
}

fn load_err(dir: &Path) -> LoadError {
    match LocalModel::load(dir) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(err) => err,
    }
}

#[test]
fn a_missing_directory_names_config_json() {
    let dir = tempfile::tempdir().expect("temp dir");
    let err = load_err(&dir.path().join("nope"));
    assert!(matches!(err, LoadError::Missing { .. }), "{err:?}");
    assert!(err.to_string().contains("config.json"), "{err}");
}

#[test]
fn missing_weights_are_named() {
    let dir = tempfile::tempdir().expect("temp dir");
    tiny_model(dir.path());
    std::fs::remove_file(dir.path().join("model.safetensors")).expect("rm");
    let err = load_err(dir.path());
    assert!(matches!(err, LoadError::Missing { .. }), "{err:?}");
    assert!(err.to_string().contains("model.safetensors"), "{err}");
}

#[test]
fn invalid_files_are_named() {
    let cases: [(&str, String, &str); 5] = [
        ("config.json", "{not json".into(), "invalid model config"),
        ("config.json", config_json("swish"), "`hidden_act` `swish`"),
        (
            "1_Pooling/config.json",
            r#"{"pooling_mode_max_tokens": true}"#.into(),
            "pooling_mode_max_tokens",
        ),
        ("tokenizer.json", "{}".into(), "invalid tokenizer"),
        (
            "model.safetensors",
            "not safetensors".into(),
            "invalid model weights",
        ),
    ];
    for (file, content, expected) in cases {
        let dir = tempfile::tempdir().expect("temp dir");
        tiny_model(dir.path());
        std::fs::write(dir.path().join(file), content).expect("write");
        let message = load_err(dir.path()).to_string();
        assert!(message.contains(file), "{file}: {message}");
        assert!(message.contains(expected), "{file}: {message}");
    }
}

#[test]
fn a_tiny_cls_model_embeds_truncates_and_batches() {
    let dir = tempfile::tempdir().expect("temp dir");
    tiny_model(dir.path());
    let model = LocalModel::load(dir.path()).expect("loads");
    assert_eq!(model.dim(), HIDDEN);
    assert_eq!(model.max_input_length(), 8);

    // tokenizer.json's own truncation to 3 tokens is ignored: 6 words + 2 special tokens fit.
    let inputs: Vec<Input> = ["a b c d a b", "a", "", "b c"].map(Input::from).to_vec();
    let options = EmbedOptions::default();
    let batch = model.embed(&inputs, &options).expect("embeds");
    for (input, batched) in inputs.iter().zip(&batch) {
        let alone = model
            .embed(std::slice::from_ref(input), &options)
            .expect("embeds");
        assert_eq!(batched.len(), HIDDEN);
        for (x, y) in batched.iter().zip(&alone[0]) {
            assert!(
                (x - y).abs() < 1e-5,
                "{input:?}: {batched:?} vs {:?}",
                alone[0]
            );
        }
    }

    let long = vec![Input::from("a b c d a b c")];
    let no_truncation = EmbedOptions {
        truncate: Some(false),
        ..EmbedOptions::default()
    };
    let err = model.embed(&long, &no_truncation).expect_err("9 tokens");
    assert!(matches!(err, EmbedError::Validation(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("`inputs` must have less than 8 tokens. Given: 9"),
        "{err}"
    );
    let truncated = model
        .embed(
            &long,
            &EmbedOptions {
                truncate: Some(true),
                ..EmbedOptions::default()
            },
        )
        .expect("truncated to 8 tokens");
    let first_six = model
        .embed(&[Input::from("a b c d a b")], &options)
        .expect("embeds");
    for (x, y) in truncated[0].iter().zip(&first_six[0]) {
        assert!(
            (x - y).abs() < 1e-5,
            "right truncation keeps the first 6 words"
        );
    }
}
