//! TEI 1.9.3's `/tokenize` and `/decode` on the model's own tokenizer, as TEI answers them:
//! [`Encoder::simple_tokens`] and [`Encoder::decode`].

use embatch_protocol::EmbedError;
use embatch_protocol::tokenize::SimpleToken;

use crate::Encoder;

impl Encoder {
    /// The tokens of `prompt` + `text` as TEI 1.9.3's `/tokenize` lists them (its
    /// `into_tokens`): every token of the encoding, special tokens (`[CLS]`, `[SEP]`, added
    /// with `add_special_tokens`) with their own text and no offsets, the others with the bytes
    /// `start..stop` of the prompted text they cover. Not truncated, as TEI's.
    ///
    /// # Errors
    /// [`EmbedError::Validation`] for an unknown `prompt_name` ([`Encoder::prompt`]),
    /// [`EmbedError::Tokenizer`] when the tokenizer fails.
    pub fn simple_tokens(
        &self,
        text: &str,
        add_special_tokens: bool,
        prompt_name: Option<&str>,
    ) -> Result<Vec<SimpleToken>, EmbedError> {
        let input = match prompt_name {
            Some(name) => format!("{}{text}", self.prompt(name)?),
            None => text.to_owned(),
        };
        let encoding = self
            .tokenizer()
            .encode(input.as_str(), add_special_tokens)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        let tokens = encoding
            .get_ids()
            .iter()
            .zip(encoding.get_offsets())
            .zip(encoding.get_special_tokens_mask())
            .zip(encoding.get_tokens())
            .map(|(((&id, &(start, stop)), &special), token)| {
                if special == 1 {
                    return SimpleToken {
                        id,
                        text: token.clone(),
                        special: true,
                        start: None,
                        stop: None,
                    };
                }
                let bytes = input.as_bytes().get(start..stop).unwrap_or_default();
                SimpleToken {
                    id,
                    text: String::from_utf8_lossy(bytes).into_owned(),
                    special: false,
                    start: Some(start),
                    stop: Some(stop),
                }
            })
            .collect();
        Ok(tokens)
    }

    /// The text of `ids`, as TEI 1.9.3's `/decode` writes it (the tokenizer's decoder), without
    /// the special tokens when `skip_special_tokens`.
    ///
    /// # Errors
    /// [`EmbedError::Tokenizer`] when the tokenizer fails.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, EmbedError> {
        self.tokenizer()
            .decode(ids, skip_special_tokens)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use super::*;

    /// all-MiniLM-L6-v2's tokenizer (`EMBATCH_MODEL_DIR`, else the repository's `models/`).
    fn encoder() -> Encoder {
        let dir = std::env::var_os("EMBATCH_MODEL_DIR").map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/all-MiniLM-L6-v2"),
            std::path::PathBuf::from,
        );
        let prompts = BTreeMap::from([("query".to_owned(), "query: ".to_owned())]);
        Encoder::load(&dir.join("tokenizer.json"), 256, prompts).expect("loads")
    }

    #[test]
    fn tokens_and_texts_are_teis() {
        let encoder = encoder();
        let tokens = encoder
            .simple_tokens("Hello world", true, None)
            .expect("tokenizes");
        let shape: Vec<_> = tokens
            .iter()
            .map(|t| (t.id, t.text.as_str(), t.special, t.start, t.stop))
            .collect();
        assert_eq!(
            shape,
            [
                (101, "[CLS]", true, None, None),
                (7592, "Hello", false, Some(0), Some(5)),
                (2088, "world", false, Some(6), Some(11)),
                (102, "[SEP]", true, None, None),
            ]
        );
        let bare = encoder
            .simple_tokens("Hello", false, Some("query"))
            .expect("tokenizes");
        let texts: Vec<&str> = bare.iter().map(|t| t.text.as_str()).collect();
        assert_eq!(texts, ["query", ":", "Hello"]);
        assert_eq!(
            encoder
                .simple_tokens("a", true, Some("nope"))
                .expect_err("")
                .status(),
            422
        );
        let ids = [101, 7592, 2088, 102];
        assert_eq!(encoder.decode(&ids, true).expect("decodes"), "hello world");
        assert_eq!(
            encoder.decode(&ids, false).expect("decodes"),
            "[CLS] hello world [SEP]"
        );
    }
}
