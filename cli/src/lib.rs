//! `embatch`, the command-line tool for bulk embedding jobs: it submits a file through the
//! gateway's OpenAI-compatible Files and Batches API, follows the batch with a progress bar,
//! finds its job again when re-run after an interruption, and writes the results.
//!
//! Modules: [`cli`] (flags), [`input`] (JSONL or plain text → the uploaded JSONL and its
//! sha256), [`api`] (wire types and HTTP client), [`resume`] (finding a job again),
//! [`progress`] (the bar), [`job`] (one job end to end), [`error`].

pub mod api;
pub mod cli;
pub mod error;
pub mod input;
pub mod job;
pub mod progress;
pub mod resume;

pub use error::CliError;
