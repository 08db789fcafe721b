//! OpenAI's embeddings API (`POST /v1/embeddings`, `POST /embeddings`): the request and response
//! shapes, the translation to and from TEI's `/embed` shapes, and OpenAI's error shape.
//!
//! The routes translate an OpenAI request into an [`EmbedRequest`] body and send it down the same
//! path as `POST /embed` (same NATS request, deadline and in-flight limit), so requests of every
//! route are batched together by the workers; the worker's reply (TEI's `[[f32, ...], ...]`) is
//! then re-shaped into OpenAI's response.

use base64::Engine as _;
use embatch_protocol::compact::{Dtype, OutputDtype, Quantized};
use embatch_protocol::request::{Inputs, invalid_json};
use embatch_protocol::{EmbedError, EmbedRequest};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{
    ArrayBuilder, KnownFormat, ObjectBuilder, OneOfBuilder, Schema, SchemaFormat, Type,
};

/// OpenAI's `POST /v1/embeddings` body.
///
/// ```json
/// {"input": "one text" | ["text", ...] | [101, 7592, 102] | [[101, 102], ...],
///  "model": "name", "encoding_format": "float", "dimensions": 256, "user": "ignored",
///  "output_dtype": "int8"}
/// ```
/// Only `input` is required (OpenAI requires `model` too; here an absent one means the default
/// model). Token
/// ids (an array of numbers is one input, an array of such arrays several) are accepted as
/// OpenAI accepts them, and must be ids of the workers' model's vocabulary, as with TEI.
/// Unknown fields are ignored.
#[derive(Debug, Clone, PartialEq, Deserialize, utoipa::ToSchema)]
pub struct EmbeddingsRequest {
    /// One input or an array of inputs (texts or arrays of token ids); one embedding each, in
    /// order.
    pub input: Inputs,
    /// The model to use: routed to the workers that serve a model of this name (see
    /// [`crate::models`]); absent or `""`: the default model (`EMBATCH_DEFAULT_MODEL`, else
    /// the plain subject's workers). A name no worker serves is answered 404 `model_not_found`.
    /// Echoed in the response's `model`.
    #[serde(default)]
    pub model: Option<String>,
    /// How embeddings are encoded in the response (absent or `null`: `float`).
    #[serde(default)]
    pub encoding_format: Option<EncodingFormat>,
    /// Matryoshka output size: keep the first `dimensions` values (TEI's `dimensions`; a count
    /// of values, at least 1).
    #[serde(default)]
    #[schema(minimum = 1)]
    pub dimensions: Option<usize>,
    /// OpenAI's end-user id: accepted and ignored.
    #[serde(default)]
    pub user: Option<String>,
    /// Voyage's `output_dtype` (not OpenAI's): `"float"` (absent or `null`: the default),
    /// `"int8"`, `"uint8"`, `"binary"` or `"ubinary"`, quantized by the worker as
    /// [`embatch_protocol::compact`] documents. The embedding is then an array of integers
    /// (`binary` and `ubinary`: `ceil(d / 8)` of them); with `encoding_format: "base64"`, the
    /// base64 of one byte per integer, as Voyage encodes it.
    #[serde(default)]
    pub output_dtype: Option<Dtype>,
}

/// OpenAI's `encoding_format`: `"float"` or `"base64"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    /// A JSON array of numbers per embedding (OpenAI's default).
    #[default]
    Float,
    /// One string per embedding: standard base64 (with padding) of the vector's f32 values as
    /// little-endian bytes, 4 bytes per value, as OpenAI and TEI encode it (the `openai` Python
    /// SDK asks for this by default and decodes it with `numpy.frombuffer(..., "float32")`).
    Base64,
}

/// What the response needs from the request, once the request itself has been sent on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyShape {
    /// Echoed as the response's `model`: the request's `model`, or `""` when it had none.
    pub model: String,
    /// The response's encoding.
    pub encoding_format: EncodingFormat,
    /// The type of the worker's vectors (`Float` unless the request asked for another).
    pub output_dtype: Dtype,
}

impl EmbeddingsRequest {
    /// Parses an OpenAI request body.
    ///
    /// # Errors
    /// [`OpenAiError`] wrapping [`EmbedError::InvalidJson`] (400) for a body that is not JSON,
    /// as TEI 1.9.3's route answers it, or [`EmbedError::Validation`] (422), with `param` naming
    /// the offending top-level field, for a missing `input` or a field of the wrong type (e.g.
    /// an unknown `encoding_format`).
    pub fn from_slice(body: &[u8]) -> Result<EmbeddingsRequest, OpenAiError> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let request: EmbeddingsRequest =
            serde_path_to_error::deserialize(&mut de).map_err(|err| {
                let path = err.path().to_string();
                let inner = err.into_inner();
                if inner.is_syntax() || inner.is_eof() {
                    OpenAiError::new(invalid_json(&inner))
                } else if path == "." || path.is_empty() {
                    OpenAiError::new(EmbedError::Validation(format!(
                        "invalid request body: {inner}"
                    )))
                } else {
                    let param = path.split(['.', '[']).next().unwrap_or_default().to_owned();
                    OpenAiError {
                        error: EmbedError::Validation(format!("`{path}`: {inner}")),
                        param: Some(param),
                    }
                }
            })?;
        de.end()
            .map_err(|err| OpenAiError::new(invalid_json(&err)))?;
        Ok(request)
    }

    /// Translates the request into TEI's `/embed` request (`inputs`, `normalize: true` as OpenAI's
    /// embeddings are unit length, `dimensions`, `output_dtype` unless `float`; truncation left
    /// to the upstream's default) and what the response needs.
    pub fn into_embed_request(self) -> (EmbedRequest, ReplyShape) {
        let request = EmbedRequest {
            inputs: self.input,
            normalize: true,
            truncate: None,
            truncation_direction: None,
            prompt_name: None,
            prompt_hint: None,
            dimensions: self.dimensions,
            // The worker quantizes (contract v1.5); `float` asks nothing, so the body is TEI's.
            output_dtype: self
                .output_dtype
                .filter(|dtype| *dtype != Dtype::Float)
                .map(OutputDtype::One),
        };
        let shape = ReplyShape {
            model: self.model.unwrap_or_default(),
            encoding_format: self.encoding_format.unwrap_or_default(),
            output_dtype: self.output_dtype.unwrap_or_default(),
        };
        (request, shape)
    }
}

/// OpenAI's embeddings response:
/// `{"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [...]}],
///   "model": "...", "usage": {"prompt_tokens": 12, "total_tokens": 12}}`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EmbeddingsResponse<'a> {
    /// Always `"list"`.
    #[schema(schema_with = list_tag)]
    pub object: &'static str,
    /// One entry per input, in input order.
    pub data: Vec<EmbeddingObject<'a>>,
    /// The request's `model`, echoed.
    pub model: String,
    /// Token counts: see [`Usage`].
    pub usage: Usage,
}

/// One embedding of [`EmbeddingsResponse::data`].
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EmbeddingObject<'a> {
    /// Always `"embedding"`.
    #[schema(schema_with = embedding_tag)]
    pub object: &'static str,
    /// The input's position in the request, from 0.
    pub index: usize,
    /// The vector, encoded as the request's `encoding_format` asked.
    pub embedding: EmbeddingValue<'a>,
}

/// An embedding in the response's encoding.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum EmbeddingValue<'a> {
    /// `encoding_format: "float"`: the worker's JSON array (floats, or integers for an
    /// `output_dtype`), borrowed from its reply and passed through as is (its numbers are never
    /// re-encoded).
    Float(&'a RawValue),
    /// `encoding_format: "base64"`: see [`EncodingFormat::Base64`]; for an `output_dtype`, one
    /// byte per integer.
    Base64(String),
}

/// `[f32, ...]` or a base64 string (see [`EncodingFormat`]).
impl utoipa::PartialSchema for EmbeddingValue<'_> {
    fn schema() -> RefOr<Schema> {
        let floats = ArrayBuilder::new()
            .items(
                ObjectBuilder::new()
                    .schema_type(Type::Number)
                    .format(Some(SchemaFormat::KnownFormat(KnownFormat::Float))),
            )
            .description(Some(
                "`encoding_format: \"float\"`: the vector, one f32 per dimension; for an \
                 `output_dtype`, its integers (`int8`/`uint8`: one per dimension, \
                 `binary`/`ubinary`: one per 8 dimensions).",
            ));
        let base64 = ObjectBuilder::new()
            .schema_type(Type::String)
            .content_encoding("base64")
            .description(Some(
                "`encoding_format: \"base64\"`: standard base64 (padded) of the vector's f32 \
                 values as little-endian bytes, 4 bytes per dimension; for an `output_dtype`, \
                 of its integers, one byte each (int8 as two's complement), as Voyage encodes \
                 them.",
            ));
        OneOfBuilder::new().item(floats).item(base64).into()
    }
}

impl utoipa::ToSchema for EmbeddingValue<'_> {}

/// The schema of [`EmbeddingsResponse::object`]: always `"list"`.
fn list_tag() -> Schema {
    constant("list")
}

/// The schema of [`EmbeddingObject::object`]: always `"embedding"`.
fn embedding_tag() -> Schema {
    constant("embedding")
}

/// The schema of a string that is always `value` (OpenAI's `object` tags).
fn constant(value: &'static str) -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some([value]))
        .description(Some(format!("Always `\"{value}\"`.")))
        .into()
}

/// The schema of [`ErrorBody::kind`]: the values of [`OpenAiError::error_type`].
fn error_types() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some([
            "invalid_request_error",
            "rate_limit_error",
            "server_error",
        ]))
        .description(Some(
            "OpenAI's error type: `rate_limit_error` for 429, `server_error` for 424 and 5xx, \
             `invalid_request_error` for the other statuses.",
        ))
        .into()
}

/// OpenAI's `usage`: the request's tokens as the worker's tokenizer counts them (the model's own
/// `tokenizer.json`; special tokens included, after truncation), from the reply's
/// `Embatch-Tokens` header. `0` when the worker has no tokenizer for its model (never an
/// estimate: a count that looks real but is not would mislead cost accounting).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, utoipa::ToSchema)]
pub struct Usage {
    /// Tokens in the inputs, summed over them (0 when not counted).
    pub prompt_tokens: u64,
    /// Same as `prompt_tokens`: embeddings produce no output tokens.
    pub total_tokens: u64,
}

/// Re-shapes a worker's reply `payload` (TEI's `[[f32, ...], ...]`) into OpenAI's response body,
/// serialized, with `tokens` (the reply's token count, if any) as its `usage`.
///
/// # Errors
/// [`EmbedError::Backend`] (424) when the payload is not an array of float arrays.
pub fn response_body(
    payload: &[u8],
    shape: ReplyShape,
    tokens: Option<u64>,
) -> Result<Vec<u8>, EmbedError> {
    let malformed =
        |e: serde_json::Error| EmbedError::Backend(format!("malformed reply from the worker: {e}"));
    let embeddings: Vec<&RawValue> = serde_json::from_slice(payload).map_err(malformed)?;
    let data = embeddings
        .into_iter()
        .enumerate()
        .map(|(index, raw)| {
            let embedding = match shape.encoding_format {
                EncodingFormat::Float => EmbeddingValue::Float(raw),
                EncodingFormat::Base64 => {
                    EmbeddingValue::Base64(base64_of(raw, shape.output_dtype).map_err(malformed)?)
                }
            };
            Ok(EmbeddingObject {
                object: "embedding",
                index,
                embedding,
            })
        })
        .collect::<Result<Vec<_>, EmbedError>>()?;
    let response = EmbeddingsResponse {
        object: "list",
        data,
        model: shape.model,
        usage: Usage {
            prompt_tokens: tokens.unwrap_or(0),
            total_tokens: tokens.unwrap_or(0),
        },
    };
    serde_json::to_vec(&response)
        .map_err(|e| EmbedError::Backend(format!("cannot encode the response: {e}")))
}

/// The base64 of the worker's vector `raw`, of type `dtype`: [`encode_base64`] of floats, or of
/// the integers of a quantized vector, one byte each (Voyage's base64 of a numpy `int8` or
/// `uint8` array).
fn base64_of(raw: &RawValue, dtype: Dtype) -> Result<String, serde_json::Error> {
    let bytes = match dtype {
        Dtype::Float => return Ok(encode_base64(&serde_json::from_str::<Vec<f32>>(raw.get())?)),
        Dtype::Int8 | Dtype::Binary => Quantized::Signed(serde_json::from_str(raw.get())?),
        Dtype::Uint8 | Dtype::Ubinary => Quantized::Unsigned(serde_json::from_str(raw.get())?),
    };
    Ok(base64::engine::general_purpose::STANDARD.encode(bytes.to_bytes()))
}

/// Standard base64 (with padding) of `vector`'s values as little-endian f32 bytes: see
/// [`EncodingFormat::Base64`].
pub fn encode_base64(vector: &[f32]) -> String {
    let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// An error answered in OpenAI's shape, with the HTTP status the TEI route gives the same error
/// ([`EmbedError::status`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{error}")]
pub struct OpenAiError {
    /// The error, as the TEI route would answer it.
    pub error: EmbedError,
    /// The request field at fault (OpenAI's `param`), when known.
    pub param: Option<String>,
}

/// OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = OpenAiErrorResponse)]
pub struct ErrorResponse {
    /// The error.
    pub error: ErrorBody,
}

/// The inside of OpenAI's error body ([`ErrorResponse`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = OpenAiErrorBody)]
pub struct ErrorBody {
    /// Human-readable message: the TEI route's message (TEI's `error`).
    pub message: String,
    /// OpenAI's error type; see [`OpenAiError::error_type`].
    #[serde(rename = "type")]
    #[schema(schema_with = error_types)]
    pub kind: String,
    /// The request field at fault (`input`, `dimensions`, `encoding_format`, ...) or `null`.
    #[schema(required = true)]
    pub param: Option<String>,
    /// `model_not_found` when the request names a model no worker serves (404); else `null`.
    #[schema(required = true)]
    pub code: Option<String>,
}

impl From<EmbedError> for OpenAiError {
    fn from(error: EmbedError) -> OpenAiError {
        OpenAiError::new(error)
    }
}

impl OpenAiError {
    /// Wraps `error`, guessing `param` from it: `model` for an unknown model, `input` for an
    /// empty request or one with too
    /// many inputs (messages naming `` `inputs` ``), `dimensions` and `output_dtype` for
    /// messages naming them, else none.
    pub fn new(error: EmbedError) -> OpenAiError {
        let message = error.to_string();
        let param = if matches!(error, EmbedError::ModelNotFound { .. }) {
            Some("model".to_owned())
        } else if matches!(error, EmbedError::Empty(_)) || message.contains("`inputs`") {
            Some("input".to_owned())
        } else if message.contains("`dimensions`") {
            Some("dimensions".to_owned())
        } else if message.contains("`output_dtype`") {
            Some("output_dtype".to_owned())
        } else {
            None
        };
        OpenAiError { error, param }
    }

    /// The HTTP status: the TEI route's for the same error.
    pub fn status(&self) -> u16 {
        self.error.status()
    }

    /// OpenAI's `type` for the status: `rate_limit_error` for 429, `server_error` for 424 (the
    /// upstream model failed) and 5xx, `invalid_request_error` for every other status (400, 413,
    /// 422, ...).
    pub fn error_type(&self) -> &'static str {
        match self.status() {
            429 => "rate_limit_error",
            424 | 500.. => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The error body, in OpenAI's shape.
    pub fn to_response(&self) -> ErrorResponse {
        ErrorResponse {
            error: ErrorBody {
                message: self.error.to_string(),
                kind: self.error_type().to_owned(),
                param: self.param.clone(),
                code: matches!(self.error, EmbedError::ModelNotFound { .. })
                    .then(|| "model_not_found".to_owned()),
            },
        }
    }

    /// The error body, serialized.
    pub fn to_json(&self) -> Vec<u8> {
        // A struct of strings cannot fail to serialize.
        serde_json::to_vec(&self.to_response()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;

    use super::*;

    fn decode_base64(text: &str) -> Vec<f32> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .expect("valid base64");
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    #[test]
    fn base64_is_little_endian_f32() {
        // 1.0f32 = 0x3F800000 → bytes 00 00 80 3F; -2.0f32 = 0xC0000000 → 00 00 00 C0.
        assert_eq!(encode_base64(&[1.0]), "AACAPw==");
        assert_eq!(encode_base64(&[1.0, -2.0]), "AACAPwAAAMA=");
        let known = [0.0, 1.0, -0.5, 0.123_456_79, f32::MIN_POSITIVE, 3.4e38];
        assert_eq!(decode_base64(&encode_base64(&known)), known);
    }

    #[test]
    fn request_translates_to_teis_shape() {
        let request = EmbeddingsRequest::from_slice(
            br#"{"input":["a","b"],"model":"m","encoding_format":"base64","dimensions":4,"user":"u"}"#,
        )
        .expect("valid");
        let (embed, shape) = request.into_embed_request();
        assert_eq!(
            serde_json::to_value(&embed).expect("serializes"),
            serde_json::json!({"inputs":["a","b"],"normalize":true,"dimensions":4})
        );
        assert_eq!(
            shape,
            ReplyShape {
                model: "m".into(),
                encoding_format: EncodingFormat::Base64,
                output_dtype: Dtype::Float,
            }
        );
        let (embed, shape) = EmbeddingsRequest::from_slice(br#"{"input":"a"}"#)
            .expect("valid")
            .into_embed_request();
        assert_eq!(embed.inputs, Inputs::Single("a".into()));
        let (embed, _) = EmbeddingsRequest::from_slice(br#"{"input":[[101,102],[7592]]}"#)
            .expect("token ids")
            .into_embed_request();
        assert_eq!(embed.inputs.len(), 2);
        assert_eq!(shape.encoding_format, EncodingFormat::Float);
        assert_eq!(shape.model, "");
    }

    #[test]
    fn bad_requests_name_the_param() {
        let cases: [(&[u8], Option<&str>); 5] = [
            (
                br#"{"input":"a","output_dtype":"int4"}"#,
                Some("output_dtype"),
            ),
            (br#"{"input":[1,"a"]}"#, Some("input")),
            (
                br#"{"input":"a","encoding_format":"hex"}"#,
                Some("encoding_format"),
            ),
            (br#"{"input":"a","dimensions":"x"}"#, Some("dimensions")),
            (br#"{"model":"m"}"#, None),
        ];
        for (body, param) in cases {
            let err = EmbeddingsRequest::from_slice(body).expect_err("invalid");
            assert_eq!(err.status(), 422, "{err}");
            assert_eq!(err.param.as_deref(), param, "{err}");
        }
        // Not JSON at all: 400, as TEI 1.9.3's OpenAI route answers.
        for body in [&b"{nope"[..], b"", br#"{"input":"a"} x"#] {
            let err = EmbeddingsRequest::from_slice(body).expect_err("invalid");
            assert_eq!(err.status(), 400, "{err}");
            assert_eq!(err.param, None, "{err}");
        }
    }

    #[test]
    fn response_reshapes_the_workers_reply() {
        let payload = br#"[[1.0,-2.0],[0.5,0.25]]"#;
        let float = response_body(
            payload,
            ReplyShape {
                model: "m".into(),
                encoding_format: EncodingFormat::Float,
                output_dtype: Dtype::Float,
            },
            Some(7),
        )
        .expect("reshapes");
        let value: serde_json::Value = serde_json::from_slice(&float).expect("JSON");
        assert_eq!(
            value,
            serde_json::json!({
                "object": "list",
                "data": [
                    {"object": "embedding", "index": 0, "embedding": [1.0, -2.0]},
                    {"object": "embedding", "index": 1, "embedding": [0.5, 0.25]},
                ],
                "model": "m",
                "usage": {"prompt_tokens": 7, "total_tokens": 7},
            })
        );
        let b64 = response_body(
            payload,
            ReplyShape {
                model: String::new(),
                encoding_format: EncodingFormat::Base64,
                output_dtype: Dtype::Float,
            },
            None,
        )
        .expect("reshapes");
        let value: serde_json::Value = serde_json::from_slice(&b64).expect("JSON");
        assert_eq!(value["usage"]["prompt_tokens"], 0, "not counted: 0");
        assert_eq!(value["data"][0]["embedding"], "AACAPwAAAMA=");
        let second = value["data"][1]["embedding"].as_str().expect("a string");
        assert_eq!(decode_base64(second), [0.5, 0.25]);
        let err = response_body(
            b"{}",
            ReplyShape {
                model: String::new(),
                encoding_format: EncodingFormat::Float,
                output_dtype: Dtype::Float,
            },
            None,
        )
        .expect_err("not an array");
        assert_eq!(err.status(), 424);
    }

    #[test]
    fn errors_have_openais_shape_and_teis_status() {
        let err = OpenAiError::from(EmbedError::Empty("`inputs` cannot be empty".into()));
        assert_eq!(err.status(), 400);
        let value: serde_json::Value = serde_json::from_slice(&err.to_json()).expect("JSON");
        assert_eq!(
            value,
            serde_json::json!({"error": {
                "message": "Input validation error: `inputs` cannot be empty",
                "type": "invalid_request_error",
                "param": "input",
                "code": null,
            }})
        );
        let overloaded = OpenAiError::from(EmbedError::Overloaded("queue is full".into()));
        assert_eq!(overloaded.status(), 429);
        assert_eq!(overloaded.to_response().error.kind, "rate_limit_error");
        assert_eq!(overloaded.param, None);
        let backend = OpenAiError::from(EmbedError::Backend("boom".into()));
        assert_eq!(backend.status(), 424);
        assert_eq!(backend.error_type(), "server_error");
        let unavailable = OpenAiError::from(EmbedError::Unavailable("no worker".into()));
        assert_eq!(unavailable.error_type(), "server_error");
        let too_many = OpenAiError::from(EmbedError::TooLarge(
            "`inputs` must have at most 2 elements. Given: 3".into(),
        ));
        assert_eq!(
            (too_many.status(), too_many.param.as_deref()),
            (413, Some("input"))
        );
    }

    #[test]
    fn output_dtype_is_asked_of_the_worker_and_encoded_as_voyage() {
        let (embed, shape) =
            EmbeddingsRequest::from_slice(br#"{"input":"a","output_dtype":"int8"}"#)
                .expect("valid")
                .into_embed_request();
        assert_eq!(
            serde_json::to_value(&embed).expect("serializes")["output_dtype"],
            "int8"
        );
        assert_eq!(shape.output_dtype, Dtype::Int8);
        let (embed, _) = EmbeddingsRequest::from_slice(br#"{"input":"a","output_dtype":"float"}"#)
            .expect("valid")
            .into_embed_request();
        assert_eq!(embed.output_dtype, None, "float asks the worker nothing");
        // The worker's int8 vectors: passed through as numbers, or one byte each in base64.
        let payload = br#"[[-1,0,127,-128]]"#;
        let shape = |encoding_format, output_dtype| ReplyShape {
            model: String::new(),
            encoding_format,
            output_dtype,
        };
        let float = response_body(payload, shape(EncodingFormat::Float, Dtype::Int8), None)
            .expect("reshapes");
        let value: serde_json::Value = serde_json::from_slice(&float).expect("JSON");
        assert_eq!(
            value["data"][0]["embedding"],
            serde_json::json!([-1, 0, 127, -128])
        );
        let b64 = response_body(payload, shape(EncodingFormat::Base64, Dtype::Int8), None)
            .expect("reshapes");
        let value: serde_json::Value = serde_json::from_slice(&b64).expect("JSON");
        // Bytes ff 00 7f 80.
        assert_eq!(value["data"][0]["embedding"], "/wB/gA==");
        let ubinary = response_body(
            b"[[255,1]]",
            shape(EncodingFormat::Base64, Dtype::Ubinary),
            None,
        )
        .expect("reshapes");
        let value: serde_json::Value = serde_json::from_slice(&ubinary).expect("JSON");
        assert_eq!(value["data"][0]["embedding"], "/wE=");
        let err = response_body(b"[[300]]", shape(EncodingFormat::Base64, Dtype::Int8), None)
            .expect_err("not an int8");
        assert_eq!(err.status(), 424);
    }
}
