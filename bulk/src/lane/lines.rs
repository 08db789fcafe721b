//! One input line of a batch file, read and checked: OpenAI's batch request line
//! `{"custom_id", "method": "POST", "url": "/v1/embeddings" | "/embed", "body": {...}}`.

use std::collections::HashSet;

use embatch_protocol::bulk::{BatchError, EncodingFormat, ItemLine, LineRoute};
use embatch_protocol::request::Inputs;
use embatch_protocol::{EmbedError, EmbedRequest};
use serde::Deserialize;

/// The limits a file's lines are checked against (the worker's `BULK_*` settings).
#[derive(Debug, Clone, Copy)]
pub struct LineLimits {
    /// Most requests (lines) in one file (OpenAI's 50,000).
    pub max_requests: u64,
    /// Most inputs in one line (OpenAI's 2,048 per embeddings request).
    pub max_line_inputs: usize,
}

/// A line as written, before its body is read by its route.
#[derive(Debug, Deserialize)]
struct RawLine {
    custom_id: Option<serde_json::Value>,
    method: Option<String>,
    url: Option<String>,
    body: Option<Box<serde_json::value::RawValue>>,
}

/// OpenAI's embeddings request body, as `POST /v1/embeddings` reads it.
#[derive(Debug, Deserialize)]
struct OpenAiBody {
    input: Inputs,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    encoding_format: Option<EncodingFormat>,
    #[serde(default)]
    dimensions: Option<usize>,
}

/// The checks that span lines: `custom_id`s seen, the model named, the count.
#[derive(Debug, Default)]
pub struct FileCheck {
    custom_ids: HashSet<String>,
    model: Option<(String, u64)>,
    /// The models served and the model of a line that names none; `None`: lines are not
    /// checked against the models served (a line without a model then names none).
    models: Option<Models>,
    /// Lines read (blank lines excluded).
    pub requests: u64,
}

/// What [`FileCheck::for_models`] checks lines' models against.
#[derive(Debug)]
struct Models {
    served: Vec<String>,
    default: String,
}

/// The error of line `line` (1-based): `message` prefixed with `line N: `.
pub(super) fn error(code: &str, param: Option<&str>, line: u64, message: String) -> BatchError {
    BatchError {
        code: code.to_owned(),
        message: format!("line {line}: {message}"),
        param: param.map(str::to_owned),
        line: Some(line),
    }
}

impl FileCheck {
    /// A check of a file whose lines must name one of `served` (a line without a model, or
    /// with `""`, names `default`): the job's model, as OpenAI requires one per batch.
    pub fn for_models(served: Vec<String>, default: String) -> FileCheck {
        FileCheck {
            models: Some(Models { served, default }),
            ..FileCheck::default()
        }
    }

    /// The batch's model: the first valid line's (its own, or the default).
    pub fn model(&self) -> Option<&str> {
        self.model.as_ref().map(|(name, _)| name.as_str())
    }

    /// Reads line `line` (1-based) of the file, `text` without its line break.
    ///
    /// # Errors
    /// The [`BatchError`] naming the field, the line and the limit: `invalid_json`,
    /// `missing_custom_id`, `duplicate_custom_id`, `invalid_method`, `invalid_url`,
    /// `missing_body`, `invalid_body`, `empty_input`, `too_many_inputs`, `model_mismatch`,
    /// `too_many_requests`.
    pub fn line(
        &mut self,
        line: u64,
        text: &str,
        limits: LineLimits,
    ) -> Result<ItemLine, BatchError> {
        self.requests += 1;
        if self.requests > limits.max_requests {
            return Err(error(
                "too_many_requests",
                None,
                line,
                format!(
                    "the file holds more than {} requests (BULK_MAX_REQUESTS)",
                    limits.max_requests
                ),
            ));
        }
        let raw: RawLine = serde_json::from_str(text).map_err(|e| {
            error(
                "invalid_json",
                None,
                line,
                format!("not a JSON object: {e}"),
            )
        })?;
        let custom_id = self.custom_id(raw.custom_id, line)?;
        let route = route(raw.method.as_deref(), raw.url.as_deref(), line)?;
        let Some(body) = raw.body else {
            return Err(error(
                "missing_body",
                Some("body"),
                line,
                "`body` is required".into(),
            ));
        };
        let (request, model, encoding_format) = read_body(route, &body, line, limits)?;
        self.check_model(model.as_deref(), line)?;
        Ok(ItemLine {
            line,
            custom_id,
            route,
            request,
            model,
            encoding_format,
        })
    }

    /// The line's `custom_id`: a non-empty string no earlier line had.
    fn custom_id(
        &mut self,
        custom_id: Option<serde_json::Value>,
        line: u64,
    ) -> Result<String, BatchError> {
        let custom_id = match custom_id {
            Some(serde_json::Value::String(id)) if !id.is_empty() => id,
            Some(_) => {
                return Err(error(
                    "invalid_custom_id",
                    Some("custom_id"),
                    line,
                    "`custom_id` must be a non-empty string".into(),
                ));
            }
            None => {
                return Err(error(
                    "missing_custom_id",
                    Some("custom_id"),
                    line,
                    "`custom_id` is required".into(),
                ));
            }
        };
        if !self.custom_ids.insert(custom_id.clone()) {
            return Err(error(
                "duplicate_custom_id",
                Some("custom_id"),
                line,
                format!("`custom_id` {custom_id:?} appears on an earlier line"),
            ));
        }
        Ok(custom_id)
    }

    /// The line's model (its own `body.model`, or the default) is one served, and the same as
    /// the first line's: a batch uses one model, as OpenAI's.
    fn check_model(&mut self, model: Option<&str>, line: u64) -> Result<(), BatchError> {
        let named = model.filter(|m| !m.is_empty());
        let name = match (&self.models, named) {
            (Some(models), named) => {
                let name = named.unwrap_or(&models.default);
                if !models.served.iter().any(|s| s == name) {
                    return Err(error(
                        "model_not_found",
                        Some("body.model"),
                        line,
                        format!(
                            "the model `{name}` does not exist or you do not have access to \
                             it. Models served: {}",
                            models.served.join(", ")
                        ),
                    ));
                }
                Some(name.to_owned())
            }
            (None, named) => named.map(str::to_owned),
        };
        if let Some(name) = name {
            match &self.model {
                None => self.model = Some((name, line)),
                Some((first, first_line)) if *first != name => {
                    return Err(error(
                        "model_mismatch",
                        Some("body.model"),
                        line,
                        format!(
                            "`body.model` is {name:?}, but line {first_line} names {first:?}: \
                             a batch uses one model"
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

/// The route of a line: `method` POST (or absent) and `url` one of the batch's embeddings
/// endpoints.
fn route(method: Option<&str>, url: Option<&str>, line: u64) -> Result<LineRoute, BatchError> {
    if let Some(method) = method
        && method != "POST"
    {
        return Err(error(
            "invalid_method",
            Some("method"),
            line,
            format!("`method` must be \"POST\", got {method:?}"),
        ));
    }
    match url {
        Some("/v1/embeddings") => Ok(LineRoute::OpenAi),
        Some("/embed") => Ok(LineRoute::Tei),
        other => Err(error(
            "invalid_url",
            Some("url"),
            line,
            format!(
                "`url` must be \"/v1/embeddings\" or \"/embed\" (the batch's \
                 embeddings endpoints), got {other:?}"
            ),
        )),
    }
}

/// The line's `body` read as its route reads it and validated: the request, the model it
/// names and the encoding of its vectors.
fn read_body(
    route: LineRoute,
    body: &serde_json::value::RawValue,
    line: u64,
    limits: LineLimits,
) -> Result<(EmbedRequest, Option<String>, EncodingFormat), BatchError> {
    let body_error = |e: EmbedError| {
        let (code, param) = if matches!(e, EmbedError::Empty(_)) {
            ("empty_input", "body.input")
        } else {
            ("invalid_body", "body")
        };
        error(code, Some(param), line, format!("`body`: {e}"))
    };
    let (request, model, encoding_format) = match route {
        LineRoute::OpenAi => {
            let body: OpenAiBody = serde_json::from_str(body.get()).map_err(|e| {
                body_error(EmbedError::Validation(format!(
                    "not an embeddings request: {e}"
                )))
            })?;
            let request = EmbedRequest {
                inputs: body.input,
                normalize: true,
                truncate: None,
                truncation_direction: None,
                prompt_name: None,
                prompt_hint: None,
                output_dtype: None,
                dimensions: body.dimensions,
            };
            (
                request,
                body.model,
                body.encoding_format.unwrap_or_default(),
            )
        }
        LineRoute::Tei => (
            EmbedRequest::from_slice(body.get().as_bytes()).map_err(body_error)?,
            None,
            EncodingFormat::Float,
        ),
    };
    // The output files hold float vectors only: a compact type asked is refused, not dropped.
    if request.output_dtype.is_some() {
        return Err(error(
            "invalid_value",
            Some("body.output_dtype"),
            line,
            "`body.output_dtype`: batch output files hold float vectors only; leave it out".into(),
        ));
    }
    // Counted here, not read from the error's words: more inputs than the line may carry.
    let inputs = request.inputs.len();
    if inputs > limits.max_line_inputs && !request.inputs.as_slice().iter().any(|i| i.is_empty()) {
        return Err(error(
            "too_many_inputs",
            Some("body.input"),
            line,
            format!(
                "`body.input` holds {inputs} inputs, more than {} (BULK_MAX_LINE_INPUTS)",
                limits.max_line_inputs
            ),
        ));
    }
    request
        .validate(limits.max_line_inputs)
        .map_err(body_error)?;
    Ok((request, model, encoding_format))
}

/// The `custom_id` of a line, if it has one (for the error entries of lines a cancelled or
/// expired batch never ran).
pub fn custom_id_of(text: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Id {
        custom_id: Option<String>,
    }
    serde_json::from_str::<Id>(text).ok()?.custom_id
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: LineLimits = LineLimits {
        max_requests: 3,
        max_line_inputs: 2,
    };

    fn check(lines: &[&str]) -> Vec<Result<ItemLine, BatchError>> {
        let mut file = FileCheck::default();
        lines
            .iter()
            .enumerate()
            .map(|(i, l)| file.line(i as u64 + 1, l, LIMITS))
            .collect()
    }

    fn code(r: &Result<ItemLine, BatchError>) -> &str {
        r.as_ref().err().map_or("ok", |e| e.code.as_str())
    }

    #[test]
    fn lines_must_name_a_served_model_and_one_per_file() {
        let mut file = FileCheck::for_models(vec!["a".into(), "b/c.d".into()], "a".into());
        let mut line = |n: u64, text: &str| file.line(n, text, LIMITS);
        let r = line(
            1,
            r#"{"custom_id":"1","url":"/v1/embeddings","body":{"input":"x"}}"#,
        );
        assert!(r.is_ok(), "no model: the default");
        let r = line(
            2,
            r#"{"custom_id":"2","url":"/v1/embeddings","body":{"model":"nope","input":"x"}}"#,
        );
        let e = r.expect_err("not served");
        assert_eq!(
            (e.code.as_str(), e.param.as_deref()),
            ("model_not_found", Some("body.model"))
        );
        assert!(
            e.message.ends_with("Models served: a, b/c.d"),
            "{}",
            e.message
        );
        let r = line(
            3,
            r#"{"custom_id":"3","url":"/v1/embeddings","body":{"model":"b/c.d","input":"x"}}"#,
        );
        assert_eq!(code(&r), "model_mismatch", "line 1 took the default, a");
        assert_eq!(file.model(), Some("a"));
    }

    #[test]
    fn good_lines_of_both_routes() {
        let r = check(&[
            r#"{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":{"model":"m","input":["x","y"],"encoding_format":"base64"}}"#,
            r#"{"custom_id":"b","url":"/embed","body":{"inputs":"z","normalize":false}}"#,
        ]);
        let a = r[0].as_ref().expect("valid");
        assert_eq!(a.route, LineRoute::OpenAi);
        assert_eq!(a.request.inputs.len(), 2);
        assert_eq!(a.encoding_format, EncodingFormat::Base64);
        let b = r[1].as_ref().expect("valid");
        assert_eq!(b.route, LineRoute::Tei);
        assert!(!b.request.normalize);
    }

    #[test]
    fn a_compact_output_type_is_refused_not_dropped() {
        let r = check(&[
            r#"{"custom_id":"a","url":"/embed","body":{"inputs":"x","output_dtype":"int8"}}"#,
        ]);
        let e = r[0].as_ref().expect_err("floats only");
        assert_eq!(e.code, "invalid_value");
        assert_eq!(e.param.as_deref(), Some("body.output_dtype"));
    }

    #[test]
    fn every_rejection_names_field_line_and_limit() {
        let r = check(&[
            "{oops",
            r#"{"url":"/v1/embeddings","body":{"input":"x"}}"#,
            r#"{"custom_id":"a","url":"/v1/chat/completions","body":{}}"#,
            r#"{"custom_id":"a","url":"/v1/embeddings","body":{"input":"x"}}"#,
        ]);
        assert_eq!(code(&r[0]), "invalid_json");
        assert_eq!(code(&r[1]), "missing_custom_id");
        assert_eq!(code(&r[2]), "invalid_url");
        assert_eq!(code(&r[3]), "too_many_requests");
        let e = r[3].as_ref().expect_err("over the limit");
        assert!(e.message.contains("line 4") && e.message.contains("more than 3"));

        let r = check(&[
            r#"{"custom_id":"a","url":"/v1/embeddings","body":{"model":"m","input":"x"}}"#,
            r#"{"custom_id":"a","url":"/v1/embeddings","body":{"input":"x"}}"#,
            r#"{"custom_id":"c","url":"/v1/embeddings","body":{"model":"n","input":"x"}}"#,
        ]);
        assert_eq!(code(&r[1]), "duplicate_custom_id");
        assert_eq!(code(&r[2]), "model_mismatch");
        let r = check(&[r#"{"custom_id":"a","url":"/embed","body":{"inputs":["a","b","c"]}}"#]);
        let e = r[0].as_ref().expect_err("3 inputs > 2");
        assert_eq!(e.code, "too_many_inputs");
        assert_eq!(e.param.as_deref(), Some("body.input"));
        assert!(e.message.contains("line 1") && e.message.contains("more than 2"));

        let r = check(&[
            r#"{"custom_id":"a","method":"GET","url":"/embed","body":{"inputs":"x"}}"#,
            r#"{"custom_id":"b","url":"/embed","body":{"inputs":["a",""]}}"#,
            r#"{"custom_id":"c","url":"/embed","body":{"inputs":["a","b",""]}}"#,
        ]);
        assert_eq!(code(&r[0]), "invalid_method");
        assert_eq!(code(&r[1]), "empty_input");
        assert_eq!(
            code(&r[2]),
            "empty_input",
            "an empty input, whatever the count"
        );
        let r = check(&[
            r#"{"custom_id":"a","url":"/v1/embeddings","body":{"input":"x","dimensions":0}}"#,
            r#"{"custom_id":"b","url":"/v1/embeddings","body":{"inputs":"x"}}"#,
            r#"{"custom_id":"c","url":"/v1/embeddings"}"#,
        ]);
        assert_eq!(code(&r[0]), "invalid_body");
        assert_eq!(code(&r[1]), "invalid_body");
        assert_eq!(code(&r[2]), "missing_body");
    }
}
