//! The double's deterministic vectors: a hash of the text, expanded (no model).

/// The deterministic vector of one input: [`embedding`] of its text, or for token ids of their
/// JSON text (`[101,7592,102]`): ids get vectors of their own, which only a text spelling that
/// same JSON would share.
pub fn embedding_of(
    input: &embatch_protocol::Input,
    dim: usize,
    dimensions: Option<usize>,
    normalize: bool,
) -> Vec<f32> {
    match input {
        embatch_protocol::Input::Text(text) => embedding(text, dim, dimensions, normalize),
        embatch_protocol::Input::Ids(ids) => {
            let key = serde_json::to_string(ids).unwrap_or_default();
            embedding(&key, dim, dimensions, normalize)
        }
        embatch_protocol::Input::Pair(..) => {
            let key = serde_json::to_string(input).unwrap_or_default();
            embedding(&key, dim, dimensions, normalize)
        }
    }
}

/// The double's deterministic logit of a (query, text) pair, the same on `/rerank` and
/// `/predict`: in [-8, 8), from a 64-bit FNV-1a hash of the query, a NUL byte and the text,
/// expanded once with splitmix64. What a cross-encoder's one-class head would output.
pub fn logit(query: &str, text: &str) -> f32 {
    let mut bytes = Vec::with_capacity(query.len() + text.len() + 1);
    bytes.extend_from_slice(query.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(text.as_bytes());
    let mut state = fnv1a(&bytes);
    let bits = splitmix64(&mut state) >> 40; // 24 random bits
    (bits as f32 / (1u64 << 20) as f32) - 8.0
}

/// The double's score of a pair as TEI 1.9.3 reports it: [`logit`] with `raw_scores`, else its
/// sigmoid `1 / (1 + e^-logit)` (TEI's one-class reranker).
pub fn rerank_score(query: &str, text: &str, raw_scores: bool) -> f32 {
    let logit = logit(query, text);
    if raw_scores {
        logit
    } else {
        1.0 / (1.0 + (-logit).exp())
    }
}

/// The deterministic vector of `text`: `dim` floats in [-1, 1) from a 64-bit FNV-1a hash of the
/// text expanded with splitmix64, cut to `dimensions` when given (as TEI's Matryoshka
/// `dimensions`), then L2-normalized when `normalize`.
pub fn embedding(text: &str, dim: usize, dimensions: Option<usize>, normalize: bool) -> Vec<f32> {
    let mut state = fnv1a(text.as_bytes());
    let len = dimensions.unwrap_or(dim).min(dim);
    let mut v: Vec<f32> = (0..len)
        .map(|_| {
            let bits = splitmix64(&mut state) >> 40; // 24 random bits
            (bits as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect();
    if normalize {
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        if norm > 0.0 {
            v.iter_mut().for_each(|x| *x /= norm);
        }
    }
    v
}

pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

pub(crate) fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
