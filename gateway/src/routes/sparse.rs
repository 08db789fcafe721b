//! TEI 1.9.3's `POST /embed_sparse` (and `POST /models/{model}/embed_sparse`): each HTTP
//! request is one NATS request on the model's sparse subject (`<subject>.embed_sparse`,
//! contract v1.3), so the workers batch the inputs of every caller into one upstream call, with
//! the embedding path's deadline, shedding, bisection and cache.

use axum::extract::Path;
use axum::response::Response;
use embatch_client::Operation;
use embatch_protocol::sparse::SparseValue;
use embatch_protocol::{EmbedError, SparseRequest};
use std::collections::BTreeMap;
use utoipa::openapi::{RefOr, Response as DocResponse};
use utoipa::{IntoResponses, PartialSchema};

use super::forward::{RouteRequest, TeiRoute};

/// `POST /embed_sparse`: TEI 1.9.3's `/embed_sparse` for the default model (or the
/// `Embatch-Model` header's); the body is checked and forwarded as it is, and the worker's reply
/// is the body.
#[utoipa::path(
    post,
    path = "/embed_sparse",
    tag = "tei",
    summary = "Sparse embeddings (TEI's /embed_sparse)",
    description = "Exactly TEI 1.9.3's `POST /embed_sparse`: one list of the non-zero values \
                   `{\"index\", \"value\"}` per input, in input order, from a SPLADE model. \
                   Inputs of every caller are batched together. A model without SPLADE \
                   pooling: 424 `Backend` \"Model is not an embedding model with SPLADE \
                   pooling\", as TEI.",
    request_body(content = SparseRequest, content_type = "application/json",
        example = json!({"inputs": ["What is vector search?", "Hello, world!"]})),
    params(crate::openapi::TimeoutHeader),
    responses(SparseOk, crate::openapi::TeiErrors),
)]
pub(crate) async fn embed_sparse(request: RouteRequest) -> Response {
    request.forward_by_header(SPARSE).await
}

/// `POST /models/{model}/embed_sparse`: `POST /embed_sparse` for `model`.
#[utoipa::path(
    post,
    path = "/models/{model}/embed_sparse",
    tag = "tei",
    summary = "Sparse embeddings with a named model (TEI's /embed_sparse)",
    description = "`POST /embed_sparse` for the model named in the path (percent-encode a `/` \
                   in its name). A model no worker serves: 404.",
    params(super::forward::ModelPath, crate::openapi::TimeoutHeader),
    request_body(content = SparseRequest, content_type = "application/json"),
    responses(SparseOk, crate::openapi::TeiErrors),
)]
pub(crate) async fn model_embed_sparse(
    Path(model): Path<String>,
    request: RouteRequest,
) -> Response {
    request.forward(Some(model), SPARSE).await
}

/// `POST /embed_sparse`'s part of the shared path: the model's sparse subject, TEI's body.
const SPARSE: TeiRoute = TeiRoute {
    operation: Operation::Sparse,
    check,
};

/// TEI 1.9.3's checks of an `/embed_sparse` body: its inputs.
fn check(body: &[u8], max_inputs: usize) -> Result<u64, EmbedError> {
    let request = SparseRequest::from_slice(body)?;
    request.validate(max_inputs)?;
    Ok(request.inputs.len() as u64)
}

/// The 200 of `POST /embed_sparse`: a list of non-zero values per input, with the timing
/// headers. A declaration for the document.
pub struct SparseOk;

impl IntoResponses for SparseOk {
    fn responses() -> BTreeMap<String, RefOr<DocResponse>> {
        crate::openapi::ok_with_timings(
            "One list per input, in input order: the non-zero values of its sparse embedding, \
             `index` a token id of the model's vocabulary, ascending.",
            Vec::<Vec<SparseValue>>::schema(),
        )
    }
}
