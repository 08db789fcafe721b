//! Cohere's embed API: `POST /v2/embed` (Embed API v2) and `POST /v1/embed`, the shapes the
//! `cohere` SDK's `ClientV2.embed` and `Client.embed` speak, with `embedding_types` served as
//! compact outputs ([`embatch_protocol::compact`]).
//!
//! A request becomes TEI's `/embed` body: `texts` as `inputs`, `normalize: true` (Cohere's
//! vectors are unit length), `truncate` (`END`, the default: cut the end; `START`: cut the
//! start; `NONE`: refuse an over-long text, 422), `output_dimension` as `dimensions`,
//! `input_type` as the contract's `prompt_hint` ([`InputType::prompt_name`]: the model's prompt
//! of that name if it defines one), and the types asked as the
//! contract's `output_dtype`: the worker quantizes, once, for every type in one reply. The reply
//! is re-shaped here:
//!
//! ```json
//! {"id": "…", "response_type": "embeddings_by_type", "texts": ["…"],
//!  "embeddings": {"float": [[…]], "int8": [[…]], "ubinary": [[…]]},
//!  "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": 42}}}
//! ```
//! v1 without `embedding_types` answers Cohere v1's `"response_type": "embeddings_floats"` with
//! `embeddings` the float vectors. `base64` is the float vector's little-endian f32 bytes in
//! base64, written here from the floats (an encoding, not a quantization). `max_tokens` and
//! `priority` are accepted and ignored (the model's own token limit cuts each text); `images`
//! and `inputs` are refused (422): the workers embed text.

use embatch_protocol::compact::{Dtype, OutputDtype};
use embatch_protocol::request::{Input, Inputs, parse_object};
use embatch_protocol::{EmbedError, EmbedRequest, TruncationDirection};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};

use crate::openai::encode_base64;

/// Cohere's `input_type`: what the texts are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum InputType {
    /// Documents stored for search: the model's `document` prompt.
    SearchDocument,
    /// Search queries: the model's `query` prompt.
    SearchQuery,
    /// Texts to classify: the model's `classification` prompt.
    Classification,
    /// Texts to cluster: the model's `clustering` prompt.
    Clustering,
    /// Images: refused (422), the workers embed text.
    Image,
}

impl InputType {
    /// The sentence-transformers prompt (`prompt_name`, from the model's
    /// `config_sentence_transformers.json`) this input type selects: `query`, `document`,
    /// `classification` or `clustering`, sent as the contract's `prompt_hint`: applied when the
    /// model defines it, and the texts embedded without a prompt when the worker knows the model
    /// does not (as Cohere's older models take no `input_type` into account); a worker that
    /// cannot tell passes it on as `prompt_name` and the upstream answers it.
    pub fn prompt_name(self) -> Option<&'static str> {
        match self {
            InputType::SearchDocument => Some("document"),
            InputType::SearchQuery => Some("query"),
            InputType::Classification => Some("classification"),
            InputType::Clustering => Some("clustering"),
            InputType::Image => None,
        }
    }
}

/// Cohere's `embedding_types`: a compact output type, or `base64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EmbeddingType {
    /// f32 values.
    Float,
    /// Signed bytes, `-128..=127`, one per dimension.
    Int8,
    /// Unsigned bytes, `0..=255`, one per dimension.
    Uint8,
    /// Sign bits packed 8 per byte, as int8.
    Binary,
    /// Sign bits packed 8 per byte, as uint8.
    Ubinary,
    /// The float vector's little-endian f32 bytes, base64-encoded.
    Base64,
}

impl EmbeddingType {
    /// The key in `embeddings`.
    fn name(self) -> &'static str {
        match self {
            EmbeddingType::Base64 => "base64",
            other => other.dtype().name(),
        }
    }

    /// The worker's vectors this type is written from.
    fn dtype(self) -> Dtype {
        match self {
            EmbeddingType::Float | EmbeddingType::Base64 => Dtype::Float,
            EmbeddingType::Int8 => Dtype::Int8,
            EmbeddingType::Uint8 => Dtype::Uint8,
            EmbeddingType::Binary => Dtype::Binary,
            EmbeddingType::Ubinary => Dtype::Ubinary,
        }
    }
}

/// Cohere's `truncate`: which end of an over-long text to cut, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum Truncate {
    /// Refuse an over-long text (422, as TEI answers `truncate: false`).
    None,
    /// Cut its start.
    Start,
    /// Cut its end (Cohere's default).
    #[default]
    End,
}

/// The body of `POST /v2/embed` and `POST /v1/embed`, as Cohere's embed API takes it.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct CohereEmbedRequest {
    /// The model, as `GET /v1/models` lists it; absent or empty: the default model (or the
    /// `Embatch-Model` header's). Any other: 404.
    #[serde(default)]
    pub model: Option<String>,
    /// The texts, at most `MAX_CLIENT_BATCH_SIZE`; one embedding each, in order.
    #[schema(example = json!(["What is vector search?", "Hello, world!"]))]
    #[serde(default)]
    pub texts: Option<Vec<String>>,
    /// What the texts are for: selects the model's prompt, where it has one
    /// ([`InputType::prompt_name`]); absent or `null`: no prompt.
    #[serde(default)]
    pub input_type: Option<InputType>,
    /// The types to answer, each once, in `embeddings` (default `["float"]`).
    #[serde(default)]
    pub embedding_types: Option<Vec<EmbeddingType>>,
    /// Which end of an over-long text to cut (default `END`).
    #[serde(default)]
    pub truncate: Option<Truncate>,
    /// Matryoshka output size: the first `output_dimension` values (TEI's `dimensions`).
    #[serde(default)]
    #[schema(minimum = 1)]
    pub output_dimension: Option<usize>,
    /// Cohere's tokens per text: accepted and ignored (the model's own limit cuts).
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Cohere's priority: accepted and ignored.
    #[serde(default)]
    pub priority: Option<i64>,
    /// Images: refused when not empty (422).
    #[serde(default)]
    pub images: Option<Vec<String>>,
    /// Cohere v2's mixed inputs: refused when not empty (422); send `texts`.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub inputs: Option<Vec<serde_json::Value>>,
}

/// The reply of `POST /v2/embed` and `POST /v1/embed`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CohereEmbedResponse<'a> {
    /// An id of this response.
    pub id: String,
    /// `embeddings_by_type`, or `embeddings_floats` (v1 without `embedding_types`).
    pub response_type: &'static str,
    /// By type: `{"float": [[f32, ...]], "int8": [[int, ...]], ...}`, one vector per text in
    /// each; `embeddings_floats`: the float vectors.
    #[schema(schema_with = embeddings_schema)]
    pub embeddings: Embeddings<'a>,
    /// The texts, echoed.
    pub texts: Vec<String>,
    /// `{"api_version": {"version"}, "billed_units"?: {"input_tokens"}}`, as Cohere's
    /// (`billed_units` only when the workers count tokens).
    #[schema(value_type = Object)]
    pub meta: serde_json::Value,
}

/// The schema of [`CohereEmbedResponse::embeddings`]: an object of arrays of vectors by type
/// (`base64`: of strings), or (`embeddings_floats`) an array of float vectors.
fn embeddings_schema() -> Schema {
    let number = || ObjectBuilder::new().schema_type(Type::Number);
    let vectors = || ArrayBuilder::new().items(ArrayBuilder::new().items(number()));
    let strings = ArrayBuilder::new().items(ObjectBuilder::new().schema_type(Type::String));
    let any_type: Schema = OneOfBuilder::new().item(vectors()).item(strings).into();
    let by_type = ObjectBuilder::new()
        .schema_type(Type::Object)
        .additional_properties(Some(any_type))
        .description(Some(
            "`embeddings_by_type`: one entry per type asked (`float`, `int8`, `uint8`, \
             `binary`, `ubinary`: arrays of numbers; `base64`: strings).",
        ));
    OneOfBuilder::new()
        .item(by_type)
        .item(vectors().description(Some("`embeddings_floats`: the float vectors.")))
        .into()
}

/// The response's `embeddings`.
#[derive(Debug)]
pub enum Embeddings<'a> {
    /// `embeddings_floats`: the worker's float vectors, as they are.
    Floats(&'a RawValue),
    /// `embeddings_by_type`: one entry per type asked, in order.
    ByType(Vec<(&'static str, ByType<'a>)>),
}

/// One type's vectors.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum ByType<'a> {
    /// The worker's arrays (floats or integers), as they are.
    Raw(&'a RawValue),
    /// `base64`: one string per vector.
    Base64(Vec<String>),
}

impl Serialize for Embeddings<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Embeddings::Floats(raw) => raw.serialize(serializer),
            Embeddings::ByType(types) => {
                serializer.collect_map(types.iter().map(|(name, value)| (*name, value)))
            }
        }
    }
}

/// A parsed Cohere embed request: TEI's `/embed` body and what shapes the reply.
#[derive(Debug)]
pub struct Translated {
    /// The model named (`None` or empty: the default).
    pub model: Option<String>,
    /// TEI's `/embed` body, with the contract's `output_dtype`.
    pub request: EmbedRequest,
    /// The reply's shape.
    pub shape: Shape,
}

/// What the response needs: the types asked (`None`: v1's floats), the texts, the version.
#[derive(Debug)]
pub struct Shape {
    types: Option<Vec<EmbeddingType>>,
    /// The worker was asked for floats only: its reply is `[[f32, ...], ...]`, not by type.
    plain: bool,
    texts: Vec<String>,
    version: &'static str,
}

/// The values `embedding_types` takes, for error messages.
const EMBEDDING_TYPES: &str = "`float`, `int8`, `uint8`, `binary`, `ubinary`, `base64`";

/// `items` in order, each once.
fn unique<T: PartialEq + Copy>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    items.into_iter().fold(Vec::new(), |mut seen, item| {
        if !seen.contains(&item) {
            seen.push(item);
        }
        seen
    })
}

/// 422 `Validation` for a request that asks for images, which the workers do not embed.
fn only_texts(field: &str) -> EmbedError {
    EmbedError::Validation(format!(
        "`{field}`: only texts are embedded here; send them in `texts`"
    ))
}

impl CohereEmbedRequest {
    /// Parses and checks a Cohere embed body against `max_inputs`, for API `version` (`"1"` or
    /// `"2"`, echoed in `meta`; v1 without `embedding_types` answers floats only).
    ///
    /// # Errors
    /// 400 for a body that is not JSON and for no texts ("`texts` cannot be empty"); 422 for
    /// JSON of the wrong shape (naming the field, and for an unknown `embedding_types`,
    /// `input_type` or `truncate` value the values allowed), `images`, `inputs` or
    /// `input_type: "image"`, `embedding_types: []`, more than `max_inputs` texts (naming
    /// `MAX_CLIENT_BATCH_SIZE`) and an `output_dimension` of 0.
    pub fn translate(
        body: &[u8],
        max_inputs: usize,
        version: &'static str,
    ) -> Result<Translated, EmbedError> {
        let request: CohereEmbedRequest = parse_object(
            body,
            "{\"model\": \"m\", \"texts\": [\"a\"], \"input_type\": \"search_document\"}",
        )?;
        if request
            .images
            .as_ref()
            .is_some_and(|images| !images.is_empty())
        {
            return Err(only_texts("images"));
        }
        if request
            .inputs
            .as_ref()
            .is_some_and(|inputs| !inputs.is_empty())
        {
            return Err(only_texts("inputs"));
        }
        if request.input_type == Some(InputType::Image) {
            return Err(only_texts("input_type` `image"));
        }
        let texts = request.texts.unwrap_or_default();
        if texts.is_empty() {
            return Err(EmbedError::Empty("`texts` cannot be empty".into()));
        }
        if request.embedding_types.as_ref().is_some_and(Vec::is_empty) {
            return Err(EmbedError::Validation(format!(
                "`embedding_types` lists no type: give one or more of {EMBEDDING_TYPES}"
            )));
        }
        if request.output_dimension == Some(0) {
            return Err(EmbedError::Validation(
                "`output_dimension` must be at least 1".into(),
            ));
        }
        let types = request.embedding_types.map(unique);
        let asked = types.clone().unwrap_or_else(|| vec![EmbeddingType::Float]);
        let dtypes = unique(asked.iter().map(|t| t.dtype()));
        let plain = dtypes == [Dtype::Float];
        let (truncate, truncation_direction) = match request.truncate.unwrap_or_default() {
            Truncate::None => (Some(false), None),
            Truncate::Start => (Some(true), Some(TruncationDirection::Left)),
            Truncate::End => (Some(true), Some(TruncationDirection::Right)),
        };
        let embed = EmbedRequest {
            inputs: Inputs::Batch(texts.iter().cloned().map(Input::Text).collect()),
            normalize: true,
            truncate,
            truncation_direction,
            prompt_name: None,
            prompt_hint: request
                .input_type
                .and_then(InputType::prompt_name)
                .map(str::to_owned),
            dimensions: request.output_dimension,
            output_dtype: (!plain).then_some(OutputDtype::Many(dtypes)),
        };
        embed.validate(max_inputs)?;
        // Cohere v2 always answers by type; v1 only when asked for types.
        let types = if version == "1" { types } else { Some(asked) };
        Ok(Translated {
            model: request.model,
            request: embed,
            shape: Shape {
                types,
                plain,
                texts,
                version,
            },
        })
    }
}

impl Shape {
    /// The response body from the worker's reply `payload` (`[[f32, ...], ...]` for floats
    /// only, else its object of arrays by type) and the request's `tokens` when counted.
    ///
    /// # Errors
    /// 424 `Backend` when `payload` is not the reply asked for.
    pub fn response(self, payload: &[u8], tokens: Option<u64>) -> Result<Vec<u8>, EmbedError> {
        let malformed = |e: &dyn std::fmt::Display| {
            EmbedError::Backend(format!("malformed reply from the worker: {e}"))
        };
        let by_dtype: Vec<(String, &RawValue)> = if self.plain {
            let raw: &RawValue = serde_json::from_slice(payload).map_err(|e| malformed(&e))?;
            vec![(Dtype::Float.name().to_owned(), raw)]
        } else {
            let object: std::collections::BTreeMap<String, &RawValue> =
                serde_json::from_slice(payload).map_err(|e| malformed(&e))?;
            object.into_iter().collect()
        };
        let vectors = |dtype: Dtype| {
            by_dtype
                .iter()
                .find(|(name, _)| name == dtype.name())
                .map(|(_, raw)| *raw)
                .ok_or_else(|| malformed(&format!("no `{}` vectors", dtype.name())))
        };
        let embeddings = match &self.types {
            None => Embeddings::Floats(vectors(Dtype::Float)?),
            Some(types) => Embeddings::ByType(
                types
                    .iter()
                    .map(|t| {
                        let raw = vectors(t.dtype())?;
                        let value = if *t == EmbeddingType::Base64 {
                            let floats: Vec<Vec<f32>> =
                                serde_json::from_str(raw.get()).map_err(|e| malformed(&e))?;
                            ByType::Base64(floats.iter().map(|v| encode_base64(v)).collect())
                        } else {
                            ByType::Raw(raw)
                        };
                        Ok((t.name(), value))
                    })
                    .collect::<Result<_, EmbedError>>()?,
            ),
        };
        let mut meta = serde_json::json!({"api_version": {"version": self.version}});
        if let Some(tokens) = tokens {
            meta["billed_units"] = serde_json::json!({"input_tokens": tokens});
        }
        let response = CohereEmbedResponse {
            id: nuid::next().to_string(),
            response_type: if self.types.is_some() {
                "embeddings_by_type"
            } else {
                "embeddings_floats"
            },
            embeddings,
            texts: self.texts,
            meta,
        };
        serde_json::to_vec(&response)
            .map_err(|e| EmbedError::Backend(format!("cannot write the response: {e}")))
    }
}

/// An error answered in Cohere's shape (`{"message": ...}`), with the status `POST /embed`
/// gives the same error ([`EmbedError::status`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CohereError(pub EmbedError);

impl From<EmbedError> for CohereError {
    fn from(error: EmbedError) -> CohereError {
        CohereError(error)
    }
}

/// Cohere's error body: `{"message": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CohereErrorResponse {
    /// What went wrong: the message `POST /embed` answers for the same error.
    pub message: String,
}

impl CohereError {
    /// The HTTP status: the TEI route's for the same error.
    pub fn status(&self) -> u16 {
        self.0.status()
    }

    /// The error body, serialized.
    pub fn to_json(&self) -> Vec<u8> {
        let body = CohereErrorResponse {
            message: self.0.to_string(),
        };
        // A struct of one string cannot fail to serialize.
        serde_json::to_vec(&body).unwrap_or_default()
    }
}

#[cfg(test)]
#[path = "cohere_embed_tests.rs"]
mod tests;
