//! `zbd bench codec` (the paper's Table I on 4 KiB blocks) and `zbd bench engine` (in-process
//! throughput as a fraction of the raw codec speed, and the write amplification of small
//! synchronous writes). The unit/dictionary part of `bench codec` lives in bench_codec.rs.

use crate::sample;
use anyhow::{anyhow, Result};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;
use zbd_core::{
    codec, Codec, CreateOptions, FileStorage, MemStorage, OpenOptions, Storage, Volume,
};

/// Arguments of `zbd bench`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// Per-codec cost and savings on 4 KiB blocks (ZBD Table I).
    Codec {
        /// Data file to cut into 4 KiB blocks (default: built-in mixed sample).
        #[arg(long)]
        data: Option<PathBuf>,
        /// Units and dictionaries (bench_codec.rs).
        #[command(flatten)]
        units: super::bench_codec::UnitArgs,
        /// Codecs to measure (default: all).
        #[arg(long, value_delimiter = ',')]
        codecs: Vec<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Engine throughput vs the raw codec on the same data, and write amplification of 4K
    /// write + flush.
    Engine {
        /// Bytes written sequentially per run.
        #[arg(long, default_value = "256M")]
        size: String,
        /// Directory for the volume file (default: system temp dir).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Codec of the volume (and of the raw codec speed it is compared with).
        #[arg(long, default_value = "lz4")]
        codec: String,
        /// Client thread counts to measure, one volume each.
        #[arg(long, value_delimiter = ',', default_value = "1,2")]
        threads: Vec<usize>,
        /// Skip the write-amplification runs (throughput only, as `make bench` repeats it).
        #[arg(long)]
        no_wa: bool,
        /// Open the volume file with O_DIRECT (bypass the page cache).
        #[arg(long, conflicts_with = "ram")]
        direct: bool,
        /// Keep the volume in RAM (no file, no system call below the engine): the engine's own
        /// cost, as `make bench` measures it.
        #[arg(long, conflicts_with = "dir")]
        ram: bool,
        /// Volumes keep their map in metadata pages (checkpoint flag bit 10; hidden like
        /// `zbd create --metadata-pages`).
        #[arg(long, hide = true)]
        metadata_pages: bool,
        /// I/O threads below the engine (0: synchronous device writes, the old path).
        #[arg(long, default_value_t = zbd_core::IoOptions::default().threads)]
        io_threads: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Cleaner: WA and throughput of 4 KiB random overwrites at 50/75/90 % live vs an empty
    /// volume, and a throughput-over-time series while the cleaner starts and stops.
    Cleaner {
        /// Data area size of the test volumes.
        #[arg(long, default_value = "64M")]
        capacity: String,
        /// Overwrites per level, as a multiple of the capacity (stored bytes).
        #[arg(long, default_value_t = 4)]
        factor: u64,
        /// Write the time series here (CSV).
        #[arg(long)]
        csv: Option<PathBuf>,
        /// Directory for the volume files (default: system temp dir).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Volumes keep their map in metadata pages (bit 10: writers never clean under the
        /// state lock; hidden like `zbd create --metadata-pages`).
        #[arg(long, hide = true)]
        metadata_pages: bool,
    },
    /// The engine's work over the extent table under the state lock on large data areas: one
    /// checkpoint's phase 1 and one choice of cleaner victims (incremental, compact), with
    /// made-up accounting in a sparse RAM volume (bench_extents.rs).
    Extents {
        /// Extents in the data area, one volume each (K / M = thousands / millions; 161M is a
        /// 16 TiB volume's at 128 KiB extents). RAM: 13 bytes per extent, more while choosing.
        #[arg(long, value_delimiter = ',', default_value = "16M,161M")]
        extents: Vec<String>,
        /// Extent size.
        #[arg(long, default_value = "128K")]
        extent_size: String,
        /// Timed repetitions of each measurement.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Extents emptied before each checkpoint (what it releases).
        #[arg(long, default_value_t = 256)]
        pending: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(a: Args) -> Result<ExitCode> {
    match a.what {
        What::Codec {
            data,
            units,
            codecs,
            json,
        } => codec_table(data, &units, codecs, json),
        What::Engine {
            size,
            dir,
            codec,
            threads,
            no_wa,
            direct,
            ram,
            metadata_pages,
            io_threads,
            json,
        } => {
            let codec: Codec = codec.parse().map_err(|e| anyhow!("--codec: {e}"))?;
            if threads.is_empty() || threads.contains(&0) {
                return Err(anyhow!("--threads: give counts of at least 1, e.g. 1,2"));
            }
            let opts = EngineOpts {
                codec,
                threads,
                wa: !no_wa,
                direct,
                ram,
                metadata_pages,
                io_threads,
                json,
            };
            engine(super::size_arg("--size", &size)?, dir, opts)
        }
        What::Cleaner {
            capacity,
            factor,
            csv,
            dir,
            metadata_pages,
        } => {
            let d = tempdir_in(dir)?;
            let capacity = super::size_arg("--capacity", &capacity)?;
            super::bench_cleaner::run(capacity, factor, csv, metadata_pages, &d.0)
        }
        What::Extents {
            extents,
            extent_size,
            rounds,
            pending,
            json,
        } => {
            let counts = extents
                .iter()
                .map(|s| super::bench_extents::parse_count(s))
                .collect::<Result<Vec<u32>>>()?;
            let eb = super::size_arg("--extent-size", &extent_size)?;
            let eb = u32::try_from(eb).map_err(|_| anyhow!("--extent-size: at most 1M"))?;
            super::bench_extents::run(&counts, eb, rounds, pending, json)
        }
    }
}

#[derive(serde::Serialize)]
struct CodecRow {
    codec: String,
    compress_us_per_block: f64,
    decompress_us_per_block: f64,
    compress_mb_s: f64,
    decompress_mb_s: f64,
    savings_pct: f64,
    stored_savings_pct: f64,
}

fn load_blocks(data: Option<PathBuf>) -> Result<Vec<Vec<u8>>> {
    let bytes = match data {
        Some(p) => std::fs::read(&p).map_err(|e| anyhow!("--data {}: {e}", p.display()))?,
        None => sample::mixed(16 << 20),
    };
    let blocks: Vec<Vec<u8>> = bytes
        .chunks_exact(4096)
        .map(|c| c.to_vec())
        .filter(|b| b.iter().any(|&x| x != 0))
        .collect();
    if blocks.is_empty() {
        return Err(anyhow!("--data: no non-zero 4 KiB block in the file"));
    }
    Ok(blocks)
}

/// Measures one codec over all blocks (4 KiB blocks for Table I; compression units of any size
/// for the engine's reference speed).
fn measure(c: Codec, blocks: &[Vec<u8>]) -> CodecRow {
    let t = Instant::now();
    let packed: Vec<Option<Vec<u8>>> = blocks.iter().map(|b| c.compress(b)).collect();
    let ct = t.elapsed().as_secs_f64();
    let mut out = vec![0u8; blocks.iter().map(Vec::len).max().unwrap_or(0)];
    let t = Instant::now();
    for (z, b) in packed.iter().zip(blocks) {
        let out = &mut out[..b.len()];
        match z {
            Some(z) => {
                let _ = codec::decompress(c.id(), z, out);
            }
            None => out.copy_from_slice(b),
        }
    }
    let dt = t.elapsed().as_secs_f64();
    let n = blocks.len() as f64;
    let total = blocks.iter().map(|b| b.len() as f64).sum::<f64>();
    let comp: f64 = packed
        .iter()
        .zip(blocks)
        .map(|(z, b)| z.as_ref().map_or(b.len(), |z| z.len().min(b.len())) as f64)
        .sum();
    let stored: f64 = packed
        .iter()
        .zip(blocks)
        .map(|(z, b)| {
            z.as_ref()
                .filter(|z| z.len() + 512 <= b.len())
                .map_or(b.len(), |z| z.len()) as f64
        })
        .sum();
    CodecRow {
        codec: c.to_string(),
        compress_us_per_block: ct * 1e6 / n,
        decompress_us_per_block: dt * 1e6 / n,
        compress_mb_s: total / ct.max(1e-9) / 1e6,
        decompress_mb_s: total / dt.max(1e-9) / 1e6,
        savings_pct: 100.0 * (1.0 - comp / total),
        stored_savings_pct: 100.0 * (1.0 - stored / total),
    }
}

fn codec_table(
    data: Option<PathBuf>,
    units: &super::bench_codec::UnitArgs,
    codecs: Vec<String>,
    json: bool,
) -> Result<ExitCode> {
    let blocks = load_blocks(data)?;
    let list: Vec<Codec> = if codecs.is_empty() {
        Codec::all_defaults()
    } else {
        codecs
            .iter()
            .map(|s| s.parse().map_err(|e| anyhow!("--codecs: {e}")))
            .collect::<Result<_>>()?
    };
    let rows: Vec<CodecRow> = list.into_iter().map(|c| measure(c, &blocks)).collect();
    let unit_report = if super::bench_codec::enabled(units) {
        Some(super::bench_codec::run(units)?)
    } else {
        None
    };
    if json {
        // Table I alone keeps its array (zbdlab reproduce reads it); with units, an object.
        let out = match &unit_report {
            Some(u) => serde_json::json!({ "blocks": rows, "units": u }),
            None => serde_json::to_value(&rows)?,
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("{} blocks of 4 KiB, one core", blocks.len());
    println!(
        "{:<9} {:>12} {:>12} {:>10} {:>10} {:>9} {:>9}",
        "codec", "comp us/blk", "dec us/blk", "comp MB/s", "dec MB/s", "savings", "stored"
    );
    for r in &rows {
        println!(
            "{:<9} {:>12.2} {:>12.2} {:>10.0} {:>10.0} {:>8.1}% {:>8.1}%",
            r.codec,
            r.compress_us_per_block,
            r.decompress_us_per_block,
            r.compress_mb_s,
            r.decompress_mb_s,
            r.savings_pct,
            r.stored_savings_pct
        );
    }
    println!("paper (Xeon 5400, 2 GHz): lzo 46 / 14 us, 34 %; zlib-1 150 / 60 us, 54 %");
    println!("savings = codec output capped at 4 KiB; stored = engine rule (kept compressed only if it saves a sector)");
    match &unit_report {
        Some(r) => super::bench_codec::print(r),
        None => println!("per unit size and dictionary: add --units 4K,16K,64K and/or --dir PATH"),
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(serde::Serialize)]
struct EngineReport {
    bytes: u64,
    codec: String,
    /// The codec alone on one core, on the same data cut in the engine's compression units
    /// (`unit_bytes`), in the same process.
    raw_compress_mb_s: f64,
    raw_decompress_mb_s: f64,
    unit_bytes: usize,
    direct: bool,
    ram: bool,
    io_threads: usize,
    runs: Vec<EngineRun>,
    savings_pct: f64,
    wa_4k_write_flush: Option<f64>,
    wa_4k_write_flush_incompressible: Option<f64>,
}

#[derive(serde::Serialize)]
struct EngineRun {
    threads: usize,
    write_mb_s: f64,
    read_mb_s: f64,
    /// Engine speed over the single-core raw codec speed.
    write_ratio: f64,
    read_ratio: f64,
}

struct EngineOpts {
    codec: Codec,
    threads: Vec<usize>,
    wa: bool,
    direct: bool,
    ram: bool,
    metadata_pages: bool,
    io_threads: usize,
    json: bool,
}

const REQUEST_BYTES: usize = 128 * 1024;

/// A volume as `zbd create` makes one on a file (its extent size), so that the benches measure
/// what users get.
pub(super) fn file_volume(logical_bytes: u64) -> CreateOptions {
    CreateOptions {
        extent_bytes: zbd_core::layout::FILE_EXTENT_BYTES_DEFAULT,
        ..CreateOptions::new(logical_bytes)
    }
}

fn engine(bytes: u64, dir: Option<PathBuf>, o: EngineOpts) -> Result<ExitCode> {
    let dir = tempdir_in(dir)?;
    let data = Arc::new(sample::mixed(32 << 20));
    let bytes = bytes / REQUEST_BYTES as u64 * REQUEST_BYTES as u64;
    // The reference is the codec on what the engine compresses: units of the volume's unit
    // size (sequential requests fill whole units), not 4 KiB blocks, whose speed differs.
    let mut opts = file_volume(bytes);
    opts.codec = o.codec;
    opts.metadata_pages = o.metadata_pages;
    let planned = zbd_core::layout::plan(&opts)?;
    let unit_bytes = usize::from(planned.unit_blocks) * 4096;
    let units: Vec<Vec<u8>> = data.chunks_exact(unit_bytes).map(|c| c.to_vec()).collect();
    if o.ram {
        // Refused here, with the reason, rather than killed by the kernel halfway.
        let need = planned.total_bytes();
        if let Some(have) = mem_available().filter(|&have| need > have) {
            return Err(anyhow!(
                "--ram: a {} MiB volume does not fit in the {} MiB of RAM available (smaller --size, or a file with --dir)",
                need >> 20,
                have >> 20
            ));
        }
    }
    let raw = measure(o.codec, &units);
    let mut runs = Vec::new();
    let mut savings = 0.0;
    for &threads in &o.threads {
        let path = dir.0.join(format!("engine-{threads}.zbd"));
        let storage: Box<dyn Storage> = if o.ram {
            Box::new(MemStorage::new(planned.total_bytes()))
        } else {
            let storage = FileStorage::create(&path, planned.total_bytes())?;
            if o.direct {
                Box::new(storage.into_direct(&path)?)
            } else {
                Box::new(storage)
            }
        };
        let open = OpenOptions {
            io: zbd_core::IoOptions {
                threads: o.io_threads,
                ..zbd_core::IoOptions::default()
            },
            ..OpenOptions::default()
        };
        let vol = Arc::new(Volume::create_with(storage, &opts, open)?);
        let w = timed(&vol, &data, bytes, threads, true)?;
        let r = timed(&vol, &data, bytes, threads, false)?;
        savings = vol.stats().savings_pct;
        let (write_mb_s, read_mb_s) = (bytes as f64 / w / 1e6, bytes as f64 / r / 1e6);
        runs.push(EngineRun {
            threads,
            write_mb_s,
            read_mb_s,
            write_ratio: write_mb_s / raw.compress_mb_s,
            read_ratio: read_mb_s / raw.decompress_mb_s,
        });
        drop(vol);
        if !o.ram {
            std::fs::remove_file(&path)?;
        }
    }
    let (wa_mixed, wa_rand) = if o.wa {
        (
            Some(wa_small_sync(&dir.0, false, o.metadata_pages)?),
            Some(wa_small_sync(&dir.0, true, o.metadata_pages)?),
        )
    } else {
        (None, None)
    };
    let rep = EngineReport {
        bytes,
        codec: o.codec.to_string(),
        raw_compress_mb_s: raw.compress_mb_s,
        raw_decompress_mb_s: raw.decompress_mb_s,
        unit_bytes,
        direct: o.direct,
        ram: o.ram,
        io_threads: o.io_threads,
        runs,
        savings_pct: savings,
        wa_4k_write_flush: wa_mixed,
        wa_4k_write_flush_incompressible: wa_rand,
    };
    if o.json {
        println!("{}", serde_json::to_string_pretty(&rep)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{}, sequential, {} MiB in 128 KiB requests, mixed sample ({:.1} % savings)",
        rep.codec,
        bytes >> 20,
        rep.savings_pct
    );
    println!(
        "raw {} on one core, {} KiB units: compress {:.0} MB/s, decompress {:.0} MB/s",
        rep.codec,
        rep.unit_bytes / 1024,
        rep.raw_compress_mb_s,
        rep.raw_decompress_mb_s
    );
    println!(
        "{:<8} {:>12} {:>14} {:>12} {:>14}",
        "threads", "write MB/s", "x raw comp", "read MB/s", "x raw decomp"
    );
    for r in &rep.runs {
        println!(
            "{:<8} {:>12.0} {:>14.2} {:>12.0} {:>14.2}",
            r.threads, r.write_mb_s, r.write_ratio, r.read_mb_s, r.read_ratio
        );
    }
    if let (Some(mixed), Some(rand)) = (wa_mixed, wa_rand) {
        println!(
            "write amplification of 4 KiB write + flush, repeated: {mixed:.2} (mixed data), {rand:.2} (incompressible)"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// MemAvailable of /proc/meminfo in bytes (None where there is none).
fn mem_available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kib * 1024)
}

/// Seconds to write (or read) `bytes` sequentially with `threads` threads, each owning a slice.
fn timed(
    vol: &Arc<Volume>,
    data: &Arc<Vec<u8>>,
    bytes: u64,
    threads: usize,
    write: bool,
) -> Result<f64> {
    let t = Instant::now();
    let per = bytes / threads as u64 / REQUEST_BYTES as u64 * REQUEST_BYTES as u64;
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = (0..threads)
            .map(|k| {
                let vol = Arc::clone(vol);
                let data = Arc::clone(data);
                s.spawn(move || -> zbd_core::Result<()> {
                    let mut buf = vec![0u8; REQUEST_BYTES];
                    let mut off = k as u64 * per;
                    let end = off + per;
                    while off < end {
                        let src = (off as usize) % (data.len() - REQUEST_BYTES);
                        let src = src / 4096 * 4096;
                        if write {
                            vol.write(off, &data[src..src + REQUEST_BYTES], false)?;
                        } else {
                            vol.read(off, &mut buf)?;
                        }
                        off += REQUEST_BYTES as u64;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| anyhow!("bench thread panicked"))??;
        }
        Ok(())
    })?;
    if write {
        // Writes count once durable: nothing left in the I/O queue or the page cache.
        vol.flush()?;
    }
    Ok(t.elapsed().as_secs_f64())
}

/// Write amplification of repeated "write 4 KiB at a random place, flush".
fn wa_small_sync(dir: &std::path::Path, incompressible: bool, metadata_pages: bool) -> Result<f64> {
    let path = dir.join("wa.zbd");
    let opts = CreateOptions {
        metadata_pages,
        ..file_volume(256 << 20)
    };
    let sb = zbd_core::layout::plan(&opts)?;
    let vol = Volume::create(
        Box::new(FileStorage::create(&path, sb.total_bytes())?),
        &opts,
    )?;
    let data = sample::mixed(4 << 20);
    let mut rng = SmallRng::seed_from_u64(4);
    let before = vol.stats().counters;
    let n = 10_000u64;
    for i in 0..n {
        let lba = rng.random_range(0..(256u64 << 20) / 4096);
        let block: Vec<u8> = if incompressible {
            (0..4096).map(|_| rng.random()).collect()
        } else {
            let s = ((i as usize * 4096) % data.len()) / 4096 * 4096;
            data[s..s + 4096].to_vec()
        };
        vol.write(lba * 4096, &block, false)?;
        vol.flush()?;
    }
    let after = vol.stats().counters;
    drop(vol);
    std::fs::remove_file(&path)?;
    let _ = OpenOptions::default();
    let written = (after.data_bytes_written + after.metadata_bytes_written)
        - (before.data_bytes_written + before.metadata_bytes_written);
    Ok(written as f64 / (n * 4096) as f64)
}

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir_in(dir: Option<PathBuf>) -> Result<TempDir> {
    let base = dir.unwrap_or_else(std::env::temp_dir);
    let p = base.join(format!("zbd-bench-{}", std::process::id()));
    std::fs::create_dir_all(&p).map_err(|e| anyhow!("--dir {}: {e}", base.display()))?;
    Ok(TempDir(p))
}
