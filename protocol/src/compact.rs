//! Compact outputs (contract v1.5): an `/embed` request's `output_dtype` asks the worker for
//! int8, uint8, binary or ubinary vectors instead of floats, as Voyage's `output_dtype` and
//! Cohere's `embedding_types` name them. The worker computes the floats as always (the cache and
//! the batching key see floats only), then quantizes each vector of its reply on its own.
//!
//! The quantization is sentence-transformers' `quantize_embeddings` (`quantization.py`), with
//! one fixed choice where it leaves one open:
//! - `ubinary`: one bit per value, `1` when the value is `> 0`, packed 8 per byte, most
//!   significant bit first (`numpy.packbits`); a vector whose length is not a multiple of 8 is
//!   padded with `0` bits. `ceil(d / 8)` values in `0..=255`.
//! - `binary`: the `ubinary` bytes minus 128, as int8: `ceil(d / 8)` values in `-128..=127`.
//! - `uint8`: `trunc((x - start) / step)` and `int8`: `trunc((x - start) / step - 128)`, in f64,
//!   with each vector's own symmetric range: `m = max |x|` over the vector, `start = -m`,
//!   `step = (m - start) / 255` (a zero vector: `m = 1`). That is sentence-transformers' scalar
//!   quantization of the one vector with `ranges = [[-m] * d, [m] * d]`; not the per-dimension
//!   min/max over the embeddings given that it computes without `ranges`, which would make one
//!   request's answer depend on the requests batched with it. `0` stays (nearly) `0` in int8
//!   (`trunc(-0.5)`), so the cosine of two int8 vectors estimates the floats' cosine.
//!
//! docs/design/compact-outputs.md records the choice and its measured error.
//!
//! The reply keeps TEI's shape for one type (`[[int, ...], ...]`); for a list of types it is an
//! object with one such array per type, in the order asked (`{"float": [[...]], "int8": [[...]]}`,
//! Cohere's `embeddings` object).

use std::fmt;

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

use crate::EmbedError;

/// One output type: `"float"`, `"int8"`, `"uint8"`, `"binary"` or `"ubinary"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// f32 values, as TEI answers (the default).
    #[default]
    Float,
    /// One signed byte per dimension, `-128..=127`: see the module docs.
    Int8,
    /// One unsigned byte per dimension, `0..=255`: see the module docs.
    Uint8,
    /// One bit per dimension, packed 8 per byte, as int8 (`ubinary` minus 128).
    Binary,
    /// One bit per dimension, packed 8 per byte, as uint8.
    Ubinary,
}

/// The allowed values of [`Dtype`], for error messages.
pub const DTYPES: &str = "`float`, `int8`, `uint8`, `binary`, `ubinary`";

impl Dtype {
    /// The name on the wire (`"int8"`).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Float => "float",
            Dtype::Int8 => "int8",
            Dtype::Uint8 => "uint8",
            Dtype::Binary => "binary",
            Dtype::Ubinary => "ubinary",
        }
    }

    /// `vector` in this type; `None` for [`Dtype::Float`] (the floats as they are).
    pub fn quantize(self, vector: &[f32]) -> Option<Quantized> {
        match self {
            Dtype::Float => None,
            Dtype::Int8 => Some(Quantized::Signed(int8(vector))),
            Dtype::Uint8 => Some(Quantized::Unsigned(uint8(vector))),
            Dtype::Binary => Some(Quantized::Signed(binary(vector))),
            Dtype::Ubinary => Some(Quantized::Unsigned(ubinary(vector))),
        }
    }
}

/// A quantized vector: JSON numbers, or the bytes base64 carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Quantized {
    /// `int8` and `binary`.
    Signed(Vec<i8>),
    /// `uint8` and `ubinary`.
    Unsigned(Vec<u8>),
}

impl Quantized {
    /// The values as bytes, one per value (an int8 as its two's-complement byte), as numpy's
    /// `int8` and `uint8` arrays hold them.
    pub fn to_bytes(&self) -> Vec<u8> {
        match self {
            Quantized::Signed(values) => values.iter().map(|v| v.to_ne_bytes()[0]).collect(),
            Quantized::Unsigned(values) => values.clone(),
        }
    }
}

/// The scalar range of `vector`: `(start, step)` of `[-m, m]`, `m = max |x|` (1 for a zero
/// vector), in 255 steps, computed as sentence-transformers computes `starts` and `steps`.
fn range_of(vector: &[f32]) -> (f64, f64) {
    let m = vector.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let m = if m > 0.0 { f64::from(m) } else { 1.0 };
    let start = -m;
    (start, (m - start) / 255.0)
}

/// `uint8`: `trunc((x - start) / step)`, in `0..=255`, over the vector's own range.
pub fn uint8(vector: &[f32]) -> Vec<u8> {
    let (start, step) = range_of(vector);
    // `as` truncates toward zero (as numpy's `astype`), and saturates.
    vector
        .iter()
        .map(|&x| ((f64::from(x) - start) / step) as u8)
        .collect()
}

/// `int8`: `trunc((x - start) / step - 128)`, in `-128..=127`, over the vector's own range.
pub fn int8(vector: &[f32]) -> Vec<i8> {
    let (start, step) = range_of(vector);
    vector
        .iter()
        .map(|&x| ((f64::from(x) - start) / step - 128.0) as i8)
        .collect()
}

/// `ubinary`: the bits `x > 0`, 8 per byte, most significant first, the last byte padded
/// with `0` bits.
pub fn ubinary(vector: &[f32]) -> Vec<u8> {
    vector
        .chunks(8)
        .map(|chunk| {
            chunk
                .iter()
                .enumerate()
                .fold(0u8, |byte, (i, &x)| byte | (u8::from(x > 0.0) << (7 - i)))
        })
        .collect()
}

/// `binary`: [`ubinary`]'s bytes minus 128, as int8.
pub fn binary(vector: &[f32]) -> Vec<i8> {
    ubinary(vector)
        .into_iter()
        .map(|byte| (i16::from(byte) - 128) as i8)
        .collect()
}

/// An `/embed` request's `output_dtype`: one type (Voyage's `output_dtype`; the reply keeps
/// TEI's shape) or a list of types (Cohere's `embedding_types`; the reply is an object keyed by
/// type).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum OutputDtype {
    /// `"int8"`: the reply is `[[int, ...], ...]`.
    One(Dtype),
    /// `["float", "int8"]`: the reply is `{"float": [[...]], "int8": [[...]]}`, repeats
    /// answered once.
    Many(Vec<Dtype>),
}

/// A request's `output_dtype` that cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompactError {
    /// `[]`.
    #[error("`output_dtype` lists no type: give one or more of {DTYPES}")]
    NoType,
    /// The assembled reply is not `[[f32, ...], ...]`.
    #[error("cannot quantize the embeddings: {0}")]
    Malformed(String),
}

/// Each [`CompactError`] as the contract answers it: a request's error is 422 `Validation`, a
/// malformed reply 424 `Backend`.
impl From<CompactError> for EmbedError {
    fn from(err: CompactError) -> EmbedError {
        match err {
            CompactError::Malformed(_) => EmbedError::Backend(err.to_string()),
            CompactError::NoType => EmbedError::Validation(err.to_string()),
        }
    }
}

impl OutputDtype {
    /// The types asked, in order, each once.
    pub fn dtypes(&self) -> Vec<Dtype> {
        match self {
            OutputDtype::One(dtype) => vec![*dtype],
            OutputDtype::Many(dtypes) => dtypes.iter().fold(Vec::new(), |mut seen, d| {
                if !seen.contains(d) {
                    seen.push(*d);
                }
                seen
            }),
        }
    }

    /// `true` when the reply is TEI's floats, unchanged (`"float"`).
    pub fn is_plain(&self) -> bool {
        *self == OutputDtype::One(Dtype::Float)
    }

    /// Checks the ask.
    ///
    /// # Errors
    /// [`CompactError::NoType`] for `[]`.
    pub fn validate(&self) -> Result<(), CompactError> {
        if self.dtypes().is_empty() {
            return Err(CompactError::NoType);
        }
        Ok(())
    }

    /// The reply in this shape from TEI's `[[f32, ...], ...]` `payload`: see the module docs.
    ///
    /// # Errors
    /// [`CompactError::Malformed`] when `payload` is not an array of float arrays.
    pub fn reshape(&self, payload: &[u8]) -> Result<Vec<u8>, CompactError> {
        let malformed = |e: serde_json::Error| CompactError::Malformed(e.to_string());
        let raw: Vec<&RawValue> = serde_json::from_slice(payload).map_err(malformed)?;
        let dtypes = self.dtypes();
        let floats: Vec<Vec<f32>> = if dtypes.iter().any(|d| *d != Dtype::Float) {
            raw.iter()
                .map(|v| serde_json::from_str(v.get()))
                .collect::<Result<_, _>>()
                .map_err(malformed)?
        } else {
            Vec::new()
        };
        let mut out = Vec::with_capacity(payload.len() / 2);
        let write = |out: &mut Vec<u8>, dtype: Dtype| match dtype {
            Dtype::Float => serde_json::to_writer(out, &raw),
            quantized => {
                let vectors: Vec<Option<Quantized>> =
                    floats.iter().map(|v| quantized.quantize(v)).collect();
                serde_json::to_writer(out, &vectors)
            }
        };
        match self {
            OutputDtype::One(dtype) => write(&mut out, *dtype).map_err(malformed)?,
            OutputDtype::Many(_) => {
                out.push(b'{');
                for (i, dtype) in dtypes.into_iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(format!("\"{}\":", dtype.name()).as_bytes());
                    write(&mut out, dtype).map_err(malformed)?;
                }
                out.push(b'}');
            }
        }
        Ok(out)
    }
}

impl<'de> Deserialize<'de> for OutputDtype {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct OutputVisitor;

        impl<'de> Visitor<'de> for OutputVisitor {
            type Value = OutputDtype;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "one of {DTYPES}, or an array of them")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<OutputDtype, E> {
                Dtype::deserialize(de::value::StrDeserializer::new(v)).map(OutputDtype::One)
            }

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<OutputDtype, A::Error> {
                Vec::<Dtype>::deserialize(de::value::SeqAccessDeserializer::new(seq))
                    .map(OutputDtype::Many)
            }
        }

        deserializer.deserialize_any(OutputVisitor)
    }
}

#[cfg(feature = "openapi")]
pub use schema::embed_reply_schema;

#[cfg(feature = "openapi")]
mod schema {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};
    use utoipa::openapi::{Ref, RefOr};

    use super::{Dtype, OutputDtype};

    /// The schema of an `/embed` reply: `[[number, ...], ...]` (f32s, or the integers of one
    /// `output_dtype`), or for a list of types `{"<type>": [[number, ...], ...], ...}`.
    pub fn embed_reply_schema() -> RefOr<Schema> {
        let vectors = || {
            ArrayBuilder::new()
                .items(ArrayBuilder::new().items(ObjectBuilder::new().schema_type(Type::Number)))
        };
        let by_type = ObjectBuilder::new()
            .schema_type(Type::Object)
            .additional_properties(Some(vectors()))
            .description(Some(
                "`output_dtype` a list: one array of vectors per type asked, keyed by type.",
            ));
        OneOfBuilder::new()
            .item(vectors().description(Some(
                "One vector per input: f32s, or the integers of the `output_dtype` asked.",
            )))
            .item(by_type)
            .into()
    }

    /// A [`Dtype`], or an array of them.
    impl utoipa::PartialSchema for OutputDtype {
        fn schema() -> RefOr<Schema> {
            let one = Ref::from_schema_name(<Dtype as utoipa::ToSchema>::name());
            OneOfBuilder::new()
                .item(one.clone())
                .item(ArrayBuilder::new().items(one).min_items(Some(1)))
                .description(Some(
                    "One output type (Voyage's `output_dtype`: the reply keeps TEI's shape, \
                     `[[int, ...], ...]`) or a list of them (Cohere's `embedding_types`: the \
                     reply is `{\"<type>\": [[...], ...], ...}`). See docs/http-api.md, \
                     \"Compact outputs\".",
                ))
                .into()
        }
    }

    impl utoipa::ToSchema for OutputDtype {
        fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
            schemas.push((
                <Dtype as utoipa::ToSchema>::name().into_owned(),
                <Dtype as utoipa::PartialSchema>::schema(),
            ));
        }
    }
}

#[cfg(test)]
#[path = "compact_tests.rs"]
mod tests;
