//! How one request uses the cache: HTTP's `Cache-Control` request directives.

/// How one request uses the cache, from its [`embatch_protocol::headers::CACHE_CONTROL`] (HTTP's
/// `Cache-Control` request directives, which the gateway passes on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// Read and write the cache.
    Normal,
    /// `no-cache`: do not answer from the cache; store the fresh result.
    NoCache,
    /// `no-store`: neither read nor write the cache.
    NoStore,
}

impl Usage {
    /// The usage a header value asks for: comma-separated directives, case-insensitive;
    /// `no-store` wins over `no-cache`; anything else is [`Usage::Normal`].
    pub fn from_header(value: Option<&str>) -> Usage {
        let Some(value) = value else {
            return Usage::Normal;
        };
        let mut usage = Usage::Normal;
        for directive in value.split(',').map(str::trim) {
            if directive.eq_ignore_ascii_case("no-store") {
                return Usage::NoStore;
            }
            if directive.eq_ignore_ascii_case("no-cache") {
                usage = Usage::NoCache;
            }
        }
        usage
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_control_directives_pick_the_usage() {
        assert_eq!(Usage::from_header(None), Usage::Normal);
        assert_eq!(Usage::from_header(Some("max-age=0")), Usage::Normal);
        assert_eq!(Usage::from_header(Some("No-Cache")), Usage::NoCache);
        assert_eq!(
            Usage::from_header(Some("no-cache, no-store")),
            Usage::NoStore
        );
        assert_eq!(Usage::from_header(Some("no-store")), Usage::NoStore);
    }
}
