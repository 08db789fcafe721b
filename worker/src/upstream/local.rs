//! The built-in CPU model as an upstream: runs [`embatch_local_model::LocalModel`] on tokio's
//! blocking pool, one batch at a time per call.

use std::sync::Arc;

use embatch_local_model::LocalModel;
use embatch_protocol::{EmbedError, EmbedOptions, Input};

use super::{Backend, Embedding, Upstream, UpstreamError};

/// The built-in model behind the [`Upstream`] interface.
pub struct LocalUpstream {
    model: Arc<LocalModel>,
}

impl LocalUpstream {
    /// Wraps a loaded model.
    pub fn new(model: LocalModel) -> LocalUpstream {
        LocalUpstream {
            model: Arc::new(model),
        }
    }

    /// The model's tokenizer, for TEI's token routes.
    pub(super) fn encoder(&self) -> Arc<embatch_local_model::Encoder> {
        self.model.encoder()
    }
}

/// Why the built-in model cannot compute `task`, as TEI 1.9.3 answers (424 `Backend`) for a
/// model like it: it has no classifier head, and a SPLADE head only when `splade` (a SPLADE
/// model's `/embed` refusals are the model's own). It does not expose its last hidden state, so
/// `/embed_all` is refused too, naming the route.
fn unsupported(task: embatch_protocol::Task, splade: bool) -> Option<&'static str> {
    use embatch_protocol::Task;
    match task {
        Task::Embed | Task::Rerank { .. } => None,
        Task::Sparse if splade => None,
        Task::Sparse => Some(embatch_protocol::sparse::NOT_SPLADE),
        Task::Predict { .. } => Some(embatch_protocol::predict::NOT_A_CLASSIFIER),
        Task::EmbedAll => Some(
            "the built-in model does not serve /embed_all (token embeddings): run the model \
             behind TEI (--tei-url) for them",
        ),
    }
}

/// A blocking call of the model: [`LocalModel::embed`] or [`LocalModel::embed_sparse`].
type ModelCall<T> = fn(&LocalModel, &[Input], &EmbedOptions) -> Result<Vec<T>, EmbedError>;

impl LocalUpstream {
    /// `call` on tokio's blocking pool.
    async fn run<T: Send + 'static>(
        &self,
        inputs: &[Input],
        options: &EmbedOptions,
        call: ModelCall<T>,
    ) -> Result<Vec<T>, UpstreamError> {
        let model = Arc::clone(&self.model);
        let options = options.clone();
        let inputs = inputs.to_vec();
        tokio::task::spawn_blocking(move || call(&model, &inputs, &options))
            .await
            .map_err(|e| UpstreamError::Crashed(format!("model task failed: {e}")))?
            .map_err(UpstreamError::Model)
    }
}

/// One input's result as the JSON text of TEI's reply.
fn to_json<T: serde::Serialize + ?Sized>(value: &T) -> Result<Embedding, UpstreamError> {
    serde_json::to_vec(value)
        .map(Embedding::from_json)
        .map_err(|e| UpstreamError::Malformed(format!("cannot encode embedding: {e}")))
}

impl Backend for LocalUpstream {
    async fn embed(
        &self,
        inputs: &[Input],
        options: &EmbedOptions,
    ) -> Result<Vec<Embedding>, UpstreamError> {
        if let Some(refusal) = unsupported(options.task, self.model.is_splade()) {
            return Err(UpstreamError::Model(EmbedError::Backend(refusal.into())));
        }
        if options.task == embatch_protocol::Task::Sparse {
            // TEI's reply per input: its non-zero values, `[{"index", "value"}, ...]`.
            let lists = self.run(inputs, options, LocalModel::embed_sparse).await?;
            return lists.iter().map(to_json).collect();
        }
        let vectors = self.run(inputs, options, LocalModel::embed).await?;
        vectors.iter().map(to_json).collect()
    }

    fn max_batch_size(&self) -> usize {
        usize::MAX
    }
}

impl Upstream for LocalUpstream {
    /// A document in the shape of TEI's `GET /info`, from what the loaded model knows: its
    /// `model_id`, `max_input_length` (tokens), `model_dtype` `float32` (the CPU model runs in
    /// f32) and `auto_truncate` `true` (inputs over the limit are truncated unless the request
    /// says `truncate: false`, as TEI 1.9.3 does by default). Fields TEI derives from its own router (`max_concurrent_requests`,
    /// `max_batch_tokens`, `max_batch_requests`, `tokenization_workers`, `sha`, `model_sha`,
    /// `docker_label`) are `null`, and so is a dense model's pooling; a SPLADE model's is
    /// `"splade"`, as TEI's (which turns on `/embed_sparse` at the intake and in discovery);
    /// `max_client_batch_size` is left for the worker to set (see `crate::info`), and `version`
    /// is the worker's.
    /// The model's own tokenizer; an absent `truncate` truncates (`auto_truncate`), and an
    /// unknown `prompt_name` is refused before batching, as the model would.
    async fn counter(&self, _lookup: &crate::tokens::TokenizerLookup) -> crate::tokens::Counter {
        crate::tokens::Counter::tokenizer(
            self.model.encoder(),
            format!("of the built-in model {}", self.model.model_id()),
            true,
            true,
        )
    }

    async fn info(&self) -> Result<serde_json::Value, UpstreamError> {
        Ok(serde_json::json!({
            "model_id": self.model.model_id(),
            "model_sha": null,
            "model_dtype": "float32",
            "model_type": {"embedding": {"pooling": self.model.is_splade().then_some("splade")}},
            "max_concurrent_requests": null,
            "max_input_length": self.model.max_input_length(),
            "max_batch_tokens": null,
            "max_batch_requests": null,
            "max_client_batch_size": null,
            "auto_truncate": true,
            "tokenization_workers": null,
            "version": env!("CARGO_PKG_VERSION"),
            "sha": null,
            "docker_label": null,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use embatch_protocol::Task;

    #[test]
    fn only_a_splade_model_serves_sparse_embeddings() {
        assert_eq!(unsupported(Task::Sparse, true), None);
        assert_eq!(
            unsupported(Task::Sparse, false),
            Some(embatch_protocol::sparse::NOT_SPLADE)
        );
        for splade in [false, true] {
            assert_eq!(unsupported(Task::Embed, splade), None);
            assert!(unsupported(Task::EmbedAll, splade).is_some());
        }
    }
}
