//! `zbd grow VOLUME --size N | --capacity N`: a larger logical size or data area, offline.
//!
//! The map and the extent table are laid out at create time, before the data area, for the
//! room the volume was made with (format 3: `zbd create --max-size`, `--max-capacity`; format 2:
//! the unused entries of their last pages), so a volume grows in place up to that room
//! (docs/format.md, "Growing a volume"); beyond it this says so in one line and changes nothing.

use super::{human, size_arg};
use crate::target::Target;
use anyhow::{anyhow, bail, Context, Result};
use std::path::PathBuf;
use std::process::ExitCode;
use zbd_core::format::Superblock;
use zbd_core::{FileStorage, OpenOptions, Volume};

/// Arguments of `zbd grow`.
#[derive(clap::Args)]
pub struct Args {
    /// Volume file or block device, not served (stop its server first).
    path: PathBuf,
    /// New logical size (K/M/G/T suffixes): at most what the volume's map region holds (see
    /// docs/format.md, "Growing a volume"); an error names the largest size possible.
    #[arg(long, required_unless_present = "capacity")]
    size: Option<String>,
    /// New data area size: a file is extended, a block device must be grown first; at most
    /// what the volume's extent table holds (an error names it).
    #[arg(long)]
    capacity: Option<String>,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let target = Target::parse(&a.path)?;
    let Some(path) = target.file() else {
        bail!("{target}: zbd grow works on files and block devices only");
    };
    if !path.exists() {
        bail!("no volume at {}", path.display());
    }
    if super::serve::query_control(path, "info").is_some() {
        bail!(
            "{} is served: zbd grow works offline; stop the server first (systemctl stop \
             zbd@NAME), grow, start it again",
            path.display()
        );
    }
    let size = a
        .size
        .as_deref()
        .map(|s| size_arg("--size", s))
        .transpose()?;
    let capacity = a
        .capacity
        .as_deref()
        .map(|c| size_arg("--capacity", c))
        .transpose()?;
    // Open (recovering if needed) and close cleanly first: a volume that does not open is not
    // grown, and the grown one starts from a fresh checkpoint.
    let opts = OpenOptions {
        background_cleaner: false,
        ..OpenOptions::default()
    };
    let storage = FileStorage::open(path, true).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let vol = Volume::open(Box::new(storage), opts)
        .with_context(|| format!("cannot open volume {}", path.display()))?;
    let old = vol.superblock().clone();
    vol.close()
        .with_context(|| format!("cannot close volume {}", path.display()))?;
    drop(vol);
    check_limits(&a, &old, size, capacity)?;
    let grown = zbd_core::layout::grow(&old, size, capacity).map_err(|e| anyhow!("{e}"))?;
    if grown == old {
        println!("{}: unchanged ({})", path.display(), describe(&old));
        return Ok(ExitCode::SUCCESS);
    }
    // Order (a crash at any point leaves a volume that opens, as before or grown): the file
    // first, extended and synced; then superblock copy A, synced; then copy B, synced
    // (zbd_core::layout::write_superblock_update argues each step).
    let storage = FileStorage::open(path, true).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    storage
        .extend_to(grown.total_bytes(), path)
        .map_err(|e| anyhow!("{e}"))?;
    zbd_core::layout::write_superblock_update(&storage, &old, &grown)
        .map_err(|e| anyhow!("{}: {e}", path.display()))?;
    drop(storage);
    println!("grew {}", path.display());
    println!("  before  {}", describe(&old));
    println!("  after   {}", describe(&grown));
    Ok(ExitCode::SUCCESS)
}

fn describe(sb: &Superblock) -> String {
    format!(
        "logical size {}, data area {} ({} extents)",
        human(sb.logical_blocks * 4096),
        human(u64::from(sb.extent_count) * u64::from(sb.extent_bytes)),
        sb.extent_count
    )
}

/// The limits of growing in place, as one line naming the flag and the largest value possible.
fn check_limits(a: &Args, sb: &Superblock, size: Option<u64>, capacity: Option<u64>) -> Result<()> {
    let format_note = "the room is laid out at create time (zbd create --max-size, \
                       --max-capacity; docs/format.md, \"Growing a volume\"): more needs a new volume";
    if let (Some(bytes), Some(text)) = (size, a.size.as_deref()) {
        let max = zbd_core::layout::logical_bytes_max(sb);
        let current = sb.logical_blocks * 4096;
        if bytes < current {
            bail!(
                "--size {text}: smaller than the volume ({}); shrinking is not supported",
                human(current)
            );
        }
        if bytes > max {
            bail!(
                "--size {text}: the volume's map region holds at most {} ({max} bytes; now {}): \
                 {format_note}",
                human(max),
                human(current)
            );
        }
    }
    if let (Some(bytes), Some(text)) = (capacity, a.capacity.as_deref()) {
        let extent = u64::from(sb.extent_bytes);
        let max = zbd_core::layout::extent_count_max(sb) * extent;
        let current = u64::from(sb.extent_count) * extent;
        if bytes < current {
            bail!(
                "--capacity {text}: smaller than the data area ({}); shrinking is not supported",
                human(current)
            );
        }
        if bytes > max {
            bail!(
                "--capacity {text}: the volume's extent table holds at most {} of data area \
                 ({max} bytes; now {}): {format_note}",
                human(max),
                human(current)
            );
        }
    }
    Ok(())
}
