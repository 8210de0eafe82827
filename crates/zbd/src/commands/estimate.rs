//! `zbd estimate PATH...`: what deduplication and compression would save on these files, trees
//! or images, before a volume is made (as vdoestimator and `zdb -S` do), and how much of the
//! duplication a dedup index of a given RAM budget finds.
//!
//! Every non-zero 4 KiB block is fingerprinted (xxh3-128). The *exact* count of duplicates comes
//! from a set of every fingerprint seen (64 bits each: at 2^32 blocks, one false match in about
//! 2^32 draws, which an estimate can afford; the engine itself never trusts a fingerprint). New
//! blocks are compressed in units as the engine would, after taking duplicates out. Then each
//! budget's [`Index`] is driven over the same stream against a simulated log: misses are
//! appended to extents in order, a hook loads an extent's manifest, and a candidate counts only
//! if its full fingerprint equals the block's (the engine compares bytes).

use crate::commands::{human, size_arg};
use crate::commands::{Progress, BLOCKS_BAR};
use anyhow::{anyhow, Context, Result};
use rayon::prelude::*;
use std::collections::hash_map::{Entry, HashMap};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use zbd_core::codec::unit::{compress_unit, BLOCK_BYTES};
use zbd_core::dedup::{Candidate, Fingerprint, Index, IndexStats, Location};
use zbd_core::format::RECORD_BYTES;
use zbd_core::Codec;

/// Options of `zbd estimate`.
#[derive(clap::Args)]
pub struct Args {
    /// Files, block devices or directories (read recursively; each file is cut into 4 KiB
    /// blocks, its tail padded with zeros, as a filesystem stores it).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Codec of the compression estimate: lz4, zstd[:LEVEL], zlib[:LEVEL], lzo[:999] or none.
    #[arg(long, default_value = "lz4")]
    codec: String,
    /// Compression unit, as `zbd create --unit-size` (4K to 64K).
    #[arg(long, default_value = "8K")]
    unit_size: String,
    /// Dedup index budgets to simulate (comma-separated, as `--dedup-index` will take).
    #[arg(long, value_delimiter = ',', default_value = "64M")]
    dedup_index: Vec<String>,
    /// Extent size of the simulated log, as `zbd create --extent-size`.
    #[arg(long, default_value = "128K")]
    extent_size: String,
    /// Print the estimate as JSON.
    #[arg(long)]
    json: bool,
}

/// The estimate, as `--json` prints it.
#[derive(serde::Serialize)]
pub struct Estimate {
    pub files: u64,
    /// Bytes read, tails padded to 4 KiB.
    pub logical_bytes: u64,
    pub zero_blocks: u64,
    pub nonzero_blocks: u64,
    /// Non-zero blocks whose content appeared before (exact).
    pub duplicate_blocks: u64,
    /// Non-zero blocks / distinct non-zero blocks.
    pub dedup_ratio: f64,
    pub codec: String,
    pub unit_bytes: u64,
    /// Distinct blocks' bytes / what they compress to (payload only).
    pub compression_ratio: f64,
    /// What the log would hold with every duplicate found: payloads and 40-byte records.
    pub stored_bytes: u64,
    /// Non-zero logical bytes / stored bytes.
    pub total_ratio: f64,
    pub indexes: Vec<IndexRun>,
}

/// One simulated index budget.
#[derive(serde::Serialize)]
pub struct IndexRun {
    pub budget_bytes: u64,
    /// Share of the exact duplicates this index found.
    pub found: f64,
    pub found_blocks: u64,
    /// What the log would hold with this index.
    pub stored_bytes: u64,
    /// Index RAM per block written (the window it covers is everything written while no hook
    /// was evicted).
    pub bytes_per_block: f64,
    /// Manifest reads per GiB written (the I/O hooks cost).
    pub manifest_loads_per_gib: f64,
    pub stats: IndexStats,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let codec: Codec = a.codec.parse().map_err(|e| anyhow!("--codec: {e}"))?;
    let unit = size_arg("--unit-size", &a.unit_size)?;
    if !unit.is_power_of_two() || !(4096..=65536).contains(&unit) {
        return Err(anyhow!(
            "--unit-size '{}': must be a power of two from 4K to 64K",
            a.unit_size
        ));
    }
    let extent = size_arg("--extent-size", &a.extent_size)?;
    if !extent.is_power_of_two() || !(8192..=1 << 20).contains(&extent) {
        return Err(anyhow!(
            "--extent-size '{}': must be a power of two from 8K to 1M",
            a.extent_size
        ));
    }
    let budgets = a
        .dedup_index
        .iter()
        .map(|b| size_arg("--dedup-index", b))
        .collect::<Result<Vec<u64>>>()?;
    let files = list_files(&a.paths)?;
    let total: u64 = files.iter().map(|(_, len)| len.div_ceil(4096)).sum();
    let progress = Progress::new(!a.json, BLOCKS_BAR);
    let mut est = Estimator::new(codec, (unit / 4096) as usize, extent, &budgets);
    for (path, _) in &files {
        est.file(path, &|done| progress.set(done, total))?;
    }
    progress.finish();
    let report = est.finish(a.codec.clone(), unit);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print(&report);
    }
    Ok(ExitCode::SUCCESS)
}

/// Regular files under the paths (directories walked, sorted), block devices and files as given,
/// with their sizes.
fn list_files(paths: &[PathBuf]) -> Result<Vec<(PathBuf, u64)>> {
    let mut out = Vec::new();
    for p in paths {
        let meta = std::fs::metadata(p).with_context(|| format!("{}", p.display()))?;
        if meta.is_dir() {
            let mut found = Vec::new();
            let mut stack = vec![p.clone()];
            while let Some(d) = stack.pop() {
                let rd = std::fs::read_dir(&d).with_context(|| format!("{}", d.display()))?;
                for e in rd.flatten() {
                    let Ok(ft) = e.file_type() else { continue };
                    if ft.is_dir() {
                        stack.push(e.path());
                    } else if ft.is_file() {
                        let len = e.metadata().map(|m| m.len()).unwrap_or(0);
                        found.push((e.path(), len));
                    }
                }
            }
            found.sort();
            out.extend(found);
        } else {
            out.push((p.clone(), device_or_file_len(p, &meta)?));
        }
    }
    Ok(out)
}

fn device_or_file_len(p: &Path, meta: &std::fs::Metadata) -> Result<u64> {
    use std::io::Seek;
    if meta.is_file() {
        return Ok(meta.len());
    }
    // A block device reports its size by seeking to its end.
    let mut f = File::open(p).with_context(|| format!("{}", p.display()))?;
    f.seek(std::io::SeekFrom::End(0))
        .with_context(|| format!("{}: not a file, directory or block device", p.display()))
}

/// What the exact pass knows of a distinct block: its share of its unit's stored bytes.
type Shares = HashMap<u64, u32>;

struct Estimator {
    codec: Codec,
    unit_blocks: usize,
    seen: Shares,
    files: u64,
    blocks_read: u64,
    zero: u64,
    nonzero: u64,
    duplicates: u64,
    distinct_payload: u64,
    stored_exact: u64,
    sims: Vec<Sim>,
}

/// Blocks are read and fingerprinted in batches of this many bytes (several units each).
const BATCH_BYTES: usize = 8 << 20;

impl Estimator {
    fn new(codec: Codec, unit_blocks: usize, extent: u64, budgets: &[u64]) -> Estimator {
        Estimator {
            codec,
            unit_blocks,
            seen: HashMap::new(),
            files: 0,
            blocks_read: 0,
            zero: 0,
            nonzero: 0,
            duplicates: 0,
            distinct_payload: 0,
            stored_exact: 0,
            sims: budgets.iter().map(|&b| Sim::new(b, extent)).collect(),
        }
    }

    fn file(&mut self, path: &Path, progress: &dyn Fn(u64)) -> Result<()> {
        let mut f = File::open(path).with_context(|| format!("{}", path.display()))?;
        self.files += 1;
        let mut buf = vec![0u8; BATCH_BYTES];
        loop {
            let n = read_full(&mut f, &mut buf).with_context(|| format!("{}", path.display()))?;
            if n == 0 {
                return Ok(());
            }
            let padded = n.next_multiple_of(BLOCK_BYTES);
            buf[n..padded].fill(0);
            self.batch(&buf[..padded]);
            progress(self.blocks_read);
            if n < buf.len() {
                return Ok(());
            }
        }
    }

    /// One batch of whole blocks of one file, in order.
    fn batch(&mut self, data: &[u8]) {
        let blocks: Vec<&[u8]> = data.chunks(BLOCK_BYTES).collect();
        self.blocks_read += blocks.len() as u64;
        let fps: Vec<Option<Fingerprint>> = blocks
            .par_iter()
            .map(|b| (!b.iter().all(|&x| x == 0)).then(|| Fingerprint::of(b)))
            .collect();
        // Units of new blocks: consecutive runs of the unit's size, duplicates and zeros taken
        // out as the engine takes its hits out of a write's unit plan.
        let mut units: Vec<Vec<usize>> = Vec::new();
        for chunk in (0..blocks.len())
            .collect::<Vec<_>>()
            .chunks(self.unit_blocks)
        {
            let mut unit = Vec::new();
            for &i in chunk {
                let Some(fp) = fps[i] else {
                    self.zero += 1;
                    continue;
                };
                self.nonzero += 1;
                match self.seen.entry(fp.high()) {
                    Entry::Occupied(_) => self.duplicates += 1,
                    Entry::Vacant(v) => {
                        v.insert(0);
                        unit.push(i);
                    }
                }
            }
            if !unit.is_empty() {
                units.push(unit);
            }
        }
        let codec = self.codec;
        let stored: Vec<usize> = units
            .par_iter()
            .map(|u| {
                let raw: Vec<u8> = u.iter().flat_map(|&i| blocks[i].iter().copied()).collect();
                compress_unit(codec, None, &raw).map_or(raw.len(), |s| s.bytes.len())
            })
            .collect();
        for (u, bytes) in units.iter().zip(stored) {
            self.distinct_payload += bytes as u64;
            self.stored_exact += (bytes + RECORD_BYTES * u.len()) as u64;
            // Each block's share of its unit; the first also takes the remainder, so that the
            // shares of a unit add up to it exactly.
            for (k, &i) in u.iter().enumerate() {
                let share = bytes / u.len() + if k == 0 { bytes % u.len() } else { 0 };
                let fp = fps[i].expect("non-zero");
                self.seen.insert(fp.high(), share as u32);
            }
        }
        for &fp in fps.iter().flatten() {
            let share = self.seen[&fp.high()];
            for sim in &mut self.sims {
                sim.block(fp, share);
            }
        }
    }

    fn finish(self, codec: String, unit_bytes: u64) -> Estimate {
        let distinct = self.nonzero - self.duplicates;
        let gib_written = (self.nonzero * BLOCK_BYTES as u64) as f64 / f64::from(1u32 << 30);
        let indexes = self
            .sims
            .into_iter()
            .map(|s| {
                let stats = s.index.stats();
                IndexRun {
                    budget_bytes: s.index.budget(),
                    found: ratio(s.hits, self.duplicates),
                    found_blocks: s.hits,
                    stored_bytes: s.stored,
                    bytes_per_block: ratio(s.index.budget(), self.nonzero),
                    manifest_loads_per_gib: if gib_written > 0.0 {
                        stats.manifests_loaded as f64 / gib_written
                    } else {
                        0.0
                    },
                    stats,
                }
            })
            .collect();
        Estimate {
            files: self.files,
            logical_bytes: self.blocks_read * BLOCK_BYTES as u64,
            zero_blocks: self.zero,
            nonzero_blocks: self.nonzero,
            duplicate_blocks: self.duplicates,
            dedup_ratio: ratio(self.nonzero, distinct),
            codec,
            unit_bytes,
            compression_ratio: ratio(distinct * BLOCK_BYTES as u64, self.distinct_payload),
            stored_bytes: self.stored_exact,
            total_ratio: ratio(self.nonzero * BLOCK_BYTES as u64, self.stored_exact),
            indexes,
        }
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// Reads until `buf` is full or the end of the file.
fn read_full(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// One budget's index against a simulated log: the full fingerprint of every block stored, by
/// extent, stands for the bytes the engine would compare.
struct Sim {
    index: Index,
    extent_bytes: u64,
    extents: Vec<Vec<Fingerprint>>,
    fill: u64,
    stored: u64,
    hits: u64,
}

impl Sim {
    fn new(budget: u64, extent_bytes: u64) -> Sim {
        Sim {
            index: Index::new(budget),
            extent_bytes,
            extents: vec![Vec::new()],
            fill: 0,
            stored: 0,
            hits: 0,
        }
    }

    fn at(&self, loc: Location) -> Option<Fingerprint> {
        self.extents
            .get((loc >> 16) as usize)?
            .get((loc & 0xffff) as usize)
            .copied()
    }

    /// The manifest of extent `e`, as the log's record table would give it.
    fn load(&mut self, e: u32) {
        let manifest: Vec<(u32, Location)> = self.extents[e as usize]
            .iter()
            .enumerate()
            .map(|(k, f)| (f.manifest_part(), (u64::from(e) << 16) | k as u64))
            .collect();
        self.index.add_manifest(e, manifest);
    }

    /// A duplicate run found in the last quarter of an extent goes on, most likely, in the
    /// extent written after it: its manifest is loaded before the run gets there, so the run
    /// is not lost at the boundary until its next hook.
    fn follow(&mut self, loc: Location) {
        let (e, k) = ((loc >> 16) as usize, (loc & 0xffff) as usize);
        let next = e + 1;
        if k * 4 >= self.extents[e].len() * 3
            && next + 1 < self.extents.len()
            && !self.index.has_manifest(next as u32)
        {
            self.load(next as u32);
        }
    }

    fn block(&mut self, fp: Fingerprint, share: u32) {
        let mut candidate = self.index.lookup(fp);
        if let Some(Candidate::Extents(extents)) = &candidate {
            for &e in extents {
                self.load(e);
            }
            candidate = self.index.lookup_cached(fp);
        }
        if let Some(Candidate::Block(loc)) = candidate {
            if self.at(loc) == Some(fp) {
                self.hits += 1;
                self.index.verified(fp, loc);
                self.follow(loc);
                return;
            }
            self.index.rejected();
        }
        // A miss: stored, appended to the open extent (a new one when it is full).
        let bytes = u64::from(share) + RECORD_BYTES as u64;
        let blocks_max = 1 << 16;
        if self.fill + bytes > self.extent_bytes
            || self.extents.last().expect("one").len() == blocks_max
        {
            self.extents.push(Vec::new());
            self.fill = 0;
        }
        let e = self.extents.len() - 1;
        let loc = ((e as u64) << 16) | self.extents[e].len() as u64;
        self.extents[e].push(fp);
        self.fill += bytes;
        self.stored += bytes;
        self.index.insert(fp, loc, e as u32);
    }
}

fn print(r: &Estimate) {
    let pct = |a: u64, b: u64| 100.0 * ratio(a, b);
    println!(
        "{} file(s), {} in {} blocks of 4 KiB",
        r.files,
        human(r.logical_bytes),
        r.zero_blocks + r.nonzero_blocks
    );
    let all = r.zero_blocks + r.nonzero_blocks;
    println!(
        "  zero blocks        {:>6.1} %  (not stored)",
        pct(r.zero_blocks, all)
    );
    println!(
        "  duplicate blocks   {:>6.1} %  of non-zero blocks: dedup {:.2}:1",
        pct(r.duplicate_blocks, r.nonzero_blocks),
        r.dedup_ratio
    );
    println!(
        "  compression        {:.2}:1  ({} in {} KiB units, distinct blocks)",
        r.compression_ratio,
        r.codec,
        r.unit_bytes / 1024
    );
    println!(
        "  stored             {}  of {} non-zero data: {:.2}:1 with dedup and compression",
        human(r.stored_bytes),
        human(r.nonzero_blocks * BLOCK_BYTES as u64),
        r.total_ratio
    );
    for ix in &r.indexes {
        println!(
            "  index {:>9}    finds {:>5.1} % of the duplicates ({:.2} B per block written, {:.0} manifest reads per GiB); stored {}",
            human(ix.budget_bytes),
            100.0 * ix.found,
            ix.bytes_per_block,
            ix.manifest_loads_per_gib,
            human(ix.stored_bytes)
        );
    }
}
