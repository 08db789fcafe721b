//! [`LocalModel`]: a loaded model and the embed call.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use candle_transformers::models::bert::BertModel;
use embatch_protocol::sparse::{NOT_SPLADE, SparseValue};
use embatch_protocol::{EmbedError, EmbedOptions, Input, TruncationDirection};

use crate::LoadError;
use crate::config::{self, ModelConfig, Pooling};
use crate::splade::{self, NOT_NORMALIZABLE, SpladeHead};
use crate::tokenize::{Encoder, Tokens};

/// Most padded tokens (inputs × longest input) one forward pass may hold. A larger batch is run
/// as several passes over inputs of similar length; this bounds the attention scores' memory
/// (about 100 MB for 256-token inputs) and wastes less compute on padding.
const MAX_BATCH_TOKENS: usize = 8192;
/// [`MAX_BATCH_TOKENS`] for a SPLADE model, whose head holds a logit per token and vocabulary
/// entry: 1024 tokens × 30522 entries is 125 MB of f32.
const MAX_SPLADE_BATCH_TOKENS: usize = 1024;

/// A sentence-transformers BERT-family embedding model on the CPU, in f32: a BERT encoder, its
/// tokenizer and its pooling, loaded once and shared by all calls (`Send + Sync`; wrap it in an
/// `Arc`).
///
/// Mirrors text-embeddings-inference (TEI): the same tokenization, limits, truncation, prompts,
/// pooling, Matryoshka `dimensions` and normalization, so its embeddings are interchangeable with
/// TEI's for the same model (cosine similarity ≥ 0.9999 on the reference set).
pub struct LocalModel {
    model_id: String,
    bert: BertModel,
    encoder: Arc<Encoder>,
    pooling: Pooling,
    /// The masked-language-model head of a SPLADE model ([`Pooling::Splade`]).
    splade: Option<SpladeHead>,
    dim: usize,
    pad_id: u32,
    device: Device,
}

// The worker shares one model between its tasks.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<LocalModel>();
};

impl LocalModel {
    /// Loads a sentence-transformers BERT-family model directory:
    ///
    /// - `config.json`: the BERT config (`model_type` `bert`; `hidden_act` `gelu`, computed with
    ///   the tanh approximation as TEI does, or `relu`);
    /// - `tokenizer.json`: the tokenizer (its own padding and truncation settings are ignored);
    /// - `model.safetensors`: the weights, loaded as f32;
    /// - `1_Pooling/config.json`: CLS or mean pooling; or, for a SPLADE model,
    ///   `1_SpladePooling/config.json` (`max` of `relu`), and then the weights' masked-language-model
    ///   head (`cls.predictions.*`) is loaded too;
    /// - optional `sentence_bert_config.json`: `max_seq_length`, the input limit in tokens
    ///   (capped at `max_position_embeddings`, which is the limit without it);
    /// - optional `config_sentence_transformers.json`: `prompts` for `prompt_name`.
    ///
    /// [`LocalModel::model_id`] is the directory's name. Takes about a second for MiniLM; the
    /// weights are read into memory (~90 MB for MiniLM).
    ///
    /// # Errors
    /// A [`LoadError`] naming the file that is missing, unreadable, invalid or unsupported.
    pub fn load(dir: &Path) -> Result<LocalModel, LoadError> {
        let started = Instant::now();
        let ModelConfig {
            bert: config,
            pooling,
            max_input_length,
            prompts,
        } = ModelConfig::read(dir)?;
        let encoder = Arc::new(Encoder::load(
            &dir.join(config::TOKENIZER),
            max_input_length,
            prompts,
        )?);

        let weights = dir.join(config::WEIGHTS);
        let device = Device::Cpu;
        let weights_error = |source| LoadError::Weights {
            path: weights.clone(),
            source,
        };
        let vb = crate::weights::var_builder(&config::read_file(&weights)?, &device)
            .map_err(weights_error)?;
        let bert = BertModel::load(vb.clone(), &config).map_err(weights_error)?;
        let splade = (pooling == Pooling::Splade)
            .then(|| SpladeHead::load(&vb, &config))
            .transpose()
            .map_err(weights_error)?;

        let pad_id = u32::try_from(config.pad_token_id)
            .ok()
            .filter(|&id| (id as usize) < config.vocab_size)
            .ok_or_else(|| {
                LoadError::unsupported(
                    &dir.join(config::CONFIG),
                    format!(
                        "`pad_token_id` {} is not below `vocab_size` {}",
                        config.pad_token_id, config.vocab_size
                    ),
                )
            })?;

        let model_id = dir
            .canonicalize()
            .ok()
            .as_deref()
            .unwrap_or(dir)
            .file_name()
            .map_or_else(
                || dir.display().to_string(),
                |name| name.to_string_lossy().into_owned(),
            );
        let model = LocalModel {
            model_id,
            bert,
            encoder,
            pooling,
            splade,
            // A SPLADE vector has a value per vocabulary entry.
            dim: if pooling == Pooling::Splade {
                config.vocab_size
            } else {
                config.hidden_size
            },
            pad_id,
            device,
        };
        tracing::info!(
            model_id = %model.model_id,
            dir = %dir.display(),
            dim = model.dim,
            max_input_length = model.max_input_length(),
            pooling = ?model.pooling,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "loaded local model"
        );
        Ok(model)
    }

    /// Sets the id [`LocalModel::model_id`] reports.
    #[cfg(feature = "hub")]
    pub(crate) fn set_model_id(&mut self, model_id: String) {
        self.model_id = model_id;
    }

    /// The longest input the model accepts, in tokens, special tokens included (256 for
    /// all-MiniLM-L6-v2: `max_seq_length` of `sentence_bert_config.json`, as in TEI). Longer
    /// inputs are truncated unless the request says `truncate: false` (then 422, as TEI 1.9.3).
    pub fn max_input_length(&self) -> usize {
        self.encoder.max_input_length()
    }

    /// The model's tokenizer, with its limit and prompts: what the worker counts tokens with
    /// before batching (the same tokenization [`LocalModel::embed`] runs).
    pub fn encoder(&self) -> Arc<Encoder> {
        Arc::clone(&self.encoder)
    }

    /// The size of the embeddings, in values (384 for all-MiniLM-L6-v2; the vocabulary's size,
    /// 30522, for a SPLADE model); the most a request's `dimensions` may ask for.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Whether this is a SPLADE model (`1_SpladePooling/config.json`): it answers
    /// [`LocalModel::embed_sparse`], and [`LocalModel::embed`] only with `normalize` off.
    pub fn is_splade(&self) -> bool {
        self.splade.is_some()
    }

    /// The model's name: the directory's name for [`LocalModel::load`], the hub id for
    /// `from_hub`.
    pub fn model_id(&self) -> &str {
        &self.model_id
    }

    /// Embeds `inputs`: one vector of [`LocalModel::dim`] values (or `options.dimensions`) per
    /// input, in input order. An input is a text or the token ids of one (used as given, as TEI
    /// does: no special tokens are added to them). An empty `inputs` gives an empty result; an
    /// empty string is a valid input (only the special tokens).
    ///
    /// Blocking and CPU-bound (tens of milliseconds for a few short inputs in a release build):
    /// call it from `spawn_blocking` or a dedicated thread. Inputs are padded to the longest in a
    /// forward pass and padding is masked out, so an input's embedding does not depend on the
    /// batch it is in.
    ///
    /// `options`, as in TEI's `POST /embed`:
    /// - `prompt_name`: the named prompt from `config_sentence_transformers.json` is prepended;
    /// - `truncate`: `true` or absent (TEI 1.9.3's default, `--auto-truncate true`) cuts inputs
    ///   over [`LocalModel::max_input_length`] tokens to that length, at the end given by
    ///   `truncation_direction` (default `Right`: keep the start); `false` refuses them;
    /// - `dimensions`: keep only the first `dimensions` values (Matryoshka), before normalizing;
    /// - `normalize`: scale each vector to unit L2 norm.
    ///
    /// # Errors
    /// - [`EmbedError::Validation`] (422, as TEI 1.9.3) when an input is over the token limit
    ///   and `truncate` is `false`: "`inputs` must have less than 256 tokens. Given: 1042".
    /// - [`EmbedError::Validation`] (422) for `dimensions` of 0 or over [`LocalModel::dim`], an
    ///   unknown `prompt_name`, or a token id outside the vocabulary (`inputs[i]`); the message
    ///   names the field and the limit or the choices.
    /// - [`EmbedError::Tokenizer`] (422) when the tokenizer fails on an input.
    /// - [`EmbedError::Backend`] (424) when the forward pass fails, and, as TEI 1.9.3, for
    ///   `normalize` on a SPLADE model ("`normalize` is not available for SPLADE models").
    ///
    /// The first failing input, in input order, fails the whole call.
    pub fn embed(
        &self,
        inputs: &[Input],
        options: &EmbedOptions,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        if self.is_splade() && options.normalize {
            return Err(EmbedError::Backend(NOT_NORMALIZABLE.into()));
        }
        self.pooled(inputs, options)
    }

    /// The sparse embeddings of a SPLADE model: for each input, in input order, its non-zero
    /// values by increasing vocabulary index, as TEI 1.9.3's `POST /embed_sparse` answers
    /// (`[{"index": 2054, "value": 1.73}, ...]`). The SPLADE vector is the maximum over the
    /// input's tokens of log(1 + relu(logits of the masked-language-model head)). `options`:
    /// `prompt_name`, `truncate` and `truncation_direction`, as for [`LocalModel::embed`];
    /// `normalize` and `dimensions` are not fields of TEI's route and are ignored.
    ///
    /// Blocking and CPU-bound, as [`LocalModel::embed`].
    ///
    /// # Errors
    /// As [`LocalModel::embed`], and [`EmbedError::Backend`] (424) with TEI's "Model is not an
    /// embedding model with SPLADE pooling" on a model that is not a SPLADE model.
    pub fn embed_sparse(
        &self,
        inputs: &[Input],
        options: &EmbedOptions,
    ) -> Result<Vec<Vec<SparseValue>>, EmbedError> {
        if !self.is_splade() {
            return Err(EmbedError::Backend(NOT_SPLADE.into()));
        }
        let options = EmbedOptions {
            normalize: false,
            dimensions: None,
            ..options.clone()
        };
        let vectors = self.pooled(inputs, &options)?;
        Ok(vectors.iter().map(|v| splade::sparsify(v)).collect())
    }

    /// [`LocalModel::embed`] without its SPLADE check: tokenize, run the forward passes, pool,
    /// cut to `dimensions`, normalize.
    fn pooled(
        &self,
        inputs: &[Input],
        options: &EmbedOptions,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        let started = Instant::now();
        let dimensions = self.check_dimensions(options.dimensions)?;
        let prompt = options
            .prompt_name
            .as_deref()
            .map(|name| self.encoder.prompt(name))
            .transpose()?;
        let truncate = truncation(options);

        let tokens = inputs
            .iter()
            .enumerate()
            .map(|(i, input)| match input {
                Input::Text(text) => self.encoder.encode(text, prompt, truncate),
                Input::Ids(ids) => self.encoder.encode_ids(i, ids, prompt, truncate),
                // An embedding model has no classifier head to score pairs with (as TEI 1.9.3
                // answers `/rerank` on an embedding model).
                Input::Pair(..) => Err(EmbedError::Backend(
                    embatch_protocol::rerank::NOT_A_RERANKER.into(),
                )),
            })
            .collect::<Result<Vec<Tokens>, EmbedError>>()?;

        // Shortest first, so that each forward pass holds inputs of similar length.
        let mut order: Vec<usize> = (0..tokens.len()).collect();
        order.sort_by_key(|&i| tokens[i].ids.len());

        let budget = if self.is_splade() {
            MAX_SPLADE_BATCH_TOKENS
        } else {
            MAX_BATCH_TOKENS
        };
        let mut embeddings = vec![Vec::new(); tokens.len()];
        let mut passes = 0;
        let mut start = 0;
        while start < order.len() {
            let end = pass_end(&order, start, budget, |i| tokens[i].ids.len());
            let pass = &order[start..end];
            let pooled = self
                .forward(pass.iter().map(|&i| &tokens[i]))
                .map_err(|err| {
                    // candle may append a backtrace on further lines: the reply keeps the cause.
                    let err = err.to_string();
                    let cause = err.lines().next().unwrap_or_default();
                    EmbedError::Backend(format!("local model inference failed: {cause}"))
                })?;
            for (&i, mut embedding) in pass.iter().zip(pooled) {
                embedding.truncate(dimensions);
                if options.normalize {
                    normalize(&mut embedding);
                }
                embeddings[i] = embedding;
            }
            passes += 1;
            start = end;
        }

        tracing::debug!(
            inputs = inputs.len(),
            tokens = tokens.iter().map(|t| t.ids.len()).sum::<usize>(),
            passes,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "embedded"
        );
        Ok(embeddings)
    }

    /// The number of values to keep.
    fn check_dimensions(&self, dimensions: Option<usize>) -> Result<usize, EmbedError> {
        match dimensions {
            None => Ok(self.dim),
            Some(0) => Err(EmbedError::Validation(
                "`dimensions` must be at least 1".into(),
            )),
            Some(d) if d > self.dim => Err(EmbedError::Validation(format!(
                "`dimensions` must be at most {}, the model's embedding size. Given: {d}",
                self.dim
            ))),
            Some(d) => Ok(d),
        }
    }

    /// One forward pass and pooling over `batch` (at least one input): a `[hidden_size]` vector
    /// per input, in order.
    fn forward<'a>(
        &self,
        batch: impl ExactSizeIterator<Item = &'a Tokens> + Clone,
    ) -> candle_core::Result<Vec<Vec<f32>>> {
        let n = batch.len();
        let len = batch.clone().map(|t| t.ids.len()).max().unwrap_or(0);

        let mut ids = Vec::with_capacity(n * len);
        let mut type_ids = Vec::with_capacity(n * len);
        let mut mask = Vec::with_capacity(n * len);
        for tokens in batch {
            let pad = len - tokens.ids.len();
            ids.extend_from_slice(&tokens.ids);
            ids.extend(std::iter::repeat_n(self.pad_id, pad));
            type_ids.extend_from_slice(&tokens.type_ids);
            type_ids.extend(std::iter::repeat_n(0, pad));
            mask.extend(std::iter::repeat_n(1u32, tokens.ids.len()));
            mask.extend(std::iter::repeat_n(0u32, pad));
        }
        let ids = Tensor::from_vec(ids, (n, len), &self.device)?;
        let type_ids = Tensor::from_vec(type_ids, (n, len), &self.device)?;
        let mask = Tensor::from_vec(mask, (n, len), &self.device)?;

        // [n, len, hidden]
        let hidden = self.bert.forward(&ids, &type_ids, Some(&mask))?;
        let pooled = match (self.pooling, &self.splade) {
            (Pooling::Splade, Some(head)) => head.pool(&hidden, &mask)?,
            (Pooling::Splade, None) => {
                // `load` loads the head of every SPLADE model.
                return Err(candle_core::Error::Msg(
                    "SPLADE model without its head".into(),
                ));
            }
            (Pooling::Cls, _) => hidden.narrow(1, 0, 1)?.squeeze(1)?,
            (Pooling::Mean, _) => {
                let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?; // [n, len, 1]
                let sum = hidden.broadcast_mul(&mask)?.sum(1)?; // [n, hidden]
                sum.broadcast_div(&mask.sum(1)?)?
            }
        };
        pooled.to_vec2::<f32>()
    }
}

/// The truncation `options` ask for: `Some(direction)` unless `truncate` is `false`. An absent
/// `truncate` truncates, as TEI 1.9.3 does by default (its `--auto-truncate` defaults to `true`).
pub fn truncation(options: &EmbedOptions) -> Option<TruncationDirection> {
    (options.truncate != Some(false)).then(|| options.truncation_direction.unwrap_or_default())
}

/// The end (exclusive) of the forward pass that starts at `order[start]`: as many inputs as fit
/// in `budget` padded tokens, and at least one. `order` is sorted by length.
fn pass_end(order: &[usize], start: usize, budget: usize, len: impl Fn(usize) -> usize) -> usize {
    let mut end = start + 1;
    while end < order.len() && (end + 1 - start) * len(order[end]) <= budget {
        end += 1;
    }
    end
}

/// Scales `v` to unit L2 norm (summing in f64, as TEI does); a zero vector stays zero.
fn normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        let scale = (1.0 / norm) as f32;
        v.iter_mut().for_each(|x| *x *= scale);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_fit_the_token_budget_and_cover_every_input() {
        let lens = [3usize, 3, 10, 200, 256, 256, 256, 256];
        let mut order: Vec<usize> = (0..lens.len()).collect();
        order.sort_by_key(|&i| lens[i]);
        let mut start = 0;
        let mut covered = 0;
        while start < order.len() {
            let end = pass_end(&order, start, MAX_BATCH_TOKENS, |i| lens[i]);
            assert!(end > start);
            let longest = order[start..end].iter().map(|&i| lens[i]).max().unwrap();
            assert!((end - start) * longest <= MAX_BATCH_TOKENS);
            covered += end - start;
            start = end;
        }
        assert_eq!(covered, lens.len());
    }

    #[test]
    fn one_input_over_the_budget_still_gets_a_pass() {
        let lens = [MAX_BATCH_TOKENS * 2];
        assert_eq!(pass_end(&[0], 0, MAX_BATCH_TOKENS, |i| lens[i]), 1);
    }

    #[test]
    fn normalize_gives_unit_norm_and_keeps_zero() {
        let mut v = vec![3.0, 4.0];
        normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8]);
        let mut zero = vec![0.0; 3];
        normalize(&mut zero);
        assert_eq!(zero, vec![0.0; 3]);
    }
}
