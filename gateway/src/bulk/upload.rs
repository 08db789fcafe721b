//! The file part of `POST /v1/files`, read against the limits before anything is stored.
//!
//! async-nats's `ObjectStore::put` publishes each chunk as it reads it and writes the object's
//! record only at the end; when its reader fails it returns at once and the chunks it published
//! stay, owned by nothing. So the reader given to `put`, [`Capped`], never fails: when the file
//! passes `BULK_MAX_FILE_BYTES` or the room `BULK_FILES_MAX_BYTES` leaves, when the body fails
//! (a client gone) or stalls for [`UPLOAD_IDLE_TIMEOUT`], it ends the file there and records
//! why ([`Stop`]). `put` then writes a truncated object with a record, which the route discards
//! whole (`super::sweep::discard`). A `Content-Length` that cannot fit is refused before the
//! body is read ([`Caps::declared`]); after any refusal, the rest of the body is read and
//! dropped for a while ([`LINGER_TIMEOUT`]) so that the client gets the answer.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::multipart::MultipartError;
use axum::http::StatusCode;
use bytes::Bytes;
use embatch_bulk::FilesUsage;
use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::{ApiError, BulkLimits};

/// Room the form may take besides the file (its other fields, boundaries and part headers):
/// 64 KiB. The route's body limit is `BULK_MAX_FILE_BYTES` plus this, and a `Content-Length`
/// above that is refused at once.
pub const FORM_ALLOWANCE: u64 = 64 * 1024;

/// Longest an upload may go without receiving any of its body: 5 minutes; then it is answered
/// 408 and what it stored is discarded. Far below the sweeper's grace
/// (`super::sweep::SWEEP_GRACE`), so an upload in progress is never swept.
pub const UPLOAD_IDLE_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// After a refusal, how long the rest of the body is read and dropped (it is answered at once):
/// 30 s, at most the route's body limit (`BULK_MAX_FILE_BYTES` plus [`FORM_ALLOWANCE`]). A
/// client that sends its whole body before it reads the answer (most HTTP clients) then gets
/// the answer instead of a connection reset; one that reads while it sends stops sending.
pub const LINGER_TIMEOUT: Duration = Duration::from_secs(30);

/// Bytes a stored chunk takes in nats-server's file store beyond its payload, rounded up: its
/// subject (`$O.EMBATCH_FILES.C.<nuid>`, 41 bytes), the record header and hash (30 bytes).
pub const CHUNK_OVERHEAD: u64 = 128;

/// Bytes kept free for an object's meta record (its JSON and subject, about 600 bytes, once
/// more while its `purpose` is rewritten).
pub const RECORD_RESERVE: u64 = 4096;

/// Bytes a file of `bytes` in `chunks` chunks takes in the stream, by [`CHUNK_OVERHEAD`] and
/// [`RECORD_RESERVE`].
pub fn stored_cost(bytes: u64, chunks: u64) -> u64 {
    bytes
        .saturating_add(chunks.saturating_mul(CHUNK_OVERHEAD))
        .saturating_add(RECORD_RESERVE)
}

/// Why an upload ended before its file did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// Over `BULK_MAX_FILE_BYTES` (or the route's body limit).
    TooLarge,
    /// Larger than the whole files' budget (`BULK_FILES_MAX_BYTES`): it never fits.
    OverBudget,
    /// Larger than the room the files stored leave in the budget.
    NoRoom,
    /// The body failed (a client gone, a malformed form): its status and message.
    Body(StatusCode, String),
    /// Nothing arrived for [`UPLOAD_IDLE_TIMEOUT`].
    Idle,
}

impl Stop {
    /// Whether the rest of the body is worth reading so that the client gets the answer (a
    /// refusal of the content; not a broken or idle body).
    pub fn lingers(&self) -> bool {
        matches!(self, Stop::TooLarge | Stop::OverBudget | Stop::NoRoom)
    }
}

/// The limits one upload is read against: the file limit and, when the files have a budget,
/// the budget and what the files stored take at the upload's start.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// `BULK_MAX_FILE_BYTES`.
    pub max_file: u64,
    /// The files' budget and use (`None` without a budget).
    pub usage: Option<FilesUsage>,
}

impl Caps {
    /// The caps of `limits` with the files' `usage` now.
    pub fn new(limits: &BulkLimits, usage: FilesUsage) -> Caps {
        Caps {
            max_file: limits.max_file_bytes as u64,
            usage: usage.budget.is_some().then_some(usage),
        }
    }

    /// Whether a file of `bytes` in `chunks` chunks is past a limit, and which.
    pub fn check(&self, bytes: u64, chunks: u64) -> Option<Stop> {
        if bytes > self.max_file {
            return Some(Stop::TooLarge);
        }
        let usage = self.usage?;
        let cost = stored_cost(bytes, chunks);
        if usage.budget.is_some_and(|budget| cost > budget) {
            Some(Stop::OverBudget)
        } else if usage.room().is_some_and(|room| cost > room) {
            Some(Stop::NoRoom)
        } else {
            None
        }
    }

    /// The refusal of a body whose `Content-Length` is `length`, before reading it: over the
    /// file limit plus [`FORM_ALLOWANCE`], or a file of at least `length` less the allowance
    /// that does not fit the files' budget or room.
    ///
    /// # Errors
    /// The refusal, as [`Caps::error`] words it.
    pub fn declared(&self, length: u64) -> Result<(), ApiError> {
        if length > self.max_file.saturating_add(FORM_ALLOWANCE) {
            return Err(self.error(&Stop::TooLarge));
        }
        let least = length.saturating_sub(FORM_ALLOWANCE);
        match self.check(least, 0) {
            Some(stop) => Err(self.error(&stop)),
            None => Ok(()),
        }
    }

    /// The answer to an upload stopped for `stop`, in OpenAI's error shape.
    pub fn error(&self, stop: &Stop) -> ApiError {
        let budget = self.usage.and_then(|u| u.budget).unwrap_or(0);
        let too_large = |message: String| ApiError {
            status: 413,
            kind: "invalid_request_error",
            message,
            param: Some("file".into()),
            code: Some("file_too_large"),
        };
        match stop {
            Stop::TooLarge => too_large(format!(
                "`file` is larger than the limit of {} bytes (BULK_MAX_FILE_BYTES)",
                self.max_file
            )),
            Stop::OverBudget => too_large(format!(
                "`file` is larger than all files together may take in the store: {budget} \
                 bytes (BULK_FILES_MAX_BYTES)"
            )),
            Stop::NoRoom => no_room(self.usage.map_or(0, |u| u.bytes), budget),
            Stop::Body(status, message) => ApiError {
                status: status.as_u16(),
                kind: "invalid_request_error",
                message: format!("cannot read the multipart form: {message}"),
                param: None,
                code: None,
            },
            Stop::Idle => ApiError {
                status: 408,
                kind: "invalid_request_error",
                message: format!(
                    "no part of the body arrived for {} s; the upload is discarded",
                    UPLOAD_IDLE_TIMEOUT.as_secs()
                ),
                param: Some("file".into()),
                code: None,
            },
        }
    }
}

/// 507 `insufficient_storage`: the files stored (`used` bytes) leave too little of the `budget`.
pub fn no_room(used: u64, budget: u64) -> ApiError {
    ApiError {
        status: 507,
        kind: "server_error",
        message: format!(
            "`file` does not fit: the files stored take {used} of the {budget} bytes all files \
             may take (BULK_FILES_MAX_BYTES); delete files (DELETE /v1/files/{{id}}) to make room"
        ),
        param: Some("file".into()),
        code: Some("insufficient_storage"),
    }
}

/// Reads and drops what is left of a refused request's `body`, at most `limit` bytes, for at
/// most [`LINGER_TIMEOUT`] (see there).
pub async fn linger(body: axum::body::Body, limit: u64) {
    let mut frames = body.into_data_stream();
    let mut left = limit;
    let read = async {
        while let Some(Ok(frame)) = frames.next().await {
            match left.checked_sub(frame.len() as u64) {
                Some(rest) => left = rest,
                None => return,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER_TIMEOUT, read).await;
}

/// The reader `put` stores from: the file part's bytes until the file ends or a limit stops it
/// ([`Stop`]); it never fails (see the module docs). Each read it answers is one chunk `put`
/// publishes, so it counts them to price the file in the stream ([`stored_cost`]).
pub struct Capped<S> {
    body: S,
    caps: Caps,
    pending: Bytes,
    bytes: u64,
    chunks: u64,
    ended: bool,
    stop: Option<Stop>,
    idle: Pin<Box<Sleep>>,
}

impl<S> Capped<S>
where
    S: Stream<Item = Result<Bytes, MultipartError>> + Unpin,
{
    /// Reads `body` under `caps`.
    pub fn new(body: S, caps: Caps) -> Capped<S> {
        Capped {
            body,
            caps,
            pending: Bytes::new(),
            bytes: 0,
            chunks: 0,
            ended: false,
            stop: None,
            idle: Box::pin(tokio::time::sleep(UPLOAD_IDLE_TIMEOUT)),
        }
    }

    /// Why the file was cut short; `None` when it was read to its end.
    pub fn stop(&self) -> Option<&Stop> {
        self.stop.as_ref()
    }

    fn end(&mut self, err: MultipartError) {
        // The route's body limit (the file limit plus the form's allowance).
        self.stop = Some(if err.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Stop::TooLarge
        } else {
            Stop::Body(err.status(), err.body_text())
        });
    }
}

impl<S> AsyncRead for Capped<S>
where
    S: Stream<Item = Result<Bytes, MultipartError>> + Unpin,
{
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.ended || this.stop.is_some() || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            if this.pending.is_empty() {
                match this.body.poll_next_unpin(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        this.pending = frame;
                        let deadline = Instant::now() + UPLOAD_IDLE_TIMEOUT;
                        this.idle.as_mut().reset(deadline);
                    }
                    Poll::Ready(Some(Err(err))) => this.end(err),
                    Poll::Ready(None) => this.ended = true,
                    Poll::Pending if this.idle.as_mut().poll(cx).is_ready() => {
                        this.stop = Some(Stop::Idle);
                    }
                    Poll::Pending => return Poll::Pending,
                }
                continue;
            }
            let n = this.pending.len().min(buf.remaining());
            if let Some(stop) = this.caps.check(this.bytes + n as u64, this.chunks + 1) {
                this.stop = Some(stop);
                continue;
            }
            buf.put_slice(&this.pending.split_to(n));
            this.bytes += n as u64;
            this.chunks += 1;
            return Poll::Ready(Ok(()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(max_file: u64, budget: Option<(u64, u64)>) -> Caps {
        Caps {
            max_file,
            usage: budget.map(|(budget, bytes)| FilesUsage {
                bytes,
                budget: Some(budget),
            }),
        }
    }

    #[test]
    fn the_file_limit_is_exact_and_the_budget_counts_overheads() {
        let c = caps(1000, None);
        assert_eq!(c.check(1000, 1), None);
        assert_eq!(c.check(1001, 1), Some(Stop::TooLarge));
        let c = caps(1 << 20, Some((10_000, 4_000)));
        assert_eq!(c.check(1_000, 1), None);
        // 6,000 left: 4,000 bytes in 1 chunk cost 4,000 + 128 + 4,096.
        assert_eq!(c.check(4_000, 1), Some(Stop::NoRoom));
        assert_eq!(c.check(9_000, 1), Some(Stop::OverBudget));
    }

    type Frames = futures::stream::Iter<std::vec::IntoIter<Result<Bytes, MultipartError>>>;

    fn frames(sizes: &[usize]) -> Frames {
        let frames: Vec<Result<Bytes, MultipartError>> = sizes
            .iter()
            .map(|n| Ok(Bytes::from(vec![b'f'; *n])))
            .collect();
        futures::stream::iter(frames)
    }

    #[tokio::test]
    async fn the_reader_ends_the_file_at_a_limit_instead_of_failing() {
        use tokio::io::AsyncReadExt;
        let mut whole = Capped::new(frames(&[600, 400]), caps(1000, None));
        let mut read = Vec::new();
        assert_eq!(whole.read_to_end(&mut read).await.ok(), Some(1000));
        assert_eq!(whole.stop(), None);

        let mut over = Capped::new(frames(&[600, 401]), caps(1000, None));
        let mut read = Vec::new();
        assert_eq!(over.read_to_end(&mut read).await.ok(), Some(600));
        assert_eq!(over.stop(), Some(&Stop::TooLarge));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stalls_ends_the_file_as_idle() {
        use tokio::io::AsyncReadExt;
        let stalled = frames(&[100]).chain(futures::stream::pending());
        let mut reader = Capped::new(stalled, caps(1000, None));
        let started = Instant::now();
        let mut read = Vec::new();
        let bound = UPLOAD_IDLE_TIMEOUT * 2;
        let ended = tokio::time::timeout(bound, reader.read_to_end(&mut read)).await;
        assert_eq!(
            ended.ok().and_then(Result::ok),
            Some(100),
            "ended, not failed"
        );
        assert_eq!(reader.stop(), Some(&Stop::Idle));
        assert!(started.elapsed() >= UPLOAD_IDLE_TIMEOUT);
        assert_eq!(caps(1000, None).error(&Stop::Idle).status, 408);
    }

    #[test]
    fn a_declared_length_is_refused_only_when_no_form_could_fit() {
        let c = caps(1000, None);
        assert!(c.declared(1000 + FORM_ALLOWANCE).is_ok());
        let err = c.declared(1001 + FORM_ALLOWANCE).expect_err("too large");
        assert_eq!((err.status, err.param.as_deref()), (413, Some("file")));
        assert!(
            err.message.contains("BULK_MAX_FILE_BYTES"),
            "{}",
            err.message
        );
        let c = caps(1 << 30, Some((1 << 20, 0)));
        let err = c.declared(2 << 20).expect_err("over the budget");
        assert_eq!(err.status, 413);
        assert!(
            err.message.contains("BULK_FILES_MAX_BYTES"),
            "{}",
            err.message
        );
        let c = caps(1 << 30, Some((1 << 20, 900 << 10)));
        let err = c.declared(300 << 10).expect_err("no room");
        assert_eq!((err.status, err.code), (507, Some("insufficient_storage")));
    }
}
