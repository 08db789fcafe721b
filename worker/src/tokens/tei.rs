//! Token counts from TEI's own `POST /tokenize`, when the worker has no tokenizer of the TEI
//! model.

use embatch_protocol::{EmbedError, EmbedOptions, Input, TruncationDirection};
use serde::Deserialize;

use super::truncate_for;

/// TEI's `POST /tokenize`: `{"inputs": [...], "add_special_tokens": true, "prompt_name": ...}`,
/// answered with one array of tokens per input. TEI's `/tokenize` does not truncate: the limit is
/// applied here.
pub(super) struct TeiTokenize {
    client: reqwest::Client,
    url: String,
    max_input_length: usize,
    auto_truncate: bool,
}

impl TeiTokenize {
    /// TEI's `/tokenize` at `base_url`, for a model of `max_input_length` tokens.
    pub(super) fn new(
        client: reqwest::Client,
        base_url: &str,
        max_input_length: usize,
        auto_truncate: bool,
    ) -> TeiTokenize {
        TeiTokenize {
            client,
            url: format!("{}/tokenize", base_url.trim_end_matches('/')),
            max_input_length,
            auto_truncate,
        }
    }

    /// Counts per input, and whether they are tokens: when TEI's `/tokenize` fails (TEI then
    /// answers the inputs itself), each text counts 1 and the counts are not reported. TEI's
    /// `/tokenize` takes texts only: token ids count as given.
    pub(super) async fn count(
        &self,
        inputs: &[Input],
        options: &EmbedOptions,
    ) -> Result<(Vec<u32>, bool), EmbedError> {
        #[derive(Deserialize)]
        struct Token {}
        if inputs.iter().any(|i| matches!(i, Input::Pair(..))) {
            // TEI's `/tokenize` has no pairs: rerank pairs count as inputs, and no count is
            // reported.
            return Ok((vec![1; inputs.len()], false));
        }
        let texts: Vec<&str> = inputs.iter().filter_map(Input::as_text).collect();
        let answered = if texts.is_empty() {
            Some(Vec::new())
        } else {
            let body = serde_json::json!({
                "inputs": texts,
                "add_special_tokens": true,
                "prompt_name": options.prompt_name,
            });
            let answer = async {
                let response = self.client.post(&self.url).json(&body).send().await.ok()?;
                if !response.status().is_success() {
                    return None;
                }
                response.json::<Vec<Vec<Token>>>().await.ok()
            };
            answer
                .await
                .filter(|tokens| tokens.len() == texts.len())
                .map(|tokens| tokens.iter().map(Vec::len).collect::<Vec<_>>())
        };
        let exact = answered.is_some();
        let mut counted = answered.unwrap_or_default().into_iter();
        let truncate = truncate_for(options, self.auto_truncate);
        let lengths = inputs
            .iter()
            .map(|input| {
                let given = match input {
                    Input::Text(_) => counted.next().unwrap_or(1),
                    Input::Ids(ids) => ids.len(),
                    Input::Pair(..) => 1,
                };
                limit(given, self.max_input_length, truncate)
            })
            .collect::<Result<_, _>>()?;
        Ok((lengths, exact))
    }
}

/// `given` tokens against the limit of `max` tokens: cut to `max` when truncating, else TEI's
/// 422.
fn limit(
    given: usize,
    max: usize,
    truncate: Option<TruncationDirection>,
) -> Result<u32, EmbedError> {
    if given > max && truncate.is_none() {
        return Err(EmbedError::Validation(format!(
            "`inputs` must have less than {max} tokens. Given: {given}"
        )));
    }
    Ok(u32::try_from(given.min(max)).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::{Counter, Source};

    #[test]
    fn the_limit_cuts_or_refuses_with_teis_message() {
        assert_eq!(limit(300, 256, Some(TruncationDirection::Right)), Ok(256));
        assert_eq!(limit(12, 256, None), Ok(12));
        let err = limit(830, 256, None).expect_err("over the limit");
        assert_eq!(err.status(), 422);
        assert_eq!(
            err.to_string(),
            "Input validation error: `inputs` must have less than 256 tokens. Given: 830"
        );
    }

    /// TEI's `POST /tokenize` shape (`{"inputs": [...], "add_special_tokens": true}` → one array
    /// of `{id, text, special, start, stop}` per input), served by a minimal HTTP server whose
    /// "tokenizer" is one token per word plus 2 special tokens.
    #[tokio::test]
    async fn tei_tokenize_counts_texts_and_applies_the_limit_here() {
        use axum::Json;
        use axum::routing::post;
        async fn tokenize(Json(body): Json<serde_json::Value>) -> Json<serde_json::Value> {
            assert_eq!(body["add_special_tokens"], true);
            let tokens: Vec<Vec<serde_json::Value>> = body["inputs"]
                .as_array()
                .expect("a batch")
                .iter()
                .map(|text| {
                    let words = text.as_str().expect("a text").split_whitespace().count();
                    (0..words + 2)
                        .map(|i| serde_json::json!({"id": i, "text": "w", "special": false, "start": null, "stop": null}))
                        .collect()
                })
                .collect();
            Json(serde_json::json!(tokens))
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let server = tokio::spawn(async move {
            axum::serve(
                listener,
                axum::Router::new().route("/tokenize", post(tokenize)),
            )
            .await
        });
        let counter = Counter::tei_tokenize(reqwest::Client::new(), &url, 8, true);
        assert_eq!(counter.source(), Source::TeiTokenize);
        let inputs = vec![
            Input::from("one two three"),
            Input::Ids(vec![101, 7, 102]),
            Input::from("a b c d e f g h i j"),
        ];
        let counted = counter
            .count(inputs.clone(), EmbedOptions::default())
            .await
            .expect("counted");
        assert_eq!(
            counted.lengths,
            [5, 3, 8],
            "the long text is cut to the limit"
        );
        assert_eq!(counted.tokens(), Some(16));
        let refuse = EmbedOptions {
            truncate: Some(false),
            ..EmbedOptions::default()
        };
        let err = counter.count(inputs, refuse).await.expect_err("over 8");
        assert_eq!(
            err.to_string(),
            "Input validation error: `inputs` must have less than 8 tokens. Given: 12"
        );
        // TEI's `/tokenize` gone: texts count 1 each, and no token count is reported.
        server.abort();
        let _ = server.await;
        let counted = counter
            .count(vec![Input::from("a b")], EmbedOptions::default())
            .await
            .expect("counted as inputs");
        assert_eq!(counted.lengths, [1]);
        assert_eq!(counted.tokens(), None);
    }
}
