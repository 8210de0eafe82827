//! `zbd list`: every volume served on this host, found by the control sockets servers keep in
//! the run directory (`/run/zbd/ctl-*.sock`, see `serve::control_socket_path`). Each live one
//! is asked for its `info` and `stats json`; a socket no server answers on (a server killed
//! with SIGKILL leaves it) is listed as dead, not an error.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;

use super::human;
use super::serve::{ServedInfo, RUN_DIR};

/// Arguments of `zbd list`.
#[derive(clap::Args)]
pub struct Args {
    /// Print JSON (one array) instead of a table.
    #[arg(long)]
    json: bool,
    /// Directory of attach records (as given to `zbd attach`), for the DEVICE column.
    #[arg(long, default_value = super::attach::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
}

/// Time one server may take to answer; a hung server is listed as not answering.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// One control socket and what its server said.
#[derive(Serialize, Debug)]
pub struct Entry {
    /// The control socket.
    pub control: PathBuf,
    /// `serving`, `failed` (stopped writing: see `zbd stat`), `dead` (nobody listens) or
    /// `not answering`.
    pub state: String,
    /// The server's description; None for a dead socket.
    #[serde(flatten)]
    pub info: Option<ServedInfo>,
    pub size_bytes: Option<u64>,
    pub data_savings_pct: Option<f64>,
    pub data_compression_ratio: Option<f64>,
    pub physical_bytes_live: Option<u64>,
    /// Why the volume stopped writing, when it did.
    pub failed: Option<String>,
    /// Block device `zbd attach` made of it.
    pub device: Option<PathBuf>,
    /// Where that device is mounted.
    pub mountpoint: Option<String>,
}

fn ask(control: &Path, request: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut stream = UnixStream::connect(control)?;
    stream.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    stream.set_write_timeout(Some(ANSWER_TIMEOUT))?;
    stream.write_all(format!("{request}\n").as_bytes())?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply)?;
    Ok(reply)
}

fn entry(control: PathBuf) -> Entry {
    let mut entry = Entry {
        control,
        state: "dead".into(),
        info: None,
        size_bytes: None,
        data_savings_pct: None,
        data_compression_ratio: None,
        physical_bytes_live: None,
        failed: None,
        device: None,
        mountpoint: None,
    };
    let info = match ask(&entry.control, "info") {
        Ok(reply) => reply,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return entry,
        Err(_) => {
            entry.state = "not answering".into();
            return entry;
        }
    };
    entry.info = serde_json::from_str(info.trim()).ok();
    let stats: Option<serde_json::Value> = ask(&entry.control, "stats json")
        .ok()
        .and_then(|reply| serde_json::from_str(&reply).ok());
    let Some(stats) = stats.filter(|_| entry.info.is_some()) else {
        // A server from an older zbd (no `info`), or one that went away meanwhile.
        entry.state = "not answering".into();
        return entry;
    };
    entry.size_bytes = stats["logical_bytes"].as_u64();
    entry.data_savings_pct = stats["data_savings_pct"].as_f64();
    entry.data_compression_ratio = stats["data_compression_ratio"].as_f64();
    entry.physical_bytes_live = stats["physical_bytes_live"].as_u64();
    entry.failed = stats["failed"].as_str().map(str::to_string);
    entry.state = if entry.failed.is_some() {
        "failed".into()
    } else {
        "serving".into()
    };
    entry
}

/// The control sockets in `dir`, sorted.
fn control_sockets(dir: &Path) -> Result<Vec<PathBuf>> {
    let listing = match std::fs::read_dir(dir) {
        Ok(listing) => listing,
        // No server ever ran here.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot list {}", dir.display())),
    };
    let mut sockets: Vec<PathBuf> = listing
        .filter_map(|item| item.ok().map(|item| item.path()))
        .filter(|path| {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            name.is_some_and(|n| n.starts_with("ctl-") && n.ends_with(".sock"))
        })
        .collect();
    sockets.sort();
    Ok(sockets)
}

/// Fills in the device attached from each served volume and its mount point.
fn add_devices(entries: &mut [Entry], state_dir: &Path) {
    let records = super::attach::read_records(state_dir);
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    for entry in entries.iter_mut() {
        let Some(info) = &entry.info else { continue };
        let key = match &info.socket {
            Some(socket) => super::attach::socket_key(socket),
            None => info.uri.clone(),
        };
        let Some(record) = records.iter().find(|r| r.server.as_deref() == Some(&key)) else {
            continue;
        };
        let device = record.attachment.device().to_path_buf();
        entry.mountpoint = mounts
            .lines()
            .map(|line| line.split(' ').collect::<Vec<_>>())
            .find(|fields| fields.first().map(Path::new) == Some(device.as_path()))
            .and_then(|fields| fields.get(1).map(|m| m.replace("\\040", " ")));
        entry.device = Some(device);
    }
}

pub fn run(a: Args) -> Result<ExitCode> {
    let mut entries: Vec<Entry> = control_sockets(Path::new(RUN_DIR))?
        .into_iter()
        .map(entry)
        .collect();
    add_devices(&mut entries, &a.state_dir);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&entries)?);
    } else {
        print!("{}", table(&entries));
    }
    Ok(ExitCode::SUCCESS)
}

fn table(entries: &[Entry]) -> String {
    let mut out = format!(
        "{:<10} {:>10} {:>14} {:>8}  {:<28} {:<28} {:<12} {}\n",
        "STATE", "SIZE", "DATA SAVINGS", "PID", "VOLUME", "SOCKET", "DEVICE", "MOUNTED ON"
    );
    for e in entries {
        let (volume, socket, pid) = match &e.info {
            Some(info) => (
                info.volume.clone(),
                info.socket
                    .as_ref()
                    .map_or(info.uri.clone(), |s| s.display().to_string()),
                info.pid.to_string(),
            ),
            None => ("-".into(), e.control.display().to_string(), "-".into()),
        };
        let savings = match (e.data_savings_pct, e.data_compression_ratio) {
            (Some(pct), Some(ratio)) if ratio > 0.0 => format!("{pct:.1} % {ratio:.1}:1"),
            _ => "-".into(),
        };
        out.push_str(&format!(
            "{:<10} {:>10} {:>14} {:>8}  {:<28} {:<28} {:<12} {}\n",
            e.state,
            e.size_bytes.map_or("-".into(), human),
            savings,
            pid,
            volume,
            socket,
            e.device
                .as_ref()
                .map_or("-".into(), |d| d.display().to_string()),
            e.mountpoint.as_deref().unwrap_or("-")
        ));
    }
    out
}
