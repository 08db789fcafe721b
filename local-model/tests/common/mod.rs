//! Shared by the tests that run a real model: finding and loading a model directory, the
//! reference files of `testdata/`, and the comparison against them.

use std::path::{Path, PathBuf};
use std::time::Instant;

use embatch_local_model::LocalModel;
use embatch_protocol::EmbedRequest;
use serde::Deserialize;

/// The model directory named by the environment variable `var`, else `<repo>/models/<name>`.
pub fn model_dir(var: &str, name: &str) -> PathBuf {
    std::env::var_os(var).map_or_else(
        || {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../models")
                .join(name)
        },
        PathBuf::from,
    )
}

/// Loads the model in `dir`, panicking with the command that fetches it when it is missing.
pub fn load_model(dir: &Path, fetch: &str) -> LocalModel {
    assert!(
        dir.join("model.safetensors").is_file(),
        "no model in {}: run {fetch}",
        dir.display()
    );
    LocalModel::load(dir).unwrap_or_else(|err| panic!("loading {}: {err}", dir.display()))
}

/// `<repo>/testdata/<name>`.
pub fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata")
        .join(name)
}

/// `testdata/reference-long-input.txt`: about 800 words, over both models' token limits.
pub fn long_input() -> String {
    let path = testdata("reference-long-input.txt");
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

pub fn norm(v: &[f32]) -> f32 {
    v.iter().map(|x| x * x).sum::<f32>().sqrt()
}

pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    dot / (norm(a) * norm(b))
}

/// A reference file of `testdata/`: requests and the embeddings another implementation answered.
#[derive(Deserialize)]
pub struct Reference {
    pub cases: Vec<Case>,
}

#[derive(Deserialize)]
pub struct Case {
    pub request: EmbedRequest,
    pub embeddings: Vec<Vec<f32>>,
}

/// Reads `testdata/<name>`.
pub fn reference(name: &str) -> Reference {
    let path = testdata(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// Embeds every case of `reference` with `model`, one call per case, and asserts each vector has
/// the model's dimension, a cosine similarity of at least `min_cosine` with the reference's, and
/// the reference's norm (1 when normalized, within 1% otherwise). Returns the lowest cosine seen.
pub fn assert_matches(model: &LocalModel, reference: Reference, min_cosine: f32) -> f32 {
    let mut lowest = f32::INFINITY;
    for (case_index, case) in reference.cases.into_iter().enumerate() {
        let (inputs, options) = case.request.into_parts();
        let started = Instant::now();
        let got = model
            .embed(&inputs, &options)
            .unwrap_or_else(|err| panic!("case {case_index}: {err}"));
        eprintln!(
            "case {case_index}: {} inputs ({options:?}) embedded in one call in {:?}",
            inputs.len(),
            started.elapsed()
        );
        assert_eq!(got.len(), case.embeddings.len(), "case {case_index}");

        for (i, (got, want)) in got.iter().zip(&case.embeddings).enumerate() {
            let what = format!("case {case_index} input {i} {:?}", inputs[i]);
            assert_eq!(got.len(), want.len(), "{what}: dimension");
            assert_eq!(got.len(), model.dim(), "{what}: dimension");
            let cos = cosine(got, want);
            lowest = lowest.min(cos);
            assert!(cos >= min_cosine, "{what}: cosine {cos} < {min_cosine}");
            if options.normalize {
                assert!((norm(got) - 1.0).abs() < 1e-4, "{what}: norm {}", norm(got));
            } else {
                let (got_norm, want_norm) = (norm(got), norm(want));
                assert!(
                    (got_norm - want_norm).abs() <= 1e-2 * want_norm,
                    "{what}: norm {got_norm}, the reference's {want_norm}"
                );
            }
        }
    }
    lowest
}
