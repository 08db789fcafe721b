//! Reading a model's `model.safetensors` into candle.

use candle_core::{DType, Device};
use candle_nn::VarBuilder;

/// The weights in `bytes` (a safetensors file), as f32 on `device`. LayerNorm parameters stored
/// under their TensorFlow-era names, `*.gamma` and `*.beta` (as some BERT checkpoints still have
/// them), are found under `*.weight` and `*.bias`, as TEI 1.9.3's loader finds them.
///
/// # Errors
/// candle's error when `bytes` is not a safetensors file.
pub(crate) fn var_builder(
    bytes: &[u8],
    device: &Device,
) -> candle_core::Result<VarBuilder<'static>> {
    let mut tensors = candle_core::safetensors::load_buffer(bytes, device)?;
    let renames: Vec<(String, String)> = tensors
        .keys()
        .filter_map(|name| {
            let new = match name.strip_suffix(".gamma") {
                Some(layer) => format!("{layer}.weight"),
                None => format!("{}.bias", name.strip_suffix(".beta")?),
            };
            (!tensors.contains_key(&new)).then(|| (name.clone(), new))
        })
        .collect();
    for (old, new) in renames {
        if let Some(tensor) = tensors.remove(&old) {
            tensors.insert(new, tensor);
        }
    }
    Ok(VarBuilder::from_tensors(tensors, DType::F32, device))
}
