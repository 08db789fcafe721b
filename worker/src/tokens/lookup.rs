//! Where the TEI model's `tokenizer.json` is found: `--tokenizer`, else the Hugging Face cache.

use std::path::PathBuf;

/// Where the TEI model's tokenizer is looked for, in order: `--tokenizer`, then the Hugging Face
/// cache (or hub) for `model_id`.
#[derive(Debug, Clone, Default)]
pub struct TokenizerLookup {
    /// `--tokenizer`: a `tokenizer.json` path.
    pub path: Option<PathBuf>,
}

impl TokenizerLookup {
    /// The tokenizer file for the TEI model `model_id` (from its `/info`), and where it came
    /// from; `None` when there is none (the reason is logged). Blocking (may fetch from the hub).
    pub fn find(&self, model_id: Option<&str>) -> Option<(PathBuf, String)> {
        if let Some(path) = &self.path {
            return Some((path.clone(), path.display().to_string()));
        }
        let model_id = model_id?;
        find_in_hub(model_id).map(|path| (path, format!("{model_id} (Hugging Face cache)")))
    }
}

#[cfg(feature = "hub")]
fn find_in_hub(model_id: &str) -> Option<PathBuf> {
    match embatch_local_model::tokenizer_path(model_id) {
        Ok(path) => Some(path),
        Err(err) => {
            tracing::info!(model_id, %err, "no tokenizer for the TEI model in the Hugging Face cache or hub");
            None
        }
    }
}

#[cfg(not(feature = "hub"))]
fn find_in_hub(model_id: &str) -> Option<PathBuf> {
    tracing::info!(
        model_id,
        "this build has no `hub` feature: set --tokenizer for the TEI model's tokenizer"
    );
    None
}
