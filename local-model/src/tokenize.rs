//! Input text → token ids, with TEI's prompts, length limits and truncation.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use embatch_protocol::{EmbedError, TruncationDirection};
use tokenizers::{PostProcessor, Tokenizer};

use crate::LoadError;
use crate::config::read_file;

/// TEI refuses (or, when truncating, cuts) inputs of more than `max_input_length` × this many
/// characters before tokenizing them, so that a huge input cannot keep the tokenizer busy.
const MAX_CHARS_PER_TOKEN: usize = 250;

/// One tokenized input: special tokens included, at most `max_input_length` tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tokens {
    pub ids: Vec<u32>,
    pub type_ids: Vec<u32>,
}

/// The tokenizer with the limits and prompts of its model.
pub(crate) struct Encoder {
    /// Configured without padding or truncation: both are done here, per request.
    tokenizer: Tokenizer,
    /// Special tokens the post-processor adds to a single sequence (`[CLS]`, `[SEP]`: 2).
    added_tokens: usize,
    max_input_length: usize,
    prompts: BTreeMap<String, String>,
}

impl Encoder {
    /// Loads `tokenizer.json`, dropping the padding and truncation it may carry (MiniLM's pads and
    /// truncates everything to 128 tokens).
    pub(crate) fn load(
        path: &Path,
        max_input_length: usize,
        prompts: BTreeMap<String, String>,
    ) -> Result<Encoder, LoadError> {
        let invalid = |err: tokenizers::Error| LoadError::Tokenizer {
            path: path.to_path_buf(),
            message: err.to_string(),
        };
        let mut tokenizer = Tokenizer::from_bytes(read_file(path)?).map_err(invalid)?;
        tokenizer.with_padding(None);
        tokenizer.with_truncation(None).map_err(invalid)?;
        let added_tokens = tokenizer
            .get_post_processor()
            .map_or(0, |p| p.added_tokens(false));
        if added_tokens >= max_input_length {
            return Err(LoadError::Tokenizer {
                path: path.to_path_buf(),
                message: format!(
                    "the tokenizer adds {added_tokens} special tokens, which leaves no room for \
                     text within the model's {max_input_length} tokens"
                ),
            });
        }
        Ok(Encoder {
            tokenizer,
            added_tokens,
            max_input_length,
            prompts,
        })
    }

    /// Longest input in tokens, special tokens included.
    pub(crate) fn max_input_length(&self) -> usize {
        self.max_input_length
    }

    /// The text of the prompt `name`.
    ///
    /// # Errors
    /// [`EmbedError::Validation`] naming `prompt_name` and the prompts that exist when the model
    /// has no prompt of that name.
    pub(crate) fn prompt(&self, name: &str) -> Result<&str, EmbedError> {
        if let Some(text) = self.prompts.get(name) {
            return Ok(text);
        }
        let message = if self.prompts.is_empty() {
            format!("`prompt_name` is `{name}`, but the model defines no prompts")
        } else {
            let known: Vec<&str> = self.prompts.keys().map(String::as_str).collect();
            format!(
                "`prompt_name` is `{name}`, which is not one of the model's prompts: {}",
                known.join(", ")
            )
        };
        Err(EmbedError::Validation(message))
    }

    /// Tokenizes `prompt` + `input` with special tokens.
    ///
    /// `truncate`: `Some(direction)` cuts an input over `max_input_length` tokens to that length,
    /// keeping its start (`Right`) or its end (`Left`); `None` refuses it.
    ///
    /// # Errors
    /// - [`EmbedError::Validation`] (422, as TEI 1.9.3) for an input over the limit when not
    ///   truncating, with TEI's message: "`inputs` must have less than 256 tokens. Given: 1042"
    ///   (or, for a huge input, the same about characters).
    /// - [`EmbedError::Tokenizer`] when the tokenizer fails.
    pub(crate) fn encode(
        &self,
        input: &str,
        prompt: Option<&str>,
        truncate: Option<TruncationDirection>,
    ) -> Result<Tokens, EmbedError> {
        let input = self.limit_chars(input, truncate)?;
        let text = match prompt {
            Some(prompt) => Cow::Owned(format!("{prompt}{input}")),
            None => Cow::Borrowed(input),
        };
        self.tokenize(&text, true, truncate)
    }

    /// Turns token ids sent by the caller into the model's input, as TEI 1.9.3 does: the ids are
    /// decoded to text and that text is tokenized again *without* adding special tokens, so the
    /// ids the caller sent (special tokens included) are what the model sees. With a prompt, the
    /// ids are decoded without their special tokens, the prompt is prepended and the result is
    /// encoded like a text input. Ids outside the vocabulary are dropped by the decoder.
    ///
    /// # Errors
    /// - [`EmbedError::Validation`] (422) naming `inputs[index]` for an id outside the model's
    ///   vocabulary (the decoder would drop it, and an input of nothing but such ids would give
    ///   the model nothing to embed), or ids that decode to no token at all.
    /// - As [`Encoder::encode`]: [`EmbedError::Validation`] for more than `max_input_length` ids
    ///   when not truncating, [`EmbedError::Tokenizer`] when decoding fails.
    pub(crate) fn encode_ids(
        &self,
        index: usize,
        ids: &[u32],
        prompt: Option<&str>,
        truncate: Option<TruncationDirection>,
    ) -> Result<Tokens, EmbedError> {
        let vocab = self.tokenizer.get_vocab_size(true);
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(EmbedError::Validation(format!(
                "`inputs[{index}]`: token id {id} is outside the model's vocabulary: ids must be \
                 below {vocab}"
            )));
        }
        let tokenizer_error = |err: tokenizers::Error| EmbedError::Tokenizer(err.to_string());
        let skip_special_tokens = prompt.is_some();
        let text = self
            .tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(tokenizer_error)?;
        let tokens = match prompt {
            Some(_) => self.encode(&text, prompt, truncate)?,
            None => self.tokenize(&text, false, truncate)?,
        };
        if tokens.ids.is_empty() {
            return Err(EmbedError::Validation(format!(
                "`inputs[{index}]`: the token ids decode to no token the model can embed"
            )));
        }
        Ok(tokens)
    }

    /// Tokenizes `text`, adding the model's special tokens when `add_special_tokens`, and checks
    /// or applies the token limit (special tokens included).
    fn tokenize(
        &self,
        text: &str,
        add_special_tokens: bool,
        truncate: Option<TruncationDirection>,
    ) -> Result<Tokens, EmbedError> {
        let max = self.max_input_length;
        let added_tokens = if add_special_tokens {
            self.added_tokens
        } else {
            0
        };
        let tokenizer_error = |err: tokenizers::Error| EmbedError::Tokenizer(err.to_string());
        let mut encoding = self
            .tokenizer
            .encode_fast(text, false)
            .map_err(tokenizer_error)?;
        let given = encoding.len() + added_tokens;
        if given > max {
            let Some(direction) = truncate else {
                return Err(EmbedError::Validation(format!(
                    "`inputs` must have less than {max} tokens. Given: {given}"
                )));
            };
            let direction = match direction {
                TruncationDirection::Left => tokenizers::TruncationDirection::Left,
                TruncationDirection::Right => tokenizers::TruncationDirection::Right,
            };
            // Same cut as the tokenizer's own `LongestFirst` truncation of a single sequence.
            encoding.truncate(max - added_tokens, 0, direction);
            // The cut-off parts are kept as "overflowing" encodings; nothing here uses them.
            drop(encoding.take_overflowing());
        }
        let encoding = self
            .tokenizer
            .post_process(encoding, None, add_special_tokens)
            .map_err(tokenizer_error)?;
        Ok(Tokens {
            ids: encoding.get_ids().to_vec(),
            type_ids: encoding.get_type_ids().to_vec(),
        })
    }

    /// TEI's character limit, checked before tokenizing.
    fn limit_chars<'a>(
        &self,
        input: &'a str,
        truncate: Option<TruncationDirection>,
    ) -> Result<&'a str, EmbedError> {
        let limit = self.max_input_length * MAX_CHARS_PER_TOKEN;
        // Cheap test first: a string of at most `limit` bytes has at most `limit` characters.
        if input.len() <= limit {
            return Ok(input);
        }
        let given = input.chars().count();
        if given <= limit {
            return Ok(input);
        }
        match truncate {
            None => Err(EmbedError::Validation(format!(
                "`inputs` must have less than {limit} characters. Given: {given}"
            ))),
            Some(TruncationDirection::Right) => {
                let end = input
                    .char_indices()
                    .nth(limit)
                    .map_or(input.len(), |(i, _)| i);
                Ok(&input[..end])
            }
            Some(TruncationDirection::Left) => {
                let start = input
                    .char_indices()
                    .nth(given - limit)
                    .map_or(0, |(i, _)| i);
                Ok(&input[start..])
            }
        }
    }
}
