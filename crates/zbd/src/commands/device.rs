//! `zbd device`: the named block devices of one volume (design.md, "Devices"), offline.
//! `zbd serve` offers each as an NBD export of its name.

use super::human;
use crate::target::CephArgs;
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::process::ExitCode;
use zbd_core::AllocState;

/// Arguments of `zbd device`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Make a new empty writable device (needs a volume made with --metadata-pages).
    Create {
        /// Volume file, block device or rados:POOL/NAME (not in use).
        path: PathBuf,
        /// Name, unique in the volume (1-64 bytes): the NBD export name.
        name: String,
        /// Logical size, e.g. 10G (a multiple of 4 KiB).
        #[arg(long)]
        size: String,
        #[command(flatten)]
        ceph: CephArgs,
    },
    /// List the devices with their size and the bytes they map.
    List {
        /// Volume file, block device or rados:POOL/NAME (not in use).
        path: PathBuf,
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ceph: CephArgs,
    },
    /// Delete a device and free the blocks only it holds (not the default device).
    Delete {
        /// Volume file, block device or rados:POOL/NAME (not in use).
        path: PathBuf,
        /// The device's name.
        name: String,
        #[command(flatten)]
        ceph: CephArgs,
    },
}

pub fn run(a: Args) -> Result<ExitCode> {
    match a.action {
        Action::Create {
            path,
            name,
            size,
            ceph,
        } => {
            let bytes = super::size_arg("--size", &size)?;
            let (target, vol) = super::open_offline(&path, &ceph)?;
            let id = vol
                .create_device(&name, bytes)
                .with_context(|| format!("{target}: device {name:?}"))?;
            vol.close()?;
            println!(
                "created device {name} (id {id}, {}) in {target}",
                human(bytes)
            );
        }
        Action::List { path, json, ceph } => {
            let (_, vol) = super::open_offline(&path, &ceph)?;
            let mut rows = Vec::new();
            for d in vol.devices() {
                let runs = vol.allocation_in(d.id, 0, d.size_bytes)?;
                let mapped: u64 = runs
                    .iter()
                    .filter(|(_, s)| *s == AllocState::Data)
                    .map(|(n, _)| n)
                    .sum();
                rows.push((d, mapped));
            }
            vol.close()?;
            if json {
                let list: Vec<_> = rows
                    .iter()
                    .map(|(d, mapped)| {
                        let mut v = serde_json::to_value(d).expect("serializable");
                        v["mapped_bytes"] = (*mapped).into();
                        v
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                println!(
                    "{:<4} {:<24} {:<9} {:>12} {:>12}",
                    "ID", "NAME", "KIND", "SIZE", "MAPPED"
                );
                for (d, mapped) in &rows {
                    println!(
                        "{:<4} {:<24} {:<9} {:>12} {:>12}",
                        d.id,
                        d.name,
                        d.kind,
                        human(d.size_bytes),
                        human(*mapped)
                    );
                }
            }
        }
        Action::Delete { path, name, ceph } => {
            let (target, vol) = super::open_offline(&path, &ceph)?;
            vol.delete_device(&name)
                .with_context(|| format!("{target}: device {name:?}"))?;
            vol.close()?;
            println!("deleted device {name} from {target}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
