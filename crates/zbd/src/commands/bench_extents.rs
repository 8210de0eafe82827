//! `zbd bench extents`: the engine's work over the extent table under the state lock, on data
//! areas of millions of extents: one checkpoint's phase 1 and one choice of cleaner victims per
//! mode (`zbd_core::bench`, which makes the accounting up in a sparse RAM volume).

use anyhow::{anyhow, Result};
use std::process::ExitCode;
use zbd_core::bench::{extent_scans, ExtentScanOptions, ExtentScanTimes};

/// Extent counts: plain numbers, or with K / M / G for thousands, millions, billions (`161M`).
pub fn parse_count(s: &str) -> Result<u32> {
    let s = s.trim();
    let (digits, scale) = match s.char_indices().last() {
        Some((i, 'K' | 'k')) => (&s[..i], 1_000u64),
        Some((i, 'M' | 'm')) => (&s[..i], 1_000_000),
        Some((i, 'G' | 'g')) => (&s[..i], 1_000_000_000),
        _ => (s, 1),
    };
    let n: u64 = digits
        .replace('_', "")
        .parse()
        .map_err(|_| anyhow!("--extents {s}: a count such as 16M"))?;
    n.checked_mul(scale)
        .and_then(|n| u32::try_from(n).ok())
        .filter(|&n| n >= 64)
        .ok_or_else(|| anyhow!("--extents {s}: from 64 to 2^32 - 1"))
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn range_ms(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(0.0, f64::max);
    format!("{:.3}-{:.3}", lo * 1e3, hi * 1e3)
}

#[derive(serde::Serialize)]
struct Row {
    extents: u64,
    closed: u64,
    extent_bytes: u32,
    released: u64,
    victims_incremental: usize,
    victims_compact: usize,
    setup_s: f64,
    phase1_ms: Vec<f64>,
    choose_incremental_ms: Vec<f64>,
    choose_compact_ms: Vec<f64>,
}

fn row(t: &ExtentScanTimes, extent_bytes: u32) -> Row {
    let ms = |v: &[f64]| v.iter().map(|s| s * 1e3).collect();
    Row {
        extents: t.extents,
        closed: t.closed,
        extent_bytes,
        released: t.released,
        victims_incremental: t.victims.0,
        victims_compact: t.victims.1,
        setup_s: t.setup_s,
        phase1_ms: ms(&t.phase1_s),
        choose_incremental_ms: ms(&t.incremental_s),
        choose_compact_ms: ms(&t.compact_s),
    }
}

/// Runs every count in turn (one volume at a time: 13 bytes per extent of RAM, and more while
/// a choice of victims sorts).
pub fn run(
    counts: &[u32],
    extent_bytes: u32,
    rounds: usize,
    pending: usize,
    json: bool,
) -> Result<ExitCode> {
    if rounds == 0 {
        return Err(anyhow!("--rounds: at least 1"));
    }
    let mut rows = Vec::new();
    if !json {
        println!(
            "{:>12} {:>12} {:>9} | {:>10} {:>19} | {:>10} {:>19} | {:>10} {:>19}",
            "extents",
            "closed",
            "released",
            "phase 1 ms",
            "(min-max)",
            "incr. ms",
            "(min-max)",
            "compact ms",
            "(min-max)"
        );
    }
    for &n in counts {
        let t = extent_scans(&ExtentScanOptions {
            extents: n,
            extent_bytes,
            rounds,
            pending,
            seed: 1,
        })?;
        if !json {
            println!(
                "{:>12} {:>12} {:>9} | {:>10.3} {:>19} | {:>10.3} {:>19} | {:>10.3} {:>19}",
                t.extents,
                t.closed,
                t.released,
                median(&t.phase1_s) * 1e3,
                range_ms(&t.phase1_s),
                median(&t.incremental_s) * 1e3,
                range_ms(&t.incremental_s),
                median(&t.compact_s) * 1e3,
                range_ms(&t.compact_s),
            );
        }
        rows.push(row(&t, extent_bytes));
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::parse_count;

    #[test]
    fn counts_take_decimal_suffixes() {
        assert_eq!(parse_count("161M").expect("161M"), 161_000_000);
        assert_eq!(parse_count("16_000k").expect("16_000k"), 16_000_000);
        assert_eq!(parse_count("4096").expect("4096"), 4096);
        assert!(parse_count("5G").is_err());
        assert!(parse_count("10").is_err());
        assert!(parse_count("x").is_err());
    }
}
