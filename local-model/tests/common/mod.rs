//! Shared by the tests that run a real model: finding and loading a model directory, the
//! reference files of `testdata/`, and the comparison against them.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use embatch_local_model::LocalModel;
use embatch_protocol::EmbedRequest;
use serde::Deserialize;

/// The files of a model directory.
const MODEL_FILES: [&str; 5] = [
    "config.json",
    "tokenizer.json",
    "model.safetensors",
    "sentence_bert_config.json",
    "1_Pooling/config.json",
];

/// A variant of the model under test, named `name` (its model id), in a temporary directory:
/// `written` (a path and its contents) as a new file, every other file of the model's own
/// directory as a symbolic link. Loaded, with the guard that keeps the directory.
pub fn variant(name: &str, (path, contents): (&str, &str)) -> (tempfile::TempDir, LocalModel) {
    let source = crate::REAL.dir();
    let _ = model(); // fails with the fetch hint when the model is missing
    let dir = tempfile::tempdir().expect("temp dir");
    let copy = dir.path().join(name);
    std::fs::create_dir_all(copy.join("1_Pooling")).expect("mkdir");
    for file in MODEL_FILES.into_iter().filter(|file| *file != path) {
        std::os::unix::fs::symlink(
            source.join(file).canonicalize().expect(file),
            copy.join(file),
        )
        .expect("symlink");
    }
    std::fs::write(copy.join(path), contents).expect("write");
    let model = LocalModel::load(&copy).expect("loads");
    (dir, model)
}

/// The tests every real model passes, on the test binary's `REAL`: it answers every case of its
/// reference, and reports its dimension, token limit and id.
macro_rules! real_model_tests {
    () => {
        #[test]
        fn matches_its_reference_embeddings() {
            crate::REAL.assert_matches_reference(common::model());
        }

        #[test]
        fn limits_and_dimensions_are_reported() {
            crate::REAL.assert_limits(common::model());
        }
    };
}

/// The model under test (the test binary's `REAL`), loaded once for all tests of the binary.
pub fn model() -> &'static LocalModel {
    static MODEL: OnceLock<LocalModel> = OnceLock::new();
    MODEL.get_or_init(|| crate::REAL.load())
}

/// A real model the tests run: where its directory is, how to fetch it, its reference file.
pub struct RealModel {
    /// The environment variable naming its directory; unset: `<repo>/models/<name>`.
    pub var: &'static str,
    /// Its directory's name under `<repo>/models/`.
    pub name: &'static str,
    /// The command that fetches it, named when it is missing.
    pub fetch: &'static str,
    /// Its reference file in `testdata/`, and who computed it (`TEI`, `ONNX Runtime`).
    pub reference: (&'static str, &'static str),
    /// The lowest cosine similarity with the reference's vectors accepted.
    pub min_cosine: f32,
    /// Its dimension and token limit (`max_seq_length`).
    pub limits: (usize, usize),
}

impl RealModel {
    /// The model's directory.
    pub fn dir(&self) -> PathBuf {
        std::env::var_os(self.var).map_or_else(
            || {
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../models")
                    .join(self.name)
            },
            PathBuf::from,
        )
    }

    /// Loads the model, panicking with the command that fetches it when it is missing.
    pub fn load(&self) -> LocalModel {
        let dir = self.dir();
        assert!(
            dir.join("model.safetensors").is_file(),
            "no model in {}: run {}",
            dir.display(),
            self.fetch
        );
        LocalModel::load(&dir).unwrap_or_else(|err| panic!("loading {}: {err}", dir.display()))
    }

    /// Its reference file.
    pub fn reference(&self) -> Reference {
        reference(self.reference.0)
    }

    /// Asserts that `model` answers every case of the reference ([`assert_matches`]).
    pub fn assert_matches_reference(&self, model: &LocalModel) {
        let lowest = assert_matches(model, self.reference(), self.min_cosine);
        eprintln!(
            "minimum cosine similarity with {}: {lowest}",
            self.reference.1
        );
    }

    /// Asserts that `model` reports this model's dimension, token limit and id (its name).
    pub fn assert_limits(&self, model: &LocalModel) {
        assert_eq!((model.dim(), model.max_input_length()), self.limits);
        assert_eq!(model.model_id(), self.name);
    }
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
