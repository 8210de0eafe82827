//! `zbd stat`: space, savings, extents and I/O at a glance.

use super::{human, open_read_only};
use crate::target::CephArgs;
use anyhow::{bail, Result};
use std::path::PathBuf;
use std::process::ExitCode;
use zbd_core::Stats;

/// Arguments of `zbd stat`.
#[derive(clap::Args)]
pub struct Args {
    /// Volume file, block device or rados:POOL/NAME.
    path: PathBuf,
    #[command(flatten)]
    ceph: CephArgs,
    /// Print JSON instead of text.
    #[arg(long, conflicts_with = "prometheus")]
    json: bool,
    /// Print Prometheus metrics (text format), e.g. for node_exporter's textfile collector;
    /// a served volume's include its requests.
    #[arg(long)]
    prometheus: bool,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let vol = match open_read_only(&a.path, &a.ceph) {
        Ok(vol) => vol,
        // Locked by `zbd serve`: ask the server.
        Err(error) => match super::serve::query_control(&a.path, request(&a)) {
            // A server whose volume a failed grow left unserved says why, in one line.
            Some(report) if report.starts_with("the volume is not served") => {
                bail!("{}: {}", a.path.display(), report.trim_end());
            }
            Some(report) => {
                print!("{report}");
                return Ok(ExitCode::SUCCESS);
            }
            None => return Err(error),
        },
    };
    let s = vol.stats();
    // Not served: the thin-provisioning settings `zbd serve` would use by default.
    let thin = crate::thin::Settings::defaults(s.data_area_bytes);
    if a.prometheus {
        print!(
            "{}",
            crate::metrics::render(&a.path.display().to_string(), &s, &thin, None)
        );
    } else if a.json {
        println!("{}", serde_json::to_string_pretty(&Report::of(&s, &thin))?);
    } else {
        print!("{}", render(&a.path.display().to_string(), &s, &thin));
    }
    Ok(ExitCode::SUCCESS)
}

/// What to ask the server of a served volume.
fn request(a: &Args) -> &'static str {
    if a.prometheus {
        "metrics"
    } else if a.json {
        "stats json"
    } else {
        "stats text"
    }
}

/// Logical block size: what every map entry covers.
const BLOCK_BYTES: u64 = 4096;

/// Space split the way `vdostats` splits it: what compression saved on the data actually
/// stored, apart from blocks that cost nothing because they are zero or were never written.
/// A 4 GiB image with 451 MiB of data is not "95.6 % saved": its data is ~2.5:1.
#[derive(serde::Serialize, Debug, Clone, Copy, PartialEq)]
pub struct Savings {
    /// Logical bytes of the blocks holding stored data (non-zero data blocks).
    pub data_logical_bytes: u64,
    /// Bytes those blocks take stored (compressed or raw), = `physical_bytes_live`.
    pub data_stored_bytes: u64,
    /// 100 * (1 - stored / logical) over data blocks only; 0 without data.
    pub data_savings_pct: f64,
    /// Data blocks' logical bytes / stored bytes; 0 without data.
    pub data_compression_ratio: f64,
    /// Logical bytes of blocks written as zeroes (a map state, no data stored).
    pub zero_bytes: u64,
    /// Logical bytes never written, or trimmed.
    pub unmapped_bytes: u64,
}

impl Savings {
    pub fn of(s: &Stats) -> Savings {
        let data_logical_bytes = s.data_blocks * BLOCK_BYTES;
        let data_stored_bytes = s.physical_bytes_live;
        let (data_savings_pct, data_compression_ratio) = if data_logical_bytes == 0 {
            (0.0, 0.0)
        } else {
            let logical = data_logical_bytes as f64;
            let stored = data_stored_bytes as f64;
            (
                100.0 * (1.0 - stored / logical),
                if stored > 0.0 { logical / stored } else { 0.0 },
            )
        };
        Savings {
            data_logical_bytes,
            data_stored_bytes,
            data_savings_pct,
            data_compression_ratio,
            zero_bytes: s.zero_blocks * BLOCK_BYTES,
            unmapped_bytes: s.unmapped_blocks * BLOCK_BYTES,
        }
    }
}

/// `zbd stat --json`: the volume's statistics with the savings split added beside them.
#[derive(serde::Serialize)]
pub struct Report<'a> {
    #[serde(flatten)]
    pub stats: &'a Stats,
    #[serde(flatten)]
    pub savings: Savings,
    /// Warning threshold, reserve and policy when full (docs/operations.md).
    pub thin: crate::thin::Report,
}

impl<'a> Report<'a> {
    pub fn of(stats: &'a Stats, thin: &crate::thin::Settings) -> Report<'a> {
        Report {
            stats,
            savings: Savings::of(stats),
            thin: crate::thin::Report::of_stats(stats, thin),
        }
    }
}

/// The human-readable report.
pub fn render(name: &str, s: &Stats, thin: &crate::thin::Settings) -> String {
    let c = &s.counters;
    let mut o = String::new();
    let mut line = |k: &str, v: String| o.push_str(&format!("  {k:<22} {v}\n"));
    line("volume", name.to_string());
    if let Some(why) = &s.failed {
        line(
            "FAILED",
            format!("stopped writing after {why}; reads go on, reopen (restart) to recover"),
        );
    }
    line("format version", s.format_version.to_string());
    line("logical size", human(s.logical_bytes));
    if s.devices.len() > 1 {
        let list: Vec<String> = s
            .devices
            .iter()
            .map(|d| format!("{} ({}, {})", d.name, d.kind, human(d.size_bytes)))
            .collect();
        line(
            "devices",
            format!("{}: {}", s.devices.len(), list.join(", ")),
        );
    }
    line(
        "codec / extent",
        format!("{} / {}", s.codec, human(u64::from(s.extent_bytes))),
    );
    line(
        "data area",
        format!("{} ({} extents)", human(s.data_area_bytes), s.extents_total),
    );
    line(
        "grows to",
        format!(
            "{} logical, {} data area (zbd grow)",
            human(s.max_logical_bytes),
            human(s.max_data_area_bytes)
        ),
    );
    line(
        "metadata",
        format!(
            "{} on disk, {} RAM",
            human(s.metadata_bytes),
            human(s.metadata_ram_bytes)
        ),
    );
    if s.metadata_extent_bytes > 0 {
        // After deletes, free pairs wait for later pages; whole extents beyond the stock go
        // back to data at the next checkpoints.
        line(
            "map extents",
            format!(
                "{} of the data area, {} of it in pairs no map page uses",
                human(s.metadata_extent_bytes),
                human(s.metadata_extent_free_bytes)
            ),
        );
    }
    let r = &s.read_cache;
    let rate = |hits: u64, misses: u64| match hits + misses {
        0 => "-".to_string(),
        n => format!("{:.1} %", 100.0 * hits as f64 / n as f64),
    };
    line(
        "read cache",
        format!(
            "{} of {}; hit rate {} ({} lookups), decoded units {}",
            human(r.bytes),
            human(r.budget_bytes),
            rate(r.hits, r.misses),
            r.hits + r.misses,
            rate(r.unit_hits, r.unit_misses)
        ),
    );
    line(
        "logical in use",
        format!(
            "{} ({} data, {} zero blocks; {} raw)",
            human(s.logical_bytes_in_use),
            s.data_blocks,
            s.zero_blocks,
            s.raw_blocks
        ),
    );
    line(
        "compression units",
        format!(
            "{} for new writes; {} blocks in units (ratio {:.2}:1), {} single blocks \
             (ratio {:.2}:1)",
            human(u64::from(s.unit_bytes)),
            s.unit_blocks,
            s.unit_ratio,
            s.data_blocks - s.unit_blocks,
            s.single_ratio
        ),
    );
    line(
        "dictionaries",
        format!(
            "{} for new writes (volume setting {}); {}",
            if s.dictionary { "on" } else { "off" },
            if s.dictionary_setting { "on" } else { "off" },
            if s.dictionaries.is_empty() {
                "none stored".to_string()
            } else {
                s.dictionaries
                    .iter()
                    .map(|d| {
                        format!(
                            "#{} {}{}{}{}",
                            d.id,
                            human(u64::from(d.bytes)),
                            d.live_blocks
                                .map_or(String::new(), |n| format!(" {n} blocks")),
                            if d.active { " (in use)" } else { "" },
                            if d.loaded { "" } else { " DAMAGED" }
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ),
    );
    // What dictionaries and unit sizes give, from counters kept on every map change.
    if !s.savings_known {
        line(
            "savings by kind",
            "unknown: last written by an older zbd (known after the next writable open)"
                .to_string(),
        );
    } else {
        let ratio = |blocks: u64, r: f64| {
            if blocks == 0 {
                "-".to_string()
            } else {
                format!("{r:.2}:1")
            }
        };
        line(
            "with / without dict",
            format!(
                "{} blocks (ratio {}) / {} blocks (ratio {}); compressed blocks only",
                s.dict_blocks,
                ratio(s.dict_blocks, s.dict_ratio),
                s.nodict_blocks,
                ratio(s.nodict_blocks, s.nodict_ratio)
            ),
        );
        let mut by_size = vec![format!(
            "4K {} blocks (ratio {})",
            s.data_blocks - s.unit_blocks,
            ratio(s.data_blocks - s.unit_blocks, s.single_ratio)
        )];
        let mut from = 8 * 1024;
        for u in &s.units_by_size {
            let (lo, hi) = (from / 1024, u.max_unit_bytes / 1024);
            let name = if lo == hi {
                format!("{hi}K")
            } else {
                format!("{lo}-{hi}K")
            };
            from = u.max_unit_bytes + 4096;
            if u.blocks > 0 {
                by_size.push(format!(
                    "{name} units {} blocks (ratio {})",
                    u.blocks,
                    ratio(u.blocks, u.ratio)
                ));
            }
        }
        line("ratio by unit size", by_size.join(", "));
    }
    line("physical live", human(s.physical_bytes_live));
    line(
        "physical allocated",
        format!(
            "{} ({} dead)",
            human(s.physical_bytes_allocated),
            human(s.dead_bytes)
        ),
    );
    let split = Savings::of(s);
    line(
        "data savings",
        if split.data_logical_bytes == 0 {
            "- (no data stored)".to_string()
        } else {
            format!(
                "{:.1} % (ratio {:.2}:1): {} of non-zero data stored in {}",
                split.data_savings_pct,
                split.data_compression_ratio,
                human(split.data_logical_bytes),
                human(split.data_stored_bytes)
            )
        },
    );
    if s.shared.items > 0 {
        // Deduplication (format bit 12): blocks naming a shared copy, and how much of the
        // data ratio each saving makes.
        let logical = split.data_logical_bytes as f64;
        let after_dedup = logical / s.dedup_ratio;
        line(
            "deduplication",
            format!(
                "ratio {:.2}:1 ({} blocks name {} shared items of {} blocks), compression \
                 alone {:.2}:1, together {:.2}:1; dedup saves {}, compression {}",
                s.dedup_ratio,
                s.shared.references,
                s.shared.items,
                s.shared.item_blocks,
                split.data_compression_ratio / s.dedup_ratio,
                split.data_compression_ratio,
                human((logical - after_dedup).max(0.0) as u64),
                human((after_dedup - split.data_stored_bytes as f64).max(0.0) as u64),
            ),
        );
    }
    match &s.dedup_index {
        Some(d) => line(
            "dedup index",
            format!(
                "{} budget; {} blocks looked up, {:.1} % found stored ({} candidates differed); \
                 {} hooks, 1 block in {} sampled",
                human(d.budget_bytes),
                d.index.lookups,
                100.0 * d.hit_rate,
                d.index.rejected,
                d.index.hooks,
                1u64 << d.index.hook_level
            ),
        ),
        None if s.dedup_setting => line(
            "dedup index",
            "off in this open (the volume's setting is on)".to_string(),
        ),
        None => {}
    }
    line(
        "zero / never written",
        format!(
            "{} / {}: no space used, not counted as savings",
            human(split.zero_bytes),
            human(split.unmapped_bytes)
        ),
    );
    line(
        "savings incl. zeroes",
        format!(
            "{:.1} % (ratio {:.2}:1) over data and zero blocks",
            s.savings_pct, s.compression_ratio
        ),
    );
    line(
        "extents",
        format!(
            "{} free, {} in use ({} open), {} awaiting checkpoint",
            s.extents_free, s.extents_in_use, s.extents_open, s.extents_pending_free
        ),
    );
    let t = crate::thin::Report::of_stats(s, thin);
    line(
        "data area used",
        format!(
            "{:.1} % of the {} writes may fill ({:.1} % of the area; live data and map \
             extents){}; warning at {} %",
            t.writable_used_pct,
            human(t.writable_bytes),
            t.data_area_used_pct,
            if t.above_warn {
                " (ABOVE THE WARNING THRESHOLD)"
            } else {
                ""
            },
            t.warn_used_pct
        ),
    );
    line(
        "when full",
        format!(
            "{}; reserve {} {}{}",
            match t.when_full {
                crate::thin::WhenFull::Error => "ENOSPC at once".to_string(),
                crate::thin::WhenFull::Queue => format!(
                    "writes wait up to {} s for room, then ENOSPC",
                    t.when_full_timeout_seconds
                ),
            },
            human(t.reserve_bytes),
            if t.reserve_lent {
                "LENT to writes (the volume opened full: repair the filesystem, then free space)"
            } else {
                "held for a filesystem's repair"
            },
            if t.served {
                ""
            } else {
                " (zbd serve's defaults)"
            }
        ),
    );
    line(
        "host written / read",
        format!(
            "{} / {}",
            human(c.host_bytes_written),
            human(c.host_bytes_read)
        ),
    );
    line(
        "device written",
        format!(
            "{} data, {} metadata, {} cleaner",
            human(c.data_bytes_written),
            human(c.metadata_bytes_written),
            human(c.cleaner_bytes_written)
        ),
    );
    line(
        "write amplification",
        format!("{:.2}", s.write_amplification),
    );
    line(
        "cleaner",
        format!(
            "{} runs, {} extents reclaimed, {} moved",
            c.cleaner_runs,
            c.extents_reclaimed,
            human(c.cleaner_bytes_moved)
        ) + &format!(
            " (watermarks {} % / {} % free)",
            s.clean_low_pct, s.clean_high_pct
        ),
    );
    line(
        "checkpoints / flushes",
        format!("{} / {}", c.checkpoints, c.flushes),
    );
    line("corrupt reads", c.corrupt_reads.to_string());
    line(
        "last scrub",
        if c.last_scrub_unix == 0 {
            "never (zbd scrub VOLUME)".to_string()
        } else {
            format!(
                "{} s ago, {} damaged blocks found",
                now_unix().saturating_sub(c.last_scrub_unix),
                c.last_scrub_damaged
            )
        },
    );
    line(
        "known damaged blocks",
        if s.damaged_blocks > 0 {
            format!("{} (zbd check lists them)", s.damaged_blocks)
        } else {
            "0".to_string()
        },
    );
    o
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
