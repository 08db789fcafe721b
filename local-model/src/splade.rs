//! SPLADE models: the masked-language-model head of a BERT model and SPLADE pooling, computed as
//! TEI 1.9.3's candle backend does (`BertSpladeHead`, `Pool::Splade`), and the sparse form of the
//! result that TEI's `/embed_sparse` answers.

use candle_core::{DType, Module, Tensor};
use candle_nn::{LayerNorm, Linear, VarBuilder};
use candle_transformers::models::bert::{Config, HiddenAct};
use embatch_protocol::sparse::SparseValue;

/// TEI 1.9.3's error for `/embed` with `normalize` (its default) on a SPLADE model (424
/// `Backend`): a SPLADE vector is a bag of token weights, not a direction.
pub const NOT_NORMALIZABLE: &str = "`normalize` is not available for SPLADE models";

/// BERT's masked-language-model head (`cls.predictions`): dense, activation, LayerNorm, then the
/// decoder to one logit per vocabulary entry.
pub(crate) struct SpladeHead {
    transform: Linear,
    act: HiddenAct,
    layer_norm: LayerNorm,
    decoder: Linear,
}

impl SpladeHead {
    /// Loads `cls.predictions.*` from the model's weights `vb`. As TEI, a checkpoint without
    /// `cls.predictions.decoder.weight` has its decoder tied to the word embeddings
    /// (`bert.embeddings.word_embeddings.weight`); the decoder's bias is `cls.predictions.bias`.
    ///
    /// # Errors
    /// candle's error naming a tensor that is missing or has the wrong shape.
    pub(crate) fn load(vb: &VarBuilder, config: &Config) -> candle_core::Result<SpladeHead> {
        let (hidden, vocab) = (config.hidden_size, config.vocab_size);
        let head = vb.pp("cls.predictions");
        let transform = candle_nn::linear(hidden, hidden, head.pp("transform.dense"))?;
        let layer_norm = candle_nn::layer_norm(
            hidden,
            config.layer_norm_eps,
            head.pp("transform.LayerNorm"),
        )?;
        let decoder = if head.contains_tensor("decoder.weight") {
            head.pp("decoder").get((vocab, hidden), "weight")?
        } else {
            vb.pp("bert.embeddings.word_embeddings")
                .get((vocab, hidden), "weight")?
        };
        let bias = head.get(vocab, "bias")?;
        Ok(SpladeHead {
            transform,
            act: config.hidden_act,
            layer_norm,
            decoder: Linear::new(decoder, Some(bias)),
        })
    }

    /// SPLADE pooling of the encoder's `hidden` states (`[n, len, hidden]`) under `mask`
    /// (`[n, len]`, 1 for a token, 0 for padding): log(1 + relu(logits)), padding zeroed, the
    /// maximum over the tokens. `[n, vocab]`, every value ≥ 0.
    pub(crate) fn pool(&self, hidden: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
        let x = self.transform.forward(hidden)?;
        let x = match self.act {
            HiddenAct::Gelu => x.gelu_erf()?,
            // candle's `gelu` is the tanh approximation, as TEI computes BERT's `gelu`.
            HiddenAct::GeluApproximate => x.gelu()?,
            HiddenAct::Relu => x.relu()?,
        };
        let logits = self.decoder.forward(&self.layer_norm.forward(&x)?)?; // [n, len, vocab]
        let weights = (logits.relu()? + 1.0)?.log()?;
        let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?; // [n, len, 1]
        weights.broadcast_mul(&mask)?.max(1)
    }
}

/// The non-zero values of a SPLADE vector, by increasing index, as TEI 1.9.3's `/embed_sparse`
/// answers them (`[{"index": 2054, "value": 1.73}, ...]`; zeros are left out).
pub fn sparsify(values: &[f32]) -> Vec<SparseValue> {
    values
        .iter()
        .enumerate()
        .filter(|&(_, &value)| value != 0.0)
        .filter_map(|(index, &value)| {
            u32::try_from(index)
                .ok()
                .map(|index| SparseValue { index, value })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparsify_keeps_the_non_zero_values_in_index_order() {
        let sparse = sparsify(&[0.0, 0.5, 0.0, 2.0]);
        let pairs: Vec<(u32, f32)> = sparse.iter().map(|v| (v.index, v.value)).collect();
        assert_eq!(pairs, [(1, 0.5), (3, 2.0)]);
        assert!(sparsify(&[0.0; 4]).is_empty());
    }
}
