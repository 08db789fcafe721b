//! The files of a sentence-transformers model directory and what this crate reads from them.

use std::collections::BTreeMap;
use std::path::Path;

use candle_transformers::models::bert::{self, HiddenAct};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::LoadError;

/// The transformer's config (Hugging Face `config.json`). Required.
pub(crate) const CONFIG: &str = "config.json";
/// The tokenizer (Hugging Face tokenizers format). Required.
pub(crate) const TOKENIZER: &str = "tokenizer.json";
/// The weights. Required.
pub(crate) const WEIGHTS: &str = "model.safetensors";
/// The sentence-transformers pooling module's config. Required, unless [`SPLADE_POOLING`] is there.
pub(crate) const POOLING: &str = "1_Pooling/config.json";
/// The pooling config of a sentence-transformers SPLADE model (`SparseEncoder`: `MLMTransformer`
/// then `SpladePooling`). When present, the model is a SPLADE model and [`POOLING`] is not read.
pub(crate) const SPLADE_POOLING: &str = "1_SpladePooling/config.json";
/// sentence-transformers' transformer module config: `max_seq_length`. Optional.
pub(crate) const SENTENCE_BERT: &str = "sentence_bert_config.json";
/// sentence-transformers' model config: `prompts`. Optional.
pub(crate) const SENTENCE_TRANSFORMERS: &str = "config_sentence_transformers.json";

/// How token embeddings become one sentence embedding (`1_Pooling/config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pooling {
    /// The first token's (`[CLS]`) embedding.
    Cls,
    /// The mean over the non-padding tokens.
    Mean,
    /// SPLADE: the masked-language-model head's logits, log(1 + relu(x)), padding masked, max over
    /// the tokens: one value per vocabulary entry.
    Splade,
}

/// Everything the model directory's configs decide.
pub(crate) struct ModelConfig {
    pub bert: bert::Config,
    pub pooling: Pooling,
    /// Longest input in tokens, special tokens included.
    pub max_input_length: usize,
    /// Prompt name → text prepended to the input.
    pub prompts: BTreeMap<String, String>,
}

impl ModelConfig {
    /// Reads and checks the configs of the model directory `dir`.
    pub(crate) fn read(dir: &Path) -> Result<ModelConfig, LoadError> {
        let bert = read_bert_config(&dir.join(CONFIG))?;
        let pooling = match read_optional_json(&dir.join(SPLADE_POOLING))? {
            Some(splade) => {
                read_splade_pooling(&dir.join(SPLADE_POOLING), splade, bert.vocab_size)?
            }
            None => read_pooling(&dir.join(POOLING), bert.hidden_size)?,
        };

        #[derive(Deserialize)]
        struct SentenceBertConfig {
            max_seq_length: Option<usize>,
        }
        // As TEI: the sentence-transformers limit when there is one, never more than the positions
        // the model has embeddings for.
        let max_seq_length = read_optional_json::<SentenceBertConfig>(&dir.join(SENTENCE_BERT))?
            .and_then(|c| c.max_seq_length);
        let max_input_length = max_seq_length.map_or(bert.max_position_embeddings, |n| {
            n.min(bert.max_position_embeddings)
        });
        if max_input_length == 0 {
            return Err(LoadError::unsupported(
                &dir.join(if max_seq_length == Some(0) {
                    SENTENCE_BERT
                } else {
                    CONFIG
                }),
                "the input limit is 0 tokens",
            ));
        }

        let prompts = read_prompts(dir)?;

        Ok(ModelConfig {
            bert,
            pooling,
            max_input_length,
            prompts,
        })
    }
}

/// The prompts (name → text) of `config_sentence_transformers.json` in `dir`; none when the file
/// does not exist or has no `prompts`.
pub(crate) fn read_prompts(dir: &Path) -> Result<BTreeMap<String, String>, LoadError> {
    #[derive(Deserialize)]
    struct SentenceTransformersConfig {
        prompts: Option<BTreeMap<String, String>>,
    }
    Ok(
        read_optional_json::<SentenceTransformersConfig>(&dir.join(SENTENCE_TRANSFORMERS))?
            .and_then(|c| c.prompts)
            .unwrap_or_default(),
    )
}

/// `config.json`: a BERT config. Accepts the activation names of `transformers` (`gelu`,
/// `gelu_new`, …), which candle's own deserializer does not.
fn read_bert_config(path: &Path) -> Result<bert::Config, LoadError> {
    let mut raw: Map<String, Value> = read_json(path)?;

    match raw.get("model_type").and_then(Value::as_str) {
        None | Some("bert") => {}
        Some(other) => {
            return Err(LoadError::unsupported(
                path,
                format!("`model_type` is `{other}`; only `bert` is supported"),
            ));
        }
    }

    let act_name = raw
        .get("hidden_act")
        .and_then(Value::as_str)
        .unwrap_or("gelu");
    let hidden_act = match act_name {
        // TEI's CPU backend computes BERT's `gelu` with the tanh approximation; so does this
        // crate, so that its embeddings match TEI's (cosine ≥ 0.9999) rather than PyTorch's.
        "gelu" | "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => HiddenAct::GeluApproximate,
        "relu" => HiddenAct::Relu,
        other => {
            return Err(LoadError::unsupported(
                path,
                format!(
                    "`hidden_act` `{other}` is not supported; supported: gelu, gelu_new, \
                     gelu_pytorch_tanh, gelu_fast, relu"
                ),
            ));
        }
    };
    // candle's `HiddenAct` only parses its own spellings: deserialize with a placeholder, then set
    // the activation decided above.
    raw.insert("hidden_act".into(), Value::from("relu"));
    let mut config: bert::Config =
        serde_json::from_value(Value::Object(raw)).map_err(|source| LoadError::Json {
            path: path.to_path_buf(),
            source,
        })?;
    config.hidden_act = hidden_act;

    if config.num_attention_heads == 0
        || !config
            .hidden_size
            .is_multiple_of(config.num_attention_heads)
    {
        return Err(LoadError::unsupported(
            path,
            format!(
                "`hidden_size` {} is not a multiple of `num_attention_heads` {}",
                config.hidden_size, config.num_attention_heads
            ),
        ));
    }
    Ok(config)
}

/// `1_Pooling/config.json`: exactly one of CLS or mean pooling, as TEI supports for embeddings.
fn read_pooling(path: &Path, hidden_size: usize) -> Result<Pooling, LoadError> {
    let raw: Map<String, Value> = read_json(path)?;

    if let Some(dim) = raw.get("word_embedding_dimension").and_then(Value::as_u64)
        && dim != hidden_size as u64
    {
        return Err(LoadError::unsupported(
            path,
            format!(
                "`word_embedding_dimension` {dim} differs from the model's `hidden_size` \
                 {hidden_size}"
            ),
        ));
    }

    let enabled: Vec<&str> = raw
        .iter()
        .filter(|(key, value)| key.starts_with("pooling_mode_") && value.as_bool() == Some(true))
        .map(|(key, _)| key.as_str())
        .collect();
    match enabled.as_slice() {
        ["pooling_mode_cls_token"] => Ok(Pooling::Cls),
        ["pooling_mode_mean_tokens"] => Ok(Pooling::Mean),
        _ => Err(LoadError::unsupported(
            path,
            format!(
                "enabled pooling modes {enabled:?} are not supported; exactly one of \
                 `pooling_mode_cls_token` and `pooling_mode_mean_tokens` must be true"
            ),
        )),
    }
}

/// `1_SpladePooling/config.json` (`raw`, read from `path`): sentence-transformers' `SpladePooling`
/// as TEI's SPLADE pooling computes it: `pooling_strategy` `max`, `activation_function` `relu`
/// (the defaults when absent), and a `word_embedding_dimension`, if given, of `vocab_size`.
fn read_splade_pooling(
    path: &Path,
    raw: Map<String, Value>,
    vocab_size: usize,
) -> Result<Pooling, LoadError> {
    for (key, supported) in [("pooling_strategy", "max"), ("activation_function", "relu")] {
        if let Some(value) = raw.get(key)
            && value.as_str() != Some(supported)
        {
            return Err(LoadError::unsupported(
                path,
                format!("`{key}` {value} is not supported; only \"{supported}\" is"),
            ));
        }
    }
    if let Some(dim) = raw.get("word_embedding_dimension").and_then(Value::as_u64)
        && dim != vocab_size as u64
    {
        return Err(LoadError::unsupported(
            path,
            format!(
                "`word_embedding_dimension` {dim} differs from the model's `vocab_size` {vocab_size}"
            ),
        ));
    }
    Ok(Pooling::Splade)
}

/// Reads a file, mapping "not found" to [`LoadError::Missing`].
pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => LoadError::Missing {
            path: path.to_path_buf(),
        },
        _ => LoadError::Read {
            path: path.to_path_buf(),
            source,
        },
    })
}

fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T, LoadError> {
    let bytes = read_file(path)?;
    serde_json::from_slice(&bytes).map_err(|source| LoadError::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads an optional JSON file: `None` when it does not exist.
fn read_optional_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, LoadError> {
    match read_json(path) {
        Ok(value) => Ok(Some(value)),
        Err(LoadError::Missing { .. }) => Ok(None),
        Err(err) => Err(err),
    }
}
