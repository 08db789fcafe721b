//! Reading a batch's input file line by line, as bytes.
//!
//! A line is read up to its `\n` whatever its bytes are, and decoded on its own: a line that is
//! not UTF-8, or longer than a work item can carry, is refused with its line number
//! ([`decode`]), and the lines after it are still read and checked. (Reading lines into a
//! `String` failed the whole read at the first byte that was not UTF-8, and the job was retried
//! for good.) At most [`max_line_bytes`] of a line are held in memory, whatever its length.

use embatch_protocol::bulk::BatchError;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

use super::lines::error;

/// The UTF-8 byte-order mark, ignored at the start of a file (some editors write it).
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Bytes of a work item's message kept for its envelope (`batch_id`, `chunk`, the JSON
/// structure, the `Nats-Msg-Id` header): a line may hold the server's `max_payload` less this.
pub const ITEM_ENVELOPE: usize = 4096;

/// The longest input line, in bytes (its line break excluded): the NATS server's
/// `max_payload` (bytes, from the server's INFO) less [`ITEM_ENVELOPE`], so that a work item
/// holding the line alone fits one message. 1,044,480 with nats-server's default `max_payload`
/// of 1 MiB.
pub fn max_line_bytes(max_payload: usize) -> usize {
    max_payload.saturating_sub(ITEM_ENVELOPE).max(1024)
}

/// One line as read: its 1-based number, its first bytes (at most the reader's cap; without
/// the `\n`, trailing `\r`s and, on line 1, a byte-order mark) and its whole length.
#[derive(Debug)]
pub struct Line<'a> {
    /// 1-based line number in the file.
    pub number: u64,
    /// The line's bytes, cut at the reader's cap when `len` exceeds it.
    pub bytes: &'a [u8],
    /// The line's whole length in bytes (without its line break).
    pub len: usize,
}

/// Reads a file's lines as bytes, holding at most `cap` bytes of each.
pub struct LineReader<R> {
    inner: R,
    cap: usize,
    number: u64,
    buf: Vec<u8>,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    /// A reader of `inner` that keeps at most `cap` bytes of a line.
    pub fn new(inner: R, cap: usize) -> LineReader<R> {
        LineReader {
            inner,
            cap,
            number: 0,
            buf: Vec::new(),
        }
    }

    /// The next line; `None` at the end of the file. A last line without `\n` is a line.
    ///
    /// # Errors
    /// The underlying reader's error (the file cannot be read; never its content).
    pub async fn next(&mut self) -> std::io::Result<Option<Line<'_>>> {
        self.buf.clear();
        let (mut len, mut newline, mut any) = (0usize, false, false);
        loop {
            let available = self.inner.fill_buf().await?;
            if available.is_empty() {
                break;
            }
            any = true;
            let take = match memchr::memchr(b'\n', available) {
                Some(at) => {
                    newline = true;
                    at + 1
                }
                None => available.len(),
            };
            // A byte more than the cap (and a byte-order mark) is kept, so a cut line is never
            // taken for a whole one.
            let room = (self.cap + 1 + BOM.len()).saturating_sub(self.buf.len());
            self.buf.extend_from_slice(&available[..take.min(room)]);
            len += take;
            self.inner.consume(take);
            if newline {
                break;
            }
        }
        if !any {
            return Ok(None);
        }
        self.number += 1;
        let mut start = 0;
        if self.number == 1 && self.buf.starts_with(BOM) {
            start = BOM.len();
            len -= BOM.len();
        }
        if newline {
            len -= 1;
        }
        let mut end = self.buf.len().min(start + len);
        if end - start == len {
            // The whole line is held: its trailing `\r`s (CRLF line ends) go too.
            while end > start && self.buf[end - 1] == b'\r' {
                end -= 1;
                len -= 1;
            }
        }
        Ok(Some(Line {
            number: self.number,
            bytes: &self.buf[start..end.min(start + self.cap)],
            len,
        }))
    }
}

/// The text of `line`, or the error that refuses it: `line_too_large` when it is longer than
/// `cap` bytes, `invalid_utf8` when its bytes are not UTF-8 (the message names the first bad
/// byte's position in the line, 1-based).
///
/// # Errors
/// The [`BatchError`] naming the line and the limit.
pub fn decode<'a>(line: &Line<'a>, cap: usize, max_payload: usize) -> Result<&'a str, BatchError> {
    if line.len > cap {
        return Err(error(
            "line_too_large",
            None,
            line.number,
            format!(
                "the line is {} bytes long, more than the {cap} bytes a line may hold (the NATS \
                 server's max_payload of {max_payload} bytes less {ITEM_ENVELOPE}: a work item \
                 must fit one message)",
                line.len
            ),
        ));
    }
    std::str::from_utf8(line.bytes).map_err(|e| {
        error(
            "invalid_utf8",
            None,
            line.number,
            format!(
                "the line is not valid UTF-8 (byte {} of the line): a batch file is UTF-8 text",
                e.valid_up_to() + 1
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read(file: &[u8], cap: usize) -> Vec<(u64, Vec<u8>, usize)> {
        // A small buffer, so lines span several fills.
        let mut reader = LineReader::new(tokio::io::BufReader::with_capacity(3, file), cap);
        let mut lines = Vec::new();
        while let Some(line) = reader.next().await.expect("an in-memory read") {
            lines.push((line.number, line.bytes.to_vec(), line.len));
        }
        lines
    }

    #[tokio::test]
    async fn lines_are_bytes_without_their_breaks_and_the_bom() {
        let lines = read(b"\xEF\xBB\xBFab\r\n\xFF\xFEc\n\nlast", 100).await;
        assert_eq!(
            lines,
            [
                (1, b"ab".to_vec(), 2),
                (2, b"\xFF\xFEc".to_vec(), 3),
                (3, Vec::new(), 0),
                (4, b"last".to_vec(), 4),
            ]
        );
        assert!(read(b"", 100).await.is_empty(), "an empty file has no line");
        assert_eq!(read(b"\n", 100).await, [(1, Vec::new(), 0)]);
        assert_eq!(
            read(b"a\xEF\xBB\xBF\n\xEF\xBB\xBFb", 100).await,
            [
                (1, b"a\xEF\xBB\xBF".to_vec(), 4),
                (2, b"\xEF\xBB\xBFb".to_vec(), 4)
            ],
            "a byte-order mark is dropped only at the start of the file"
        );
    }

    #[tokio::test]
    async fn a_line_over_the_cap_is_cut_but_its_length_counted() {
        let mut file = vec![b'x'; 50];
        file.extend_from_slice(b"\r\nshort\n");
        let lines = read(&file, 10).await;
        assert_eq!(lines[0].0, 1);
        assert_eq!(lines[0].1, vec![b'x'; 10], "at most the cap is held");
        assert!(lines[0].2 > 10, "its length says it is over the cap");
        assert_eq!(
            lines[1],
            (2, b"short".to_vec(), 5),
            "the next line is whole"
        );
        // Exactly at the cap is allowed; one byte over is not.
        let at = read(&[b'y'; 10], 10).await;
        assert_eq!((at[0].1.len(), at[0].2), (10, 10));
        let over = read(&[b'y'; 11], 10).await;
        assert_eq!((over[0].1.len(), over[0].2), (10, 11));
        let mut marked = BOM.to_vec();
        marked.extend_from_slice(&[b'y'; 10]);
        assert_eq!(
            read(&marked, 10).await,
            [(1, vec![b'y'; 10], 10)],
            "the mark does not count"
        );
    }

    #[test]
    fn decode_names_the_line_and_the_limit() {
        let line = |bytes: &'static [u8], len| Line {
            number: 7,
            bytes,
            len,
        };
        assert_eq!(decode(&line(b"{}", 2), 10, 4106), Ok("{}"));
        let e = decode(&line(b"ab\xC3", 3), 10, 4106).expect_err("cut UTF-8");
        assert_eq!((e.code.as_str(), e.line), ("invalid_utf8", Some(7)));
        assert!(e.message.starts_with("line 7: ") && e.message.contains("byte 3"));
        let e = decode(&line(b"0123456789", 11), 10, 4106).expect_err("too long");
        assert_eq!((e.code.as_str(), e.line), ("line_too_large", Some(7)));
        assert!(e.message.contains("11 bytes") && e.message.contains("10 bytes"));
    }

    #[test]
    fn a_line_at_the_limit_fits_a_message_with_room_for_its_envelope() {
        assert_eq!(max_line_bytes(1 << 20), 1_044_480);
        assert_eq!(max_line_bytes(0), 1024, "never below 1 KiB");
    }
}
