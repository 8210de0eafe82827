//! `zbd scrub`: verify every stored block of a volume at a bounded rate. A volume served by
//! `zbd serve` is scrubbed by the server, through its control socket, without stopping it;
//! otherwise the volume is opened here. `zbd stat` shows when the last scrub ran and what it
//! found.

use super::check::print_report;
use super::{Progress, BLOCKS_BAR};
use crate::target::{CephArgs, Target};
use anyhow::{anyhow, Result};
use std::path::PathBuf;
use std::process::ExitCode;
use zbd_core::{OpenOptions, Volume};

/// Arguments of `zbd scrub`.
#[derive(clap::Args)]
pub struct Args {
    /// Volume file, block device or rados:POOL/NAME.
    path: PathBuf,
    #[command(flatten)]
    ceph: CephArgs,
    /// Stored bytes read per second at most (K/M/G suffixes; 0 = as fast as possible).
    #[arg(long, default_value = "50M")]
    rate: String,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let rate = super::size_arg("--rate", &a.rate)?;
    let bar = Progress::new(!a.json, BLOCKS_BAR);
    if let Some(report) = super::serve::remote_scrub(&a.path, rate, |d, t| bar.set(d, t)) {
        bar.finish();
        return print_report(&report?, a.json);
    }
    let target = Target::parse(&a.path)?;
    let storage = target.open(&a.ceph, true)?;
    let vol = Volume::open(
        storage,
        OpenOptions {
            background_cleaner: false,
            ..OpenOptions::default()
        },
    )
    .map_err(|e| anyhow!("{target}: {e}"))?;
    let report = vol.scrub((rate > 0).then_some(rate), &|d, t| bar.set(d, t));
    bar.finish();
    // Close writes a checkpoint: the scrub's time and result persist, and damaged metadata
    // copies it found are rewritten.
    vol.close().map_err(|e| anyhow!("{target}: {e}"))?;
    print_report(&report, a.json)
}
