//! `zbd check`: verify metadata and every block checksum; non-zero exit lists the damage.

use super::{open_read_only, Progress, BLOCKS_BAR};
use crate::target::CephArgs;
use anyhow::{anyhow, Result};
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `zbd check`.
#[derive(clap::Args)]
pub struct Args {
    /// Volume file, block device or rados:POOL/NAME.
    path: PathBuf,
    #[command(flatten)]
    ceph: CephArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Repair first (offline, the volume not in use): open it writable, which writes damaged
    /// metadata copies again from their intact ones, and give blocks with bad stored bytes the
    /// damaged state (they read as errors until overwritten or trimmed); then check.
    #[arg(long)]
    repair: bool,
}

/// Exit code when damage was found.
const EXIT_DAMAGED: u8 = 3;

pub fn run(a: Args) -> Result<ExitCode> {
    if a.repair {
        repair(&a)?;
    }
    let vol = match open_read_only(&a.path, &a.ceph) {
        Ok(vol) => vol,
        // Held by `zbd serve`: the server checks it without stopping (a scrub at full speed).
        Err(error) => {
            let bar = Progress::new(!a.json, BLOCKS_BAR);
            return match super::serve::remote_scrub(&a.path, 0, |d, t| bar.set(d, t)) {
                Some(report) => {
                    bar.finish();
                    print_report(&report?, a.json)
                }
                None => Err(error),
            };
        }
    };
    let bar = Progress::new(!a.json, BLOCKS_BAR);
    let report = vol.check(&|done, total| bar.set(done, total));
    bar.finish();
    print_report(&report, a.json)
}

/// `--repair`: a writable open rewrites both copies of the checkpoint it starts from and the
/// next checkpoints rewrite damaged map-page copies; a check of the writable volume marks
/// damaged blocks; a clean close persists it all.
fn repair(a: &Args) -> Result<()> {
    let (target, vol) = super::open_offline(&a.path, &a.ceph)?;
    let bar = Progress::new(!a.json, BLOCKS_BAR);
    let report = vol.check(&|done, total| bar.set(done, total));
    bar.finish();
    // Twice: each checkpoint writes one slot; both then hold intact copies.
    vol.checkpoint().map_err(|e| anyhow!("{target}: {e}"))?;
    vol.close().map_err(|e| anyhow!("{target}: {e}"))?;
    eprintln!(
        "repair: {} metadata copies rewritten, {} blocks given the damaged state",
        report.repaired.len(),
        report.marked_damaged
    );
    Ok(())
}

/// Prints a check or scrub report; exit code 3 when damage was found.
pub fn print_report(report: &zbd_core::CheckReport, json: bool) -> Result<ExitCode> {
    for line in &report.repaired {
        eprintln!("note: {line}");
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for p in &report.metadata_problems {
            println!("metadata: {p}");
        }
        if !report.damaged_blocks.is_empty() {
            let list: Vec<String> = report
                .damaged_blocks
                .iter()
                .take(100)
                .map(|b| b.to_string())
                .collect();
            let more = report.damaged_blocks.len().saturating_sub(100);
            println!(
                "damaged logical blocks (4 KiB): {}{}",
                list.join(" "),
                if more > 0 {
                    format!(" ... and {more} more")
                } else {
                    String::new()
                }
            );
        }
        println!(
            "{}: {} blocks verified, {} damaged, {} metadata problems",
            if report.is_clean() {
                "clean"
            } else {
                "DAMAGED"
            },
            report.blocks_checked,
            report.damaged_blocks.len(),
            report.metadata_problems.len()
        );
    }
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_DAMAGED)
    })
}
