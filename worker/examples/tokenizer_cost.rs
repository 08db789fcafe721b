//! What counting tokens costs the worker, per input, over the repo's reference corpus
//! (`testdata/reference-inputs.txt`: 30 texts of mixed lengths, languages and scripts; and
//! `testdata/reference-long-input.txt`, truncated to 256 tokens).
//!
//! ```text
//! EMBATCH_MODEL_DIR=models/all-MiniLM-L6-v2 cargo run --release -p embatch-worker --example tokenizer_cost
//! ```
//!
//! Prints µs per input for: each short input alone on the caller's thread (the tokenizer's own
//! cost), the long input alone, and each short input as one request through
//! `Counter::count` (the worker's path: a hop to tokio's blocking pool and back).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use embatch_local_model::Encoder;
use embatch_protocol::{EmbedOptions, Input};
use embatch_worker::tokens::Counter;

/// Passes over the corpus per measurement.
const ROUNDS: usize = 200;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let model_dir = std::env::var_os("EMBATCH_MODEL_DIR")
        .map_or_else(|| repo.join("models/all-MiniLM-L6-v2"), PathBuf::from);
    let encoder = Encoder::load_file(&model_dir.join("tokenizer.json"), 256)?;
    let counter = Counter::tokenizer(Arc::new(encoder), "the built-in model's", true, true);
    let short: Vec<Input> = std::fs::read_to_string(repo.join("testdata/reference-inputs.txt"))?
        .lines()
        .filter(|line| !line.is_empty())
        .map(Input::from)
        .collect();
    let long = vec![Input::from(
        std::fs::read_to_string(repo.join("testdata/reference-long-input.txt"))?.trim_end(),
    )];
    let options = EmbedOptions::default();

    let tokens: u32 = counter.count_blocking(&short, &options)?.iter().sum();
    println!(
        "corpus: {} short inputs, {tokens} tokens in all (mean {:.1}); 1 long input cut to 256 tokens",
        short.len(),
        f64::from(tokens) / short.len() as f64
    );

    // Warm-up: the tokenizer's caches and the allocator.
    for input in &short {
        counter.count_blocking(std::slice::from_ref(input), &options)?;
    }

    let started = Instant::now();
    for _ in 0..ROUNDS {
        for input in &short {
            counter.count_blocking(std::slice::from_ref(input), &options)?;
        }
    }
    let per_short = started.elapsed().as_secs_f64() * 1e6 / (ROUNDS * short.len()) as f64;
    println!("short input, on the caller's thread: {per_short:.1} µs/input");

    let started = Instant::now();
    for _ in 0..ROUNDS {
        counter.count_blocking(&long, &options)?;
    }
    let per_long = started.elapsed().as_secs_f64() * 1e6 / ROUNDS as f64;
    println!(
        "long input (800 words -> 256 tokens), on the caller's thread: {per_long:.1} µs/input"
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let per_request = runtime.block_on(async {
        let started = Instant::now();
        for _ in 0..ROUNDS {
            for input in &short {
                counter
                    .count(vec![input.clone()], options.clone())
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok::<_, String>(started.elapsed().as_secs_f64() * 1e6 / (ROUNDS * short.len()) as f64)
    })?;
    println!(
        "short input as one request through Counter::count (blocking pool): {per_request:.1} µs/input"
    );
    Ok(())
}
