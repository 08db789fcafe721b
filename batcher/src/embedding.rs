//! One embedding as the JSON text the upstream wrote, and the split of TEI's reply into them.
//!
//! The worker never decodes a float: it cuts TEI's reply body `[[0.1,-0.2,...],[...],...]` into
//! one slice per input (sharing the body's buffer, no copy) and joins the slices of each request
//! into its reply. Decoding each number only to check it was the worker's top cost at the
//! pipeline's ceiling (serde_json's `RawValue` validation: 22–23 % of its CPU in two profiles
//! with 384-float vectors), so the split checks the shape the batcher relies on and leaves the
//! digits as TEI wrote them, as an HTTP proxy would.

use std::borrow::Cow;

use bytes::Bytes;

use crate::UpstreamError;

/// One embedding: the JSON array text of its values, e.g. `[0.0132,-0.0418,...]` (bytes, UTF-8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Embedding(Bytes);

impl Embedding {
    /// An embedding whose JSON text `json` the caller produced itself (e.g. serde_json's
    /// serialization of a `Vec<f32>`); it is not checked.
    pub fn from_json(json: impl Into<Bytes>) -> Embedding {
        Embedding(json.into())
    }

    /// The JSON text, as sent to the caller.
    pub fn json(&self) -> &[u8] {
        &self.0
    }

    /// Splits a TEI `/embed` reply body into its embeddings, in order, each a slice of `body`.
    ///
    /// Accepted: an array (`[...]`) whose elements are arrays holding only number characters
    /// (`0-9 + - . e E`), `null`, commas and JSON whitespace — the shape TEI answers (serde_json
    /// writes a NaN value as `null`; that input's caller gets it as TEI sent it, and its
    /// batch-mates are unaffected, as when the reply was parsed). The numbers are not parsed: a
    /// reply that TEI could not have written, like `[["a"]]`, `[{"x":1}]`, `[[true]]`, `[[1],2]`
    /// or `[[1]` is refused; one with a malformed number inside a well-formed array is passed
    /// on as written. An element may also be a sparse embedding, TEI's `/embed_sparse` list of
    /// `{"index": u32, "value": f32}` objects, or a list of predictions, TEI's `/predict` list
    /// of `{"score": f32, "label": string}` objects (parsed, see [`sparse_list_end`]), or an
    /// input's token vectors, TEI's `/embed_all` list of arrays of numbers (checked as dense
    /// ones, see [`nested_list_end`]): the cache cuts the batcher's replies of every kind with
    /// this one function.
    ///
    /// # Errors
    /// [`ShapeError`], naming the byte offset where the body left that shape.
    pub fn split_reply(body: &Bytes) -> Result<Vec<Embedding>, ShapeError> {
        let bytes = body.as_ref();
        let mut at = skip_whitespace(bytes, 0);
        if bytes.get(at) != Some(&b'[') {
            return Err(shape_error(
                at,
                "expected `[` opening the array of embeddings",
            ));
        }
        at = skip_whitespace(bytes, at + 1);
        let mut embeddings = Vec::new();
        if bytes.get(at) == Some(&b']') {
            return finish(bytes, at + 1, embeddings);
        }
        loop {
            if bytes.get(at) != Some(&b'[') {
                return Err(shape_error(at, "expected `[` opening an embedding"));
            }
            let end = match bytes.get(skip_whitespace(bytes, at + 1)) {
                Some(b'{') => sparse_list_end(bytes, at)?,
                Some(b'[') => nested_list_end(bytes, at)?,
                _ => dense_end(bytes, at)?,
            };
            embeddings.push(Embedding(body.slice(at..end)));
            at = skip_whitespace(bytes, end);
            match bytes.get(at) {
                Some(b',') => at = skip_whitespace(bytes, at + 1),
                Some(b']') => return finish(bytes, at + 1, embeddings),
                _ => return Err(shape_error(at, "expected `,` or `]` after an embedding")),
            }
        }
    }
}

/// The end (one past its `]`) of the dense embedding starting at `at`: an array holding only
/// number text ([`all_number_text`]), TEI's `/embed` shape. The values are not parsed.
fn dense_end(bytes: &[u8], at: usize) -> Result<usize, ShapeError> {
    let Some(len) = memchr::memchr(b']', &bytes[at..]) else {
        return Err(shape_error(at, "an embedding's `]` is missing"));
    };
    let end = at + len + 1;
    let values = &bytes[at + 1..end - 1];
    if !all_number_text(values) {
        let bad = values.iter().position(|&b| !is_number_text(b)).unwrap_or(0);
        return Err(shape_error(
            at + 1 + bad,
            "an embedding may hold only numbers (found another character)",
        ));
    }
    Ok(end)
}

/// The end (one past its `]`) of the sparse embedding starting at `at`: a JSON array of
/// `{"index": u32, "value": f32 or null}` objects, as TEI 1.9.3's `/embed_sparse` writes each
/// input's (a NaN value written as `null`). Parsed with serde_json: sparse lists are short, and
/// their shape has no cheap character test.
fn sparse_list_end(bytes: &[u8], at: usize) -> Result<usize, ShapeError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Value {
        #[serde(rename = "index")]
        _index: u32,
        // Required even though it may be `null` (a `deserialize_with` field is never defaulted).
        #[serde(rename = "value", deserialize_with = "serde::Deserialize::deserialize")]
        _value: Option<f32>,
    }
    /// One of TEI 1.9.3's `/predict` predictions.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Prediction {
        #[serde(rename = "score", deserialize_with = "serde::Deserialize::deserialize")]
        _score: Option<f32>,
        #[serde(rename = "label")]
        _label: String,
    }
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Objects {
        Sparse(#[allow(dead_code)] Vec<Value>),
        Predictions(#[allow(dead_code)] Vec<Prediction>),
    }
    let mut values = serde_json::Deserializer::from_slice(&bytes[at..]).into_iter::<Objects>();
    match values.next() {
        Some(Ok(_)) => Ok(at + values.byte_offset()),
        Some(Err(err)) => Err(shape_error(
            at,
            format!(
                "a list of objects must be a sparse embedding ({{\"index\", \"value\"}}) or \
                 predictions ({{\"score\", \"label\"}}) ({err})"
            ),
        )),
        None => Err(shape_error(at, "a sparse embedding is missing")),
    }
}

/// The end (one past its `]`) of the token vectors starting at `at`, TEI 1.9.3's `/embed_all`
/// list for one input: an array of arrays holding only number text ([`all_number_text`], as
/// a dense embedding), possibly empty.
fn nested_list_end(bytes: &[u8], at: usize) -> Result<usize, ShapeError> {
    let mut at = skip_whitespace(bytes, at + 1);
    if bytes.get(at) == Some(&b']') {
        return Ok(at + 1);
    }
    loop {
        if bytes.get(at) != Some(&b'[') {
            return Err(shape_error(at, "expected `[` opening a token's vector"));
        }
        let Some(len) = memchr::memchr(b']', &bytes[at..]) else {
            return Err(shape_error(at, "a token vector's `]` is missing"));
        };
        let end = at + len + 1;
        if !all_number_text(&bytes[at + 1..end - 1]) {
            return Err(shape_error(at, "a token vector may hold only numbers"));
        }
        at = skip_whitespace(bytes, end);
        match bytes.get(at) {
            Some(b',') => at = skip_whitespace(bytes, at + 1),
            Some(b']') => return Ok(at + 1),
            _ => return Err(shape_error(at, "expected `,` or `]` after a token vector")),
        }
    }
}

/// Only whitespace may follow the closing `]` at `at`.
fn finish(
    bytes: &[u8],
    at: usize,
    embeddings: Vec<Embedding>,
) -> Result<Vec<Embedding>, ShapeError> {
    let rest = skip_whitespace(bytes, at);
    if rest != bytes.len() {
        return Err(shape_error(rest, "trailing characters after the array"));
    }
    Ok(embeddings)
}

/// Why [`Embedding::split_reply`] refused a reply: what was expected or found, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the reply is not an array of embeddings: {what} at byte {at}")]
pub struct ShapeError {
    /// What the body holds instead of the expected shape, e.g. "an embedding's `]` is missing".
    pub what: Cow<'static, str>,
    /// The byte offset in the body where it left the shape.
    pub at: usize,
}

/// The reply is not TEI's: 424 `Backend`, as any malformed reply.
impl From<ShapeError> for UpstreamError {
    fn from(err: ShapeError) -> UpstreamError {
        UpstreamError::Malformed(err.to_string())
    }
}

fn shape_error(at: usize, what: impl Into<Cow<'static, str>>) -> ShapeError {
    ShapeError {
        what: what.into(),
        at,
    }
}

fn skip_whitespace(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at).is_some_and(|b| is_whitespace(*b)) {
        at += 1;
    }
    at
}

fn is_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

/// The characters of a JSON number list besides the digits: sign, point, exponent, comma, JSON
/// whitespace, and the letters of `null`.
const NUMBER_PUNCTUATION: &[u8; 13] = b"nul-+.eE, \n\r\t";

/// A character of a JSON number list: a digit or one of [`NUMBER_PUNCTUATION`]. Written without
/// branches (the fold over a constant array unrolls into compares joined by `|`), so
/// [`all_number_text`] compiles to SIMD compares.
fn is_number_text(b: u8) -> bool {
    NUMBER_PUNCTUATION
        .iter()
        .fold(b.wrapping_sub(b'0') < 10, |any, &c| any | (b == c))
}

/// Whether every byte of `values` [`is_number_text`], 64 bytes at a time (no early exit inside a
/// block, so each block is checked with vector instructions).
fn all_number_text(values: &[u8]) -> bool {
    values
        .chunks(64)
        .all(|block| block.iter().fold(true, |ok, &b| ok & is_number_text(b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(body: &str) -> Result<Vec<String>, String> {
        Embedding::split_reply(&Bytes::copy_from_slice(body.as_bytes()))
            .map(|v| {
                v.iter()
                    .map(|e| String::from_utf8(e.json().to_vec()).expect("utf-8"))
                    .collect()
            })
            .map_err(|e| e.to_string())
    }

    #[test]
    fn splits_tei_replies_into_the_arrays_as_written() {
        assert_eq!(
            split("[[0.1,-2e-3],[3.5E+2, 4]]").expect("valid"),
            ["[0.1,-2e-3]", "[3.5E+2, 4]"]
        );
        assert_eq!(
            split(" [ [1] ,\n [2]\t] \n").expect("valid"),
            ["[1]", "[2]"]
        );
        assert_eq!(split("[]").expect("valid"), Vec::<String>::new());
        assert_eq!(split("[[]]").expect("valid"), ["[]"]);
        // A NaN value, as serde_json (and so TEI) writes it.
        assert_eq!(split("[[0.5,null]]").expect("valid"), ["[0.5,null]"]);
    }

    #[test]
    fn refuses_what_tei_cannot_have_written_naming_the_offset() {
        for (body, offset, what) in [
            ("", 0, "expected `[` opening the array"),
            ("{\"error\":\"x\"}", 0, "expected `[` opening the array"),
            ("[1,2]", 1, "expected `[` opening an embedding"),
            ("[[1],2]", 5, "expected `[` opening an embedding"),
            ("[[\"a\"]]", 2, "only numbers"),
            ("[[true]]", 2, "only numbers"),
            ("[[[1],2]]", 6, "opening a token's vector"),
            ("[[[\"a\"]]]", 2, "token vector may hold only numbers"),
            ("[[1]", 4, "expected `,` or `]`"),
            ("[[1] [2]]", 5, "expected `,` or `]`"),
            ("[[1,2", 1, "`]` is missing"),
            ("[[1]] x", 6, "trailing characters"),
        ] {
            let err = split(body).expect_err(body);
            assert!(
                err.contains(what) && err.ends_with(&format!("at byte {offset}")),
                "{body:?}: {err}"
            );
        }
    }

    #[test]
    fn token_vectors_and_predictions_are_cut_as_written() {
        let all = "[[[1,2],[3,4]], [] ,[ [5,6] ]]";
        assert_eq!(
            split(all).expect("TEI's /embed_all shape"),
            ["[[1,2],[3,4]]", "[]", "[ [5,6] ]"]
        );
        let predictions = r#"[[{"score":0.9,"label":"pos"},{"score":0.1,"label":"neg"}],[]]"#;
        assert_eq!(
            split(predictions).expect("TEI's /predict shape"),
            [
                r#"[{"score":0.9,"label":"pos"},{"score":0.1,"label":"neg"}]"#,
                "[]"
            ]
        );
        for body in [
            r#"[[{"score":0.9}]]"#,
            r#"[[{"score":1,"label":2}]]"#,
            "[[[1],[2]",
        ] {
            assert!(split(body).is_err(), "{body}");
        }
    }

    #[test]
    fn sparse_lists_are_cut_as_written_and_checked() {
        let sparse = r#"[[{"index":3,"value":0.5}], [] ,[ {"index":1,"value":null}]]"#;
        assert_eq!(
            split(sparse).expect("TEI's sparse shape"),
            [
                r#"[{"index":3,"value":0.5}]"#,
                "[]",
                r#"[ {"index":1,"value":null}]"#
            ]
        );
        for body in [
            r#"[[{"index":"a","value":1}]]"#,
            r#"[[{"index":1}]]"#,
            r#"[[{"index":1,"value":1,"x":2}]]"#,
            r#"[[{"index":1,"value":1}, 2]]"#,
            r#"[[{"index":1,"value":1}]"#,
        ] {
            assert!(split(body).is_err(), "{body}");
        }
    }

    #[test]
    fn slices_share_the_reply_buffer() {
        let body = Bytes::from_static(b"[[1,2],[3]]");
        let split = Embedding::split_reply(&body).expect("valid");
        assert_eq!(split[1].json().as_ptr(), body[7..].as_ptr());
    }
}
