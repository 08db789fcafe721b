//! OpenAPI schemas (utoipa) of the request types whose JSON shape serde's derive does not give:
//! [`Input`] and [`Inputs`], which are read by a hand-written deserializer (an array of numbers
//! is one input of token ids, an array of texts and id arrays is a batch). Only built with the
//! `openapi` feature (the gateway's `GET /openapi.json`).
//!
//! The schemas describe the inputs the workers embed: an empty text, an empty array of token ids
//! and an empty `inputs` array are answered 400 `Empty`, so they are outside the schema
//! (`minLength`/`minItems` 1). That also keeps the `oneOf` branches disjoint: a non-empty array
//! of numbers is one input of ids, a non-empty array of texts and id arrays is a batch.

use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{PartialSchema, ToSchema};

use crate::request::{Input, Inputs};

/// A text: a non-empty string.
fn text() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .description(Some("A text (UTF-8, at least 1 character)."))
        .into()
}

/// One input as token ids: a non-empty array of ids of the model's vocabulary (u32 each), used as
/// given (no special tokens are added).
fn token_ids() -> Schema {
    let id = ObjectBuilder::new()
        .schema_type(Type::Integer)
        .minimum(Some(0))
        .maximum(Some(u32::MAX));
    ArrayBuilder::new()
        .items(id)
        .min_items(Some(1))
        .description(Some(
            "Token ids of one text (u32 ids of the model's vocabulary, at least 1), used as \
             given: no special tokens are added.",
        ))
        .into()
}

/// `"text"` or `[101, 7592, 102]`.
impl PartialSchema for Input {
    fn schema() -> RefOr<Schema> {
        OneOfBuilder::new()
            .item(text())
            .item(token_ids())
            .description(Some(
                "One input: a text, or the token ids of one text. `\"\"` and `[]` are answered \
                 400 `Empty`.",
            ))
            .into()
    }
}

impl ToSchema for Input {}

/// `"text"`, `[101, 7592, 102]` (one input of ids) or `["text", [101, 102], ...]` (a batch).
impl PartialSchema for Inputs {
    fn schema() -> RefOr<Schema> {
        let batch = ArrayBuilder::new()
            .items(Ref::from_schema_name(Input::name()))
            .min_items(Some(1))
            .description(Some(
                "A batch: one embedding per element, in order. At most the gateway's \
                 `MAX_CLIENT_BATCH_SIZE` elements (`max_client_batch_size` of `GET /info`); \
                 more are answered 422.",
            ));
        OneOfBuilder::new()
            .item(text())
            .item(token_ids())
            .item(batch)
            .description(Some(
                "A text, one input of token ids (an array of numbers), or an array of texts and \
                 token-id arrays, as TEI 1.9.3 reads `inputs`. An array mixing numbers with \
                 texts or arrays is answered 422; an empty array, an empty text or an empty \
                 id array 400 `Empty`.",
            ))
            .into()
    }
}

impl ToSchema for Inputs {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((Input::name().into(), Input::schema()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_is_a_one_of_of_three() {
        let json = serde_json::to_value(Inputs::schema()).expect("serializes");
        let branches = json["oneOf"].as_array().expect("oneOf");
        assert_eq!(branches.len(), 3, "{json}");
        assert_eq!(branches[0]["type"], "string");
        assert_eq!(branches[1]["items"]["type"], "integer");
        assert_eq!(branches[1]["items"]["maximum"], u32::MAX);
        assert_eq!(branches[2]["items"]["$ref"], "#/components/schemas/Input");
        let mut collected = Vec::new();
        Inputs::schemas(&mut collected);
        assert_eq!(collected.len(), 1);
        assert_eq!(collected[0].0, "Input");
    }
}
