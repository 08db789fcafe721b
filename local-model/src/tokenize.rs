//! Input text → token ids, with TEI's prompts, length limits and truncation: [`Encoder`], used by
//! the model for its forward passes and by the worker to count tokens before batching.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use embatch_protocol::{EmbedError, Input, TruncationDirection};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{PostProcessor, Tokenizer};

use crate::LoadError;
use crate::config::{self, read_file};

/// TEI refuses (or, when truncating, cuts) inputs of more than `max_input_length` × this many
/// characters before tokenizing them, so that a huge input cannot keep the tokenizer busy.
const MAX_CHARS_PER_TOKEN: usize = 250;

/// When truncating, the first piece of a long text tokenized, in bytes per token kept: 16 (about
/// four times what English needs, ~4.5 bytes per token); each further piece is 4 times larger.
const PIECE_BYTES_PER_TOKEN: usize = 16;

/// One tokenized input: special tokens included, at most `max_input_length` tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tokens {
    /// The token ids, special tokens included.
    pub ids: Vec<u32>,
    /// The token type (segment) ids, one per token.
    pub type_ids: Vec<u32>,
}

/// A model's tokenizer (`tokenizer.json`) with the limits and prompts of its model, tokenizing as
/// TEI 1.9.3 does: the prompt prepended, special tokens added, TEI's character limit, then the
/// token limit (`max_input_length`, special tokens included) applied by truncating or refusing.
/// `Send + Sync`: share one in an `Arc`.
pub struct Encoder {
    /// Configured without padding or truncation: both are done here, per request.
    tokenizer: Tokenizer,
    /// Special tokens the post-processor adds to a single sequence (`[CLS]`, `[SEP]`: 2).
    added_tokens: usize,
    max_input_length: usize,
    prompts: BTreeMap<String, String>,
    /// Whether a text cut at a space, tab or newline tokenizes into a run of the whole text's
    /// tokens (see [`splits_at_whitespace`]): then truncation tokenizes a bounded piece.
    pieces: bool,
}

impl Encoder {
    /// Loads `tokenizer.json`, dropping the padding and truncation it may carry (MiniLM's pads and
    /// truncates everything to 128 tokens), for a model whose inputs have at most
    /// `max_input_length` tokens (special tokens included) and whose prompts are `prompts`
    /// (name → text).
    ///
    /// # Errors
    /// [`LoadError::Missing`] or [`LoadError::Read`] when the file cannot be read,
    /// [`LoadError::Tokenizer`] when it is not a tokenizer or its special tokens leave no room.
    pub fn load(
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
        let pieces = splits_at_whitespace(&tokenizer);
        Ok(Encoder {
            tokenizer,
            added_tokens,
            max_input_length,
            prompts,
            pieces,
        })
    }

    /// Loads the tokenizer file `path` for a model served elsewhere (a TEI server) whose input
    /// limit is `max_input_length` tokens (TEI's `/info`), with the prompts of the
    /// `config_sentence_transformers.json` next to it, when there is one (as in a model
    /// directory or a Hugging Face cache snapshot).
    ///
    /// # Errors
    /// As [`Encoder::load`]; [`LoadError::Json`] for a prompts file that is not valid JSON.
    pub fn load_file(path: &Path, max_input_length: usize) -> Result<Encoder, LoadError> {
        let prompts = match path.parent() {
            Some(dir) => config::read_prompts(dir)?,
            None => BTreeMap::new(),
        };
        Encoder::load(path, max_input_length, prompts)
    }

    /// The tokenizer itself (no padding, no truncation), for TEI's token routes.
    pub(crate) fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Longest input in tokens, special tokens included.
    pub fn max_input_length(&self) -> usize {
        self.max_input_length
    }

    /// Token counts of `inputs` as the model will see them: special tokens included, after the
    /// prompt `prompt` (its text) is prepended and after truncation (`truncate`: `Some(end)` cuts
    /// at that end, `None` refuses an input over the limit). One count per input, in order; each
    /// at most [`Encoder::max_input_length`]. CPU-bound (a few µs to tens of µs per short input,
    /// see `docs/design/tokenizer.md`).
    ///
    /// # Errors
    /// As [`Encoder::encode`] and [`Encoder::encode_ids`] (the first failing input, in order):
    /// [`EmbedError::Validation`] (422) for an input over the limit when not truncating or a
    /// token id outside the vocabulary, [`EmbedError::Tokenizer`] (422) when the tokenizer fails.
    pub fn count(
        &self,
        inputs: &[Input],
        prompt: Option<&str>,
        truncate: Option<TruncationDirection>,
    ) -> Result<Vec<u32>, EmbedError> {
        inputs
            .iter()
            .enumerate()
            .map(|(i, input)| {
                let tokens = match input {
                    Input::Text(text) => self.encode(text, prompt, truncate)?,
                    Input::Ids(ids) => self.encode_ids(i, ids, prompt, truncate)?,
                    Input::Pair(query, text) => return self.count_pair(query, text, truncate),
                };
                // At most `max_input_length` tokens, itself a `usize` read from a config file.
                Ok(u32::try_from(tokens.ids.len()).unwrap_or(u32::MAX))
            })
            .collect()
    }

    /// The token count of a (query, text) pair as a cross-encoder sees it (TEI 1.9.3 encodes a
    /// rerank pair as one dual input): both sequences with the tokenizer's pair template
    /// (`[CLS] q [SEP] t [SEP]` for BERT), at most [`Encoder::max_input_length`] when
    /// truncating.
    ///
    /// # Errors
    /// [`EmbedError::Validation`] (422) with TEI's message for a pair over the limit when not
    /// truncating; [`EmbedError::Tokenizer`] when the tokenizer fails.
    pub fn count_pair(
        &self,
        query: &str,
        text: &str,
        truncate: Option<TruncationDirection>,
    ) -> Result<u32, EmbedError> {
        let encoding = self
            .tokenizer
            .encode_fast((query, text), true)
            .map_err(|err| EmbedError::Tokenizer(err.to_string()))?;
        let (given, max) = (encoding.len(), self.max_input_length);
        if given > max && truncate.is_none() {
            return Err(EmbedError::Validation(format!(
                "`inputs` must have less than {max} tokens. Given: {given}"
            )));
        }
        Ok(u32::try_from(given.min(max)).unwrap_or(u32::MAX))
    }

    /// The text of the prompt `name`.
    ///
    /// # Errors
    /// [`EmbedError::Validation`] naming `prompt_name` and the prompts that exist when the model
    /// has no prompt of that name.
    pub fn prompt(&self, name: &str) -> Result<&str, EmbedError> {
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
    pub fn encode(
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
    pub fn encode_ids(
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
        // Truncating, a piece of a long text that holds the tokens kept is enough.
        let piece = match truncate {
            Some(direction) if self.pieces => {
                self.encode_piece(text, max - added_tokens, direction)?
            }
            _ => None,
        };
        let mut encoding = match piece {
            Some(encoding) => encoding,
            None => self
                .tokenizer
                .encode_fast(text, false)
                .map_err(tokenizer_error)?,
        };
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

    /// The encoding of the smallest piece of `text` at the end `direction` keeps (its start for
    /// `Right`, its end for `Left`) that holds at least `kept` tokens, trying pieces of
    /// [`PIECE_BYTES_PER_TOKEN`] × `kept` bytes, then 4 times larger each time, each cut at a
    /// space, tab or newline; `None` when no such piece is shorter than `text` (tokenize it
    /// whole). Cut there, a piece's tokens are a run of the whole text's at that end
    /// ([`splits_at_whitespace`]), so truncating the piece to `kept` tokens gives the whole
    /// text's truncation: a 2 MiB input costs the tokens it keeps, not 500,000 of them.
    ///
    /// # Errors
    /// [`EmbedError::Tokenizer`] when the tokenizer fails.
    fn encode_piece(
        &self,
        text: &str,
        kept: usize,
        direction: TruncationDirection,
    ) -> Result<Option<tokenizers::Encoding>, EmbedError> {
        let mut size = kept.saturating_mul(PIECE_BYTES_PER_TOKEN).max(1024);
        while size < text.len() {
            let Some(piece) = piece(text, size, direction) else {
                return Ok(None);
            };
            let encoding = self
                .tokenizer
                .encode_fast(piece, false)
                .map_err(|err| EmbedError::Tokenizer(err.to_string()))?;
            if encoding.len() >= kept {
                return Ok(Some(encoding));
            }
            size = size.saturating_mul(4);
        }
        Ok(None)
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

/// The piece of `text` of about `size` bytes at the end `direction` keeps, cut at a space, tab or
/// newline (the nearest to `size` bytes from that end, preferring a smaller piece); `None` when
/// there is no such cut, or the piece would be the whole text.
fn piece(text: &str, size: usize, direction: TruncationDirection) -> Option<&str> {
    let bytes = text.as_bytes();
    let is_cut = |b: &u8| matches!(b, b' ' | b'\t' | b'\n');
    // ASCII bytes never occur inside a multi-byte UTF-8 character: every cut is a char boundary.
    match direction {
        TruncationDirection::Right => {
            let end = bytes.get(..=size)?.iter().rposition(is_cut).or_else(|| {
                let after = bytes.get(size..)?.iter().position(is_cut)?;
                Some(size + after)
            })?;
            (end > 0).then(|| text.get(..end)).flatten()
        }
        TruncationDirection::Left => {
            let from = bytes.len().checked_sub(size)?;
            let start = match bytes.get(from..)?.iter().position(is_cut) {
                Some(at) => from + at,
                None => bytes.get(..from)?.iter().rposition(is_cut)?,
            };
            (start > 0).then(|| text.get(start..)).flatten()
        }
    }
}

/// Whether `tokenizer` tokenizes a text cut at a space, tab or newline into a run of the whole
/// text's tokens: its normalizer works per character (none, BERT's, lowercasing, Unicode
/// normalization, accent or whitespace stripping), and its pre-tokenizer splits at whitespace and
/// drops it (BERT's, `Whitespace`, `WhitespaceSplit`, or a sequence of those with
/// punctuation and digit splitting). The model then tokenizes each word alone (WordPiece, BPE,
/// Unigram and WordLevel all do), so the words of a piece are the whole text's words there.
/// Tokenizers that prepend or merge across spaces (`Metaspace`, `ByteLevel`, SentencePiece's
/// `Precompiled`) are tokenized whole.
fn splits_at_whitespace(tokenizer: &Tokenizer) -> bool {
    fn local(normalizer: &NormalizerWrapper) -> bool {
        match normalizer {
            NormalizerWrapper::BertNormalizer(_)
            | NormalizerWrapper::StripNormalizer(_)
            | NormalizerWrapper::StripAccents(_)
            | NormalizerWrapper::NFC(_)
            | NormalizerWrapper::NFD(_)
            | NormalizerWrapper::NFKC(_)
            | NormalizerWrapper::NFKD(_)
            | NormalizerWrapper::Lowercase(_) => true,
            NormalizerWrapper::Sequence(sequence) => sequence.as_ref().iter().all(local),
            _ => false,
        }
    }
    fn splits(pre_tokenizer: &PreTokenizerWrapper) -> bool {
        match pre_tokenizer {
            PreTokenizerWrapper::BertPreTokenizer(_)
            | PreTokenizerWrapper::Whitespace(_)
            | PreTokenizerWrapper::WhitespaceSplit(_) => true,
            PreTokenizerWrapper::Sequence(sequence) => {
                let members = sequence.as_ref();
                members.iter().any(splits)
                    && members.iter().all(|member| {
                        splits(member)
                            || matches!(
                                member,
                                PreTokenizerWrapper::Punctuation(_)
                                    | PreTokenizerWrapper::Digits(_)
                            )
                    })
            }
            _ => false,
        }
    }
    tokenizer.get_normalizer().is_none_or(local)
        && tokenizer.get_pre_tokenizer().is_some_and(splits)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// all-MiniLM-L6-v2's `tokenizer.json` (`EMBATCH_MODEL_DIR`, else the repository's
    /// `models/`; `scripts/fetch-model.sh` fetches it).
    fn tokenizer_file() -> std::path::PathBuf {
        let dir = std::env::var_os("EMBATCH_MODEL_DIR").map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/all-MiniLM-L6-v2"),
            std::path::PathBuf::from,
        );
        let file = dir.join("tokenizer.json");
        assert!(
            file.is_file(),
            "no {}: run scripts/fetch-model.sh",
            file.display()
        );
        file
    }

    /// The encoder for `max` tokens, and the same one tokenizing every text whole.
    fn encoders(max: usize) -> (Encoder, Encoder) {
        let load = || Encoder::load(&tokenizer_file(), max, BTreeMap::new()).expect("loads");
        let pieces = load();
        assert!(pieces.pieces, "BERT's tokenizer splits at whitespace");
        let mut whole = load();
        whole.pieces = false;
        (pieces, whole)
    }

    /// A rerank pair counts BERT's pair template: `[CLS] q [SEP] t [SEP]`; over the limit it is
    /// cut, or refused with TEI's message.
    #[test]
    fn a_pair_counts_both_sequences_and_three_special_tokens() {
        let (encoder, _) = encoders(8);
        let single = |text: &str| {
            encoder
                .count(&[Input::from(text)], None, None)
                .expect("counts")[0]
        };
        let (query, text) = ("hello world", "good day");
        let pair = encoder.count_pair(query, text, None).expect("counts");
        assert_eq!(pair, single(query) + single(text) - 1);
        let counted = encoder
            .count(&[Input::Pair(query.into(), text.into())], None, None)
            .expect("counts");
        assert_eq!(counted, [pair]);
        let long = "word ".repeat(20);
        let cut = encoder.count_pair(query, &long, Some(TruncationDirection::Right));
        assert_eq!(cut.expect("cut"), 8);
        let err = encoder
            .count_pair(query, &long, None)
            .expect_err("over the limit");
        assert!(
            err.to_string().contains("must have less than 8 tokens"),
            "{err}"
        );
    }

    /// Texts whose cuts fall on every kind of boundary: long prose, several spaces, newlines
    /// and tabs in a row, punctuation, CJK (a token per character), combining accents right after
    /// a space, a word longer than WordPiece takes (one `[UNK]`), leading and trailing spaces, no
    /// space at all.
    fn texts() -> Vec<String> {
        let prose = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/reference-long-input.txt"),
        )
        .expect("the long reference input");
        let mixed =
            "Hello,  world!\n\n\tTabs\tand  spaces; naïve café \u{301}accent, 東京は晴れ。 \
                     x{}y(z) [CLS] don't 3.14159 "
                .repeat(200);
        vec![
            prose.repeat(20),
            mixed.clone(),
            format!("   {mixed}   "),
            format!("{} {}", "a".repeat(150), prose),
            "漢字".repeat(5000),
            "word".repeat(20_000),
            "short text".into(),
        ]
    }

    #[test]
    fn a_piece_truncates_exactly_as_the_whole_text() {
        for max in [8, 40, 256] {
            let (pieces, whole) = encoders(max);
            for direction in [TruncationDirection::Right, TruncationDirection::Left] {
                let piece = pieces.encode_piece(&texts()[0], max - 2, direction);
                assert!(
                    piece.is_ok_and(|piece| piece.is_some()),
                    "long prose is tokenized by a piece"
                );
            }
            for text in texts() {
                for direction in [TruncationDirection::Right, TruncationDirection::Left] {
                    for prompt in [None, Some("query: ")] {
                        let got = pieces.encode(&text, prompt, Some(direction));
                        let expected = whole.encode(&text, prompt, Some(direction));
                        assert_eq!(
                            got,
                            expected,
                            "max {max}, {direction:?}, prompt {prompt:?}, text {:?}...",
                            text.chars().take(40).collect::<String>()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn without_truncation_a_long_text_is_counted_whole() {
        let (pieces, _) = encoders(256);
        let err = pieces
            .encode(&"word ".repeat(1000), None, None)
            .expect_err("over the limit");
        assert_eq!(
            err.to_string(),
            "Input validation error: `inputs` must have less than 256 tokens. Given: 1002"
        );
    }

    #[test]
    fn pieces_are_cut_at_whitespace_toward_the_end_kept() {
        let text = "aaaa bbbb cccc dddd";
        assert_eq!(piece(text, 7, TruncationDirection::Right), Some("aaaa"));
        assert_eq!(
            piece(text, 10, TruncationDirection::Right),
            Some("aaaa bbbb")
        );
        assert_eq!(piece(text, 7, TruncationDirection::Left), Some(" dddd"));
        assert_eq!(
            piece(text, 12, TruncationDirection::Left),
            Some(" cccc dddd")
        );
        assert_eq!(piece("abcdefgh", 3, TruncationDirection::Right), None);
        assert_eq!(piece("abcdefgh", 3, TruncationDirection::Left), None);
        assert_eq!(piece(" abcdefgh", 3, TruncationDirection::Left), None);
        assert_eq!(
            piece("ab cdefgh", 1, TruncationDirection::Right),
            Some("ab")
        );
        assert_eq!(
            piece("abcdef gh", 1, TruncationDirection::Left),
            Some(" gh")
        );
    }

    #[test]
    fn only_tokenizers_that_split_at_whitespace_use_pieces() {
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(tokenizer_file()).expect("reads")).expect("JSON");
        let with = |field: &str, value: serde_json::Value| {
            let mut json = json.clone();
            json[field] = value;
            let tokenizer: Tokenizer = json.to_string().parse().expect("a tokenizer");
            splits_at_whitespace(&tokenizer)
        };
        assert!(with("pre_tokenizer", json["pre_tokenizer"].clone()));
        assert!(with(
            "pre_tokenizer",
            serde_json::json!({"type": "Sequence", "pretokenizers": [
                {"type": "WhitespaceSplit"}, {"type": "Punctuation", "behavior": "Isolated"}]})
        ));
        assert!(!with(
            "pre_tokenizer",
            serde_json::json!({"type": "Metaspace", "replacement": "▁",
                "prepend_scheme": "always", "split": true})
        ));
        assert!(!with(
            "pre_tokenizer",
            serde_json::json!({"type": "ByteLevel", "add_prefix_space": false,
                "trim_offsets": true, "use_regex": true})
        ));
        assert!(!with("pre_tokenizer", serde_json::Value::Null));
        assert!(!with(
            "normalizer",
            serde_json::json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"})
        ));
    }
}
