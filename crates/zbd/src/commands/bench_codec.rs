//! `zbd bench codec`, second part: ratio and speed per compression-unit size, with and without a
//! trained dictionary, on real files (`--dir`) or the built-in sample; the cost of one random
//! 4 KiB read out of a unit of each size; and what the engine would store (record, segment and
//! extent-packing overhead included), so the defaults of docs/savings.md come from numbers.
//!
//! The dictionary is trained on one file in eight (chosen by a hash of the path) and everything
//! is measured on the other seven: it never sees the blocks it is measured on.

use crate::sample;
use anyhow::{anyhow, Result};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::time::Instant;
use zbd_core::codec::dict::{self, Dictionary};
use zbd_core::codec::unit::{self, StoredUnit, BLOCK_BYTES};
use zbd_core::Codec;

/// Options of the unit/dictionary part of `zbd bench codec`.
#[derive(clap::Args)]
pub struct UnitArgs {
    /// Directory of real files to measure (read recursively, each file cut into 4 KiB blocks as a
    /// filesystem stores it; default: the built-in mixed sample).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Unit sizes to measure (default with --dir: 4K,8K,16K,32K,64K,128K). Without --units and
    /// --dir, only Table I runs and --json prints its array as before.
    #[arg(long, value_delimiter = ',')]
    units: Option<Vec<String>>,
    /// Dictionary sizes to train (0 = no dictionary).
    #[arg(long, value_delimiter = ',', default_value = "0,16K,64K,112K")]
    dict_sizes: Vec<String>,
    /// Codecs of the unit table (dictionaries apply to lz4 and zstd only).
    #[arg(long, value_delimiter = ',', default_value = "lz4,zstd:1,zlib:1")]
    unit_codecs: Vec<String>,
    /// Read at most this many bytes of files from --dir (spread over all files).
    #[arg(long, default_value = "192M")]
    max_bytes: String,
    /// Extent size of the projected engine layout.
    #[arg(long, default_value = "128K")]
    extent: String,
}

/// One row of the unit table.
#[derive(serde::Serialize)]
pub struct UnitRow {
    codec: String,
    unit_bytes: usize,
    dict_bytes: usize,
    /// Bytes measured (non-zero 4 KiB blocks of the measured files).
    input_bytes: u64,
    /// Codec output, each unit kept compressed only if that saves a sector.
    stored_bytes: u64,
    savings_pct: f64,
    compress_mb_s: f64,
    decompress_mb_s: f64,
    /// Mean time to get one random 4 KiB block out of its unit (decode included).
    random_4k_read_us: f64,
    /// Bytes the engine would write for these units: payload + 40-byte records + segment
    /// headers and sector padding + unused extent tails, at `extent_bytes`.
    projected_engine_bytes: u64,
    /// Units that did not fit an extent and were split in two.
    units_split: u64,
}

/// The unit/dictionary report.
#[derive(serde::Serialize)]
pub struct UnitReport {
    source: String,
    files_measured: usize,
    files_training: usize,
    training_bytes: u64,
    zero_blocks: u64,
    extent_bytes: usize,
    rows: Vec<UnitRow>,
}

/// A file cut into 4 KiB blocks (tail zero-padded, as a filesystem stores it).
struct File {
    blocks: Vec<Vec<u8>>,
}

const UNITS_DEFAULT: [&str; 6] = ["4K", "8K", "16K", "32K", "64K", "128K"];

/// Whether the unit/dictionary part was asked for (`--units` or `--dir`).
pub fn enabled(a: &UnitArgs) -> bool {
    a.units.is_some() || a.dir.is_some()
}

pub fn run(a: &UnitArgs) -> Result<UnitReport> {
    let size = |flag: &str, v: &str| super::size_arg(flag, v).map(|x| x as usize);
    let default_units = UNITS_DEFAULT.map(String::from).to_vec();
    let units: Vec<usize> = a
        .units
        .as_ref()
        .unwrap_or(&default_units)
        .iter()
        .map(|u| size("--units", u))
        .collect::<Result<_>>()?;
    if let Some(bad) = units
        .iter()
        .find(|&&u| u == 0 || u % BLOCK_BYTES != 0 || u / BLOCK_BYTES > unit::UNIT_BLOCKS_MAX)
    {
        return Err(anyhow!(
            "--units: {bad} bytes: expected multiples of 4K up to 128K"
        ));
    }
    let dict_sizes: Vec<usize> = a
        .dict_sizes
        .iter()
        .map(|d| size("--dict-sizes", d))
        .collect::<Result<_>>()?;
    let codecs: Vec<Codec> = a
        .unit_codecs
        .iter()
        .map(|s| s.parse().map_err(|e| anyhow!("--unit-codecs: {e}")))
        .collect::<Result<_>>()?;
    let extent = size("--extent", &a.extent)?;
    if !(8 * 1024..=1 << 20).contains(&extent) {
        return Err(anyhow!("--extent {extent}: expected 8K..1M"));
    }
    let (source, files) = match &a.dir {
        Some(d) => (
            d.display().to_string(),
            read_tree(d, size("--max-bytes", &a.max_bytes)? as u64)?,
        ),
        None => ("built-in mixed sample".to_string(), sample_files()),
    };
    let (train_files, measured): (Vec<_>, Vec<_>) =
        files.into_iter().partition(|(k, _)| k % 8 == 0);
    let train_blocks: Vec<&[u8]> = train_files
        .iter()
        .flat_map(|(_, f)| f.blocks.iter().map(Vec::as_slice))
        .collect();
    let measured: Vec<File> = measured.into_iter().map(|(_, f)| f).collect();
    if measured.is_empty() {
        return Err(anyhow!("{source}: no data to measure"));
    }
    let zero_blocks = measured
        .iter()
        .flat_map(|f| &f.blocks)
        .filter(|b| is_zero(b))
        .count() as u64;
    let mut rows = Vec::new();
    for &codec in &codecs {
        for &ds in &dict_sizes {
            if ds > 0 && !Dictionary::supports(codec) {
                continue;
            }
            let d = if ds == 0 {
                None
            } else {
                // zstd wants ~100x the dictionary in samples; more only slows training down.
                let step = (train_blocks.len() * BLOCK_BYTES / (100 * ds)).max(1);
                let sample: Vec<&[u8]> = train_blocks.iter().step_by(step).copied().collect();
                let content = dict::train(&sample, ds)
                    .map_err(|e| anyhow!("training a {ds}-byte dictionary on {source}: {e}"))?;
                Some(Dictionary::new(1, codec, 0, content)?)
            };
            for &u in &units {
                rows.push(measure(
                    codec,
                    d.as_ref(),
                    ds,
                    u / BLOCK_BYTES,
                    &measured,
                    extent,
                )?);
            }
        }
    }
    Ok(UnitReport {
        source,
        files_measured: measured.len(),
        files_training: train_files.len(),
        training_bytes: (train_blocks.len() * BLOCK_BYTES) as u64,
        zero_blocks,
        extent_bytes: extent,
        rows,
    })
}

fn is_zero(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}

/// Units of one file, as the engine would form them for a sequential write from LBA 0.
fn file_units(f: &File, n: usize) -> Vec<std::ops::Range<usize>> {
    let nz: Vec<bool> = f.blocks.iter().map(|b| !is_zero(b)).collect();
    unit::plan_units(0, &nz, n)
}

fn measure(
    codec: Codec,
    d: Option<&Dictionary>,
    dict_bytes: usize,
    n: usize,
    files: &[File],
    extent: usize,
) -> Result<UnitRow> {
    let inputs: Vec<Vec<u8>> = files
        .iter()
        .flat_map(|f| file_units(f, n).into_iter().map(|r| f.blocks[r].concat()))
        .collect();
    let input_bytes: u64 = inputs.iter().map(|u| u.len() as u64).sum();
    let t = Instant::now();
    let stored: Vec<StoredUnit> = inputs
        .iter()
        .map(|u| unit::compress_unit(codec, d, u))
        .collect::<zbd_core::Result<_>>()?;
    let ct = t.elapsed().as_secs_f64();
    let mut out = vec![0u8; n * BLOCK_BYTES];
    let t = Instant::now();
    for s in &stored {
        let o = &mut out[..usize::from(s.blocks) * BLOCK_BYTES];
        unit::decompress_unit(s, d, o)
            .ok_or_else(|| anyhow!("{codec}: a unit failed to decode"))?;
    }
    let dt = t.elapsed().as_secs_f64();
    // Random 4 KiB reads: a uniformly chosen logical block, decoded out of its unit.
    let mut rng = SmallRng::seed_from_u64(10);
    let blocks: Vec<(usize, usize)> = stored
        .iter()
        .enumerate()
        .flat_map(|(i, s)| (0..usize::from(s.blocks)).map(move |k| (i, k)))
        .collect();
    let reads = 4000.min(blocks.len() * 4);
    let picks: Vec<(usize, usize)> = (0..reads)
        .map(|_| blocks[rng.random_range(0..blocks.len())])
        .collect();
    let mut scratch = Vec::new();
    let mut one = vec![0u8; BLOCK_BYTES];
    let t = Instant::now();
    for &(i, k) in &picks {
        unit::read_block(&stored[i], d, k, &mut scratch, &mut one)
            .ok_or_else(|| anyhow!("{codec}: a block read failed"))?;
    }
    let rt = t.elapsed().as_secs_f64();
    let stored_bytes: u64 = stored.iter().map(|s| s.bytes.len() as u64).sum();
    let (projected, split) = project(codec, d, &inputs, &stored, extent)?;
    let mb = input_bytes as f64 / 1e6;
    Ok(UnitRow {
        codec: codec.to_string(),
        unit_bytes: n * BLOCK_BYTES,
        dict_bytes,
        input_bytes,
        stored_bytes,
        savings_pct: 100.0 * (1.0 - stored_bytes as f64 / input_bytes.max(1) as f64),
        compress_mb_s: mb / ct.max(1e-9),
        decompress_mb_s: mb / dt.max(1e-9),
        random_4k_read_us: rt * 1e6 / reads.max(1) as f64,
        projected_engine_bytes: projected,
        units_split: split,
    })
}

/// Engine constants (docs/format.md): 64-byte segment header, 40-byte record, sector padding.
const SEGMENT_HEADER: usize = 64;
const RECORD: usize = 40;
const SECTOR: usize = 512;
/// Open extents the packing model keeps (the engine keeps up to its buffer / extent size).
const OPEN_EXTENTS: usize = 64;

/// Bytes the engine would use for `stored`: items packed best-fit into extents of `extent`
/// bytes, one segment per extent (a bulk copy), each item costing its payload plus a record.
/// A raw unit becomes per-block raw records (the zero-cost rule); a unit too large for an extent
/// is split in two and recompressed. Returns (bytes, units split).
fn project(
    codec: Codec,
    d: Option<&Dictionary>,
    inputs: &[Vec<u8>],
    stored: &[StoredUnit],
    extent: usize,
) -> Result<(u64, u64)> {
    let capacity = extent - SEGMENT_HEADER - SECTOR; // worst-case padding kept free
    let mut items: Vec<usize> = Vec::new();
    let mut split = 0u64;
    fn push(
        codec: Codec,
        d: Option<&Dictionary>,
        input: &[u8],
        s: &StoredUnit,
        capacity: usize,
        items: &mut Vec<usize>,
        split: &mut u64,
    ) -> Result<()> {
        if s.codec_id == zbd_core::codec::id::RAW {
            items.extend(std::iter::repeat_n(
                BLOCK_BYTES + RECORD,
                usize::from(s.blocks),
            ));
        } else if s.bytes.len() + RECORD > capacity {
            *split += 1;
            let half = usize::from(s.blocks) / 2 * BLOCK_BYTES;
            for part in [&input[..half], &input[half..]] {
                let p = unit::compress_unit(codec, d, part)?;
                push(codec, d, part, &p, capacity, items, split)?;
            }
        } else {
            items.push(s.bytes.len() + RECORD);
        }
        Ok(())
    }
    for (input, s) in inputs.iter().zip(stored) {
        push(codec, d, input, s, capacity, &mut items, &mut split)?;
    }
    // Best fit over a bounded set of open extents; a full set closes the fullest one.
    let mut open: Vec<usize> = Vec::new();
    let mut closed = 0u64;
    for it in items {
        let best = open
            .iter()
            .enumerate()
            .filter(|(_, &used)| used + it <= capacity)
            .min_by_key(|(_, &used)| capacity - used - it)
            .map(|(i, _)| i);
        match best {
            Some(i) => open[i] += it,
            None => {
                if open.len() >= OPEN_EXTENTS {
                    let (i, _) = open
                        .iter()
                        .enumerate()
                        .max_by_key(|(_, &u)| u)
                        .ok_or_else(|| anyhow!("no open extent"))?;
                    open.swap_remove(i);
                    closed += 1;
                }
                open.push(it);
            }
        }
    }
    // Open extents at the end count what a final flush writes: header + payload, sector-rounded.
    let tail: u64 = open
        .iter()
        .map(|u| (SEGMENT_HEADER + u).div_ceil(SECTOR) as u64 * SECTOR as u64)
        .sum();
    Ok((closed * extent as u64 + tail, split))
}

/// The built-in sample as 256 KiB pseudo-files.
fn sample_files() -> Vec<(u64, File)> {
    sample::mixed(24 << 20)
        .chunks(256 * 1024)
        .enumerate()
        .map(|(i, c)| (i as u64, cut(c)))
        .collect()
}

fn cut(bytes: &[u8]) -> File {
    File {
        blocks: bytes
            .chunks(BLOCK_BYTES)
            .map(|c| {
                let mut b = c.to_vec();
                b.resize(BLOCK_BYTES, 0);
                b
            })
            .collect(),
    }
}

/// Regular files under `dir`, sorted by path; if they exceed `max_bytes`, every k-th file is
/// kept so the selection spans the whole tree. Each file gets a key (FNV hash of its path) that
/// decides whether it trains the dictionary or is measured.
fn read_tree(dir: &Path, max_bytes: u64) -> Result<Vec<(u64, File)>> {
    let mut paths = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let rd = std::fs::read_dir(&d).map_err(|e| anyhow!("--dir {}: {e}", d.display()))?;
        for e in rd.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                let len = e.metadata().map(|m| m.len()).unwrap_or(0);
                if len > 0 {
                    paths.push((e.path(), len));
                }
            }
        }
    }
    paths.sort();
    let total: u64 = paths.iter().map(|(_, l)| l).sum();
    if total == 0 {
        return Err(anyhow!(
            "--dir {}: no non-empty regular file",
            dir.display()
        ));
    }
    let keep_every = total.div_ceil(max_bytes.max(1)).max(1) as usize;
    let mut files = Vec::new();
    for (p, _) in paths.into_iter().step_by(keep_every) {
        // Unreadable files (permissions, races) are skipped: this is a sample.
        let Ok(bytes) = std::fs::read(&p) else {
            continue;
        };
        let key = p
            .to_string_lossy()
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
            });
        files.push((key, cut(&bytes)));
    }
    Ok(files)
}

pub fn print(r: &UnitReport) {
    println!();
    println!(
        "units and dictionaries: {}, {} files measured, dictionary trained on {} other files ({} MiB; never measured)",
        r.source,
        r.files_measured,
        r.files_training,
        r.training_bytes >> 20
    );
    println!(
        "{} all-zero blocks left out (a map state in the engine); engine projection at {} KiB extents",
        r.zero_blocks,
        r.extent_bytes >> 10
    );
    println!(
        "{:<8} {:>6} {:>6} {:>9} {:>10} {:>10} {:>11} {:>10} {:>7}",
        "codec",
        "unit",
        "dict",
        "savings",
        "comp MB/s",
        "dec MB/s",
        "4K read us",
        "engine",
        "split"
    );
    for row in &r.rows {
        let dict = if row.dict_bytes == 0 {
            "-".to_string()
        } else {
            format!("{}K", row.dict_bytes >> 10)
        };
        println!(
            "{:<8} {:>5}K {:>6} {:>8.1}% {:>10.0} {:>10.0} {:>11.1} {:>9.1}% {:>7}",
            row.codec,
            row.unit_bytes >> 10,
            dict,
            row.savings_pct,
            row.compress_mb_s,
            row.decompress_mb_s,
            row.random_4k_read_us,
            100.0 * (1.0 - row.projected_engine_bytes as f64 / row.input_bytes.max(1) as f64),
            row.units_split
        );
    }
    println!("savings = codec output (raw when it saves < 1 sector) vs the non-zero blocks; engine = same with records, segments and extent packing");
}
