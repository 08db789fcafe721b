//! [`LocalModel::from_hub`]: a model directory fetched from the Hugging Face Hub.

use hf_hub::api::sync::{ApiBuilder, ApiError};

use crate::config::{CONFIG, POOLING, SENTENCE_BERT, SENTENCE_TRANSFORMERS, TOKENIZER, WEIGHTS};
use crate::{LoadError, LocalModel};

impl LocalModel {
    /// Fetches the files [`LocalModel::load`] reads from the Hugging Face Hub model repository
    /// `model_id` (e.g. `sentence-transformers/all-MiniLM-L6-v2`) into the Hugging Face cache,
    /// then loads them. Files already in the cache are not fetched again, so a filled cache works
    /// offline. `HF_HOME`, `HF_ENDPOINT` and the cached token are honoured, as by the Python
    /// client. Blocking.
    ///
    /// [`LocalModel::model_id`] is `model_id`.
    ///
    /// # Errors
    /// [`LoadError::Hub`] naming the file that could not be fetched (network, authentication or
    /// a required file missing from the repository), or any error of [`LocalModel::load`].
    pub fn from_hub(model_id: &str) -> Result<LocalModel, LoadError> {
        let hub_error = |file: &str, source| hub_error(model_id, file, source);
        let repo = hub_repo(model_id)?;

        let config = repo
            .get(CONFIG)
            .map_err(|source| hub_error(CONFIG, source))?;
        for file in [TOKENIZER, WEIGHTS, POOLING] {
            repo.get(file).map_err(|source| hub_error(file, source))?;
        }
        for file in [SENTENCE_BERT, SENTENCE_TRANSFORMERS] {
            match repo.get(file) {
                Ok(_) => {}
                Err(ApiError::RequestError(err)) if matches!(*err, ureq::Error::Status(404, _)) => {
                    tracing::debug!(model_id, file, "optional model file not in the repository");
                }
                Err(source) => return Err(hub_error(file, source)),
            }
        }

        // Every file of one revision lands in the same snapshot directory.
        let dir = config.parent().ok_or_else(|| LoadError::Missing {
            path: config.clone(),
        })?;
        let mut model = LocalModel::load(dir)?;
        model.set_model_id(model_id.to_string());
        Ok(model)
    }
}

/// The `tokenizer.json` of the Hugging Face Hub model repository `model_id`, from the Hugging
/// Face cache (`HF_HOME`), fetched into it first when it is not there and the hub can be
/// reached, with the repository's `config_sentence_transformers.json` (its prompts) when it has
/// one. With `HF_HUB_OFFLINE=1` the cache alone is read. Blocking.
///
/// # Errors
/// [`LoadError::Hub`] when the file is neither cached nor fetchable (offline, unknown
/// repository, no `tokenizer.json`), [`LoadError::Missing`] when offline and not cached.
pub fn tokenizer_path(model_id: &str) -> Result<std::path::PathBuf, LoadError> {
    let offline = std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| v == "1" || v == "true");
    if offline {
        let cache = hf_hub::Cache::from_env().model(model_id.to_string());
        return cache.get(TOKENIZER).ok_or_else(|| LoadError::Missing {
            path: format!("(Hugging Face cache) {model_id}/{TOKENIZER}").into(),
        });
    }
    let repo = hub_repo(model_id)?;
    let path = repo
        .get(TOKENIZER)
        .map_err(|source| hub_error(model_id, TOKENIZER, source))?;
    if let Err(err) = repo.get(SENTENCE_TRANSFORMERS) {
        tracing::debug!(model_id, %err, "no {SENTENCE_TRANSFORMERS} (no prompts)");
    }
    Ok(path)
}

/// The Hugging Face Hub repository of `model_id` (honouring `HF_HOME`, `HF_ENDPOINT` and the
/// cached token), files cached on first fetch.
///
/// # Errors
/// [`LoadError::Hub`] when the hub client cannot be set up.
fn hub_repo(model_id: &str) -> Result<hf_hub::api::sync::ApiRepo, LoadError> {
    let api = ApiBuilder::from_env()
        .with_progress(false)
        .build()
        .map_err(|source| hub_error(model_id, "(hub client setup)", source))?;
    Ok(api.model(model_id.to_string()))
}

/// [`LoadError::Hub`] for `file` of `model_id`.
fn hub_error(model_id: &str, file: &str, source: ApiError) -> LoadError {
    LoadError::Hub {
        model_id: model_id.to_string(),
        file: file.to_string(),
        source,
    }
}
