//! `zbd unlock rados:POOL/NAME`: break the lock on a RADOS volume whatever its holder is doing.
//!
//! Breaking a lock is only safe if its holder can no longer write: a server that is merely cut
//! off from the cluster (or paused) could come back and overwrite what the new owner writes.
//! So, like `rbd lock remove`, the holder's address is always added to the OSD blocklist first
//! (docs/ceph.md, "The lock and fencing"); there is no option to skip it. A server that
//! crashed does not need this command: the next `zbd serve` takes its lock over.

use crate::target::{CephArgs, Target};
use anyhow::{bail, Result};
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `zbd unlock`.
#[derive(clap::Args)]
pub struct Args {
    /// The volume, rados:POOL/NAME.
    path: PathBuf,
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
                a.blocklist_expire,
            )?;
            if holders.is_empty() {
                println!("{rados} was not locked");
            }
            for holder in &holders {
                println!(
                    "broke the lock of {} on {rados} (blocklisted {})",
                    zbd_rados::describe(holder),
                    holder.address
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Target::File(path) => {
            let _ = (a.blocklist_expire, a.ceph);
            bail!(
                "{}: only rados:POOL/NAME volumes have a lock to break (a file's lock dies with its process)",
                path.display()
            )
        }
    }
}
