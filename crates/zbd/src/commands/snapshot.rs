//! `zbd snapshot`, `zbd clone`, `zbd flatten`, `zbd rollback`, `zbd diff`: snapshots and clones
//! of a volume's devices (design.md, "Copy on write"), offline or through a serving server's
//! control socket (`device::perform`). `VOL@NAME` names device NAME of volume VOL.

use super::device::{perform, Listed, Reply, Request};
use super::human;
use crate::target::CephArgs;
use anyhow::{anyhow, bail, Result};
use std::path::PathBuf;
use std::process::ExitCode;

/// `VOL@NAME`: the volume path and the device name (split at the last `@`).
fn at(spec: &str) -> Result<(PathBuf, String)> {
    match spec.rsplit_once('@') {
        Some((vol, name)) if !vol.is_empty() && !name.is_empty() => {
            Ok((PathBuf::from(vol), name.to_owned()))
        }
        _ => bail!("{spec:?}: expected VOLUME@NAME"),
    }
}

/// Arguments of `zbd snapshot`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Take a read-only snapshot of a device (the default one unless --of), in O(1).
    Create {
        /// VOLUME@NAME: the volume and the snapshot's name.
        spec: String,
        /// The device to snapshot.
        #[arg(long, default_value = "default")]
        of: String,
        #[command(flatten)]
        ceph: CephArgs,
    },
    /// List the snapshots: origin, creation time (UTC), and stored bytes referenced and
    /// unique (what deleting the snapshot frees), computed when asked. A snapshot whose delete
    /// is under way, or was stopped by a crash, is listed as "deleting" (its space is not free
    /// yet; `zbd serve` finishes the delete, as does deleting it again).
    List {
        /// Volume file, block device or rados:POOL/NAME (served or not).
        path: PathBuf,
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ceph: CephArgs,
    },
    /// Delete a snapshot: what only it held is freed; clones made from it keep theirs.
    Delete {
        /// VOLUME@NAME of the snapshot.
        spec: String,
        #[command(flatten)]
        ceph: CephArgs,
    },
}

/// Arguments of `zbd clone`.
#[derive(clap::Args)]
pub struct CloneArgs {
    /// VOLUME@SNAPSHOT to clone.
    spec: String,
    /// The clone's name (a writable device, an NBD export of that name).
    name: String,
    #[command(flatten)]
    ceph: CephArgs,
}

/// Arguments of `zbd rollback`.
#[derive(clap::Args)]
pub struct RollbackArgs {
    /// VOLUME@SNAPSHOT: the snapshot's origin goes back to it (offline, or a device no NBD
    /// client has open).
    spec: String,
    #[command(flatten)]
    ceph: CephArgs,
}

/// Arguments of `zbd flatten`.
#[derive(clap::Args)]
pub struct FlattenArgs {
    /// VOLUME@CLONE: the clone that stops listing its origin.
    spec: String,
    #[command(flatten)]
    ceph: CephArgs,
}

/// Arguments of `zbd diff`.
#[derive(clap::Args)]
pub struct DiffArgs {
    /// VOLUME@A: a device or snapshot.
    a: String,
    /// VOLUME@B, or just B (same volume).
    b: String,
    #[command(flatten)]
    ceph: CephArgs,
}

fn done(target: &str, reply: Reply) -> Result<Reply> {
    match reply {
        Reply::Error(why) => Err(anyhow!("{target}: {why}")),
        other => Ok(other),
    }
}

/// The volume's devices; with `space`, their stored bytes too (`Request::List`).
fn listed(path: &std::path::Path, ceph: &CephArgs, space: bool) -> Result<Vec<Listed>> {
    match done(
        &path.display().to_string(),
        perform(path, ceph, &Request::List { space })?,
    )? {
        Reply::List(rows) => Ok(rows),
        other => bail!("unexpected answer {other:?}"),
    }
}

pub fn run(a: Args) -> Result<ExitCode> {
    match a.action {
        Action::Create { spec, of, ceph } => {
            let (path, name) = at(&spec)?;
            let request = Request::Snapshot {
                origin: of.clone(),
                name: name.clone(),
            };
            done(&spec, perform(&path, &ceph, &request)?)?;
            println!("snapshot {name} of {of} taken in {}", path.display());
        }
        Action::List { path, json, ceph } => {
            let rows: Vec<Listed> = listed(&path, &ceph, true)?
                .into_iter()
                // A server before `made_as` lists snapshots being deleted as "deleting" only.
                .filter(|d| {
                    d.kind == "snapshot" || (d.kind == "deleting" && d.made_as == "snapshot")
                })
                .collect();
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                println!(
                    "{:<24} {:<16} {:<20} {:>12} {:>12} {:>12} {:<8}",
                    "NAME", "ORIGIN", "CREATED", "MAPPED", "REFER", "UNIQUE", "STATE"
                );
                for d in &rows {
                    let created =
                        std::time::UNIX_EPOCH + std::time::Duration::from_secs(d.created_at);
                    println!(
                        "{:<24} {:<16} {:<20} {:>12} {:>12} {:>12} {:<8}",
                        d.name,
                        d.origin.as_deref().unwrap_or("-"),
                        humantime::format_rfc3339_seconds(created).to_string(),
                        human(d.mapped_bytes),
                        human(d.referenced_bytes),
                        human(d.unique_bytes),
                        if d.kind == "deleting" {
                            "deleting"
                        } else {
                            "live"
                        }
                    );
                }
            }
        }
        Action::Delete { spec, ceph } => {
            let (path, name) = at(&spec)?;
            let rows = listed(&path, &ceph, false)?;
            // "deleting": a delete a crash stopped, which this one finishes.
            if !rows
                .iter()
                .any(|d| d.name == name && matches!(d.kind.as_str(), "snapshot" | "deleting"))
            {
                bail!("{spec}: no snapshot named {name:?}");
            }
            done(
                &spec,
                perform(&path, &ceph, &Request::Delete { name: name.clone() })?,
            )?;
            println!("snapshot {name} deleted from {}", path.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn clone(a: CloneArgs) -> Result<ExitCode> {
    let (path, snapshot) = at(&a.spec)?;
    let request = Request::Clone {
        snapshot,
        name: a.name.clone(),
    };
    done(&a.spec, perform(&path, &a.ceph, &request)?)?;
    println!("clone {} of {} made", a.name, a.spec);
    Ok(ExitCode::SUCCESS)
}

pub fn rollback(a: RollbackArgs) -> Result<ExitCode> {
    let (path, snapshot) = at(&a.spec)?;
    let rows = listed(&path, &a.ceph, false)?;
    let origin = rows
        .iter()
        .find(|d| d.name == snapshot && d.kind == "snapshot")
        .and_then(|d| d.origin.clone())
        .ok_or_else(|| {
            anyhow!(
                "{}: no snapshot named {snapshot:?} with a live origin",
                a.spec
            )
        })?;
    let request = Request::Rollback {
        device: origin.clone(),
        snapshot,
    };
    done(&a.spec, perform(&path, &a.ceph, &request)?)?;
    println!("{origin} rolled back to {}", a.spec);
    Ok(ExitCode::SUCCESS)
}

pub fn flatten(a: FlattenArgs) -> Result<ExitCode> {
    let (path, name) = at(&a.spec)?;
    let request = Request::Flatten { name: name.clone() };
    match done(&a.spec, perform(&path, &a.ceph, &request)?)? {
        Reply::Flattened { changed: true } => println!(
            "{name} flattened: it no longer lists an origin (nothing was copied; it never \
             depended on its snapshot)"
        ),
        Reply::Flattened { changed: false } => println!("{name} lists no origin already"),
        other => bail!("unexpected answer {other:?}"),
    }
    Ok(ExitCode::SUCCESS)
}

pub fn diff(a: DiffArgs) -> Result<ExitCode> {
    let (path, first) = at(&a.a)?;
    let second = match at(&a.b) {
        Ok((other, name)) if other == path => name,
        Ok(_) => bail!("{} and {} are not of one volume", a.a, a.b),
        Err(_) => a.b.clone(),
    };
    let request = Request::Diff {
        a: first,
        b: second,
    };
    match done(&a.a, perform(&path, &a.ceph, &request)?)? {
        Reply::Diff(ranges) => {
            let list: Vec<_> = ranges
                .iter()
                .map(|&(offset, length)| serde_json::json!({"offset": offset, "length": length}))
                .collect();
            println!("{}", serde_json::to_string_pretty(&list)?);
        }
        other => bail!("unexpected answer {other:?}"),
    }
    Ok(ExitCode::SUCCESS)
}
