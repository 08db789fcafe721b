//! The local model against text-embeddings-inference's answers for the same model
//! (`testdata/minilm-reference-embeddings.json` in the repo), and its request-level behaviour.
//!
//! Needs the model: `scripts/fetch-model.sh` (or `EMBATCH_MODEL_DIR` pointing at a model dir).

#[macro_use]
mod common;

use common::{RealModel, cosine, long_input, model, norm};
use embatch_protocol::{EmbedError, EmbedOptions, Input, TruncationDirection};

/// TEI on CPU uses tanh-approximated GeLU, like this crate, but sums in another order.
const MIN_COSINE: f32 = 0.999;

/// The model under test.
const REAL: RealModel = RealModel {
    var: "EMBATCH_MODEL_DIR",
    name: "all-MiniLM-L6-v2",
    fetch: "scripts/fetch-model.sh (or set EMBATCH_MODEL_DIR to a model dir)",
    reference: ("minilm-reference-embeddings.json", "TEI"),
    min_cosine: MIN_COSINE,
    limits: (384, 256),
};

/// The default options with `dimensions`.
fn with_dimensions(dimensions: usize) -> EmbedOptions {
    EmbedOptions {
        dimensions: Some(dimensions),
        ..EmbedOptions::default()
    }
}

/// The default options with `normalize`.
fn with_normalize(normalize: bool) -> EmbedOptions {
    EmbedOptions {
        normalize,
        ..EmbedOptions::default()
    }
}

/// The default options with the prompt `prompt_name`.
fn with_prompt(prompt_name: &str) -> EmbedOptions {
    EmbedOptions {
        prompt_name: Some(prompt_name.into()),
        ..EmbedOptions::default()
    }
}

/// Asserts that `err` is a 422 validation error naming `field`; its message.
fn validation_message(err: &EmbedError, field: &str) -> String {
    assert!(matches!(err, EmbedError::Validation(_)), "{err:?}");
    assert_eq!(err.status(), 422);
    let message = err.to_string();
    assert!(message.contains(field), "{message}");
    message
}

fn embed_one(input: &str, options: &EmbedOptions) -> Result<Vec<f32>, EmbedError> {
    let mut out = model().embed(&[Input::from(input)], options)?;
    assert_eq!(out.len(), 1);
    Ok(out.remove(0))
}

real_model_tests!();

/// TEI 1.9.3 truncates by default (`--auto-truncate` is `true`): a long input without
/// `truncate` gets the embedding TEI answered for it with `truncate: true`.
#[test]
fn long_input_without_truncate_is_truncated_as_tei_does() {
    let reference = REAL.reference();
    let truncated = reference
        .cases
        .iter()
        .find(|case| case.request.truncate == Some(true))
        .expect("the reference has the long input with `truncate: true`");
    let long = truncated.request.inputs.as_slice()[0]
        .as_text()
        .expect("a text");
    assert_eq!(long, long_input().trim_end());
    let got = embed_one(long, &EmbedOptions::default()).expect("auto-truncated");
    let cos = cosine(&got, &truncated.embeddings[0]);
    assert!(
        cos >= MIN_COSINE,
        "cosine {cos} with TEI's truncated embedding"
    );
}

/// With `truncate: false`, TEI 1.9.3 answers 422 `Validation`: "Input validation error:
/// `inputs` must have less than 256 tokens. Given: N".
#[test]
fn long_input_with_truncate_false_is_422() {
    let long = long_input();
    let options = EmbedOptions {
        truncate: Some(false),
        ..EmbedOptions::default()
    };
    let err = embed_one(&long, &options).expect_err("over 256 tokens");
    let message = validation_message(&err, "`inputs` must have less than 256 tokens. Given: ");
    assert!(message.starts_with("Input validation error: "), "{message}");
    let given: usize = message
        .rsplit("Given: ")
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no token count in {message}"));
    assert!(given > 256, "{message}");
}

#[test]
fn one_long_input_fails_the_whole_call_without_truncation() {
    let inputs = vec![Input::from("short"), Input::from(long_input())];
    let options = EmbedOptions {
        truncate: Some(false),
        ..EmbedOptions::default()
    };
    let err = model()
        .embed(&inputs, &options)
        .expect_err("second input is too long");
    assert_eq!(err.status(), 422);
}

#[test]
fn left_truncation_keeps_the_end() {
    let long = long_input();
    let truncate = |direction| EmbedOptions {
        truncate: Some(true),
        truncation_direction: direction,
        ..EmbedOptions::default()
    };
    let right = embed_one(&long, &truncate(None)).expect("truncated");
    let explicit_right =
        embed_one(&long, &truncate(Some(TruncationDirection::Right))).expect("truncated");
    let left = embed_one(&long, &truncate(Some(TruncationDirection::Left))).expect("truncated");
    assert!(
        cosine(&right, &explicit_right) > 0.99999,
        "Right is the default"
    );
    assert!(
        cosine(&left, &right) < 0.999,
        "left truncation embeds another part of the text"
    );
    assert!((norm(&left) - 1.0).abs() < 1e-4);
}

#[test]
fn dimensions_keep_a_normalized_prefix() {
    let input = "Matryoshka embeddings keep their meaning when cut short.";
    let full = embed_one(input, &with_normalize(false)).expect("embeds");
    let short = embed_one(input, &with_dimensions(64)).expect("embeds");
    assert_eq!(short.len(), 64);
    assert!((norm(&short) - 1.0).abs() < 1e-4);
    assert!(cosine(&short, &full[..64]) > 0.99999);

    let all = embed_one(input, &with_dimensions(384)).expect("the model's own size is allowed");
    assert_eq!(all.len(), 384);
}

#[test]
fn dimensions_over_the_model_size_are_invalid() {
    for dimensions in [385, 4096, 0] {
        let err = embed_one("hello", &with_dimensions(dimensions)).expect_err("invalid dimensions");
        let message = validation_message(&err, "`dimensions`");
        if dimensions > 0 {
            assert!(message.contains("384"), "{message}");
        }
    }
}

#[test]
fn unknown_prompt_name_is_invalid() {
    let err = embed_one("hello", &with_prompt("query")).expect_err("MiniLM has no prompts");
    let message = validation_message(&err, "`prompt_name`");
    assert!(message.contains("query"), "{message}");
}

#[test]
fn prompts_from_the_sentence_transformers_config_are_prepended() {
    // The real model, with a config_sentence_transformers.json that defines prompts.
    let prompts = r#"{"prompts": {"query": "query: ", "passage": "passage: "}}"#;
    let (_dir, with_prompts) = common::variant(
        "minilm-with-prompts",
        ("config_sentence_transformers.json", prompts),
    );
    assert_eq!(with_prompts.model_id(), "minilm-with-prompts");

    let inputs = vec![Input::from("What is vector search?")];
    let prompted = with_prompts
        .embed(&inputs, &with_prompt("query"))
        .expect("known prompt");
    let by_hand = with_prompts
        .embed(
            &[Input::from("query: What is vector search?")],
            &EmbedOptions::default(),
        )
        .expect("embeds");
    assert!(cosine(&prompted[0], &by_hand[0]) > 0.99999);

    let err = with_prompts
        .embed(&inputs, &with_prompt("document"))
        .expect_err("unknown prompt");
    let message = validation_message(&err, "`prompt_name`");
    assert!(message.contains("passage, query"), "{message}");
}

#[test]
fn a_batch_gives_the_same_vectors_as_one_input_at_a_time() {
    let inputs: Vec<Input> = [
        "x",
        "",
        "   leading and trailing whitespace   ",
        "Emoji test: 🚀🔥 embeddings are fun 🎉",
        "東京は日本の首都です。",
        "The stock market fell sharply after the central bank raised interest rates, and \
         analysts expect further volatility as investors reassess their portfolios.",
    ]
    .map(Input::from)
    .to_vec();
    for normalize in [true, false] {
        let options = with_normalize(normalize);
        let batch = model().embed(&inputs, &options).expect("batch");
        assert_eq!(batch.len(), inputs.len());
        for (input, batched) in inputs.iter().zip(&batch) {
            let alone = model()
                .embed(std::slice::from_ref(input), &options)
                .expect("alone")
                .remove(0);
            let cos = cosine(batched, &alone);
            assert!(cos >= 0.9999, "{input:?}: cosine {cos}");
            let (a, b) = (norm(batched), norm(&alone));
            assert!((a - b).abs() <= 1e-3 * b, "{input:?}: norm {a} vs {b}");
        }
    }
}

#[test]
fn empty_string_and_empty_batch() {
    let empty = embed_one("", &EmbedOptions::default()).expect("only [CLS] [SEP]");
    assert_eq!(empty.len(), 384);
    assert!((norm(&empty) - 1.0).abs() < 1e-4);
    assert!(
        model()
            .embed(&[], &EmbedOptions::default())
            .expect("nothing to do")
            .is_empty()
    );
}

/// all-MiniLM-L6-v2's (BERT uncased) ids for `[CLS] hello world [SEP]`.
const HELLO_WORLD_IDS: [u32; 4] = [101, 7592, 2088, 102];

#[test]
fn token_ids_embed_like_the_text_they_encode() {
    let options = EmbedOptions::default();
    let by_text = embed_one("hello world", &options).expect("text");
    let out = model()
        .embed(
            &[
                Input::Ids(HELLO_WORLD_IDS.to_vec()),
                Input::from("hello world"),
            ],
            &options,
        )
        .expect("ids and text in one call");
    assert!(cosine(&out[0], &by_text) > 0.99999, "ids vs text");
    assert!(cosine(&out[1], &by_text) > 0.99999, "batched text");

    // Without [CLS]/[SEP] the model sees other tokens: the ids are used as given.
    let bare = model()
        .embed(&[Input::Ids(vec![7592, 2088])], &options)
        .expect("bare ids");
    assert!(
        cosine(&bare[0], &by_text) < 0.999,
        "no special tokens are added"
    );
}

#[test]
fn token_ids_over_the_limit_are_refused_or_truncated() {
    let long = Input::Ids([101].into_iter().chain([7592; 300]).chain([102]).collect());
    let no_truncation = EmbedOptions {
        truncate: Some(false),
        ..EmbedOptions::default()
    };
    let err = model()
        .embed(std::slice::from_ref(&long), &no_truncation)
        .expect_err("302 ids");
    assert_eq!(err.status(), 422);
    assert!(
        err.to_string()
            .contains("`inputs` must have less than 256 tokens. Given: 302"),
        "{err}"
    );
    let truncated = model()
        .embed(
            &[long],
            &EmbedOptions {
                truncate: Some(true),
                ..EmbedOptions::default()
            },
        )
        .expect("truncated");
    assert_eq!(truncated[0].len(), 384);
}

#[test]
fn token_ids_outside_the_vocabulary_are_refused_naming_the_input() {
    let err = model()
        .embed(
            &[Input::from("a"), Input::Ids(vec![101, 40_000, 102])],
            &EmbedOptions::default(),
        )
        .expect_err("id 40000 is not in MiniLM's 30522");
    let message = validation_message(&err, "`inputs[1]`");
    assert!(
        message.contains("40000") && message.contains("30522"),
        "{message}"
    );
}
