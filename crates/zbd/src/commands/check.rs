//! `zbd check`: verify metadata and every block checksum; non-zero exit lists the damage.

use super::open_read_only;
use crate::target::CephArgs;
use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
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
}

/// Exit code when damage was found.
const EXIT_DAMAGED: u8 = 3;

pub fn run(a: Args) -> Result<ExitCode> {
    let vol = open_read_only(&a.path, &a.ceph)?;
    let bar = if std::io::stderr().is_terminal() && !a.json {
        let b = ProgressBar::new(vol.superblock().logical_blocks);
        b.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} blocks {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Some(b)
    } else {
        None
    };
    let report = vol.check(&|done, _total| {
        if let Some(b) = &bar {
            b.set_position(done);
        }
    });
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    if a.json {
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
