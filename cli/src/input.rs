//! The input file: detected as the Batch API's JSONL or as plain text (one input per line),
//! checked, converted to the JSONL that is uploaded, and fingerprinted (sha256) so that a re-run
//! finds its job again.
//!
//! A JSONL line is OpenAI's batch request line:
//! `{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"model": "m", "input": "text"}}`
//! (`url: "/embed"` with a TEI body, `{"inputs": ...}`, is accepted by the gateway too). Lines are
//! checked here only for what would make the whole job useless: JSON, a string `custom_id`, no
//! repeated `custom_id`; the gateway checks the rest and names the line.
//!
//! A plain text line becomes
//! `{"custom_id": "line-N", "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL, "input": TEXT}}`
//! where N is its 1-based line number; with `--inputs-per-request K`, K consecutive lines share
//! one request, `input` is their array and N is the first one's line number. Empty lines are
//! skipped (an empty input is an error for the model).

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// How to read the input file (`--format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// JSONL when the first non-empty line is a JSON object with a `custom_id`, else text.
    Auto,
    /// OpenAI's batch request lines.
    Jsonl,
    /// One input per line.
    Text,
}

/// A line of the input that cannot be submitted (line numbers are 1-based).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InputError {
    /// The file is not UTF-8 text.
    #[error("not UTF-8 text (byte {offset})")]
    NotUtf8 {
        /// The first invalid byte's offset.
        offset: usize,
    },
    /// Nothing to embed: no non-empty line.
    #[error("no input: the file has no non-empty line")]
    Empty,
    /// A JSONL line is not a JSON object.
    #[error("line {line}: not a JSON object: {detail}")]
    NotJson {
        /// The line number.
        line: usize,
        /// serde_json's message.
        detail: String,
    },
    /// A JSONL line lacks a string `custom_id`.
    #[error("line {line}: `custom_id` is missing or not a string")]
    NoCustomId {
        /// The line number.
        line: usize,
    },
    /// A `custom_id` appears twice.
    #[error("line {line}: `custom_id` {custom_id:?} repeats line {first}")]
    DuplicateCustomId {
        /// The line number of the repeat.
        line: usize,
        /// The first line with it.
        first: usize,
        /// The id.
        custom_id: String,
    },
    /// `--inputs-per-request` is 0.
    #[error("--inputs-per-request must be at least 1")]
    ZeroPerRequest,
}

/// The job to upload: its JSONL bytes and what the progress bar and the resume need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// The JSONL uploaded as the batch's input file (one request per line, `\n`-terminated).
    pub jsonl: Vec<u8>,
    /// Lowercase hex sha256 of [`Prepared::jsonl`]: the job's identity across re-runs (stored in
    /// the batch's `metadata`).
    pub sha256: String,
    /// Requests (lines) in the job.
    pub requests: u64,
    /// Inputs in the job: a request's `input`/`inputs` array counts its length, anything else 1.
    pub inputs: u64,
    /// Whether the file was read as plain text (and converted).
    pub converted: bool,
}

/// Reads `bytes` as `format`; `model` is the `model` of converted text lines.
///
/// # Errors
/// [`InputError`] naming the first bad line.
pub fn prepare(
    bytes: &[u8],
    format: Format,
    model: &str,
    inputs_per_request: usize,
) -> Result<Prepared, InputError> {
    if inputs_per_request == 0 {
        return Err(InputError::ZeroPerRequest);
    }
    let text = std::str::from_utf8(bytes).map_err(|e| InputError::NotUtf8 {
        offset: e.valid_up_to(),
    })?;
    let jsonl = is_jsonl(text, format);
    let (out, requests, inputs) = if jsonl {
        check_jsonl(text)?
    } else {
        convert_text(text, model, inputs_per_request)?
    };
    if requests == 0 {
        return Err(InputError::Empty);
    }
    let sha256 = hex(&Sha256::digest(&out));
    Ok(Prepared {
        jsonl: out,
        sha256,
        requests,
        inputs,
        converted: !jsonl,
    })
}

/// Whether `text` is read as JSONL under `format` (else as plain text, which needs a model).
pub fn is_jsonl(text: &str, format: Format) -> bool {
    match format {
        Format::Jsonl => true,
        Format::Text => false,
        Format::Auto => looks_like_jsonl(text),
    }
}

/// Whether the first non-empty line is a JSON object with a `custom_id`.
fn looks_like_jsonl(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .and_then(|l| serde_json::from_str::<Value>(l).ok())
        .is_some_and(|v| v.get("custom_id").is_some())
}

/// Checks each non-empty line; returns the file with empty lines dropped and `\n` endings.
fn check_jsonl(text: &str) -> Result<(Vec<u8>, u64, u64), InputError> {
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut out = Vec::with_capacity(text.len() + 1);
    let (mut requests, mut inputs) = (0u64, 0u64);
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(trimmed).map_err(|e| InputError::NotJson {
            line,
            detail: e.to_string(),
        })?;
        if !value.is_object() {
            return Err(InputError::NotJson {
                line,
                detail: "a JSON value that is not an object".into(),
            });
        }
        let Some(custom_id) = value.get("custom_id").and_then(Value::as_str) else {
            return Err(InputError::NoCustomId { line });
        };
        if let Some(&first) = seen.get(custom_id) {
            return Err(InputError::DuplicateCustomId {
                line,
                first,
                custom_id: custom_id.to_owned(),
            });
        }
        seen.insert(custom_id.to_owned(), line);
        let body = value.get("body");
        let input = body.and_then(|b| b.get("input").or_else(|| b.get("inputs")));
        inputs += match input {
            Some(Value::Array(items)) if items.iter().all(Value::is_string) => items.len() as u64,
            // An array of token ids is one input; an array of arrays is one per element.
            Some(Value::Array(items)) if items.iter().all(Value::is_array) => items.len() as u64,
            _ => 1,
        };
        requests += 1;
        out.extend_from_slice(trimmed.as_bytes());
        out.push(b'\n');
    }
    Ok((out, requests, inputs))
}

/// One request per `per_request` non-empty lines.
fn convert_text(
    text: &str,
    model: &str,
    per_request: usize,
) -> Result<(Vec<u8>, u64, u64), InputError> {
    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim_end_matches('\r')))
        .filter(|(_, l)| !l.trim().is_empty())
        .collect();
    let mut out = Vec::with_capacity(text.len() * 2);
    let mut requests = 0u64;
    for group in lines.chunks(per_request) {
        let first = group[0].0;
        let input = if per_request == 1 {
            json!(group[0].1)
        } else {
            json!(group.iter().map(|(_, l)| *l).collect::<Vec<_>>())
        };
        let custom_id = format!("line-{first}");
        let line = json!({
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": model, "input": input},
        });
        // A `Value` of strings always serializes.
        out.extend_from_slice(line.to_string().as_bytes());
        out.push(b'\n');
        requests += 1;
    }
    Ok((out, requests, lines.len() as u64))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_lines_become_embeddings_requests_with_line_numbers() {
        let p = prepare(b"hello\n\nworld\r\n", Format::Auto, "m", 1).expect("valid");
        let lines: Vec<Value> = std::str::from_utf8(&p.jsonl)
            .expect("utf8")
            .lines()
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect();
        assert_eq!(
            lines,
            vec![
                json!({"custom_id": "line-1", "method": "POST", "url": "/v1/embeddings",
                       "body": {"model": "m", "input": "hello"}}),
                json!({"custom_id": "line-3", "method": "POST", "url": "/v1/embeddings",
                       "body": {"model": "m", "input": "world"}}),
            ]
        );
        assert_eq!((p.requests, p.inputs, p.converted), (2, 2, true));
    }

    #[test]
    fn text_lines_group_into_requests() {
        let p = prepare(b"a\nb\nc\n", Format::Text, "m", 2).expect("valid");
        let text = String::from_utf8(p.jsonl).expect("utf8");
        let first: Value = serde_json::from_str(text.lines().next().expect("line")).expect("json");
        assert_eq!(first["body"]["input"], json!(["a", "b"]));
        assert_eq!(first["custom_id"], "line-1");
        let second: Value = serde_json::from_str(text.lines().nth(1).expect("line")).expect("json");
        assert_eq!(second["body"]["input"], json!(["c"]));
        assert_eq!(second["custom_id"], "line-3");
        assert_eq!((p.requests, p.inputs), (2, 3));
    }

    #[test]
    fn jsonl_is_detected_checked_and_counted() {
        let file = concat!(
            r#"{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":{"model":"m","input":["x","y"]}}"#,
            "\n\n",
            r#"{"custom_id":"b","method":"POST","url":"/embed","body":{"inputs":"z"}}"#,
            "\n"
        );
        let p = prepare(file.as_bytes(), Format::Auto, "ignored", 1).expect("valid");
        assert!(!p.converted);
        assert_eq!((p.requests, p.inputs), (2, 3));
        assert_eq!(p.jsonl.iter().filter(|&&b| b == b'\n').count(), 2);
    }

    #[test]
    fn bad_jsonl_lines_are_named() {
        let dup = "{\"custom_id\":\"a\"}\n{\"custom_id\":\"b\"}\n{\"custom_id\":\"a\"}\n";
        assert_eq!(
            prepare(dup.as_bytes(), Format::Jsonl, "m", 1),
            Err(InputError::DuplicateCustomId {
                line: 3,
                first: 1,
                custom_id: "a".into()
            })
        );
        let missing = "{\"custom_id\":\"a\"}\n{\"method\":\"POST\"}\n";
        assert_eq!(
            prepare(missing.as_bytes(), Format::Jsonl, "m", 1),
            Err(InputError::NoCustomId { line: 2 })
        );
        let broken = "{\"custom_id\":\"a\"}\n{not json\n";
        assert!(matches!(
            prepare(broken.as_bytes(), Format::Jsonl, "m", 1),
            Err(InputError::NotJson { line: 2, .. })
        ));
    }

    #[test]
    fn a_text_file_starting_with_plain_json_is_text() {
        // A JSON line without custom_id is an input like any other.
        let p = prepare(b"{\"a\": 1}\nb\n", Format::Auto, "m", 1).expect("valid");
        assert!(p.converted);
        assert_eq!(p.requests, 2);
    }

    #[test]
    fn empty_and_invalid_files_are_rejected() {
        assert_eq!(
            prepare(b"\n \n", Format::Auto, "m", 1),
            Err(InputError::Empty)
        );
        assert_eq!(
            prepare(b"ok\n\xff", Format::Auto, "m", 1),
            Err(InputError::NotUtf8 { offset: 3 })
        );
        assert_eq!(
            prepare(b"a", Format::Text, "m", 0),
            Err(InputError::ZeroPerRequest)
        );
    }

    #[test]
    fn the_fingerprint_is_the_uploaded_bytes_sha256() {
        let a = prepare(b"x\ny\n", Format::Text, "m", 1).expect("valid");
        let b = prepare(b"x\r\ny", Format::Text, "m", 1).expect("valid");
        let c = prepare(b"x\ny\n", Format::Text, "other", 1).expect("valid");
        assert_eq!(a.sha256, b.sha256, "same requests, same job");
        assert_ne!(a.sha256, c.sha256, "another model is another job");
        assert_eq!(a.sha256.len(), 64);
        assert_eq!(a.sha256, hex(&Sha256::digest(&a.jsonl)));
    }
}
