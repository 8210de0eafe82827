//! `zbd device`: the named block devices of one volume (design.md, "Devices"). Offline, or on a
//! served volume through its control socket without stopping I/O; `zbd serve` offers each
//! device as an NBD export of its name.

use super::human;
use crate::target::CephArgs;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use zbd_core::{AllocState, Volume};

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
        /// Volume file, block device or rados:POOL/NAME (served or not).
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
        /// Volume file, block device or rados:POOL/NAME (served or not).
        path: PathBuf,
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ceph: CephArgs,
    },
    /// Delete a device and free the blocks only it holds (not the default device; refused
    /// while an NBD client has it open).
    Delete {
        /// Volume file, block device or rados:POOL/NAME (served or not).
        path: PathBuf,
        /// The device's name.
        name: String,
        #[command(flatten)]
        ceph: CephArgs,
    },
}

/// A device operation, as the control socket carries it (one JSON line after `device `).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Request {
    Create {
        name: String,
        size: u64,
    },
    Delete {
        name: String,
    },
    /// Without `space`, the rows carry 0 for mapped, referenced and unique bytes: names,
    /// kinds and origins at once, where the space takes a walk of every device's map (about
    /// a second with 1,000 snapshots, which `zbd snapshot delete` paid for each).
    List {
        #[serde(default = "with_space")]
        space: bool,
    },
    Snapshot {
        origin: String,
        name: String,
    },
    Clone {
        snapshot: String,
        name: String,
    },
    Rollback {
        device: String,
        snapshot: String,
    },
    Diff {
        a: String,
        b: String,
    },
    Flatten {
        name: String,
    },
}

/// One device as `zbd device list` shows it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub id: u32,
    pub name: String,
    pub kind: String,
    /// `kind` but never "deleting" (absent from servers before it: empty).
    #[serde(default)]
    pub made_as: String,
    pub size_bytes: u64,
    /// Bytes of blocks that name stored data.
    pub mapped_bytes: u64,
    /// Stored bytes of those blocks, shared ones included (`zfs list -o refer`).
    pub referenced_bytes: u64,
    /// Stored bytes no other device names: what deleting it would free.
    pub unique_bytes: u64,
    pub created_at: u64,
    pub writable: bool,
    /// The device it was made from (a snapshot's origin, a clone's snapshot), by name.
    pub origin: Option<String>,
}

/// What a device operation did.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Reply {
    Created {
        id: u32,
    },
    Deleted,
    RolledBack,
    /// `changed`: false when the clone listed no origin already.
    Flattened {
        changed: bool,
    },
    List(Vec<Listed>),
    /// Byte ranges (offset, length) where two devices differ.
    Diff(Vec<(u64, u64)>),
    Error(String),
}

/// Does `request` on an open volume (offline, or the server's).
pub fn apply(vol: &Volume, request: &Request) -> Reply {
    let done = match request {
        Request::Create { name, size } => vol
            .create_device(name, *size)
            .map(|id| Reply::Created { id }),
        Request::Delete { name } => vol.delete_device(name).map(|()| Reply::Deleted),
        Request::List { space } => list(vol, *space).map(Reply::List),
        Request::Snapshot { origin, name } => {
            vol.snapshot(origin, name).map(|id| Reply::Created { id })
        }
        Request::Clone { snapshot, name } => vol
            .clone_snapshot(snapshot, name)
            .map(|id| Reply::Created { id }),
        Request::Rollback { device, snapshot } => {
            vol.rollback(device, snapshot).map(|()| Reply::RolledBack)
        }
        Request::Diff { a, b } => vol.diff(a, b).map(Reply::Diff),
        Request::Flatten { name } => vol
            .flatten(name)
            .map(|changed| Reply::Flattened { changed }),
    };
    done.unwrap_or_else(|e| Reply::Error(e.to_string()))
}

/// A request without `space` (from a client before it) asks for it.
fn with_space() -> bool {
    true
}

fn list(vol: &Volume, with_space: bool) -> zbd_core::Result<Vec<Listed>> {
    let devices = vol.devices();
    let space = if with_space {
        vol.device_space()?
    } else {
        Vec::new()
    };
    let name_of = |id: u32| devices.iter().find(|d| d.id == id).map(|d| d.name.clone());
    devices
        .iter()
        .cloned()
        .map(|d| {
            let room = space
                .iter()
                .find(|s| s.id == d.id)
                .copied()
                .unwrap_or_default();
            // A device being deleted takes no request, this one neither: part of its tree
            // may be given up already, so what it maps is nothing to show.
            let mapped_bytes = if d.kind == "deleting" || !with_space {
                0
            } else {
                vol.allocation_in(d.id, 0, d.size_bytes)?
                    .iter()
                    .filter(|(_, s)| *s == AllocState::Data)
                    .map(|(n, _)| n)
                    .sum()
            };
            Ok(Listed {
                origin: (d.parent != 0).then(|| name_of(d.parent).unwrap_or("(deleted)".into())),
                id: d.id,
                name: d.name,
                kind: d.kind.into(),
                made_as: d.made_as.into(),
                size_bytes: d.size_bytes,
                mapped_bytes,
                referenced_bytes: room.referenced_bytes,
                unique_bytes: room.unique_bytes,
                created_at: d.created_at,
                writable: d.writable,
            })
        })
        .collect()
}

/// How long a device operation of a served volume may take: a delete trims the whole device.
const REMOTE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

/// `request` on the volume at `path`: through its server if one serves it, else offline.
pub fn perform(path: &Path, ceph: &CephArgs, request: &Request) -> Result<Reply> {
    let line = format!("device {}", serde_json::to_string(request)?);
    if let Some(answer) = super::serve::ask_control(path, &line, REMOTE_TIMEOUT) {
        let answer = answer.with_context(|| format!("the server of {}", path.display()))?;
        if answer.starts_with("unknown control request") {
            bail!(
                "{} is served by an older zbd that has no devices online: stop the server first",
                path.display()
            );
        }
        if answer.trim().is_empty() {
            // The server went away mid-operation (a crash, a kill): what it did is durable
            // up to its last checkpoint; listings say where it stopped.
            bail!(
                "the server of {} closed the connection before answering: the operation may \
                 have stopped part way (`zbd device list` shows a device \"deleting\" or \
                 \"rolling back\"; repeating the command finishes it)",
                path.display()
            );
        }
        return serde_json::from_str(answer.trim())
            .with_context(|| format!("unreadable answer from the server: {answer:?}"));
    }
    let (_, vol) = super::open_offline(path, ceph)?;
    let reply = apply(&vol, request);
    vol.close()?;
    Ok(reply)
}

pub fn run(a: Args) -> Result<ExitCode> {
    let (path, ceph, request, json) = match a.action {
        Action::Create {
            path,
            name,
            size,
            ceph,
        } => {
            let size = super::size_arg("--size", &size)?;
            (path, ceph, Request::Create { name, size }, false)
        }
        Action::List { path, json, ceph } => (path, ceph, Request::List { space: true }, json),
        Action::Delete { path, name, ceph } => (path, ceph, Request::Delete { name }, false),
    };
    let target = path.display().to_string();
    match (perform(&path, &ceph, &request)?, &request) {
        (Reply::Error(why), _) => return Err(anyhow!("{target}: {why}")),
        (Reply::Created { id }, Request::Create { name, size }) => {
            println!(
                "created device {name} (id {id}, {}) in {target}",
                human(*size)
            );
        }
        (Reply::Deleted, Request::Delete { name }) => {
            println!("deleted device {name} from {target}")
        }
        (Reply::List(rows), _) if json => println!("{}", serde_json::to_string_pretty(&rows)?),
        (Reply::List(rows), _) => {
            println!(
                "{:<4} {:<24} {:<12} {:>12} {:>12} {:>12} {:>12}",
                "ID", "NAME", "KIND", "SIZE", "MAPPED", "REFER", "UNIQUE"
            );
            for d in &rows {
                println!(
                    "{:<4} {:<24} {:<12} {:>12} {:>12} {:>12} {:>12}",
                    d.id,
                    d.name,
                    d.kind,
                    human(d.size_bytes),
                    human(d.mapped_bytes),
                    human(d.referenced_bytes),
                    human(d.unique_bytes)
                );
            }
        }
        (other, _) => bail!("{target}: unexpected answer {other:?}"),
    }
    Ok(ExitCode::SUCCESS)
}
