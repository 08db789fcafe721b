//! Finding a job again after an interruption, instead of submitting it twice.
//!
//! A job's identity is the sha256 of the JSONL it uploads ([`crate::input::Prepared::sha256`]).
//! It travels in the batch's `metadata` under [`METADATA_KEY`] and in the uploaded file's name
//! ([`upload_name`]), so a re-run finds, in this order: a batch carrying it (any status: a
//! finished one is only downloaded again), else a file uploaded under its name with the same
//! size (the run stopped between upload and batch creation), else nothing, and submits.
//! Only the gateway's listings are used: no local state file to lose or go stale.

use crate::api::{Api, Batch, FileObject};
use crate::error::CliError;

/// The `metadata` key that carries the input's sha256 (lowercase hex).
pub const METADATA_KEY: &str = "embatch_input_sha256";

/// `GET /v1/batches` pages looked through at most (100 batches each).
const MAX_PAGES: usize = 100;

/// The name the input is uploaded under: `embatch-<sha256>.jsonl`.
pub fn upload_name(sha256: &str) -> String {
    format!("embatch-{sha256}.jsonl")
}

/// The newest batch of `page` (newest first, as the API lists them) carrying `sha256`.
pub fn pick<'a>(page: &'a [Batch], sha256: &str) -> Option<&'a Batch> {
    page.iter().find(|b| {
        b.metadata
            .as_ref()
            .and_then(|m| m.get(METADATA_KEY))
            .is_some_and(|v| v == sha256)
    })
}

/// The uploaded file of this input, if any: purpose `batch`, [`upload_name`], and `bytes`.
pub fn pick_file<'a>(files: &'a [FileObject], sha256: &str, bytes: u64) -> Option<&'a FileObject> {
    let name = upload_name(sha256);
    files
        .iter()
        .find(|f| f.purpose == "batch" && f.filename == name && f.bytes == bytes)
}

/// Looks through the gateway's batches, newest first, for the job with `sha256`.
///
/// # Errors
/// Network, API and decode errors of `GET /v1/batches`.
pub async fn find_batch(api: &Api, sha256: &str) -> Result<Option<Batch>, CliError> {
    let mut after: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let page = api.batches(after.as_deref(), 100).await?;
        if let Some(found) = pick(&page.data, sha256) {
            return Ok(Some(found.clone()));
        }
        after = page.data.last().map(|b| b.id.clone());
        if !page.has_more || after.is_none() {
            break;
        }
    }
    Ok(None)
}

/// Looks for this input's uploaded file.
///
/// # Errors
/// Network, API and decode errors of `GET /v1/files`.
pub async fn find_file(
    api: &Api,
    sha256: &str,
    bytes: u64,
) -> Result<Option<FileObject>, CliError> {
    let files = api.files().await?;
    Ok(pick_file(&files, sha256, bytes).cloned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{BatchStatus, test_batch};

    fn batch(id: &str, sha: Option<&str>, status: BatchStatus) -> Batch {
        let mut batch = test_batch(id, status);
        batch.metadata = sha.map(|s| [(METADATA_KEY.to_owned(), s.to_owned())].into());
        batch
    }

    #[test]
    fn the_newest_batch_with_the_fingerprint_is_found_whatever_its_status() {
        let page = [
            batch("b4", None, BatchStatus::InProgress),
            batch("b3", Some("other"), BatchStatus::InProgress),
            batch("b2", Some("abc"), BatchStatus::Cancelled),
            batch("b1", Some("abc"), BatchStatus::Completed),
        ];
        assert_eq!(pick(&page, "abc").map(|b| b.id.as_str()), Some("b2"));
        assert!(pick(&page, "nope").is_none());
    }

    #[test]
    fn an_uploaded_file_is_reused_only_with_its_name_purpose_and_size() {
        let file = |id: &str, name: &str, purpose: &str, bytes| FileObject {
            id: id.into(),
            object: "file".into(),
            bytes,
            created_at: 0,
            filename: name.into(),
            purpose: purpose.into(),
            status: "processed".into(),
            expires_at: None,
        };
        let name = upload_name("abc");
        let files = [
            file("f1", &name, "batch", 9),
            file("f2", &name, "batch_output", 10),
            file("f3", &name, "batch", 10),
        ];
        assert_eq!(
            pick_file(&files, "abc", 10).map(|f| f.id.as_str()),
            Some("f3")
        );
        assert!(pick_file(&files, "abc", 11).is_none());
        assert!(pick_file(&files, "abd", 10).is_none());
    }
}
