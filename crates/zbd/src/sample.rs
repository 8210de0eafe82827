//! The built-in mixed data sample for benchmarks: deterministic, a quarter each of English-like
//! text, machine code (this executable), structured records and random bytes.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "had",
    "they",
    "you",
    "were",
    "their",
    "one",
    "all",
    "we",
    "can",
    "her",
    "has",
    "there",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "storage",
    "block",
    "device",
    "compression",
    "extent",
    "write",
    "read",
    "system",
    "data",
    "file",
];

/// `bytes` of mixed data (rounded down to 4 KiB blocks), deterministic.
pub fn mixed(bytes: usize) -> Vec<u8> {
    let blocks = bytes / 4096;
    let quarter = blocks / 4 * 4096;
    let mut rng = SmallRng::seed_from_u64(0x5eed);
    let mut out = Vec::with_capacity(blocks * 4096);
    // Text.
    while out.len() < quarter {
        let w = WORDS[rng.random_range(0..WORDS.len())];
        out.extend_from_slice(w.as_bytes());
        out.push(if rng.random_range(0..12) == 0 {
            b'\n'
        } else {
            b' '
        });
    }
    out.truncate(quarter);
    // Machine code: this executable, repeated if short.
    let exe = std::fs::read("/proc/self/exe").unwrap_or_default();
    let start = out.len();
    while out.len() < start + quarter {
        let need = start + quarter - out.len();
        if exe.is_empty() {
            out.extend((0..need).map(|i| (i % 7) as u8));
        } else {
            out.extend_from_slice(&exe[..need.min(exe.len())]);
        }
    }
    // Structured records: id, timestamp, small counters, a short name.
    let start = out.len();
    let mut id = 0u64;
    while out.len() < start + quarter {
        id += 1;
        out.extend_from_slice(&id.to_le_bytes());
        out.extend_from_slice(&(1_700_000_000u64 + id * 7).to_le_bytes());
        out.extend_from_slice(&(rng.random_range(0..1000u32)).to_le_bytes());
        out.extend_from_slice(format!("user{:06}", rng.random_range(0..5000)).as_bytes());
    }
    out.truncate(start + quarter);
    // Random.
    let rest = blocks * 4096 - out.len();
    out.extend((0..rest).map(|_| rng.random::<u8>()));
    out
}
