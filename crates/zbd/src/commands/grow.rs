//! `zbd grow VOLUME --size N | --capacity N`: a larger logical size or data area, offline or
//! while served.
//!
//! The map and the extent table are laid out at create time, before the data area, for the
//! room the volume was made with (format 3: `zbd create --max-size`, `--max-capacity`; format 2:
//! the unused entries of their last pages), so a volume grows in place up to that room
//! (docs/format.md, "Growing a volume"); beyond it this says so in one line and changes nothing.
//! A served volume is grown by its server (control request `grow`, `served.rs`): it pauses I/O,
//! closes the volume, grows it as here and opens it again; NBD clients that connect afterwards
//! see the new size.

use super::{human, size_arg};
use crate::target::Target;
use anyhow::{anyhow, bail, Context, Result};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use zbd_core::format::Superblock;
use zbd_core::{FileStorage, OpenOptions, Volume};

/// Arguments of `zbd grow`.
#[derive(clap::Args)]
pub struct Args {
    /// Volume file or block device; a served one is grown by its server, without stopping it
    /// (clients that connect afterwards see the new size).
    path: PathBuf,
    /// New logical size (K/M/G/T suffixes): at most what the volume's map region holds (see
    /// docs/format.md, "Growing a volume"); an error names the largest size possible.
    #[arg(long, required_unless_present = "capacity")]
    size: Option<String>,
    /// New data area size: a file is extended, a block device must be grown first; at most
    /// what the volume's extent table holds (an error names it).
    #[arg(long)]
    capacity: Option<String>,
}

/// What to grow to, as typed (for messages) and in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrowRequest {
    size: Option<(String, u64)>,
    capacity: Option<(String, u64)>,
}

impl GrowRequest {
    /// Parses `--size` and `--capacity` as typed.
    pub fn parse(size: Option<&str>, capacity: Option<&str>) -> Result<GrowRequest> {
        let arg = |flag: &str, text: Option<&str>| {
            text.map(|t| Ok::<_, anyhow::Error>((t.trim().to_string(), size_arg(flag, t)?)))
                .transpose()
        };
        Ok(GrowRequest {
            size: arg("--size", size)?,
            capacity: arg("--capacity", capacity)?,
        })
    }

    /// The control request that asks a server for this grow: `grow SIZE CAPACITY`, `-` for
    /// a size not asked for.
    pub fn to_control(&self) -> String {
        let text = |a: &Option<(String, u64)>| a.as_ref().map_or("-".into(), |(t, _)| t.clone());
        format!("grow {} {}", text(&self.size), text(&self.capacity))
    }

    /// Parses what [`GrowRequest::to_control`] wrote after `grow `.
    pub fn from_control(args: &str) -> Result<GrowRequest> {
        let mut words = args.split_whitespace();
        let (Some(size), Some(capacity), None) = (words.next(), words.next(), words.next()) else {
            bail!("malformed grow request {args:?}");
        };
        let pick = |w: &str| (w != "-").then(|| w.to_string());
        GrowRequest::parse(pick(size).as_deref(), pick(capacity).as_deref())
    }

    pub fn size_bytes(&self) -> Option<u64> {
        self.size.as_ref().map(|(_, b)| *b)
    }

    pub fn capacity_bytes(&self) -> Option<u64> {
        self.capacity.as_ref().map(|(_, b)| *b)
    }
}

/// The superblock `sb` grows to for `request` (None: unchanged), or the one-line error of the
/// limits (`check_limits`) or of `layout::grow`.
pub fn plan(request: &GrowRequest, sb: &Superblock) -> Result<Option<Superblock>> {
    check_limits(request, sb)?;
    let grown = zbd_core::layout::grow(sb, request.size_bytes(), request.capacity_bytes())
        .map_err(|e| anyhow!("{e}"))?;
    Ok((grown != *sb).then_some(grown))
}

pub fn run(a: Args) -> Result<ExitCode> {
    let target = Target::parse(&a.path)?;
    let Some(path) = target.file() else {
        bail!("{target}: zbd grow works on files and block devices only");
    };
    if !path.exists() {
        bail!("no volume at {}", path.display());
    }
    let request = GrowRequest::parse(a.size.as_deref(), a.capacity.as_deref())?;
    if let Some(reply) = super::serve::remote_grow(path, &request) {
        let reply = reply?;
        print_grown(path, &reply, true);
        return Ok(ExitCode::SUCCESS);
    }
    // Offline: the same steps a server takes (`served.rs`), on a volume opened here. Open
    // (recovering if needed): a volume that does not open is not grown.
    let opts = OpenOptions {
        background_cleaner: false,
        ..OpenOptions::default()
    };
    let storage =
        Arc::new(FileStorage::open(path, true).map_err(|e| anyhow!("{}: {e}", path.display()))?);
    let vol = Volume::open(Box::new(Arc::clone(&storage)), opts)
        .with_context(|| format!("cannot open volume {}", path.display()))?;
    let old = vol.superblock().clone();
    let Some(grown) = plan(&request, &old)? else {
        vol.close()
            .with_context(|| format!("cannot close volume {}", path.display()))?;
        print_grown(path, &Reply::Unchanged(describe(&old)), false);
        return Ok(ExitCode::SUCCESS);
    };
    // Refused before the file grows (a volume that cannot grow keeps its size).
    vol.growable()
        .with_context(|| format!("cannot grow {}", path.display()))?;
    // Order (a crash at any point leaves a volume that opens, as before or grown): the file
    // first, extended and synced; then the clean close; then superblock copy A, synced; then
    // copy B, synced (`Volume::close_grown`, `layout::write_superblock_update`).
    storage
        .extend_to(grown.total_bytes(), path)
        .map_err(|e| anyhow!("{e}"))?;
    vol.close_grown(request.size_bytes(), request.capacity_bytes())
        .with_context(|| format!("cannot grow {}", path.display()))?;
    print_grown(
        path,
        &Reply::Grew {
            before: describe(&old),
            after: describe(&grown),
        },
        false,
    );
    Ok(ExitCode::SUCCESS)
}

/// A grow's outcome as told to the user (and sent by a server on its control socket: one
/// line, fields separated by tabs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Unchanged(String),
    Grew { before: String, after: String },
}

impl Reply {
    /// The control socket's reply line; errors are `error\tMESSAGE`.
    pub fn to_line(result: &Result<Reply, String>) -> String {
        match result {
            Ok(Reply::Unchanged(now)) => format!("unchanged\t{now}\n"),
            Ok(Reply::Grew { before, after }) => format!("grew\t{before}\t{after}\n"),
            Err(e) => format!("error\t{}\n", e.replace(['\n', '\t'], " ")),
        }
    }

    /// Parses a server's reply line.
    pub fn from_line(line: &str) -> Result<Reply> {
        let fields: Vec<&str> = line.trim_end_matches('\n').split('\t').collect();
        match fields.as_slice() {
            ["unchanged", now] => Ok(Reply::Unchanged(now.to_string())),
            ["grew", before, after] => Ok(Reply::Grew {
                before: before.to_string(),
                after: after.to_string(),
            }),
            ["error", message] => bail!("{message}"),
            _ => bail!("unexpected answer from the server: {:?}", line.trim_end()),
        }
    }
}

fn print_grown(path: &std::path::Path, reply: &Reply, served: bool) {
    match reply {
        Reply::Unchanged(now) => println!("{}: unchanged ({now})", path.display()),
        Reply::Grew { before, after } => {
            println!("grew {}", path.display());
            println!("  before  {before}");
            println!("  after   {after}");
            if served {
                println!(
                    "  served: NBD clients that connect from now on see the new size; a device \
                     attached before keeps the old one until detached and attached again"
                );
            }
        }
    }
}

pub fn describe(sb: &Superblock) -> String {
    format!(
        "logical size {}, data area {} ({} extents)",
        human(sb.logical_blocks * 4096),
        human(u64::from(sb.extent_count) * u64::from(sb.extent_bytes)),
        sb.extent_count
    )
}

/// The limits of growing in place, as one line naming the flag and the largest value possible.
fn check_limits(request: &GrowRequest, sb: &Superblock) -> Result<()> {
    let format_note = "the room is laid out at create time (zbd create --max-size, \
                       --max-capacity; docs/format.md, \"Growing a volume\"): more needs a new volume";
    if let Some((text, bytes)) = &request.size {
        let bytes = *bytes;
        let max = zbd_core::layout::logical_bytes_max(sb);
        let current = sb.logical_blocks * 4096;
        if bytes < current {
            bail!(
                "--size {text}: smaller than the volume ({}); shrinking is not supported",
                human(current)
            );
        }
        if bytes > max {
            bail!(
                "--size {text}: the volume's map region holds at most {} ({max} bytes; now {}): \
                 {format_note}",
                human(max),
                human(current)
            );
        }
    }
    if let Some((text, bytes)) = &request.capacity {
        let bytes = *bytes;
        let extent = u64::from(sb.extent_bytes);
        let max = zbd_core::layout::extent_count_max(sb) * extent;
        let current = u64::from(sb.extent_count) * extent;
        if bytes < current {
            bail!(
                "--capacity {text}: smaller than the data area ({}); shrinking is not supported",
                human(current)
            );
        }
        if bytes > max {
            bail!(
                "--capacity {text}: the volume's extent table holds at most {} of data area \
                 ({max} bytes; now {}): {format_note}",
                human(max),
                human(current)
            );
        }
    }
    Ok(())
}
