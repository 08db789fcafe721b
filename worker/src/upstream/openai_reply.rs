//! Cutting an OpenAI `/v1/embeddings` reply into its embeddings without decoding a float.
//!
//! The reply is `{"data": [{"index": i, "embedding": [...], ...}, ...], ...}`. A parse with
//! serde_json (each embedding a `RawValue`) scans every digit of every number, which cost 15–20
//! times TEI's byte-wise cut of the same vectors (docs/design/upstreams.md). Here the envelope
//! is walked byte by byte instead: `data[i].embedding` is found as TEI's reply is cut (its `]`
//! by `memchr`, its bytes checked to be number text a block at a time), `data[i].index` is read
//! as an integer, and the fields the worker does not read (`object`, `model`, `usage`, anything
//! a server adds) are skipped with their strings and brackets balanced but not validated
//! further.

use bytes::Bytes;

use super::{Embedding, UpstreamError};

/// The embeddings of an OpenAI reply `body` to a call of `sent` inputs, in `index` order, each
/// a slice of `body` as the server wrote it (its floats are not decoded).
///
/// Accepted: a JSON object with a `data` array of objects, each with one `index` (a
/// non-negative integer) and one `embedding` (an array of numbers, `null` allowed as serde_json
/// writes a NaN, checked by character as TEI's reply is); other fields, at any level, are
/// skipped. Keys are matched as written (a key spelt with `\u` escapes is another key).
///
/// # Errors
/// [`UpstreamError::Malformed`] for a reply that is not OpenAI's shape (not an object, no
/// `data`, a datum without `index` or `embedding` or with either twice, unbalanced or truncated
/// JSON, bytes after the object), an embedding that is not an array of numbers (a base64
/// string, say), an `index` out of range or repeated; [`UpstreamError::CountMismatch`] for
/// another number of embeddings than `sent`.
pub(super) fn split_reply(body: &Bytes, sent: usize) -> Result<Vec<Embedding>, UpstreamError> {
    let mut scan = Scan { bytes: body, at: 0 };
    let mut data: Option<Vec<(usize, usize, usize)>> = None;
    scan.object(|scan, key| {
        if key != b"data" {
            return scan.skip_value();
        }
        if data.is_some() {
            return Err(scan.malformed("`data` twice"));
        }
        data = Some(scan.data()?);
        Ok(())
    })?;
    scan.whitespace();
    if scan.at != body.len() {
        return Err(scan.malformed("bytes after the reply"));
    }
    let data = data.ok_or_else(|| scan.malformed("no `data`"))?;
    if data.len() != sent {
        return Err(UpstreamError::CountMismatch {
            sent,
            got: data.len(),
        });
    }
    let mut ordered: Vec<Option<Embedding>> = vec![None; sent];
    for (index, start, end) in data {
        let slot = ordered
            .get_mut(index)
            .ok_or_else(|| UpstreamError::Malformed(format!("index {index} of {sent} inputs")))?;
        if slot
            .replace(Embedding::from_json(body.slice(start..end)))
            .is_some()
        {
            return Err(UpstreamError::Malformed(format!("index {index} repeated")));
        }
    }
    // `sent` data with distinct indices below `sent` fill every slot.
    Ok(ordered.into_iter().flatten().collect())
}

/// A cursor over the reply's bytes.
struct Scan<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Scan<'a> {
    /// The reply is not OpenAI's shape: `what`, at the cursor's byte offset.
    fn malformed(&self, what: &str) -> UpstreamError {
        UpstreamError::Malformed(format!(
            "not an OpenAI embeddings reply: {what} at byte {}",
            self.at
        ))
    }

    fn whitespace(&mut self) {
        while self
            .bytes
            .get(self.at)
            .is_some_and(|b| matches!(b, b' ' | b'\n' | b'\r' | b'\t'))
        {
            self.at += 1;
        }
    }

    /// The next byte after whitespace, not consumed.
    fn peek(&mut self) -> Option<u8> {
        self.whitespace();
        self.bytes.get(self.at).copied()
    }

    /// Consumes `byte` after whitespace.
    fn expect(&mut self, byte: u8) -> Result<(), UpstreamError> {
        if self.peek() != Some(byte) {
            return Err(self.malformed(&format!("expected `{}`", char::from(byte))));
        }
        self.at += 1;
        Ok(())
    }

    /// A string's raw contents (escapes left as written); the cursor after its closing quote.
    fn string(&mut self) -> Result<&'a [u8], UpstreamError> {
        self.expect(b'"')?;
        let start = self.at;
        loop {
            let Some(len) = memchr::memchr2(b'"', b'\\', &self.bytes[self.at..]) else {
                return Err(self.malformed("an unterminated string"));
            };
            self.at += len + 1;
            if self.bytes[self.at - 1] == b'"' {
                return Ok(&self.bytes[start..self.at - 1]);
            }
            // A backslash escapes the next byte (`\"`, `\\`, `\u` and the rest).
            self.at += 1;
        }
    }

    /// An object `{"key": value, ...}`, calling `field` with each key and the cursor at its
    /// value (which `field` consumes); `{}` calls nothing.
    fn object(
        &mut self,
        mut field: impl FnMut(&mut Self, &'a [u8]) -> Result<(), UpstreamError>,
    ) -> Result<(), UpstreamError> {
        self.expect(b'{')?;
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(());
        }
        loop {
            let key = self.string()?;
            self.expect(b':')?;
            self.whitespace();
            field(self, key)?;
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(self.malformed("expected `,` or `}`")),
            }
        }
    }

    /// `data`: each datum's `index` and its embedding's byte range in the reply.
    fn data(&mut self) -> Result<Vec<(usize, usize, usize)>, UpstreamError> {
        self.expect(b'[')?;
        let mut data = Vec::new();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(data);
        }
        loop {
            data.push(self.datum()?);
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(data);
                }
                _ => return Err(self.malformed("expected `,` or `]` in `data`")),
            }
        }
    }

    /// One datum, `{"index": i, "embedding": [...], ...}`: `(i, start, end)` of its embedding.
    fn datum(&mut self) -> Result<(usize, usize, usize), UpstreamError> {
        let (mut index, mut embedding) = (None, None);
        self.object(|scan, key| match key {
            b"index" if index.is_none() => {
                index = Some(scan.index()?);
                Ok(())
            }
            b"embedding" if embedding.is_none() => {
                embedding = Some(scan.embedding(index)?);
                Ok(())
            }
            b"index" | b"embedding" => Err(scan.malformed("a datum's field twice")),
            _ => scan.skip_value(),
        })?;
        match (index, embedding) {
            (Some(index), Some((start, end))) => Ok((index, start, end)),
            _ => Err(self.malformed("a datum without `index` or `embedding`")),
        }
    }

    /// A non-negative integer that fits a `usize`.
    fn index(&mut self) -> Result<usize, UpstreamError> {
        let start = self.at;
        let digits = self.bytes[start..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        self.at += digits;
        let number = std::str::from_utf8(&self.bytes[start..self.at])
            .ok()
            .and_then(|text| text.parse().ok());
        match (number, self.bytes.get(self.at)) {
            (Some(index), Some(b',' | b'}' | b' ' | b'\n' | b'\r' | b'\t')) => Ok(index),
            _ => Err(self.malformed("`index` is not a non-negative integer")),
        }
    }

    /// The byte range of an embedding: an array holding only number text, TEI's check.
    /// `index`, when already read, names it in the error.
    fn embedding(&mut self, index: Option<usize>) -> Result<(usize, usize), UpstreamError> {
        let start = self.at;
        let end = (self.bytes.get(start) == Some(&b'['))
            .then(|| memchr::memchr(b']', &self.bytes[start..]))
            .flatten()
            .map(|len| start + len + 1)
            .filter(|&end| all_number_text(&self.bytes[start + 1..end - 1]));
        let Some(end) = end else {
            let which = index.map_or_else(|| "an ".to_owned(), |i| format!("data[{i}]."));
            return Err(UpstreamError::Malformed(format!(
                "{which}embedding is not an array of numbers"
            )));
        };
        self.at = end;
        Ok((start, end))
    }

    /// Skips one value of a field the worker does not read: a string, an object or an array
    /// (strings and brackets balanced), or a number or literal (its characters up to the next
    /// `,`, `}`, `]` or whitespace).
    fn skip_value(&mut self) -> Result<(), UpstreamError> {
        match self.peek() {
            Some(b'"') => self.string().map(drop),
            Some(b'{' | b'[') => self.skip_nested(),
            Some(_) => {
                let start = self.at;
                self.at += self.bytes[start..]
                    .iter()
                    .take_while(|b| !matches!(b, b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t'))
                    .count();
                if self.at == start {
                    return Err(self.malformed("a value is missing"));
                }
                Ok(())
            }
            None => Err(self.malformed("a value is missing")),
        }
    }

    /// Skips an object or array, its strings and its nested brackets balanced.
    fn skip_nested(&mut self) -> Result<(), UpstreamError> {
        let mut open: Vec<u8> = Vec::new();
        loop {
            match self.bytes.get(self.at) {
                Some(b'"') => {
                    self.string()?;
                    continue;
                }
                Some(&b @ (b'{' | b'[')) => open.push(if b == b'{' { b'}' } else { b']' }),
                Some(&b @ (b'}' | b']')) => {
                    if open.pop() != Some(b) {
                        return Err(self.malformed("unbalanced brackets"));
                    }
                    if open.is_empty() {
                        self.at += 1;
                        return Ok(());
                    }
                }
                Some(_) => {}
                None => return Err(self.malformed("truncated")),
            }
            self.at += 1;
        }
    }
}

/// Whether every byte of `values` is number text: a digit, `- + . e E`, the letters of `null`,
/// a comma or JSON whitespace, as TEI's reply is checked (the batcher's `Embedding::split_reply`).
/// Each 64-byte block is folded without an early exit, so it compiles to vector compares.
fn all_number_text(values: &[u8]) -> bool {
    const PUNCTUATION: &[u8; 13] = b"nul-+.eE, \n\r\t";
    values.chunks(64).all(|block| {
        block.iter().fold(true, |ok, &b| {
            ok & PUNCTUATION
                .iter()
                .fold(b.wrapping_sub(b'0') < 10, |any, &c| any | (b == c))
        })
    })
}
