//! The embatch wire contract, shared by the gateway, the worker and any Rust client.
//!
//! A request is a NATS request-reply message on [`DEFAULT_SUBJECT`] (configurable) whose payload is
//! exactly the JSON body of text-embeddings-inference's (TEI's) `POST /embed`, and whose reply is
//! exactly TEI's response body: a JSON array of float arrays, one per input, in input order.
//! Errors are NATS micro-style errors (the [`headers::SERVICE_ERROR_CODE`] and
//! [`headers::SERVICE_ERROR`] headers) whose payload is TEI's error JSON body.
//!
//! The contract is versioned by [`PROTOCOL_VERSION`]; docs/nats-contract.md documents it for
//! non-Rust clients.
//!
//! # Layout
//! - [`request`]: the request body ([`EmbedRequest`]) and the options that decide which requests
//!   may share an upstream call ([`EmbedOptions`]).
//! - [`bulk`]: the bulk (batch) jobs' contract: OpenAI's File and Batch objects, the JetStream
//!   subjects, streams and buckets, the work items and results.
//! - [`error`]: the one error type ([`EmbedError`]) and its single mapping to HTTP status codes,
//!   TEI error bodies and NATS error headers.
//! - [`headers`]: header names, and the deadline header's encoding.
//! - [`model`]: many models under one subject (contract v1.1): model names, their subject
//!   tokens and the discovery metadata keys.
//! - [`rerank`]: TEI's `/rerank` body and reply on `<subject>.rerank` (contract v1.2), its
//!   pairs batched as inputs of [`Task::Rerank`].
//! - [`sparse`]: TEI's `/embed_sparse` body on `<subject>.embed_sparse` (contract v1.3), its
//!   inputs batched as inputs of [`Task::Sparse`].
//! - [`tokenize`]: TEI's `/tokenize` and `/decode` bodies on `<subject>.tokenize` and
//!   `<subject>.decode` (contract v1.3), passed to the upstream one request per call.
//! - [`predict`], [`embed_all`], [`similarity`]: TEI's `/predict`, `/embed_all` and
//!   `/similarity` bodies on `<subject>.predict`, `<subject>.embed_all` and
//!   `<subject>.similarity` (contract v1.4), batched as inputs of [`Task::Predict`],
//!   [`Task::EmbedAll`] and (the sentences) [`Task::Embed`].
//! - [`compact`]: an `/embed` request's `output_dtype` (contract v1.5): int8, uint8, binary and
//!   ubinary vectors, quantized by the worker after the batch.
//! - [`reply`]: the reply codec (success and error headers, decoding a reply into a result).
//! - `openapi` (feature `openapi`): the OpenAPI schemas of [`request::Inputs`] and
//!   [`request::Input`]; with the feature, the wire types also derive `utoipa::ToSchema`.

pub mod bulk;
pub mod compact;
pub mod embed_all;
pub mod error;
pub mod headers;
mod inputs_request;
pub mod model;
#[cfg(feature = "openapi")]
mod openapi;
pub mod predict;
pub mod reply;
pub mod request;
pub mod rerank;
pub mod similarity;
pub mod sparse;
pub mod tokenize;

pub use error::{EmbedError, ErrorResponse, ErrorType};
pub use request::{EmbedOptions, EmbedRequest, Input, Task, TruncationDirection};
pub use rerank::RerankRequest;
pub use sparse::SparseRequest;

/// The default NATS subject requests are sent on (`--subject` / `EMBATCH_SUBJECT` on both sides).
pub const DEFAULT_SUBJECT: &str = "embed";

/// The default NATS queue group every worker joins, so each request goes to exactly one worker.
pub const DEFAULT_QUEUE_GROUP: &str = "embatch";

/// The NATS micro service name the workers register (`$SRV.PING.embatch`, `$SRV.STATS.embatch`).
pub const SERVICE_NAME: &str = "embatch";

/// Version of this wire contract. Sent by clients in [`headers::VERSION`] (optional) and announced
/// by workers as service metadata. A worker rejects a request whose major version it does not know
/// with a 422 `Validation` error.
pub const PROTOCOL_VERSION: &str = "1";

/// The contract's full version, `<major>.<minor>`: a minor version only adds to the contract
/// (v1.1 added model subjects, see [`model`]; v1.2 the rerank subject, see [`rerank`]; v1.3
/// the sparse and token subjects, see [`sparse`]; v1.4 the predict, embed_all and similarity
/// subjects, see [`predict`]; v1.5 `/embed`'s `output_dtype`, see [`compact`]; v1.6 the
/// per-client heartbeat subject, [`headers::HEARTBEAT_TO`]), so a client
/// of any `1.x` talks to any `1.y` worker. Announced by workers as the `contract_version` metadata of `$SRV.INFO`.
pub const CONTRACT_VERSION: &str = "1.6";
