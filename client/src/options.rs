//! What a caller sets per request: [`SendOptions`], sent as headers, and the [`Operation`]
//! that picks the subject.

use crate::TraceContext;

/// Per-request options of [`EmbedClient::embed_with`](crate::EmbedClient::embed_with), sent as
/// headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SendOptions {
    /// [`headers::CACHE_CONTROL`](embatch_protocol::headers::CACHE_CONTROL): `no-cache` or
    /// `no-store` bypass the workers' cache (HTTP's `Cache-Control` request directives); `None`
    /// uses it.
    pub cache_control: Option<String>,
    /// [`headers::TENANT`](embatch_protocol::headers::TENANT): the tenant the request is served for
    /// (the gateway sets the one that authenticated); `None` sends no header, and the worker takes
    /// the caller's account's tenant or `default`.
    pub tenant: Option<std::sync::Arc<str>>,
    /// The W3C trace context to send
    /// ([`headers::TRACEPARENT`](embatch_protocol::headers::TRACEPARENT),
    /// [`headers::TRACESTATE`](embatch_protocol::headers::TRACESTATE)): the worker's spans for the
    /// request become children of it. `None` sends none.
    pub trace: Option<TraceContext>,
    /// What the request asks for, which decides the subject it is sent on.
    pub operation: Operation,
}

/// What a request asks the workers for: the subject it is sent on, derived from the client's
/// subject. Cancels, heartbeats and discovery are the client's subject's either way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Operation {
    /// Embeddings: TEI's `/embed` body on the client's subject.
    #[default]
    Embed,
    /// Rerank scores: TEI's `/rerank` body on
    /// [`embatch_protocol::rerank::rerank_subject`] of the client's subject (contract v1.2).
    Rerank,
    /// Sparse embeddings: TEI's `/embed_sparse` body on
    /// [`embatch_protocol::sparse::sparse_subject`] of the client's subject (contract v1.3).
    Sparse,
    /// Tokens: TEI's `/tokenize` body on [`embatch_protocol::tokenize::tokenize_subject`] of the
    /// client's subject (contract v1.3).
    Tokenize,
    /// Texts of token ids: TEI's `/decode` body on
    /// [`embatch_protocol::tokenize::decode_subject`] of the client's subject (contract v1.3).
    Decode,
    /// Predictions: TEI's `/predict` body on [`embatch_protocol::predict::predict_subject`] of
    /// the client's subject (contract v1.4).
    Predict,
    /// Token embeddings: TEI's `/embed_all` body on
    /// [`embatch_protocol::embed_all::embed_all_subject`] of the client's subject (v1.4).
    EmbedAll,
    /// Sentence similarities: TEI's `/similarity` body on
    /// [`embatch_protocol::similarity::similarity_subject`] of the client's subject (v1.4).
    Similarity,
}

impl Operation {
    /// The subject a request of this operation is sent on, for a client of `subject`.
    pub(crate) fn subject(self, subject: &str) -> String {
        match self {
            Operation::Embed => subject.to_owned(),
            Operation::Rerank => embatch_protocol::rerank::rerank_subject(subject),
            Operation::Sparse => embatch_protocol::sparse::sparse_subject(subject),
            Operation::Tokenize => embatch_protocol::tokenize::tokenize_subject(subject),
            Operation::Decode => embatch_protocol::tokenize::decode_subject(subject),
            Operation::Predict => embatch_protocol::predict::predict_subject(subject),
            Operation::EmbedAll => embatch_protocol::embed_all::embed_all_subject(subject),
            Operation::Similarity => embatch_protocol::similarity::similarity_subject(subject),
        }
    }
}
