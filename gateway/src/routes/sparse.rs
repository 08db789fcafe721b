//! TEI 1.9.3's `POST /embed_sparse` (and `POST /models/{model}/embed_sparse`): each HTTP
//! request is one NATS request on the model's sparse subject (`<subject>.embed_sparse`,
//! contract v1.3), so the workers batch the inputs of every caller into one upstream call, with
//! the embedding path's deadline, shedding, bisection and cache.

use embatch_protocol::SparseRequest;
use embatch_protocol::sparse::SparseValue;
use utoipa::PartialSchema;

use super::forward::tei_route;
use crate::openapi::{TeiErrors, ok_response};

tei_route! {
    /// `POST /embed_sparse`'s part of the shared path: the model's sparse subject, TEI's body.
    const SPARSE = Sparse(SparseRequest), inputs |request| request.inputs.len();
    responses(SparseOk, TeiErrors);

    /// `POST /embed_sparse`: TEI 1.9.3's `/embed_sparse` for the default model (or the
    /// `Embatch-Model` header's); the body is checked and forwarded as it is, and the worker's
    /// reply is the body.
    post "/embed_sparse" => embed_sparse {
        summary: "Sparse embeddings (TEI's /embed_sparse)",
        description: "Exactly TEI 1.9.3's `POST /embed_sparse`: one list of the non-zero values \
                      `{\"index\", \"value\"}` per input, in input order, from a SPLADE model. \
                      Inputs of every caller are batched together. A model without SPLADE \
                      pooling: 424 `Backend` \"Model is not an embedding model with SPLADE \
                      pooling\", as TEI.",
        example: {"inputs": ["What is vector search?", "Hello, world!"]},
    }

    /// `POST /models/{model}/embed_sparse`: `POST /embed_sparse` for `model`.
    post "/models/{model}/embed_sparse" => model_embed_sparse {
        summary: "Sparse embeddings with a named model (TEI's /embed_sparse)",
        description: "`POST /embed_sparse` for the model named in the path (percent-encode a \
                      `/` in its name). A model no worker serves: 404.",
    }
}

ok_response! {
    /// The 200 of `POST /embed_sparse`: a list of non-zero values per input, with the timing
    /// headers.
    pub struct SparseOk(
        "One list per input, in input order: the non-zero values of its sparse embedding, \
         `index` a token id of the model's vocabulary, ascending.",
        Vec::<Vec<SparseValue>>::schema(),
    );
}
