//! Input texts and request bodies.
//!
//! A [`Corpus`] is either the lines of a file (sampled uniformly) or a generator of sentences of a
//! fixed number of words. A [`PayloadFactory`] turns samples into TEI request bodies (`/embed`,
//! `/rerank` or `/embed_sparse`, see [`crate::route`]) with a
//! seeded RNG, so a run with the same `--seed` sends the same texts in the same order per stream.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::LoadtestError;
use crate::route::Route;
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{RngExt, SeedableRng};

/// Words the sentence generator draws from.
const VOCABULARY: &[&str] = &[
    "the",
    "a",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "embedding",
    "vector",
    "model",
    "batch",
    "queue",
    "worker",
    "gateway",
    "request",
    "reply",
    "latency",
    "throughput",
    "search",
    "semantic",
    "query",
    "document",
    "index",
    "river",
    "mountain",
    "city",
    "ocean",
    "forest",
    "library",
    "kitchen",
    "garden",
    "engine",
    "signal",
    "network",
    "cluster",
    "message",
    "subject",
    "stream",
    "token",
    "sentence",
    "paragraph",
    "chapter",
    "story",
    "music",
    "colour",
    "light",
    "shadow",
    "morning",
    "evening",
    "winter",
    "summer",
    "coffee",
    "bread",
    "market",
    "price",
    "report",
    "science",
    "history",
    "language",
    "machine",
    "learning",
    "attention",
    "transformer",
    "layer",
    "weight",
    "gradient",
    "memory",
    "cache",
    "disk",
    "packet",
    "server",
    "client",
    "timeout",
    "deadline",
    "budget",
    "green",
    "blue",
    "red",
    "small",
    "large",
    "fast",
    "slow",
    "bright",
    "quiet",
    "loud",
    "ancient",
    "modern",
    "simple",
    "complex",
    "happy",
    "careful",
    "runs",
    "reads",
    "writes",
    "finds",
    "builds",
    "sends",
    "waits",
    "answers",
    "measures",
    "counts",
    "and",
    "or",
    "with",
    "without",
    "under",
    "near",
    "after",
    "before",
    "because",
    "while",
];

/// Where input texts come from.
#[derive(Debug, Clone)]
pub enum Corpus {
    /// The non-empty lines of a file, sampled uniformly.
    Lines(Vec<String>),
    /// Random sentences of this many words from a built-in vocabulary.
    Generated {
        /// Words per sentence (at least 1).
        words: usize,
    },
    /// A fixed set of distinct texts drawn by a Zipf law: repeated traffic, for a cache.
    Zipf(Zipf),
}

/// `unique` distinct texts, the one of rank `k` (1-based) drawn with probability proportional
/// to `1 / k^s`; remembers which were drawn ([`Zipf::distinct_drawn`]).
#[derive(Debug, Clone)]
pub struct Zipf {
    texts: Vec<String>,
    /// Cumulative probabilities by rank, ending at 1.
    cdf: Vec<f64>,
    drawn: Arc<Vec<AtomicBool>>,
}

impl Zipf {
    /// `unique` distinct texts (at least 1) of `words` words each, fixed by `seed`, with
    /// exponent `s` (> 0).
    pub fn new(unique: usize, s: f64, words: usize, seed: u64) -> Zipf {
        let unique = unique.max(1);
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5A1F);
        let sentences = Corpus::Generated { words };
        // The rank makes each text distinct; the sentence gives it a realistic length.
        let texts: Vec<String> = (0..unique)
            .map(|rank| format!("{rank} {}", sentences.sample(&mut rng)))
            .collect();
        let weights: Vec<f64> = (1..=unique).map(|k| (k as f64).powf(-s)).collect();
        let total: f64 = weights.iter().sum();
        let mut sum = 0.0;
        let mut cdf: Vec<f64> = weights
            .iter()
            .map(|w| {
                sum += w / total;
                sum
            })
            .collect();
        if let Some(last) = cdf.last_mut() {
            *last = 1.0;
        }
        let drawn = Arc::new((0..unique).map(|_| AtomicBool::new(false)).collect());
        Zipf { texts, cdf, drawn }
    }

    fn sample(&self, rng: &mut StdRng) -> String {
        let u: f64 = rng.random();
        let rank = self
            .cdf
            .partition_point(|&c| c < u)
            .min(self.texts.len() - 1);
        self.drawn[rank].store(true, Ordering::Relaxed);
        self.texts[rank].clone()
    }

    /// How many distinct texts were drawn so far.
    pub fn distinct_drawn(&self) -> usize {
        self.drawn
            .iter()
            .filter(|d| d.load(Ordering::Relaxed))
            .count()
    }
}

impl Corpus {
    /// Reads a corpus file: one text per line; empty lines and trailing `\r` are dropped.
    ///
    /// # Errors
    /// [`LoadtestError::Corpus`] when the file cannot be read, [`LoadtestError::Config`] when it
    /// holds no text.
    pub fn from_file(path: &Path) -> Result<Corpus, LoadtestError> {
        let text = std::fs::read_to_string(path).map_err(|source| LoadtestError::Corpus {
            path: path.display().to_string(),
            source,
        })?;
        Corpus::from_text(&text).ok_or_else(|| {
            LoadtestError::Config(format!("corpus {} has no non-empty line", path.display()))
        })
    }

    /// A corpus of the non-empty lines of `text`; `None` when there is none.
    pub fn from_text(text: &str) -> Option<Corpus> {
        let lines: Vec<String> = text
            .lines()
            .map(|l| l.trim_end_matches('\r'))
            .filter(|l| !l.trim().is_empty())
            .map(str::to_owned)
            .collect();
        (!lines.is_empty()).then_some(Corpus::Lines(lines))
    }

    /// One text drawn with `rng`.
    pub fn sample(&self, rng: &mut StdRng) -> String {
        match self {
            Corpus::Lines(lines) => lines.choose(rng).cloned().unwrap_or_default(),
            Corpus::Generated { words } => {
                let mut sentence = String::with_capacity(words * 8);
                for i in 0..(*words).max(1) {
                    if i > 0 {
                        sentence.push(' ');
                    }
                    sentence.push_str(VOCABULARY[rng.random_range(0..VOCABULARY.len())]);
                }
                sentence
            }
            Corpus::Zipf(zipf) => zipf.sample(rng),
        }
    }
}

/// One request ready to send: the serialized body (`/embed` unless the factory is
/// [`PayloadFactory::for_route`]) and how many elements the reply must hold.
#[derive(Debug, Clone)]
pub struct Payload {
    /// The TEI JSON body.
    pub body: Bytes,
    /// Number of inputs in the body (= elements expected in the reply: embeddings, or ranks of
    /// a `/rerank` body's (query, text) pairs).
    pub inputs: usize,
}

/// Builds request bodies from a corpus with its own seeded RNG. Use [`PayloadFactory::fork`] for
/// an independent stream.
#[derive(Debug)]
pub struct PayloadFactory {
    corpus: Arc<Corpus>,
    inputs_per_request: usize,
    seed: u64,
    rng: StdRng,
    truncate: bool,
    route: Route,
}

impl PayloadFactory {
    /// A factory of bodies with `inputs_per_request` texts each (at least 1; 1 is sent as a single
    /// string `"inputs": "text"`, more as an array), seeded with `seed`.
    pub fn new(corpus: Arc<Corpus>, inputs_per_request: usize, seed: u64) -> PayloadFactory {
        PayloadFactory {
            corpus,
            inputs_per_request: inputs_per_request.max(1),
            seed,
            rng: StdRng::seed_from_u64(seed),
            truncate: false,
            route: Route::Embed,
        }
    }

    /// The same factory, whose bodies ask for `"truncate": true` when `truncate` (an input
    /// longer than the model's limit is cut to it instead of rejected).
    pub fn truncating(self, truncate: bool) -> PayloadFactory {
        PayloadFactory { truncate, ..self }
    }

    /// The same factory, whose bodies are shaped for `route` (`/embed` by default). A `/rerank`
    /// body draws its query as one more text, so every request's pairs are distinct too.
    pub fn for_route(self, route: Route) -> PayloadFactory {
        PayloadFactory { route, ..self }
    }

    /// An independent, deterministic stream for worker `stream` of a closed loop.
    pub fn fork(&self, stream: u64) -> PayloadFactory {
        let seed = self
            .seed
            .wrapping_add(stream.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        PayloadFactory::new(self.corpus.clone(), self.inputs_per_request, seed)
            .truncating(self.truncate)
            .for_route(self.route)
    }

    /// Inputs per request.
    pub fn inputs_per_request(&self) -> usize {
        self.inputs_per_request
    }

    /// The next request body.
    pub fn next_payload(&mut self) -> Payload {
        let query = if self.route.has_query() {
            self.corpus.sample(&mut self.rng)
        } else {
            String::new()
        };
        let texts: Vec<String> = (0..self.inputs_per_request)
            .map(|_| self.corpus.sample(&mut self.rng))
            .collect();
        Payload {
            body: Bytes::from(self.route.body(&query, &texts, self.truncate)),
            inputs: self.inputs_per_request,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_skip_blanks_and_carriage_returns() {
        let corpus = Corpus::from_text("one\r\n\n  \ntwo\n").expect("has lines");
        match corpus {
            Corpus::Lines(lines) => assert_eq!(lines, ["one", "two"]),
            other => panic!("{other:?}"),
        }
        assert!(Corpus::from_text("\n \n").is_none());
    }

    #[test]
    fn generated_sentences_have_the_word_count_and_are_seeded() {
        let corpus = Corpus::Generated { words: 7 };
        let mut a = StdRng::seed_from_u64(1);
        let mut b = StdRng::seed_from_u64(1);
        let s = corpus.sample(&mut a);
        assert_eq!(s.split(' ').count(), 7);
        assert_eq!(s, corpus.sample(&mut b));
    }

    #[test]
    fn zipf_draws_the_top_ranks_most_and_counts_the_distinct_draws() {
        let zipf = Zipf::new(1000, 1.1, 4, 7);
        let corpus = Corpus::Zipf(zipf.clone());
        let mut rng = StdRng::seed_from_u64(3);
        let mut counts = std::collections::HashMap::<String, usize>::new();
        for _ in 0..20_000 {
            *counts.entry(corpus.sample(&mut rng)).or_default() += 1;
        }
        assert_eq!(zipf.distinct_drawn(), counts.len());
        let top = counts.get(&zipf.texts[0]).copied().unwrap_or(0);
        let tenth = counts.get(&zipf.texts[9]).copied().unwrap_or(0);
        // P(rank 1) / P(rank 10) = 10^1.1 ≈ 12.6.
        assert!(top > 8 * tenth, "rank 1: {top}, rank 10: {tenth}");
        assert!(
            counts.len() < 1000 && counts.len() > 500,
            "{}",
            counts.len()
        );
        let again = Zipf::new(1000, 1.1, 4, 7);
        assert_eq!(again.texts, zipf.texts, "the texts are fixed by the seed");
    }

    #[test]
    fn bodies_are_tei_shaped() {
        let corpus = Arc::new(Corpus::from_text("hello").expect("has lines"));
        let mut single = PayloadFactory::new(corpus.clone(), 1, 0);
        let p = single.next_payload();
        assert_eq!(p.inputs, 1);
        let v: serde_json::Value = serde_json::from_slice(&p.body).expect("json");
        assert_eq!(v, serde_json::json!({"inputs": "hello", "normalize": true}));

        let mut batch = PayloadFactory::new(corpus, 3, 0);
        let p = batch.next_payload();
        assert_eq!(p.inputs, 3);
        let req = embatch_protocol::EmbedRequest::from_slice(&p.body).expect("valid request");
        assert_eq!(req.inputs.len(), 3);
    }

    #[test]
    fn rerank_payloads_count_pairs_and_keep_the_route_across_forks() {
        let corpus = Arc::new(Corpus::Generated { words: 6 });
        let base = PayloadFactory::new(corpus, 20, 9).for_route(Route::Rerank);
        let p = base.fork(3).next_payload();
        assert_eq!(p.inputs, 20);
        let req = embatch_protocol::RerankRequest::from_slice(&p.body).expect("a /rerank body");
        assert_eq!(req.texts.len(), 20);
        assert!(!req.texts.contains(&req.query), "the query is drawn apart");
        let other = embatch_protocol::RerankRequest::from_slice(&base.fork(4).next_payload().body)
            .expect("a /rerank body");
        assert_ne!(req.query, other.query);
    }

    #[test]
    fn forks_differ_but_are_deterministic() {
        let corpus = Arc::new(Corpus::Generated { words: 5 });
        let base = PayloadFactory::new(corpus, 1, 42);
        let a = base.fork(1).next_payload().body;
        let b = base.fork(2).next_payload().body;
        assert_ne!(a, b);
        assert_eq!(a, base.fork(1).next_payload().body);
    }
}
