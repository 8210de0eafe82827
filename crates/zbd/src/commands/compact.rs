//! `zbd compact`: offline cleaning of every extent with dead space, with progress.

use super::{human, Progress};
use crate::target::CephArgs;
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `zbd compact`.
#[derive(clap::Args)]
pub struct Args {
    /// Volume file, block device or rados:POOL/NAME (not in use).
    path: PathBuf,
    #[command(flatten)]
    ceph: CephArgs,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let (target, vol) = super::open_offline(&a.path, &a.ceph)?;
    let before = vol.stats();
    let bar = Progress::new(true, "compacting {bar:40} {pos}/{len} extents {eta}");
    let r = vol.compact(&|done, total| bar.set(done, total))?;
    bar.finish();
    let after = vol.stats();
    vol.close()?;
    println!(
        "compacted {}: {} victims, {} extents reclaimed, {} output extents, {} moved",
        target,
        r.victims,
        r.reclaimed,
        r.outputs,
        human(r.bytes_moved)
    );
    println!(
        "  extents in use {} -> {}, physical allocated {} -> {}, write amplification {:.2}",
        before.extents_in_use,
        after.extents_in_use,
        human(before.physical_bytes_allocated),
        human(after.physical_bytes_allocated),
        after.write_amplification
    );
    if r.metadata_bytes_discarded > 0 {
        println!(
            "  map page slots no page needs given back: {}",
            human(r.metadata_bytes_discarded)
        );
    }
    Ok(ExitCode::SUCCESS)
}
