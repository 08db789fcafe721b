//! Output lines: OpenAI's batch output shape `{"id", "custom_id", "response": {"status_code",
//! "request_id", "body"}, "error"}`, with the body the line's route would have answered.

use base64::Engine as _;
use embatch_batcher::Embedding;
use embatch_protocol::EmbedError;
use embatch_protocol::bulk::{EncodingFormat, ItemLine, LineResult, LineRoute};
use serde_json::value::RawValue;

/// Why an output line could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// A `base64` line's embedding is not an array of numbers.
    #[error("malformed embedding: {0}")]
    Embedding(serde_json::Error),
    /// The line could not be encoded as JSON.
    #[error("cannot encode an output line: {0}")]
    Json(#[from] serde_json::Error),
    /// An error body was not UTF-8.
    #[error("cannot encode an output line: {0}")]
    Utf8(#[from] std::string::FromUtf8Error),
}

/// The successful output of `line` from its embeddings, in input order. An OpenAI line's
/// `usage` gives `tokens` (the line's tokens as the worker counted them, as OpenAI's Batch API
/// reports each response's usage), or 0 when the worker counts inputs, not tokens (as the
/// interactive route).
///
/// # Errors
/// [`RenderError::Embedding`] when a `base64` line's embedding is not an array of numbers.
pub fn success(
    line: &ItemLine,
    embeddings: &[Embedding],
    tokens: Option<u64>,
) -> Result<LineResult, RenderError> {
    let body = match line.route {
        LineRoute::Tei => join(embeddings.iter().map(|e| text(e.json()))),
        LineRoute::OpenAi => {
            let mut data = Vec::with_capacity(embeddings.len());
            for (index, embedding) in embeddings.iter().enumerate() {
                let value = match line.encoding_format {
                    EncodingFormat::Float => text(embedding.json()).to_owned(),
                    EncodingFormat::Base64 => {
                        let vector: Vec<f32> = serde_json::from_slice(embedding.json())
                            .map_err(RenderError::Embedding)?;
                        let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
                        serde_json::to_string(
                            &base64::engine::general_purpose::STANDARD.encode(bytes),
                        )
                        .unwrap_or_default()
                    }
                };
                data.push(format!(
                    r#"{{"object":"embedding","index":{index},"embedding":{value}}}"#
                ));
            }
            let model = serde_json::to_string(line.model.as_deref().unwrap_or_default())
                .unwrap_or_else(|_| "\"\"".into());
            let tokens = tokens.unwrap_or(0);
            format!(
                r#"{{"object":"list","data":{},"model":{model},"usage":{{"prompt_tokens":{tokens},"total_tokens":{tokens}}}}}"#,
                join(data.iter().map(String::as_str))
            )
        }
    };
    output(line, 200, Some(body), None, true)
}

/// The error output of `line` that the model refused: the route's error body and the status
/// the route answers the error with (TEI's 413/422...).
///
/// # Errors
/// [`RenderError`] when the output line cannot be encoded.
pub fn refused(line: &ItemLine, error: &EmbedError) -> Result<LineResult, RenderError> {
    let body = match line.route {
        LineRoute::Tei => String::from_utf8(error.to_json())?,
        LineRoute::OpenAi => {
            let kind = match error.status() {
                429 => "rate_limit_error",
                424 | 500.. => "server_error",
                _ => "invalid_request_error",
            };
            serde_json::json!({"error": {"message": error.to_string(), "type": kind, "param": null, "code": null}})
                .to_string()
        }
    };
    output(line, error.status(), Some(body), None, false)
}

/// The error output of a line never answered: `response: null` and `error: {code, message}`
/// (`upstream_failed`, `batch_cancelled`, `batch_expired`).
///
/// # Errors
/// [`RenderError`] when the output line cannot be encoded.
pub fn unanswered(custom_id: &str, code: &str, message: &str) -> Result<LineResult, RenderError> {
    let json = serde_json::json!({
        "id": super::new_id("batch_req_"),
        "custom_id": custom_id,
        "response": null,
        "error": {"code": code, "message": message},
    });
    Ok(LineResult {
        custom_id: custom_id.to_owned(),
        ok: false,
        output: serde_json::value::to_raw_value(&json)?,
    })
}

fn output(
    line: &ItemLine,
    status: u16,
    body: Option<String>,
    error: Option<serde_json::Value>,
    ok: bool,
) -> Result<LineResult, RenderError> {
    let custom_id = serde_json::to_string(&line.custom_id)?;
    let body = body.unwrap_or_else(|| "null".into());
    let error = error.map_or_else(|| "null".to_owned(), |e| e.to_string());
    let json = format!(
        r#"{{"id":"{}","custom_id":{custom_id},"response":{{"status_code":{status},"request_id":"{}","body":{body}}},"error":{error}}}"#,
        super::new_id("batch_req_"),
        super::new_id("req_"),
    );
    Ok(LineResult {
        custom_id: line.custom_id.clone(),
        ok,
        output: RawValue::from_string(json)?,
    })
}

fn text(json: &[u8]) -> &str {
    std::str::from_utf8(json).unwrap_or("null")
}

fn join<'a>(parts: impl Iterator<Item = &'a str>) -> String {
    let mut out = String::from("[");
    for (i, part) in parts.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(part);
    }
    out.push(']');
    out
}
