//! `embatch-loadtest run`: builds the target and the inputs, runs the load model, and returns
//! the [`Report`].

use std::path::Path;
use std::sync::Arc;

use crate::LoadtestError;
use crate::cli::{LoadModel, RunConfig, TargetSpec};
use crate::corpus::{Corpus, PayloadFactory, Zipf};
use crate::load::{self, Window};
use crate::progress::Progress;
use crate::report::{Report, RunInfo};
use crate::stats::Recorder;
use crate::targets::{HttpTarget, NatsTarget, Target};

/// The target of `config`: an HTTP client, or a NATS connection.
///
/// # Errors
/// A bad URL, model or key, or a failed initial NATS connection.
async fn connect(config: &RunConfig) -> Result<Target, LoadtestError> {
    let target = match &config.target {
        TargetSpec::Http {
            url,
            model,
            api_key,
        } => Target::Http(
            HttpTarget::new(url, config.timeout)?
                .with_model(model.as_deref())?
                .with_api_key(api_key.as_ref().map(embatch_runtime::Secret::expose))?,
        ),
        TargetSpec::Nats {
            url,
            subject,
            auth,
            tenant,
        } => Target::Nats(
            NatsTarget::connect(url, subject, config.timeout, auth)
                .await?
                .for_tenant(tenant.as_deref()),
        ),
    };
    Ok(target)
}

/// The bodies of a run (`--corpus`, `--zipf-unique` or generated sentences, shaped for
/// `--route`), and the Zipf draw when there is one (the report counts its distinct texts).
///
/// # Errors
/// [`LoadtestError::Corpus`] when the corpus file cannot be read.
fn payloads(config: &RunConfig) -> Result<(PayloadFactory, Option<Zipf>), LoadtestError> {
    let zipf = config
        .zipf
        .map(|(unique, s)| Zipf::new(unique, s, config.words, config.seed));
    let corpus = match (&config.corpus, &zipf) {
        (Some(path), _) => Corpus::from_file(path)?,
        (None, Some(zipf)) => Corpus::Zipf(zipf.clone()),
        (None, None) => Corpus::Generated {
            words: config.words,
        },
    };
    let factory = PayloadFactory::new(Arc::new(corpus), config.inputs_per_request, config.seed)
        .truncating(config.truncate)
        .for_route(config.route);
    Ok((factory, zipf))
}

/// Connects to the target and runs the load described by `config`.
///
/// # Errors
/// Configuration errors (unreadable corpus, bad URL) and a failed initial NATS connection.
/// Failed requests are not errors: they are counted in the report.
pub async fn run(config: &RunConfig) -> Result<Report, LoadtestError> {
    let (factory, zipf) = payloads(config)?;
    let target = connect(config).await?;
    tracing::info!(target = %target.describe(), load = ?config.load, plan = ?config.plan, "starting");

    let recorder = Arc::new(Recorder::new(config.timeout));
    let progress = Progress::start(recorder.clone(), config.plan, config.quiet);
    let target = Arc::new(target);
    let send = move |payload| {
        let target = target.clone();
        async move { target.send(payload).await }
    };
    let window: Window = match config.load {
        LoadModel::Closed { concurrency } => {
            load::closed::run(concurrency, config.plan, &factory, recorder.clone(), send).await
        }
        LoadModel::Open {
            rate,
            max_in_flight,
        } => {
            load::open::run(
                rate,
                max_in_flight,
                config.plan,
                factory,
                recorder.clone(),
                send,
            )
            .await
        }
    };
    progress.finish();

    let (load_model, concurrency, rate_per_s) = match config.load {
        LoadModel::Closed { concurrency } => ("closed", Some(concurrency), None),
        LoadModel::Open { rate, .. } => ("open", None, Some(rate)),
    };
    let info = RunInfo {
        target: match &config.target {
            TargetSpec::Http {
                url, model: None, ..
            } => url.clone(),
            TargetSpec::Http {
                url,
                model: Some(model),
                ..
            } => format!("{url} model {model}"),
            // The URL may carry credentials: shown redacted.
            TargetSpec::Nats { url, subject, .. } => {
                let servers = url
                    .parse::<embatch_runtime::ServerList>()
                    .map_or_else(|_| "an invalid --nats".to_string(), |s| s.to_string());
                format!("{servers} subject {subject}")
            }
        },
        load_model: load_model.into(),
        concurrency,
        rate_per_s,
        inputs_per_request: config.inputs_per_request,
        timeout_ms: u64::try_from(config.timeout.as_millis()).unwrap_or(u64::MAX),
        warmup_ms: u64::try_from(config.plan.warmup.as_millis()).unwrap_or(u64::MAX),
        zipf: zipf.map(|zipf| crate::report::ZipfInfo {
            unique: config.zipf.map_or(0, |(unique, _)| unique),
            s: config.zipf.map_or(0.0, |(_, s)| s),
            distinct_sent: zipf.distinct_drawn(),
        }),
    };
    Ok(Report::new(info, &recorder.snapshot(), window.duration()))
}

/// Writes the human summary and, when asked, the JSON report: the JSON to `json` (`-` = stdout,
/// the summary then goes to stderr), the summary to stdout otherwise.
///
/// # Errors
/// [`LoadtestError::Output`] when the JSON file cannot be written.
pub fn write_report(report: &Report, json: Option<&Path>) -> Result<(), LoadtestError> {
    let json_text = || serde_json::to_string_pretty(report).unwrap_or_default();
    match json {
        Some(path) if path == Path::new("-") => {
            eprint!("{report}");
            println!("{}", json_text());
        }
        Some(path) => {
            print!("{report}");
            std::fs::write(path, json_text() + "\n").map_err(|source| LoadtestError::Output {
                path: path.display().to_string(),
                source,
            })?;
        }
        None => print!("{report}"),
    }
    Ok(())
}
