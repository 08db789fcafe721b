//! TEI 1.9.3's `POST /tokenize` and `POST /decode` (and under `/models/{model}/`): each HTTP
//! request is one NATS request on the model's subject for the route (`<subject>.tokenize`,
//! `<subject>.decode`, contract v1.3), which the worker passes to its upstream's route, one call
//! per request (they run no model: a batch would only add its wait), with the request's
//! deadline.

use embatch_protocol::tokenize::{DecodeRequest, SimpleToken, TokenizeRequest};
use utoipa::PartialSchema;

use super::forward::tei_route;
use crate::openapi::{TeiErrors, ok_response};

tei_route! {
    /// `POST /tokenize`'s part of the shared path: the model's tokenize subject, TEI's body,
    /// counting its texts.
    const TOKENIZE = Tokenize(TokenizeRequest), inputs |request| request.len();
    responses(TokenizeOk, TeiErrors);

    /// `POST /tokenize`: TEI 1.9.3's `/tokenize` for the default model (or the `Embatch-Model`
    /// header's).
    post "/tokenize" => tokenize {
        summary: "Tokenize texts (TEI's /tokenize)",
        description: "Exactly TEI 1.9.3's `POST /tokenize`: one list of tokens per text, each \
                      `{\"id\", \"text\", \"special\", \"start\", \"stop\"}` (byte offsets; \
                      `null` for a special token). Passed to the model's upstream, one call per \
                      request. The built-in model answers from its own tokenizer. An upstream \
                      without the route (a server answering 404): 424 naming it.",
        example: {"inputs": ["What is vector search?"], "add_special_tokens": true},
    }

    /// `POST /models/{model}/tokenize`: `POST /tokenize` for `model`.
    post "/models/{model}/tokenize" => model_tokenize {
        summary: "Tokenize texts with a named model's tokenizer (TEI's /tokenize)",
        description: "`POST /tokenize` for the model named in the path (percent-encode a `/` \
                      in its name). A model no worker serves: 404.",
    }
}

tei_route! {
    /// `POST /decode`'s part of the shared path: the model's decode subject, TEI's body,
    /// counting its lists of ids.
    const DECODE = Decode(DecodeRequest), inputs |request| request.len();
    responses(DecodeOk, TeiErrors);

    /// `POST /decode`: TEI 1.9.3's `/decode` for the default model (or the `Embatch-Model`
    /// header's).
    post "/decode" => decode {
        summary: "Decode token ids (TEI's /decode)",
        description: "Exactly TEI 1.9.3's `POST /decode`: one string per list of ids. Passed \
                      to the model's upstream, one call per request (the built-in model answers \
                      from its own tokenizer). An upstream without the route: 424 naming it.",
        example: {"ids": [101, 7592, 102], "skip_special_tokens": true},
    }

    /// `POST /models/{model}/decode`: `POST /decode` for `model`.
    post "/models/{model}/decode" => model_decode {
        summary: "Decode token ids with a named model's tokenizer (TEI's /decode)",
        description: "`POST /decode` for the model named in the path (percent-encode a `/` in \
                      its name). A model no worker serves: 404.",
    }
}

ok_response! {
    /// The 200 of `POST /tokenize`: a list of tokens per text.
    pub struct TokenizeOk(
        "One list of tokens per text, in input order.",
        Vec::<Vec<SimpleToken>>::schema(),
    );
}

ok_response! {
    /// The 200 of `POST /decode`: a string per list of ids.
    pub struct DecodeOk("One text per list of ids, in input order.", Vec::<String>::schema());
}
