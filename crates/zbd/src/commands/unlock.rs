//! `zbd unlock rados:POOL/NAME`: break the lock a crashed `zbd serve` left on a RADOS volume.
//!
//! Breaking a lock is only safe if its holder can no longer write: a server that is merely cut
//! off from the cluster could come back and overwrite what the new owner writes. So, like
//! `rbd lock remove`, the holder's address is first added to the OSD blocklist (docs/ceph.md,
//! "The lock and fencing").

use crate::target::{CephArgs, Target};
use anyhow::{bail, Result};
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `zbd unlock`.
#[derive(clap::Args)]
pub struct Args {
    /// The volume, rados:POOL/NAME.
    path: PathBuf,
    /// Do not blocklist the holder first. Only when you know it is dead (process gone, host
    /// powered off): otherwise it may still write and corrupt the volume.
    #[arg(long)]
    no_blocklist: bool,
    /// How long the holder stays blocklisted, in seconds [default: the cluster's, one hour].
    #[arg(long, value_name = "SECS", default_value_t = 0)]
    blocklist_expire: u32,
    #[command(flatten)]
    ceph: CephArgs,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let target = Target::parse(&a.path)?;
    match target {
        #[cfg(feature = "ceph")]
        Target::Rados(rados) => {
            let holders = zbd_rados::break_lock(
                &crate::target::cluster_options(&a.ceph),
                &rados,
                !a.no_blocklist,
                a.blocklist_expire,
            )?;
            if holders.is_empty() {
                println!("{rados} was not locked");
            }
            for holder in &holders {
                let fenced = if a.no_blocklist {
                    String::new()
                } else {
                    format!(" (blocklisted {})", holder.address)
                };
                println!(
                    "broke the lock of {} on {rados}{fenced}",
                    zbd_rados::describe(holder)
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Target::File(path) => {
            let _ = (a.no_blocklist, a.blocklist_expire, a.ceph);
            bail!(
                "{}: only rados:POOL/NAME volumes have a lock to break (a file's lock dies with its process)",
                path.display()
            )
        }
    }
}
