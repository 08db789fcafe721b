//! Why a model directory could not be loaded.

use std::path::{Path, PathBuf};

/// A model could not be loaded. Every variant names the file at fault.
///
/// Errors of a request (too long, unknown prompt, …) are not load errors: [`crate::LocalModel::embed`]
/// reports them as [`embatch_protocol::EmbedError`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// A required file is missing from the model directory.
    #[error("model file {} is missing", path.display())]
    Missing {
        /// The file that should exist.
        path: PathBuf,
    },
    /// A file exists but cannot be read.
    #[error("cannot read model file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A JSON configuration file is not valid JSON or lacks a required field.
    #[error("invalid model config {}: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The parse error, with line and column.
        source: serde_json::Error,
    },
    /// A configuration file is well-formed but describes something this crate cannot run (another
    /// architecture, an activation or a pooling mode it does not implement, contradictory sizes).
    #[error("unsupported model config {}: {reason}", path.display())]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// What is unsupported, and what is.
        reason: String,
    },
    /// `tokenizer.json` cannot be parsed or configured.
    #[error("invalid tokenizer {}: {message}", path.display())]
    Tokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// The tokenizers library's message.
        message: String,
    },
    /// The weights cannot be read as safetensors or do not fit the config (a tensor is missing or
    /// has the wrong shape).
    #[error("invalid model weights {}: {source}", path.display())]
    Weights {
        /// The weights file.
        path: PathBuf,
        /// The candle error, naming the tensor at fault.
        source: candle_core::Error,
    },
    /// A file could not be fetched from the Hugging Face Hub (feature `hub`).
    #[cfg(feature = "hub")]
    #[error("cannot fetch {file} of {model_id} from the Hugging Face Hub: {source}")]
    Hub {
        /// The hub model id, e.g. `sentence-transformers/all-MiniLM-L6-v2`.
        model_id: String,
        /// The file within the model repository.
        file: String,
        /// The hub client's error.
        source: hf_hub::api::sync::ApiError,
    },
}

impl LoadError {
    /// A [`LoadError::Unsupported`] for `path`.
    pub(crate) fn unsupported(path: &Path, reason: impl Into<String>) -> LoadError {
        LoadError::Unsupported {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }
}
