//! One module per subcommand.

pub mod attach;
pub mod bench;
pub mod bench_cleaner;
pub mod bench_codec;
pub mod bench_extents;
pub mod check;
pub mod compact;
pub mod copy;
pub mod create;
pub mod dedup;
pub mod detach;
pub mod device;
pub mod docs;
pub mod estimate;
pub mod grow;
pub mod list;
pub mod scrub;
pub mod serve;
pub mod set;
pub mod snapshot;
pub mod stat;
pub mod unlock;
pub mod upgrade;

use crate::target::{CephArgs, Target};
use anyhow::{anyhow, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::Path;
use zbd_core::Volume;

/// Parses a size argument (`32K`, `1G`, `4096`), naming the flag on error.
pub fn size_arg(flag: &str, value: &str) -> Result<u64> {
    zbd_core::parse_size(value).ok_or_else(|| {
        anyhow!(
            "{flag} '{value}': expected a byte count with optional K/M/G/T suffix, e.g. 32K or 10G"
        )
    })
}

/// Opens a volume read-only (stat, check).
pub fn open_read_only(path: &Path, ceph: &CephArgs) -> Result<Volume> {
    let target = Target::parse(path)?;
    let storage = target.open(ceph, false)?;
    Volume::open_read_only(storage).map_err(|e| anyhow!("{target}: {e}"))
}

/// Opens a volume not in use for offline maintenance (compact, check --repair): writable, no
/// background thread. Returns its name for messages too.
pub fn open_offline(path: &Path, ceph: &CephArgs) -> Result<(Target, Volume)> {
    let target = Target::parse(path)?;
    let storage = target.open(ceph, true)?;
    let opts = zbd_core::OpenOptions {
        background_cleaner: false,
        ..zbd_core::OpenOptions::default()
    };
    let vol = Volume::open(storage, opts).map_err(|e| anyhow!("{target}: {e}"))?;
    Ok((target, vol))
}

/// A progress bar on a terminal (stderr), nothing otherwise.
pub struct Progress(Option<ProgressBar>);

/// The bar of commands that count blocks (check, scrub, estimate).
pub const BLOCKS_BAR: &str = "{bar:40} {pos}/{len} blocks {eta}";

impl Progress {
    /// A bar drawn with the indicatif `template` when `wanted` and stderr is a terminal.
    pub fn new(wanted: bool, template: &str) -> Progress {
        Progress((wanted && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::new(0);
            b.set_style(
                ProgressStyle::with_template(template)
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b
        }))
    }

    pub fn set(&self, done: u64, total: u64) {
        if let Some(b) = &self.0 {
            b.set_length(total);
            b.set_position(done);
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}

/// Human-readable binary size.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}
