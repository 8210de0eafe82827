//! `zbd create`: format a new volume, refusing to destroy anything that looks in use.

use super::{human, size_arg};
use crate::target::{CephArgs, Target};
use anyhow::{anyhow, bail, Context, Result};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use zbd_core::{Codec, CreateOptions, FileStorage, Volume};

/// Arguments of `zbd create`.
#[derive(clap::Args)]
pub struct Args {
    /// New sparse file, existing block device, or rados:POOL/NAME (objects in a Ceph pool).
    path: PathBuf,
    /// Logical size (K/M/G/T suffixes), a multiple of 4K.
    #[arg(long)]
    size: String,
    /// Codec: lz4, zstd[:LEVEL], zlib[:LEVEL], lzo[:999] or none (lzo:999: slower,
    /// higher-ratio LZO1X encoder).
    #[arg(long, default_value = "lz4")]
    codec: String,
    /// Extent size, a power of two from 8K to 1M [default: 512K; 256K for rados:POOL/NAME,
    /// where every extent write is one RADOS operation].
    #[arg(long)]
    extent_size: Option<String>,
    /// Compression unit: consecutive blocks written together are compressed as one unit of up
    /// to this size (4K: every block on its own; 8K..64K) [default: 8K, or the largest the
    /// extent size holds].
    #[arg(long)]
    unit_size: Option<String>,
    /// Trained dictionaries for new writes (lz4, zstd; volumes of 8M or more), stored in the
    /// volume as what `zbd serve` does unless its --dict says otherwise.
    #[arg(long, value_parser = ["on", "off"], default_value = "off")]
    dict: String,
    /// Data area size; default holds the whole logical size even if incompressible.
    #[arg(long)]
    capacity: Option<String>,
    /// Cleaner starts when free extents fall below this % (can be overridden at open time).
    #[arg(long, default_value_t = 10)]
    clean_low: u8,
    /// Cleaner stops when free extents reach this %.
    #[arg(long, default_value_t = 25)]
    clean_high: u8,
    /// Overwrite an existing file, volume or filesystem signature.
    #[arg(long)]
    force: bool,
    /// rados:POOL/NAME only: size of the RADOS objects the volume is striped over, a power of
    /// two from 64K to 32M [default: 4M].
    #[arg(long)]
    object_size: Option<String>,
    /// Largest logical size `zbd grow --size` may reach later (K/M/G/T) [default: 4x --size
    /// for a file; none for a block device or rados:]. Its map room costs 16 KiB per MiB, but
    /// only on block devices: a sparse file never writes it until used.
    #[arg(long)]
    max_size: Option<String>,
    /// Largest data area `zbd grow --capacity` may reach later [default: 4x the data area for
    /// a file; none otherwise]; 32 bytes of extent table per extent of it.
    #[arg(long)]
    max_capacity: Option<String>,
    /// Format version: the current one, or 2 for a volume older zbd builds must open (no
    /// seeded item checksums; `zbd upgrade` brings it to the current one later).
    #[arg(long, default_value_t = zbd_core::format::FORMAT_VERSION)]
    format_version: u32,
    /// Experimental: keep the map in metadata pages (format bits 10 and 11), the shared-block
    /// format `zbd dedup` needs (snapshots and clones will build on it too).
    #[arg(long)]
    metadata_pages: bool,
    /// Inline deduplication: a block equal to one already stored (compared byte for byte)
    /// becomes a reference to it. Stored in the volume as what `zbd serve` does unless its
    /// --dedup says otherwise; needs --metadata-pages.
    #[arg(long, value_parser = ["on", "off"], default_value = "off")]
    dedup: String,
    #[command(flatten)]
    ceph: CephArgs,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let size = size_arg("--size", &a.size)?;
    let target = Target::parse(&a.path)?;
    let extent_size = a.extent_size.clone().unwrap_or_else(|| {
        let bytes = if target.file().is_some() {
            zbd_core::layout::FILE_EXTENT_BYTES_DEFAULT
        } else {
            zbd_core::layout::RADOS_EXTENT_BYTES_DEFAULT
        };
        format!("{}K", bytes / 1024)
    });
    let extent = size_arg("--extent-size", &extent_size)?;
    let codec: Codec = a.codec.parse().map_err(|e| anyhow!("--codec: {e}"))?;
    let capacity = a
        .capacity
        .as_deref()
        .map(|c| size_arg("--capacity", c))
        .transpose()?;
    if size == 0 || size % 4096 != 0 {
        bail!("--size '{}': must be a non-zero multiple of 4K", a.size);
    }
    let extent_bytes = u32::try_from(extent)
        .ok()
        .filter(|e| e.is_power_of_two() && (8192..=1 << 20).contains(e))
        .ok_or_else(|| {
            anyhow!(
                "--extent-size '{}': must be a power of two from 8K to 1M",
                extent_size
            )
        })?;
    if a.clean_low >= a.clean_high || a.clean_high > 90 {
        bail!(
            "--clean-low {} / --clean-high {}: need low < high <= 90 (%)",
            a.clean_low,
            a.clean_high
        );
    }
    let unit_bytes = a
        .unit_size
        .as_deref()
        .map(|u| {
            let v = size_arg("--unit-size", u)?;
            u32::try_from(v)
                .ok()
                .filter(|v| v.is_power_of_two() && (4096..=65536).contains(v))
                .ok_or_else(|| anyhow!("--unit-size '{u}': must be a power of two from 4K to 64K"))
        })
        .transpose()?;
    let opts = CreateOptions {
        unit_bytes,
        dictionary: a.dict == "on",
        extent_bytes,
        codec,
        capacity_bytes: capacity,
        clean_low_pct: a.clean_low,
        clean_high_pct: a.clean_high,
        format_version: a.format_version,
        metadata_pages: a.metadata_pages,
        dedup: a.dedup == "on",
        ..CreateOptions::new(size)
    };
    let opts = with_room_to_grow(&a, &target, opts)?;
    let sb = zbd_core::layout::plan(&opts).map_err(|e| anyhow!("{e}"))?;
    let object_size = a
        .object_size
        .as_deref()
        .map(|s| size_arg("--object-size", s))
        .transpose()?;
    if let Some(path) = target.file() {
        refuse_if_in_use(path, a.force)?;
    }
    let storage = target.create(
        &a.ceph,
        sb.total_bytes(),
        sb.data_offset,
        object_size,
        a.force,
    )?;
    let vol = Volume::create(storage, &opts).with_context(|| format!("creating {target}"))?;
    let sb = vol.superblock().clone();
    vol.close()?;
    // The dedup index a volume overwritten here kept names another volume's blocks.
    if let Some(image) = crate::dedup_index::path(target.file()) {
        let _ = std::fs::remove_file(image);
    }
    println!("created {target}");
    println!(
        "  logical size   {} ({} blocks of 4 KiB)",
        human(size),
        sb.logical_blocks
    );
    println!("  codec          {codec}");
    println!("  extent size    {}", human(u64::from(sb.extent_bytes)));
    println!(
        "  unit size      {}",
        human(u64::from(sb.unit_blocks) * 4096)
    );
    println!(
        "  dictionaries   {} (zbd serve --dict overrides)",
        if sb.settings & zbd_core::format::SB_SETTING_DICTIONARY != 0 {
            "on"
        } else {
            "off"
        }
    );
    if sb.settings & zbd_core::format::SB_SETTING_DEDUP != 0 {
        println!("  deduplication  on (zbd serve --dedup overrides)");
    }
    println!(
        "  data area      {} ({} extents{})",
        human(u64::from(sb.extent_count) * u64::from(sb.extent_bytes)),
        sb.extent_count,
        if capacity.is_none() {
            ", holds the whole size even if incompressible"
        } else {
            ""
        }
    );
    println!(
        "  metadata       {} (superblocks, checkpoints, map), on top of the data area",
        human(sb.metadata_bytes())
    );
    println!("  total          {}", human(sb.total_bytes()));
    let (max_size, max_area) = (
        zbd_core::layout::logical_bytes_max(&sb),
        zbd_core::layout::extent_count_max(&sb) * u64::from(sb.extent_bytes),
    );
    println!(
        "  grows to       {} logical, {} data area (zbd grow)",
        human(max_size),
        human(max_area)
    );
    let data_area = u64::from(sb.extent_count) * u64::from(sb.extent_bytes);
    if data_area < size {
        // Thin provisioning: fine while data compresses, but a full data area fails writes.
        eprintln!(
            "zbd: warning: over-committed by {} ({:.1}x): the data area ({}) is smaller than the \
             logical size ({}); once stored data fills it, writes fail with ENOSPC (zbd serve \
             keeps a reserve so the filesystem can still be repaired; watch `zbd stat`, grow \
             with zbd grow --capacity)",
            human(size - data_area),
            size as f64 / data_area as f64,
            human(data_area),
            human(size)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Refuses to overwrite a zbd volume, a mounted device, a filesystem signature or a non-empty
/// file unless `force`; a mounted device is refused always.
fn refuse_if_in_use(path: &Path, force: bool) -> Result<()> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(());
    };
    let is_bdev = meta.file_type().is_block_device();
    if is_bdev && is_mounted(path) {
        bail!("{} is mounted; unmount it first", path.display());
    }
    if force {
        return Ok(());
    }
    if let Ok(storage) = FileStorage::open(path, false) {
        if Volume::open_read_only(Box::new(storage)).is_ok() {
            bail!(
                "{} already holds a zbd volume (use --force to overwrite it)",
                path.display()
            );
        }
    }
    if let Some(sig) = signature(path) {
        bail!(
            "{} holds a signature: {sig} (use --force to overwrite it)",
            path.display()
        );
    }
    if !is_bdev && meta.len() > 0 {
        bail!(
            "{} exists and is not empty (use --force to overwrite it)",
            path.display()
        );
    }
    Ok(())
}

/// Filesystem or partition-table signature found by `blkid -p`, if any.
fn signature(path: &Path) -> Option<String> {
    let out = Command::new("blkid")
        .args(["-p", "-o", "value", "-s", "TYPE"])
        .arg(path)
        .output()
        .ok()?;
    let t = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() && !t.is_empty() {
        return Some(t);
    }
    let out = Command::new("blkid")
        .args(["-p", "-o", "value", "-s", "PTTYPE"])
        .arg(path)
        .output()
        .ok()?;
    let t = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !t.is_empty()).then(|| format!("partition table ({t})"))
}

fn is_mounted(path: &Path) -> bool {
    let Ok(dev) = std::fs::canonicalize(path) else {
        return false;
    };
    let Ok(mounts) = std::fs::read_to_string("/proc/mounts") else {
        return false;
    };
    mounts
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .any(|src| std::fs::canonicalize(src).is_ok_and(|s| s == dev))
}

/// `opts` with the room to grow the flags ask for, or the default: 4x size and data area for a
/// regular file (room there is a hole until used), none for a block device or RADOS pool.
fn with_room_to_grow(a: &Args, target: &Target, opts: CreateOptions) -> Result<CreateOptions> {
    let file = target
        .file()
        .is_some_and(|p| !std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device()));
    let default = file && a.format_version >= 3;
    let area = zbd_core::layout::plan(&opts)
        .map(|sb| u64::from(sb.extent_count) * u64::from(sb.extent_bytes))
        .map_err(|e| anyhow!("{e}"))?;
    let arg = |flag: &str, v: &Option<String>, default_bytes: u64| -> Result<Option<u64>> {
        match v {
            Some(v) => size_arg(flag, v).map(Some),
            None => Ok(default.then_some(default_bytes)),
        }
    };
    let max_logical_bytes = arg("--max-size", &a.max_size, 4 * opts.logical_bytes)?;
    let max_capacity_bytes = arg("--max-capacity", &a.max_capacity, 4 * area)?;
    Ok(CreateOptions {
        max_logical_bytes,
        max_capacity_bytes,
        ..opts
    })
}
