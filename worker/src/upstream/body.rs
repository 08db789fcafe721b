//! The body of a call to TEI's `POST /embed`, `{"inputs": [...], <options>}`, written in chunks
//! while it is sent instead of into one buffer first.
//!
//! A batch of long inputs is large: 32 inputs of 2 MiB make a 64 MiB body, which a buffer would
//! hold for the whole call, next to the inputs themselves (the batcher keeps them until the call
//! ends, to retry or isolate). Written as it is sent, the body costs a few chunks of
//! [`CHUNK_BYTES`] (those written ahead, [`CHUNKS_AHEAD`], and the ones being written and sent).
//! The bytes are exactly `serde_json`'s for the same request; their length is counted first, so
//! the call carries a `Content-Length`, as before.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use embatch_protocol::{EmbedOptions, Input};
use http_body::{Frame, SizeHint};
use serde::Serialize;
use tokio::sync::mpsc;

/// Size of one chunk of the body, in bytes (64 KiB).
pub(super) const CHUNK_BYTES: usize = 64 << 10;

/// Chunks written ahead of the connection: 2.
const CHUNKS_AHEAD: usize = 2;

/// A text is escaped this many bytes at a time (8 KiB; at most 6 times that once escaped), so a
/// chunk stays under 2 × [`CHUNK_BYTES`].
const PIECE_BYTES: usize = 8 << 10;

/// The request body in TEI's shape, as `serde_json` writes it.
#[derive(Serialize)]
pub(super) struct TeiRequest<'a> {
    pub(super) inputs: &'a [Input],
    #[serde(flatten)]
    pub(super) options: &'a EmbedOptions,
}

/// The body of one call: its chunks arrive from [`BodyWriter::write`], which the call runs
/// next to sending it.
pub(super) struct ChunkedBody {
    chunks: mpsc::Receiver<Bytes>,
    /// Bytes not yet handed to the connection.
    remaining: u64,
}

/// Writes the chunks of a [`ChunkedBody`].
pub(super) struct BodyWriter {
    chunks: mpsc::Sender<Bytes>,
}

/// A body for `request`, and its writer. The body's length is known at once (it is counted
/// here, without keeping the bytes).
pub(super) fn body(request: &TeiRequest<'_>) -> (ChunkedBody, BodyWriter) {
    let mut counted = Counted(0);
    // Writing into a counter cannot fail: every `Input` and option is plain JSON.
    let _ = serde_json::to_writer(&mut counted, request);
    let (tx, rx) = mpsc::channel(CHUNKS_AHEAD);
    (
        ChunkedBody {
            chunks: rx,
            remaining: counted.0,
        },
        BodyWriter { chunks: tx },
    )
}

impl BodyWriter {
    /// Writes `request` into the body, a chunk at a time, as fast as the connection takes it.
    /// Ends early, silently, when the body is dropped (the call ended or failed: its error is
    /// the call's).
    pub(super) async fn write(self, request: &TeiRequest<'_>) {
        let mut out = Out {
            chunk: Vec::with_capacity(CHUNK_BYTES),
            chunks: self.chunks,
        };
        let _ = out.write(request).await;
    }
}

/// The chunk being written and where full ones go.
struct Out {
    chunk: Vec<u8>,
    chunks: mpsc::Sender<Bytes>,
}

/// The body was dropped: stop writing.
struct Dropped;

impl Out {
    async fn write(&mut self, request: &TeiRequest<'_>) -> Result<(), Dropped> {
        self.chunk.extend_from_slice(b"{\"inputs\":[");
        for (i, input) in request.inputs.iter().enumerate() {
            if i > 0 {
                self.chunk.push(b',');
            }
            match input {
                Input::Text(text) => {
                    self.chunk.push(b'"');
                    let mut rest = text.as_str();
                    while !rest.is_empty() {
                        let (piece, after) = rest.split_at(char_floor(rest, PIECE_BYTES));
                        write_escaped(&mut self.chunk, piece);
                        rest = after;
                        self.flush_full().await?;
                    }
                    self.chunk.push(b'"');
                }
                // Token ids: at most a few thousand numbers. (A rerank pair never goes to
                // `/embed`; written as TEI's pair `["q","t"]` if it did.)
                Input::Ids(_) | Input::Pair(..) => {
                    let _ = serde_json::to_writer(&mut self.chunk, input);
                }
            }
            self.flush_full().await?;
        }
        self.chunk.push(b']');
        // The options, flattened into the same object: `{"normalize":true,...}` without its
        // opening brace (`serde(flatten)` writes the same fields in the same order).
        let options = serde_json::to_vec(request.options).unwrap_or_else(|_| b"{}".to_vec());
        match options.get(1..) {
            Some(fields) if fields != b"}" => {
                self.chunk.push(b',');
                self.chunk.extend_from_slice(fields);
            }
            _ => self.chunk.push(b'}'),
        }
        self.send().await
    }

    /// Sends the chunk when it holds [`CHUNK_BYTES`] or more.
    async fn flush_full(&mut self) -> Result<(), Dropped> {
        if self.chunk.len() >= CHUNK_BYTES {
            self.send().await?;
        }
        Ok(())
    }

    async fn send(&mut self) -> Result<(), Dropped> {
        let full = std::mem::replace(&mut self.chunk, Vec::with_capacity(CHUNK_BYTES));
        self.chunks
            .send(Bytes::from(full))
            .await
            .map_err(|_| Dropped)
    }
}

/// Appends `text` as the inside of a JSON string (escaped as `serde_json` escapes it, without
/// the quotes): a string's escaping is per character, so a text cut at character boundaries
/// and escaped piece by piece is the whole text escaped.
fn write_escaped(out: &mut Vec<u8>, text: &str) {
    let start = out.len();
    // Writing into a `Vec` cannot fail.
    let _ = serde_json::to_writer(&mut *out, text);
    // `"..."`: drop the closing quote, then the opening one.
    out.pop();
    out.remove(start);
}

/// The largest character boundary of `text` at or below `at` bytes (at least one character).
fn char_floor(text: &str, at: usize) -> usize {
    if at >= text.len() {
        return text.len();
    }
    let mut end = at;
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    if end == 0 {
        // `at` is 0 or inside the first character: take that character.
        text.chars().next().map_or(text.len(), char::len_utf8)
    } else {
        end
    }
}

/// A writer that only counts the bytes written.
struct Counted(u64);

impl std::io::Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl http_body::Body for ChunkedBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.chunks.poll_recv(cx) {
            Poll::Ready(Some(chunk)) => {
                self.remaining = self.remaining.saturating_sub(chunk.len() as u64);
                Poll::Ready(Some(Ok(Frame::data(chunk))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use embatch_protocol::TruncationDirection;

    /// The whole body, as the connection would receive it.
    async fn written(request: &TeiRequest<'_>) -> (Vec<u8>, u64, usize) {
        let (mut body, writer) = body(request);
        let length = body.remaining;
        let collect = async {
            let mut bytes = Vec::new();
            let mut chunks = 0;
            while let Some(chunk) = body.chunks.recv().await {
                assert!(chunk.len() <= 2 * CHUNK_BYTES, "a chunk of {}", chunk.len());
                bytes.extend_from_slice(&chunk);
                chunks += 1;
            }
            (bytes, chunks)
        };
        let ((), (bytes, chunks)) = tokio::join!(writer.write(request), collect);
        (bytes, length, chunks)
    }

    #[tokio::test]
    async fn the_chunks_are_serde_jsons_bytes_and_length() {
        // Escapes and multi-byte characters on every side of the chunk boundaries.
        let awkward: String = "a\"b\\c\nd\te\u{1}é漢字🙂 ".repeat(CHUNK_BYTES / 5);
        let long = "word ".repeat(3 * CHUNK_BYTES / 5 + 7);
        let inputs = [
            Input::Text(awkward),
            Input::Ids(vec![101, 7592, 102]),
            Input::Text("short".into()),
            Input::Text(long),
        ];
        let options = [
            EmbedOptions::default(),
            EmbedOptions {
                normalize: false,
                truncate: Some(true),
                truncation_direction: Some(TruncationDirection::Left),
                prompt_name: Some("query \"q\"".into()),
                dimensions: Some(64),
                ..EmbedOptions::default()
            },
        ];
        for options in &options {
            for inputs in [&inputs[..], &inputs[1..2], &inputs[2..3]] {
                let request = TeiRequest { inputs, options };
                let expected = serde_json::to_vec(&request).expect("JSON");
                let (bytes, length, chunks) = written(&request).await;
                assert_eq!(length, expected.len() as u64);
                assert!(bytes == expected, "the body differs from serde_json's");
                if expected.len() > 2 * CHUNK_BYTES {
                    assert!(chunks > 2, "{chunks} chunks for {} bytes", expected.len());
                }
            }
        }
    }

    #[tokio::test]
    async fn a_dropped_body_stops_the_writer() {
        let inputs = vec![Input::Text("x".repeat(10 * CHUNK_BYTES))];
        let options = EmbedOptions::default();
        let request = TeiRequest {
            inputs: &inputs,
            options: &options,
        };
        let (body, writer) = body(&request);
        drop(body);
        // Returns instead of waiting for a reader forever.
        writer.write(&request).await;
    }

    #[test]
    fn char_floor_never_splits_a_character() {
        let text = "aé漢🙂";
        for at in 0..=text.len() + 1 {
            let end = char_floor(text, at);
            assert!(text.is_char_boundary(end) && end > 0, "{at} -> {end}");
        }
    }
}
