//! One job from input file to result files: prepare, find or submit, follow, download.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::api::{self, Api, Batch, BatchStatus};
use crate::cli::{BatchArgs, InputArgs};
use crate::error::CliError;
use crate::input::{self, Prepared};
use crate::progress::Progress;
use crate::resume::{self, METADATA_KEY};

/// What a finished `embatch batch` wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The batch.
    pub batch_id: String,
    /// Whether this run found the batch of an earlier run instead of submitting one.
    pub resumed: bool,
    /// Lines written to the output file.
    pub output_lines: u64,
    /// Lines written to the errors file.
    pub error_lines: u64,
    /// The output file.
    pub output: PathBuf,
    /// The errors file.
    pub errors: PathBuf,
}

/// Reads and prepares the input; asks the gateway for the model only when plain text needs one.
async fn prepare(api: &Api, args: &InputArgs) -> Result<Prepared, CliError> {
    let input_error = |source| CliError::Input {
        path: args.file.clone(),
        source,
    };
    let bytes = std::fs::read(&args.file).map_err(|source| CliError::Io {
        path: args.file.clone(),
        source,
    })?;
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        input_error(input::InputError::NotUtf8 {
            offset: e.valid_up_to(),
        })
    })?;
    let model = match (&args.model, input::is_jsonl(text, args.format)) {
        (Some(model), _) => model.clone(),
        (None, true) => String::new(),
        (None, false) => api.model_id().await?,
    };
    input::prepare(&bytes, args.format, &model, args.inputs_per_request).map_err(input_error)
}

/// `embatch batch`: see [`crate::cli::Command::Batch`].
///
/// # Errors
/// [`CliError`]: input, network and API errors, a failed batch, a cancelled or expired one
/// (after writing what it finished), Ctrl-C (the batch keeps running).
pub async fn batch(api: &Api, args: &BatchArgs) -> Result<Summary, CliError> {
    let api = api.clone();
    let prepared = prepare(&api, &args.input).await?;
    let mut progress = Progress::new(prepared.requests, prepared.inputs, args.quiet);
    progress.note(&format!(
        "{}: {} requests, {} inputs{}, sha256 {}",
        args.input.file.display(),
        prepared.requests,
        prepared.inputs,
        if prepared.converted {
            " (plain text)"
        } else {
            ""
        },
        &prepared.sha256[..12],
    ));

    let found = if args.new {
        None
    } else {
        resume::find_batch(&api, &prepared.sha256).await?
    };
    let resumed = found.is_some();
    let batch = match found {
        Some(batch) => {
            progress.note(&format!(
                "found batch {} ({}) for this input; following it (--new submits another)",
                batch.id,
                batch.status.as_str()
            ));
            batch
        }
        None => submit(&api, args, &prepared, &progress).await?,
    };
    let batch = follow(&api, batch, args, &mut progress).await?;
    progress.finish();
    deliver(&api, batch, args, resumed).await
}

/// Uploads the input (or reuses the upload of an interrupted run) and creates the batch.
async fn submit(
    api: &Api,
    args: &BatchArgs,
    prepared: &Prepared,
    progress: &Progress,
) -> Result<Batch, CliError> {
    let size = prepared.jsonl.len() as u64;
    let existing = if args.new {
        None
    } else {
        resume::find_file(api, &prepared.sha256, size).await?
    };
    let file = match existing {
        Some(file) => {
            progress.note(&format!("reusing the uploaded file {}", file.id));
            file
        }
        None => {
            api.upload(
                &resume::upload_name(&prepared.sha256),
                prepared.jsonl.clone(),
            )
            .await?
        }
    };
    let mut metadata = BTreeMap::new();
    metadata.insert(METADATA_KEY.to_owned(), prepared.sha256.clone());
    if let Some(name) = args.input.file.file_name() {
        // OpenAI caps metadata values at 512 characters.
        let name: String = name.to_string_lossy().chars().take(512).collect();
        metadata.insert("embatch_source".to_owned(), name);
    }
    let batch = api
        .create_batch(&file.id, &args.completion_window, &metadata)
        .await?;
    progress.note(&format!("submitted batch {} (file {})", batch.id, file.id));
    Ok(batch)
}

/// Polls the batch until it is terminal, drawing the bar; Ctrl-C leaves it running.
async fn follow(
    api: &Api,
    mut batch: Batch,
    args: &BatchArgs,
    progress: &mut Progress,
) -> Result<Batch, CliError> {
    let mut last_ok = Instant::now();
    loop {
        progress.update(batch.status, batch.request_counts);
        if batch.status.is_final() {
            return Ok(batch);
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {
                progress.finish();
                return Err(CliError::Interrupted { id: batch.id });
            }
            () = tokio::time::sleep(args.poll_interval) => {}
        }
        match api.batch(&batch.id).await {
            Ok(next) => {
                batch = next;
                last_ok = Instant::now();
            }
            Err(e) if api::is_transient(&e) && last_ok.elapsed() < args.retry_for => {
                progress.note(&format!("retrying: {e}"));
                tokio::time::sleep(args.poll_interval.min(Duration::from_secs(5))).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Writes the results of a terminal batch.
async fn deliver(
    api: &Api,
    batch: Batch,
    args: &BatchArgs,
    resumed: bool,
) -> Result<Summary, CliError> {
    if batch.status == BatchStatus::Failed {
        let errors = failed_errors(&batch);
        return Err(CliError::BatchFailed {
            id: batch.id,
            errors,
        });
    }
    let errors = args.errors_path();
    let output_lines = fetch(api, batch.output_file_id.as_deref(), &args.output).await?;
    let error_lines = fetch(api, batch.error_file_id.as_deref(), &errors).await?;
    let counts = batch.request_counts;
    if batch.status != BatchStatus::Completed {
        return Err(CliError::Incomplete {
            id: batch.id,
            status: batch.status.as_str().to_owned(),
            completed: counts.completed,
            total: counts.total,
            output: args.output.clone(),
        });
    }
    Ok(Summary {
        batch_id: batch.id,
        resumed,
        output_lines,
        error_lines,
        output: args.output.clone(),
        errors,
    })
}

/// Downloads a result file into `path`, or writes an empty `path` when the batch has none (so
/// that no file of an earlier job is mistaken for this one's).
async fn fetch(api: &Api, file_id: Option<&str>, path: &Path) -> Result<u64, CliError> {
    match file_id {
        Some(id) => api.download(id, path).await,
        None => std::fs::write(path, b"")
            .map(|()| 0)
            .map_err(|source| CliError::Io {
                path: path.to_owned(),
                source,
            }),
    }
}

/// `line N: [code] message (param)`, one per entry of a failed batch's `errors`.
pub fn failed_errors(batch: &Batch) -> String {
    let entries = batch
        .errors
        .as_ref()
        .map(|e| e.data.as_slice())
        .unwrap_or_default();
    if entries.is_empty() {
        return "  (the gateway gave no reason)".to_owned();
    }
    entries
        .iter()
        .map(|e| {
            let line = e.line.map(|l| format!("line {l}: ")).unwrap_or_default();
            let param = e
                .param
                .as_deref()
                .map(|p| format!(" ({p})"))
                .unwrap_or_default();
            format!("  {line}[{}] {}{param}", e.code, e.message)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `embatch cancel`: finds the batch of the input and asks the gateway to cancel it.
///
/// # Errors
/// Input, network and API errors; [`CliError::Config`] when no batch exists for the input.
pub async fn cancel(api: &Api, args: &InputArgs) -> Result<Batch, CliError> {
    let prepared = prepare(api, args).await?;
    match resume::find_batch(api, &prepared.sha256).await? {
        Some(batch) => api.cancel(&batch.id).await,
        None => Err(CliError::Config(format!(
            "no batch for {} (sha256 {}) on this gateway",
            args.file.display(),
            &prepared.sha256[..12]
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{BatchError, BatchErrors, test_batch};

    #[test]
    fn failed_batch_errors_name_line_code_and_field() {
        let mut batch = test_batch("b", BatchStatus::Failed);
        batch.errors = Some(BatchErrors {
            object: "list".into(),
            data: vec![BatchError {
                code: "duplicate_custom_id".into(),
                message: "custom_id \"a\" repeats line 1".into(),
                param: Some("custom_id".into()),
                line: Some(2),
            }],
        });
        assert_eq!(
            failed_errors(&batch),
            "  line 2: [duplicate_custom_id] custom_id \"a\" repeats line 1 (custom_id)"
        );
    }
}
