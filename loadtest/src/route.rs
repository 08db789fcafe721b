//! Which TEI route the load's bodies are shaped for (`--route`): `/embed`, `/rerank` or
//! `/embed_sparse`.
//!
//! All three replies are a JSON array with one element per input (an embedding, a rank, a
//! sparse embedding), so [`crate::stats::check_embeddings`] checks them alike: a request of `k`
//! inputs (`--inputs-per-request`) must be answered with `k` elements.

use serde::Serialize;

/// The route a body is for; `--url` must name the same route.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Route {
    /// TEI's `POST /embed`: `{"inputs": ..., "normalize": true}`.
    #[default]
    Embed,
    /// TEI's `POST /rerank`: `{"query": q, "texts": [k texts]}`; one query and `k` texts make `k`
    /// (query, text) pairs, the inputs counted.
    Rerank,
    /// TEI's `POST /embed_sparse`: `{"inputs": ...}` (TEI's body has no `normalize`).
    EmbedSparse,
}

#[derive(Serialize)]
#[serde(untagged)]
enum InputsBody<'a> {
    Single(&'a str),
    Batch(&'a [String]),
}

impl<'a> InputsBody<'a> {
    /// One text as a bare string (`"inputs": "text"`), more as an array, as TEI accepts both.
    fn of(texts: &'a [String]) -> InputsBody<'a> {
        match texts {
            [one] => InputsBody::Single(one),
            many => InputsBody::Batch(many),
        }
    }
}

#[derive(Serialize)]
struct EmbedBody<'a> {
    inputs: InputsBody<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    normalize: Option<bool>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    truncate: bool,
}

#[derive(Serialize)]
struct RerankBody<'a> {
    query: &'a str,
    texts: &'a [String],
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    truncate: bool,
}

impl Route {
    /// Whether the body needs a query besides its texts (`/rerank`).
    pub fn has_query(self) -> bool {
        self == Route::Rerank
    }

    /// The JSON body of one request of `texts` (`query` is used by `/rerank` only), asking for
    /// `"truncate": true` when `truncate`.
    pub fn body(self, query: &str, texts: &[String], truncate: bool) -> Vec<u8> {
        let json = match self {
            Route::Embed | Route::EmbedSparse => serde_json::to_vec(&EmbedBody {
                inputs: InputsBody::of(texts),
                normalize: (self == Route::Embed).then_some(true),
                truncate,
            }),
            Route::Rerank => serde_json::to_vec(&RerankBody {
                query,
                texts,
                truncate,
            }),
        };
        // Serializing strings and bools into a Vec cannot fail.
        json.unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn texts(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("text {i}")).collect()
    }

    #[test]
    fn embed_bodies_are_tei_shaped() {
        let v: serde_json::Value =
            serde_json::from_slice(&Route::Embed.body("", &texts(1), false)).expect("json");
        assert_eq!(v, json!({"inputs": "text 0", "normalize": true}));
        let req =
            embatch_protocol::EmbedRequest::from_slice(&Route::Embed.body("", &texts(3), true))
                .expect("a valid /embed body");
        assert_eq!(req.inputs.len(), 3);
    }

    #[test]
    fn rerank_bodies_parse_as_tei_rerank_requests() {
        let body = Route::Rerank.body("the query", &texts(20), false);
        let req = embatch_protocol::RerankRequest::from_slice(&body).expect("a valid /rerank body");
        assert_eq!(req.query, "the query");
        assert_eq!(req.texts, texts(20));
        assert_eq!(req.truncate, None);
        assert!(Route::Rerank.has_query() && !Route::EmbedSparse.has_query());
    }

    #[test]
    fn sparse_bodies_have_no_normalize() {
        let v: serde_json::Value =
            serde_json::from_slice(&Route::EmbedSparse.body("", &texts(2), true)).expect("json");
        assert_eq!(v, json!({"inputs": ["text 0", "text 1"], "truncate": true}));
    }
}
