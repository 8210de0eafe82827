//! `zbd upgrade VOLUME`: bring a format 2 volume to the current format in place, offline.
//!
//! v3 keeps v2's layout: the upgrade recovers and closes the volume cleanly, then rewrites the
//! superblock's two copies (docs/format.md, "Version changes"). Old items keep their plain
//! checksums until they are rewritten.

use anyhow::{Context, Result};
use std::path::PathBuf;
use std::process::ExitCode;

use crate::target::CephArgs;

/// Arguments of `zbd upgrade`.
#[derive(clap::Args)]
pub struct Args {
    /// Volume file, block device or rados:POOL/NAME, not served (stop its server first).
    path: PathBuf,
    #[command(flatten)]
    ceph: CephArgs,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let (target, vol) = super::open_offline(&a.path, &a.ceph)?;
    let before = vol.superblock().version;
    let after = vol
        .close_upgraded()
        .with_context(|| format!("cannot upgrade {target}"))?;
    println!(
        "upgraded {target}: format {before} -> {}; blocks written before keep their plain \
         checksums until rewritten",
        after.version
    );
    Ok(ExitCode::SUCCESS)
}
