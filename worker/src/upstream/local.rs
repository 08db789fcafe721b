//! The built-in CPU model as an upstream: runs [`embatch_local_model::LocalModel`] on tokio's
//! blocking pool, one batch at a time per call.

use std::sync::Arc;

use embatch_local_model::LocalModel;
use embatch_protocol::EmbedOptions;
use serde_json::value::RawValue;

use super::{Embedding, Upstream, UpstreamError};

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
}

impl Upstream for LocalUpstream {
    async fn embed(
        &self,
        inputs: &[String],
        options: &EmbedOptions,
    ) -> Result<Vec<Embedding>, UpstreamError> {
        let model = Arc::clone(&self.model);
        let options = options.clone();
        let inputs = inputs.to_vec();
        let vectors = tokio::task::spawn_blocking(move || model.embed(&inputs, &options))
            .await
            .map_err(|e| UpstreamError::Crashed(format!("model task failed: {e}")))?
            .map_err(UpstreamError::Model)?;
        vectors
            .iter()
            .map(|v| {
                serde_json::to_string(v)
                    .and_then(RawValue::from_string)
                    .map_err(|e| UpstreamError::Malformed(format!("cannot encode embedding: {e}")))
            })
            .collect()
    }

    fn max_batch_size(&self) -> usize {
        usize::MAX
    }
}
