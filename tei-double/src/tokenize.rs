//! The double's `POST /tokenize` and `POST /decode`, in TEI 1.9.3's shapes, with a made-up
//! deterministic tokenizer (no vocabulary file):
//!
//! - `/tokenize` `{"inputs": "text" | ["text", ...], "add_special_tokens": true}` → one list
//!   of tokens per text: each whitespace-separated word is one token, `{"id", "text", "special":
//!   false, "start", "stop"}` (byte offsets), its id [`word_id`]; with `add_special_tokens`,
//!   `[CLS]` (101) first and `[SEP]` (102) last, `special: true`, `start` and `stop` `null`.
//! - `/decode` `{"ids": [..] | [[..], ..], "skip_special_tokens": true}` → one string per list:
//!   each id written `tok<id>` (special ids as `[CLS]`, `[SEP]`, `[PAD]`, left out with
//!   `skip_special_tokens`), joined by spaces.
//! - An empty batch → 400 `Empty` ("`inputs` cannot be empty", "`ids` cannot be empty"); more
//!   than `max_client_batch_size` → 422 `Validation`, as TEI.
//!
//! Calls are recorded in the call log, their options `{"route": "/tokenize" | "/decode"}`, and
//! cost the cost model's time (so a test can make them slow), as the other routes.

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use embatch_protocol::Input;
use embatch_protocol::tokenize::{
    DecodeRequest, InputIds, SimpleToken, TokenizeInput, TokenizeRequest,
};

use crate::rerank::call;
use crate::{AppState, error_response};

/// `[CLS]`, `[SEP]` and `[PAD]`: BERT's special token ids.
const SPECIAL: [(u32, &str); 3] = [(101, "[CLS]"), (102, "[SEP]"), (0, "[PAD]")];

/// The double's id of `word`: 1,000 plus a 64-bit FNV-1a hash of it modulo 29,000 (never a
/// special id).
pub fn word_id(word: &str) -> u32 {
    let hash = crate::vectors::fnv1a(word.as_bytes());
    1_000 + u32::try_from(hash % 29_000).unwrap_or(0)
}

/// The double's tokens of `text` (see the module docs).
pub fn tokens_of(text: &str, add_special_tokens: bool) -> Vec<SimpleToken> {
    let special = |(id, text): (u32, &str)| SimpleToken {
        id,
        text: text.to_owned(),
        special: true,
        start: None,
        stop: None,
    };
    let mut tokens = Vec::new();
    if add_special_tokens {
        tokens.push(special(SPECIAL[0]));
    }
    let mut at = 0;
    for word in text.split_whitespace() {
        let start = at + text[at..].find(word).unwrap_or(0);
        at = start + word.len();
        tokens.push(SimpleToken {
            id: word_id(word),
            text: word.to_owned(),
            special: false,
            start: Some(start),
            stop: Some(at),
        });
    }
    if add_special_tokens {
        tokens.push(special(SPECIAL[1]));
    }
    tokens
}

/// The double's text of `ids` (see the module docs).
pub fn decoded(ids: &[u32], skip_special_tokens: bool) -> String {
    let words: Vec<String> = ids
        .iter()
        .filter_map(|id| match SPECIAL.iter().find(|(s, _)| s == id) {
            Some(_) if skip_special_tokens => None,
            Some((_, text)) => Some((*text).to_owned()),
            None => Some(format!("tok{id}")),
        })
        .collect();
    words.join(" ")
}

/// `POST /tokenize` and `POST /decode` when `served`, else no routes (404, as a server without
/// them).
pub(crate) fn routes(served: bool) -> axum::Router<Arc<AppState>> {
    let router = axum::Router::new();
    if !served {
        return router;
    }
    router
        .route("/tokenize", axum::routing::post(tokenize))
        .route("/decode", axum::routing::post(decode))
}

/// `POST /tokenize`.
pub(crate) async fn tokenize(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let arrived = Instant::now();
    let request = match TokenizeRequest::from_slice(&body) {
        Ok(r) => r,
        Err(err) => return error_response(&err),
    };
    let checked = request.validate(state.config.max_client_batch_size);
    let texts = match request.inputs {
        TokenizeInput::Single(text) => vec![text],
        TokenizeInput::Batch(texts) => texts,
    };
    let lists: Vec<Vec<SimpleToken>> = texts
        .iter()
        .map(|t| tokens_of(t, request.add_special_tokens))
        .collect();
    let inputs = texts.into_iter().map(Input::Text).collect();
    let options = serde_json::json!({"route": "/tokenize"});
    if let Err(response) = call(&state, (inputs, options, arrived), checked).await {
        return response;
    }
    Json(lists).into_response()
}

/// `POST /decode`.
pub(crate) async fn decode(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let arrived = Instant::now();
    let request = match DecodeRequest::from_slice(&body) {
        Ok(r) => r,
        Err(err) => return error_response(&err),
    };
    let checked = request.validate(state.config.max_client_batch_size);
    let lists = match request.ids {
        InputIds::Single(ids) => vec![ids],
        InputIds::Batch(lists) => lists,
    };
    let texts: Vec<String> = lists
        .iter()
        .map(|ids| decoded(ids, request.skip_special_tokens))
        .collect();
    let inputs = lists.into_iter().map(Input::Ids).collect();
    let options = serde_json::json!({"route": "/decode"});
    if let Err(response) = call(&state, (inputs, options, arrived), checked).await {
        return response;
    }
    Json(texts).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_tokens_with_their_byte_offsets() {
        let tokens = tokens_of(" héllo  world", true);
        let shape: Vec<_> = tokens
            .iter()
            .map(|t| (t.text.as_str(), t.special, t.start, t.stop))
            .collect();
        assert_eq!(
            shape,
            [
                ("[CLS]", true, None, None),
                ("héllo", false, Some(1), Some(7)),
                ("world", false, Some(9), Some(14)),
                ("[SEP]", true, None, None),
            ]
        );
        assert_eq!(tokens[1].id, word_id("héllo"));
        assert_eq!(tokens_of("a", false).len(), 1);
        let ids: Vec<u32> = tokens.iter().map(|t| t.id).collect();
        assert_eq!(decoded(&ids, true), format!("tok{} tok{}", ids[1], ids[2]));
        assert!(decoded(&ids, false).starts_with("[CLS] tok"));
    }
}
