//! `zbd dedup`: offline post-process deduplication (design.md, build order 2a), with progress.

use super::{human, Progress};
use crate::target::CephArgs;
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `zbd dedup`.
#[derive(clap::Args)]
pub struct Args {
    /// Volume file, block device or rados:POOL/NAME (not in use), created with metadata pages.
    path: PathBuf,
    #[command(flatten)]
    ceph: CephArgs,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let (target, vol) = super::open_offline(&a.path, &a.ceph)?;
    let bar = Progress::new(true, "deduplicating {bar:40} {percent} % {eta}");
    let r = vol.dedup(&|done, total| bar.set(done, total));
    bar.finish();
    let r = r?;
    let s = vol.stats();
    vol.close()?;
    println!(
        "deduplicated {target}: {} of {} data blocks now share another block's copy \
         ({} distinct); stored {} -> {}",
        r.shared,
        r.blocks,
        r.distinct,
        human(r.stored_before),
        human(r.stored_after)
    );
    println!(
        "  dedup ratio {:.2}:1, with compression {:.2}:1",
        s.dedup_ratio, s.compression_ratio
    );
    if r.collisions > 0 {
        println!(
            "  {} equal fingerprints had different bytes (compared, not shared)",
            r.collisions
        );
    }
    Ok(ExitCode::SUCCESS)
}
