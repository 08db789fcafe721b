//! Rerank in the Cohere/Jina shape: `POST /v1/rerank` and `POST /v2/rerank`, as Cohere's rerank
//! API (v1 and v2) and Jina's take them, the shape LangChain's, LlamaIndex's and RAGFlow's
//! rerankers speak.
//!
//! A request is translated into TEI's `/rerank` body ([`RerankRequest`]: `raw_scores: false`, so
//! each `relevance_score` is the sigmoid of the model's logit, in (0, 1) as Cohere's are;
//! `truncate: true`, as Cohere cuts long documents instead of refusing them) and sent down the
//! path of `POST /rerank`; TEI's ranks come back sorted by score and are re-shaped here:
//!
//! ```json
//! {"id": "rerank-…", "results": [{"index": 1, "relevance_score": 0.98, "document": {"text": "…"}}],
//!  "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1},
//!           "tokens": {"input_tokens": 42}}}
//! ```
//! `document` only with `return_documents: true`; `tokens` only when the workers count tokens.
//! Cohere's `max_tokens_per_doc`, `max_chunks_per_doc`, `priority` and `relevant_spans` are
//! accepted and ignored (the model's own token limit cuts each pair).

use embatch_protocol::request::parse_object;
use embatch_protocol::rerank::{Rank, validate_count};
use embatch_protocol::{EmbedError, RerankRequest};
use serde::{Deserialize, Serialize};

/// One document: a string (Cohere v2, Jina), or Cohere v1's object whose `text` is ranked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
#[derive(utoipa::ToSchema)]
pub enum Document {
    /// `"text"`.
    Text(String),
    /// `{"text": "..."}` (other fields are ignored).
    Object {
        /// The text ranked.
        text: String,
    },
}

impl Document {
    fn into_text(self) -> String {
        match self {
            Document::Text(text) | Document::Object { text } => text,
        }
    }
}

/// The body of `POST /v1/rerank` and `POST /v2/rerank`, as Cohere's rerank API takes it.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct CohereRerankRequest {
    /// The model, as `GET /v1/models` lists it; absent or empty: the default model (or the
    /// `Embatch-Model` header's). Any other: 404.
    #[serde(default)]
    pub model: Option<String>,
    /// The query every document is scored against.
    #[schema(example = "What is the capital of the United States?")]
    pub query: String,
    /// The documents, at most `MAX_CLIENT_BATCH_SIZE`.
    #[schema(example = json!(["Carson City is the capital city of Nevada.",
                              "Washington, D.C. is the capital of the United States."]))]
    pub documents: Vec<Document>,
    /// Return only the best `top_n` results (at least 1); absent: all.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub top_n: Option<usize>,
    /// Echo each result's document as `{"text": ...}` (default `false`).
    #[serde(default)]
    pub return_documents: bool,
    /// Cohere v1's fields of object documents to rank: only `["text"]` is served.
    #[serde(default)]
    pub rank_fields: Option<Vec<String>>,
}

/// One result: `{"index", "relevance_score", "document"?}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RerankResult {
    /// The document's position in the request's `documents`.
    pub index: usize,
    /// The sigmoid of the model's logit for (query, document), in (0, 1); higher is more
    /// relevant.
    pub relevance_score: f32,
    /// The document, with `return_documents`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub document: Option<ResultDocument>,
}

/// A result's document: `{"text": ...}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ResultDocument {
    /// The document's text.
    pub text: String,
}

/// The reply of `POST /v1/rerank` and `POST /v2/rerank`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CohereRerankResponse {
    /// An id of this response (`rerank-<nuid>`).
    pub id: String,
    /// The results, most relevant first.
    pub results: Vec<RerankResult>,
    /// `{"api_version": {"version"}, "billed_units": {"search_units": 1}, "tokens"?:
    /// {"input_tokens"}}`, as Cohere's.
    #[schema(value_type = Object)]
    pub meta: serde_json::Value,
}

/// A parsed Cohere request: TEI's `/rerank` body, and what shapes the reply.
#[derive(Debug)]
pub struct Translated {
    /// The model named (`None` or empty: the default).
    pub model: Option<String>,
    /// TEI's `/rerank` body.
    pub request: RerankRequest,
    /// The reply's shape.
    pub shape: Shape,
}

/// How the reply is shaped: `top_n`, the documents to echo, the API version.
#[derive(Debug)]
pub struct Shape {
    top_n: Option<usize>,
    documents: Option<Vec<String>>,
    version: &'static str,
}

impl CohereRerankRequest {
    /// Parses and checks a Cohere rerank body against `max_documents`, for API `version` (`"1"`
    /// or `"2"`, echoed in `meta`).
    ///
    /// # Errors
    /// 400 for a body that is not JSON and for no documents ("`documents` cannot be empty"), 422
    /// for JSON of the wrong shape, `top_n` of 0, `rank_fields` other than `["text"]`, and more
    /// than `max_documents` documents (naming `MAX_CLIENT_BATCH_SIZE`).
    pub fn translate(
        body: &[u8],
        max_documents: usize,
        version: &'static str,
    ) -> Result<Translated, EmbedError> {
        let request: CohereRerankRequest = parse_object(
            body,
            "{\"model\": \"m\", \"query\": \"q\", \"documents\": [\"a\"]}",
        )?;
        if request.documents.is_empty() {
            return Err(EmbedError::Empty("`documents` cannot be empty".into()));
        }
        validate_count(request.documents.len(), max_documents)?;
        if request.top_n == Some(0) {
            return Err(EmbedError::Validation("`top_n` must be at least 1".into()));
        }
        if let Some(fields) = &request.rank_fields
            && fields.iter().any(|f| f != "text")
        {
            return Err(EmbedError::Validation(
                "`rank_fields`: only `text` is ranked".into(),
            ));
        }
        let texts: Vec<String> = request
            .documents
            .into_iter()
            .map(Document::into_text)
            .collect();
        let documents = request.return_documents.then(|| texts.clone());
        Ok(Translated {
            model: request.model,
            request: RerankRequest {
                query: request.query,
                texts,
                truncate: Some(true),
                truncation_direction: None,
                raw_scores: false,
                return_text: false,
            },
            shape: Shape {
                top_n: request.top_n,
                documents,
                version,
            },
        })
    }
}

impl Shape {
    /// The response body from TEI's `/rerank` reply `ranks` (sorted by score) and the request's
    /// `tokens` when counted.
    ///
    /// # Errors
    /// 424 `Backend` when `ranks` is not TEI's `/rerank` reply.
    pub fn response(self, ranks: &[u8], tokens: Option<u64>) -> Result<Vec<u8>, EmbedError> {
        let ranks: Vec<Rank> = serde_json::from_slice(ranks)
            .map_err(|e| EmbedError::Backend(format!("malformed rerank reply: {e}")))?;
        let keep = self.top_n.unwrap_or(ranks.len());
        let results = ranks
            .into_iter()
            .take(keep)
            .map(|rank| RerankResult {
                index: rank.index,
                relevance_score: rank.score,
                document: self.documents.as_ref().and_then(|documents| {
                    documents
                        .get(rank.index)
                        .map(|text| ResultDocument { text: text.clone() })
                }),
            })
            .collect();
        let mut meta = serde_json::json!({
            "api_version": {"version": self.version},
            "billed_units": {"search_units": 1},
        });
        if let Some(tokens) = tokens {
            meta["tokens"] = serde_json::json!({"input_tokens": tokens});
        }
        let response = CohereRerankResponse {
            id: format!("rerank-{}", nuid::next()),
            results,
            meta,
        };
        serde_json::to_vec(&response)
            .map_err(|e| EmbedError::Backend(format!("cannot write the response: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translates_both_document_shapes() {
        let body = br#"{"model":"m","query":"q","documents":["a",{"text":"b","title":"x"}],
                        "top_n":1,"return_documents":true}"#;
        let t = CohereRerankRequest::translate(body, 8, "2").expect("valid");
        assert_eq!(t.model.as_deref(), Some("m"));
        assert_eq!(t.request.texts, ["a", "b"]);
        assert_eq!(t.request.truncate, Some(true));
        let ranks = br#"[{"index":1,"score":0.9},{"index":0,"score":0.1}]"#;
        let json: serde_json::Value =
            serde_json::from_slice(&t.shape.response(ranks, Some(7)).expect("shaped"))
                .expect("JSON");
        assert_eq!(
            json["results"],
            serde_json::json!([{"index": 1, "relevance_score": 0.9, "document": {"text": "b"}}])
        );
        assert_eq!(json["meta"]["tokens"]["input_tokens"], 7);
        assert_eq!(json["meta"]["api_version"]["version"], "2");
    }

    #[test]
    fn refuses_what_cohere_refuses() {
        let status = |body: &str| {
            CohereRerankRequest::translate(body.as_bytes(), 2, "1")
                .expect_err("refused")
                .status()
        };
        assert_eq!(status(r#"{"query":"q","documents":[]}"#), 400);
        assert_eq!(status(r#"{"query":"q","documents":["a","b","c"]}"#), 422);
        assert_eq!(status(r#"{"query":"q","documents":["a"],"top_n":0}"#), 422);
        assert_eq!(status(r#"{"query":"q"}"#), 422);
        assert_eq!(status("{"), 400);
    }
}
