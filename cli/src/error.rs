//! The errors of the `embatch` command, one type, each naming what failed and why.

use std::path::PathBuf;

use crate::input::InputError;

/// Everything that can stop `embatch batch`. `main` prints it and exits with
/// [`CliError::exit_code`].
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The input file is unreadable or one of its lines is invalid (line numbers are 1-based).
    #[error("{path}: {source}")]
    Input {
        /// The input file.
        path: PathBuf,
        /// What is wrong with it.
        source: InputError,
    },
    /// Reading or writing a local file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The gateway could not be reached, or the connection broke (after the retries of a poll).
    #[error("{what}: {}", chain(source))]
    Network {
        /// The call, e.g. `POST /v1/files`.
        what: String,
        /// reqwest's error (connect, timeout, body).
        source: reqwest::Error,
    },
    /// The gateway answered with an error status; `message` is OpenAI's `error.message` when the
    /// body has one, else the body's start.
    #[error("{what}: HTTP {status}: {message}")]
    Api {
        /// The call, e.g. `POST /v1/batches`.
        what: String,
        /// The HTTP status.
        status: u16,
        /// The gateway's explanation.
        message: String,
    },
    /// A 2xx answer whose body is not the documented shape.
    #[error("{what}: unexpected answer: {detail}")]
    Decode {
        /// The call.
        what: String,
        /// serde's message.
        detail: String,
    },
    /// A flag's value is invalid (e.g. `--url` is not an http(s) URL).
    #[error("{0}")]
    Config(String),
    /// The batch ended `failed` (the gateway rejected its input file): OpenAI's `errors` list, one
    /// entry per line.
    #[error("batch {id} failed:\n{errors}")]
    BatchFailed {
        /// The batch id.
        id: String,
        /// `line N: [code] message`, one per line.
        errors: String,
    },
    /// The batch ended `cancelled` or `expired`; what it finished was still written.
    #[error(
        "batch {id} ended {status}: {completed} of {total} requests completed; the results it \
         finished are in {output}"
    )]
    Incomplete {
        /// The batch id.
        id: String,
        /// `cancelled` or `expired`.
        status: String,
        /// Requests that succeeded.
        completed: u64,
        /// Requests in the job.
        total: u64,
        /// The output file written.
        output: PathBuf,
    },
    /// Ctrl-C: the job keeps running on the server, and the same command resumes it.
    #[error(
        "interrupted: batch {id} keeps running on the server; run the same command again to \
         follow it and fetch its results"
    )]
    Interrupted {
        /// The batch id.
        id: String,
    },
}

/// An error and its causes, `a: b: c` (reqwest's own message omits the cause, e.g. "connection
/// refused").
fn chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

impl CliError {
    /// The process exit status: 3 for a batch that ended `cancelled`/`expired` (partial results
    /// written), 130 for Ctrl-C, 1 for everything else (clap exits 2 on bad usage itself).
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Incomplete { .. } => 3,
            CliError::Interrupted { .. } => 130,
            _ => 1,
        }
    }
}
