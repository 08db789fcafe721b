//! The built-in CPU embedding model of embatch: a sentence-transformers BERT model (e.g.
//! all-MiniLM-L6-v2) run with candle in f32, answering like text-embeddings-inference (TEI).
//!
//! ```no_run
//! # use std::path::Path;
//! # use embatch_local_model::LocalModel;
//! # use embatch_protocol::{EmbedOptions, Input};
//! let model = LocalModel::load(Path::new("models/all-MiniLM-L6-v2"))?;
//! // A text, and the same text as token ids ([CLS] what is vector search ? [SEP]).
//! let inputs = vec![Input::from("What is vector search?"), Input::Ids(vec![101, 2054, 2003, 9207, 3945, 1029, 102])];
//! let embeddings = model.embed(&inputs, &EmbedOptions::default())?; // blocking
//! assert_eq!(embeddings[0].len(), model.dim());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `scripts/fetch-model.sh` puts all-MiniLM-L6-v2 (mean pooling) into `models/all-MiniLM-L6-v2`,
//! and `scripts/fetch-model.sh --model bge-small-en-v1.5` BAAI/bge-small-en-v1.5 (CLS pooling)
//! into `models/bge-small-en-v1.5`, and `--model splade-tiny` a SPLADE model (sparse embeddings,
//! [`LocalModel::embed_sparse`]) into `models/splade-tiny`; `docs/models.md` has their sources and
//! licences.
//!
//! # Layout
//! - [`model`]: [`LocalModel`], loading, the embed call, batching into forward passes, pooling.
//! - [`splade`]: SPLADE models' head and pooling, and [`splade::sparsify`], TEI's sparse form.
//! - [`tokenize`]: [`Encoder`], text → token ids with TEI's prompts, limits and truncation.
//! - `token_routes`: TEI's `/tokenize` and `/decode` on the model's tokenizer
//!   ([`Encoder::simple_tokens`], [`Encoder::decode`]).
//! - `config`: the files of a model directory and what is read from them.
//! - `weights`: `model.safetensors` into candle, with TEI's tolerance of `gamma`/`beta` names.
//! - [`error`]: [`LoadError`], why a model directory could not be loaded.
//! - `hub` (feature `hub`): `LocalModel::from_hub`, fetching a model directory from the
//!   Hugging Face Hub, and `tokenizer_path`, a model's `tokenizer.json` from the Hugging Face
//!   cache or hub (for the worker's token counts in front of TEI).

mod config;
pub mod error;
#[cfg(feature = "hub")]
mod hub;
#[cfg(feature = "hub")]
pub use hub::tokenizer_path;
pub mod model;
pub mod splade;
mod token_routes;
pub mod tokenize;
mod weights;

pub use error::LoadError;
pub use model::LocalModel;
pub use tokenize::Encoder;
