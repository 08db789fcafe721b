//! Input files for the bulk tests, made from a seeded RNG: valid lines, random bytes, cut
//! UTF-8 sequences, NUL bytes, a line over the limit, blank lines, CRLF line ends, a byte-order
//! mark; and what validation must say of each line.

use std::collections::{BTreeMap, BTreeSet};

use embatch_protocol::bulk::{Batch, BatchStatus, RequestCounts};
use rand::RngExt;
use rand::rngs::StdRng;

/// What validation must say of a line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Expect {
    /// A valid request.
    Valid,
    /// Blank: skipped.
    Blank,
    /// Refused with this code.
    Code(&'static str),
    /// Refused, whatever the code (e.g. random bytes that happen to be UTF-8).
    Refused,
}

/// A generated input file: its bytes, and what each line (1-based) must be read as.
pub struct Case {
    pub name: String,
    pub bytes: Vec<u8>,
    pub lines: Vec<Expect>,
    /// The `custom_id`s of the valid lines.
    pub valid_ids: BTreeSet<String>,
}

/// Valid text with multi-byte characters, so decoding is exercised on good lines too.
const WORDS: &[&str] = &[
    "plain",
    "café",
    "naïve",
    "日本語",
    "emoji 🦀",
    "tab\\tescaped",
];

/// UTF-8 broken in the ways files break it: a sequence cut short, a lone continuation byte, an
/// overlong encoding, an encoded surrogate, a byte never valid, a 4-byte sequence cut.
const BROKEN: &[&[u8]] = &[
    b"caf\xC3",
    b"\x80",
    b"\xC0\xAF",
    b"\xED\xA0\x80",
    b"\xFF",
    b"\xF0\x9F\xA6",
];

pub fn valid_line(id: &str, rng: &mut StdRng) -> Vec<u8> {
    let word = WORDS[rng.random_range(0..WORDS.len())];
    format!(
        r#"{{"custom_id":"{id}","method":"POST","url":"/v1/embeddings","body":{{"input":"{word} {id}"}}}}"#
    )
    .into_bytes()
}

/// One line of kind `kind` (0..6) for line `number`.
fn line(kind: u32, number: usize, rng: &mut StdRng) -> (Vec<u8>, Expect) {
    let id = format!("c-{number}");
    match kind {
        // Random bytes, never a line break (so line numbers stay known) nor blank.
        0 => {
            let mut bytes = vec![b'#'];
            for _ in 0..rng.random_range(0..60) {
                let byte: u8 = rng.random();
                if byte != b'\n' && byte != b'\r' {
                    bytes.push(byte);
                }
            }
            let expect = match std::str::from_utf8(&bytes) {
                Ok(_) => Expect::Refused,
                Err(_) => Expect::Code("invalid_utf8"),
            };
            (bytes, expect)
        }
        // A valid line with broken UTF-8 in its input.
        1 => {
            let broken = BROKEN[rng.random_range(0..BROKEN.len())];
            let mut bytes =
                format!(r#"{{"custom_id":"{id}","url":"/v1/embeddings","body":{{"input":""#)
                    .into_bytes();
            bytes.extend_from_slice(broken);
            bytes.extend_from_slice(br#""}}"#);
            (bytes, Expect::Code("invalid_utf8"))
        }
        // A NUL byte inside a string: UTF-8, but not JSON.
        2 => {
            let bytes = format!(
                "{{\"custom_id\":\"{id}\0\",\"url\":\"/v1/embeddings\",\"body\":{{\"input\":\"a\"}}}}"
            );
            (bytes.into_bytes(), Expect::Code("invalid_json"))
        }
        3 => (
            [&b""[..], b"   ", b"\t"][rng.random_range(0..3)].to_vec(),
            Expect::Blank,
        ),
        _ => (valid_line(&id, rng), Expect::Valid),
    }
}

/// A line longer than a work item may carry (nats-server's default `max_payload` is 1 MiB).
fn huge_line(id: &str) -> Vec<u8> {
    let text = "a".repeat(1_100_000);
    format!(r#"{{"custom_id":"{id}","url":"/v1/embeddings","body":{{"input":"{text}"}}}}"#)
        .into_bytes()
}

/// Builds a file from its lines: CRLF or LF line ends, a byte-order mark or not, the last line
/// ended or not.
fn case(name: String, lines: Vec<(Vec<u8>, Expect)>, rng: &mut StdRng) -> Case {
    let crlf = rng.random_bool(0.3);
    let mut bytes = Vec::new();
    if rng.random_bool(0.2) {
        bytes.extend_from_slice(b"\xEF\xBB\xBF");
    }
    let count = lines.len();
    let mut expects = Vec::new();
    let mut valid_ids = BTreeSet::new();
    for (i, (line, expect)) in lines.into_iter().enumerate() {
        bytes.extend_from_slice(&line);
        if i + 1 < count || rng.random_bool(0.5) {
            bytes.extend_from_slice(if crlf { b"\r\n" } else { b"\n" });
        }
        if expect == Expect::Valid {
            valid_ids.insert(format!("c-{}", i + 1));
        }
        expects.push(expect);
    }
    Case {
        name,
        bytes,
        lines: expects,
        valid_ids,
    }
}

/// The files: fixed corner cases, then random mixes of every kind of line.
pub fn cases(rng: &mut StdRng) -> Vec<Case> {
    let valid = |n: usize, rng: &mut StdRng| -> Vec<(Vec<u8>, Expect)> {
        (1..=n)
            .map(|i| (valid_line(&format!("c-{i}"), rng), Expect::Valid))
            .collect()
    };
    let mut cases = vec![
        case("empty file".into(), Vec::new(), rng),
        case("valid lines".into(), valid(6, rng), rng),
    ];
    // The defect's file: valid lines and one that is not UTF-8.
    let mut lines = valid(5, rng);
    lines[2] = line(1, 3, rng);
    cases.push(case("one non-UTF-8 line".into(), lines, rng));
    let mut lines = valid(3, rng);
    lines[1] = (huge_line("c-2"), Expect::Code("line_too_large"));
    cases.push(case("a line over the limit".into(), lines, rng));
    for n in 0..16 {
        let count = rng.random_range(1..10);
        let lines = (1..=count)
            .map(|i| {
                let kind = if rng.random_bool(0.6) {
                    4
                } else {
                    rng.random_range(0..4)
                };
                line(kind, i, rng)
            })
            .collect();
        cases.push(case(format!("random file {n}"), lines, rng));
    }
    cases
}

/// What validation said matches each line: a file with a refused line fails, naming each
/// refused line once with its number (and its code where it is known), and no other; a file
/// without one completes with every valid line.
pub fn check_validation(case: &Case, batch: &Batch) {
    let name = &case.name;
    let refused: BTreeMap<u64, Expect> = (1u64..)
        .zip(&case.lines)
        .filter(|(_, e)| matches!(e, Expect::Code(_) | Expect::Refused))
        .map(|(n, e)| (n, *e))
        .collect();
    if refused.is_empty() {
        assert_eq!(batch.status, BatchStatus::Completed, "{name}: {batch:?}");
        let n = case.valid_ids.len() as u64;
        assert_eq!(
            batch.request_counts,
            RequestCounts {
                total: n,
                completed: n,
                failed: 0
            },
            "{name}"
        );
        return;
    }
    assert_eq!(batch.status, BatchStatus::Failed, "{name}: {batch:?}");
    let errors = &batch.errors.as_ref().expect("errors").data;
    let named: BTreeMap<u64, &str> = errors
        .iter()
        .map(|e| (e.line.expect("a line number"), e.code.as_str()))
        .collect();
    assert_eq!(
        errors.len(),
        named.len(),
        "{name}: a line named twice: {errors:?}"
    );
    assert_eq!(
        named.keys().collect::<Vec<_>>(),
        refused.keys().collect::<Vec<_>>(),
        "{name}: the refused lines: {errors:?}"
    );
    for error in errors {
        let line = error.line.unwrap_or_default();
        assert!(
            error.message.starts_with(&format!("line {line}: ")),
            "{name}: {error:?}"
        );
        if let Some(Expect::Code(code)) = refused.get(&line) {
            assert_eq!(error.code, *code, "{name}, line {line}: {error:?}");
        }
    }
}
