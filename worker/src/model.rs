//! Which model this worker serves, and on which subjects (contract v1.1, see
//! [`embatch_protocol::model`]).
//!
//! The model name is `MODEL_ALIAS` when set, else the upstream's `model_id` (TEI's `/info`, or
//! the built-in model's); its revision is the upstream's `model_sha` when it reports one. The
//! worker answers the model subject `<subject>.<token>`, and also the plain `<subject>` when it
//! serves the default model: `EMBATCH_DEFAULT_MODEL` unset (every worker does), or equal to its
//! model name.

use std::time::Duration;

use embatch_protocol::model::{self, ModelId, ModelNameError};

use crate::Config;
use crate::upstream::Upstream;

/// How long the worker waits between reads of the upstream's `/info` while it does not know
/// its model yet (TEI still starting): 1 s.
pub const INFO_RETRY: Duration = Duration::from_secs(1);

/// The model a worker serves and the subjects it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Served {
    /// Its name and revision.
    pub model: ModelId,
    /// The model subject, then the plain subject when [`Served::plain`].
    pub subjects: Vec<String>,
    /// Whether the worker answers the plain subject.
    pub plain: bool,
}

impl Served {
    /// What a worker of `model` serves under `config` (`EMBATCH_SUBJECT`,
    /// `EMBATCH_DEFAULT_MODEL`; an empty value counts as unset).
    ///
    /// # Errors
    /// [`ModelNameError`] when the model name is empty or collides with a subject the workers
    /// already use ([`model::RESERVED_TOKENS`]).
    pub(crate) fn new(model: ModelId, config: &Config) -> Result<Served, ModelNameError> {
        model::check_name(&model.name)?;
        let plain = match config.default_model.as_deref().filter(|d| !d.is_empty()) {
            None => true,
            Some(default) => default == model.name,
        };
        let mut subjects = vec![model::model_subject(&config.subject, &model.name)];
        if plain {
            subjects.push(config.subject.clone());
        }
        Ok(Served {
            model,
            subjects,
            plain,
        })
    }
}

/// The model of `info` (the upstream's TEI-shaped `/info`) under `alias`: `None` when neither
/// names one.
pub(crate) fn identify(alias: Option<&str>, info: Option<&serde_json::Value>) -> Option<ModelId> {
    let field = |name: &str| {
        info.and_then(|i| i.get(name))
            .and_then(serde_json::Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let name = alias
        .filter(|a| !a.is_empty())
        .map(str::to_owned)
        .or_else(|| field("model_id"))?;
    Some(ModelId {
        name,
        revision: field("model_sha"),
    })
}

/// Reads the upstream's `/info` until it names the model (every [`INFO_RETRY`]). With
/// `MODEL_ALIAS` no `/info` is needed: one read of at most [`INFO_RETRY`] gives the revision, if
/// the upstream answers it.
pub(crate) async fn resolve<U: Upstream>(upstream: &U, config: &Config) -> ModelId {
    let alias = config.model_alias.as_deref().filter(|a| !a.is_empty());
    if let Some(alias) = alias {
        let info = tokio::time::timeout(INFO_RETRY, upstream.info()).await;
        let info = info.ok().and_then(Result::ok);
        let revision = identify(None, info.as_ref()).and_then(|m| m.revision);
        return ModelId {
            name: alias.to_owned(),
            revision,
        };
    }
    let mut warned = false;
    loop {
        let info = upstream.info().await;
        if let Some(model) = identify(alias, info.as_ref().ok()) {
            return model;
        }
        if !warned {
            warned = true;
            match &info {
                Err(err) => tracing::warn!(
                    %err,
                    "cannot read the upstream's /info to learn the model's name; retrying \
                     (set MODEL_ALIAS to start without it)"
                ),
                Ok(_) => tracing::warn!(
                    "the upstream's /info names no model_id; retrying (set MODEL_ALIAS)"
                ),
            }
        }
        tokio::time::sleep(INFO_RETRY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn config(args: &[&str]) -> Config {
        Config::try_parse_from(std::iter::once("embatch-worker").chain(args.iter().copied()))
            .expect("parses")
    }

    fn model(name: &str) -> ModelId {
        ModelId {
            name: name.into(),
            revision: None,
        }
    }

    #[test]
    fn the_alias_wins_and_the_revision_is_the_model_sha() {
        let info = serde_json::json!({"model_id": "BAAI/bge-small-en-v1.5", "model_sha": "abc"});
        assert_eq!(
            identify(None, Some(&info)),
            Some(ModelId {
                name: "BAAI/bge-small-en-v1.5".into(),
                revision: Some("abc".into())
            })
        );
        assert_eq!(
            identify(Some("small"), Some(&info)).map(|m| m.name),
            Some("small".into())
        );
        assert_eq!(
            identify(Some("small"), None).map(|m| m.name),
            Some("small".into())
        );
        assert_eq!(identify(None, None), None);
        assert_eq!(identify(Some(""), Some(&serde_json::json!({}))), None);
    }

    #[test]
    fn without_a_default_model_every_worker_answers_the_plain_subject() {
        let served = Served::new(model("BAAI/bge-small-en-v1.5"), &config(&[])).expect("valid");
        assert_eq!(served.subjects, ["embed.BAAI/bge-small-en-v1%2E5", "embed"]);
        assert!(served.plain);
    }

    #[test]
    fn with_a_default_model_only_its_workers_answer_the_plain_subject() {
        let set = config(&["--default-model", "a", "--subject", "emb"]);
        assert_eq!(
            Served::new(model("a"), &set).expect("valid").subjects,
            ["emb.a", "emb"]
        );
        let other = Served::new(model("b"), &set).expect("valid");
        assert_eq!(
            (other.subjects, other.plain),
            (vec!["emb.b".to_owned()], false)
        );
    }

    #[test]
    fn colliding_names_are_refused() {
        let err = Served::new(model("info"), &config(&[])).expect_err("collides");
        assert!(err.to_string().contains("MODEL_ALIAS"), "{err}");
        assert!(Served::new(model(""), &config(&[])).is_err());
    }
}
