//! `TEI_URL` / `--tei-url`: one TEI base URL, or a comma-separated list of replicas of one model
//! (see `crate::upstream::replicas`).

use std::fmt;

/// Why one URL was refused (clap prints it after the flag's name).
#[derive(Debug, thiserror::Error)]
pub enum TeiUrlError {
    /// The text does not parse as a URL.
    #[error("not a URL: {0}")]
    NotAUrl(#[source] <reqwest::Url as std::str::FromStr>::Err),
    /// A URL of another scheme than `http` or `https`.
    #[error("the scheme must be http or https, not {0}")]
    Scheme(String),
}

/// Why a `TEI_URL` list was refused: the item, by position (from 1) and text, and its fault.
#[derive(Debug, thiserror::Error)]
pub enum TeiUrlsError {
    /// An item is empty (`a,,b`, a trailing comma, or nothing at all).
    #[error("TEI_URL item {position} is empty (the list is URLs separated by commas)")]
    Empty {
        /// Position in the list, from 1.
        position: usize,
    },
    /// An item is not an `http://` or `https://` URL.
    #[error("TEI_URL item {position} ({item:?}): {source}")]
    Item {
        /// Position in the list, from 1.
        position: usize,
        /// The item as given (trimmed).
        item: String,
        /// What is wrong with it.
        source: TeiUrlError,
    },
}

/// The TEI base URLs of `TEI_URL`, in order: at least one; several are replicas of one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TeiUrls(Vec<reqwest::Url>);

impl TeiUrls {
    /// The URLs, in configured order (never empty).
    pub fn urls(&self) -> &[reqwest::Url] {
        &self.0
    }
}

/// The URLs separated by commas, as `TEI_URL` takes them.
impl fmt::Display for TeiUrls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, url) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(url.as_str())?;
        }
        Ok(())
    }
}

/// One `http://` or `https://` base URL (TEI's routes are appended to it); also `--openai-url`.
pub(super) fn parse_tei_url(s: &str) -> Result<reqwest::Url, TeiUrlError> {
    let url = reqwest::Url::parse(s).map_err(TeiUrlError::NotAUrl)?;
    match url.scheme() {
        "http" | "https" => Ok(url),
        other => Err(TeiUrlError::Scheme(other.to_owned())),
    }
}

/// `--tei-url`: base URLs separated by commas (spaces around each are ignored), each checked as
/// [`parse_tei_url`] does; one URL, as before, is a list of one.
pub(super) fn parse_tei_urls(s: &str) -> Result<TeiUrls, TeiUrlsError> {
    s.split(',')
        .enumerate()
        .map(|(i, item)| {
            let (position, item) = (i + 1, item.trim());
            if item.is_empty() {
                return Err(TeiUrlsError::Empty { position });
            }
            parse_tei_url(item).map_err(|source| TeiUrlsError::Item {
                position,
                item: item.to_owned(),
                source,
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(TeiUrls)
}
