//! TEI 1.9.3's `POST /predict`, `POST /embed_all` and `POST /similarity` (and under
//! `/models/{model}/`): each HTTP request is one NATS request on the model's subject for the
//! route (`<subject>.predict`, `<subject>.embed_all`, `<subject>.similarity`, contract v1.4),
//! so the workers batch the inputs of every caller into one upstream call, with the embedding
//! path's deadline, shedding, bisection and cache.

use embatch_protocol::embed_all::EmbedAllRequest;
use embatch_protocol::predict::{PredictRequest, Prediction};
use embatch_protocol::similarity::SimilarityRequest;
use utoipa::PartialSchema;
use utoipa::openapi::schema::OneOfBuilder;

use super::forward::tei_route;
use crate::openapi::{TeiErrors, ok_response};

tei_route! {
    /// `POST /predict`'s part of the shared path.
    const PREDICT = Predict(PredictRequest), inputs |request| request.inputs.as_slice().len();
    responses(PredictOk, TeiErrors);

    /// `POST /predict`: TEI 1.9.3's `/predict` for the default model (or the `Embatch-Model`
    /// header's); the body is checked and forwarded as it is, and the worker's reply is the body.
    post "/predict" => predict {
        summary: "Classify texts or pairs (TEI's /predict)",
        description: "Exactly TEI 1.9.3's `POST /predict`: for each sequence (a text, or a pair \
                      `[a, b]` scored together), every label of the model with its score, \
                      highest first; one list for a single sequence, a list of lists for a batch \
                      `[[a], [a, b], ...]`. Sequences of every caller are batched together. A \
                      model that is not a classifier or reranker: 424 \"Model is not a \
                      classifier model\", as TEI.",
        example: {"inputs": [["I like you."], ["What is it?", "It is a test."]]},
    }

    /// `POST /models/{model}/predict`: `POST /predict` for `model`.
    post "/models/{model}/predict" => model_predict {
        summary: "Classify with a named model (TEI's /predict)",
        description: "`POST /predict` for the model named in the path (percent-encode a `/` in \
                      its name). A model no worker serves: 404.",
    }
}

tei_route! {
    /// `POST /embed_all`'s part of the shared path.
    const EMBED_ALL = EmbedAll(EmbedAllRequest), inputs |request| request.inputs.len();
    responses(EmbedAllOk, TeiErrors);

    /// `POST /embed_all`: TEI 1.9.3's `/embed_all` for the default model (or the header's).
    post "/embed_all" => embed_all {
        summary: "Token embeddings (TEI's /embed_all)",
        description: "Exactly TEI 1.9.3's `POST /embed_all`: for each input, one vector per \
                      token (the model's last hidden state, not pooled). Inputs of every caller \
                      are batched together. Replies are large: a request whose reply cannot fit \
                      the NATS server's `max_payload` is 413 naming how many inputs fit. A \
                      classifier: 424 \"Model is not an embedding model\"; a SPLADE model: 424, \
                      as TEI.",
        example: {"inputs": ["What is vector search?"]},
    }

    /// `POST /models/{model}/embed_all`: `POST /embed_all` for `model`.
    post "/models/{model}/embed_all" => model_embed_all {
        summary: "Token embeddings with a named model (TEI's /embed_all)",
        description: "`POST /embed_all` for the model named in the path. A model no worker \
                      serves: 404.",
    }
}

tei_route! {
    /// `POST /similarity`'s part of the shared path: the source and the sentences count as
    /// inputs (TEI 1.9.3's checks of a `/similarity` body).
    const SIMILARITY = Similarity(SimilarityRequest),
        inputs |request| request.inputs.sentences.len() + 1;
    responses(SimilarityOk, TeiErrors);

    /// `POST /similarity`: TEI 1.9.3's `/similarity` for the default model (or the header's).
    post "/similarity" => similarity {
        summary: "Sentence similarity (TEI's /similarity)",
        description: "Exactly TEI 1.9.3's `POST /similarity`: the cosine similarity of each \
                      sentence's embedding with the source sentence's, in sentence order. The \
                      workers embed the source and the sentences as `/embed` inputs \
                      (`normalize: false`, as TEI), batched with other callers' and cached, and \
                      compute the cosines. A classifier: 424 \"Model is not an embedding \
                      model\", as TEI.",
        example: {"inputs": {"source_sentence": "What is Deep Learning?",
                             "sentences": ["What is Machine Learning?"]}},
    }

    /// `POST /models/{model}/similarity`: `POST /similarity` for `model`.
    post "/models/{model}/similarity" => model_similarity {
        summary: "Sentence similarity with a named model (TEI's /similarity)",
        description: "`POST /similarity` for the model named in the path. A model no worker \
                      serves: 404.",
    }
}

ok_response! {
    /// The 200 of `POST /predict`.
    pub struct PredictOk(
        "Every label of the model with its score (softmax of the logits, or the logits with \
         `raw_scores`), highest first.",
        OneOfBuilder::new()
            .item(Vec::<Prediction>::schema())
            .item(Vec::<Vec<Prediction>>::schema())
            .description(Some(
                "A single sequence: its predictions. A batch: one list of predictions per \
                 sequence, in order.",
            ))
            .into(),
    );
}

ok_response! {
    /// The 200 of `POST /embed_all`.
    pub struct EmbedAllOk(
        "One list per input, in input order: one vector per token of the input.",
        Vec::<Vec<Vec<f32>>>::schema(),
    );
}

ok_response! {
    /// The 200 of `POST /similarity`.
    pub struct SimilarityOk(
        "One cosine similarity per sentence, in sentence order, in [-1, 1].",
        Vec::<f32>::schema(),
    );
}
