//! `zbd attach --socket SOCK`: turn a served volume into a block device, and record what was done
//! so `zbd detach` undoes exactly that.
//!
//! With the kernel's nbd module (`/dev/nbd*`) and `nbd-client` installed, the kernel client is
//! used. Otherwise: `nbdfuse` exposes the export as a file in a FUSE mount (we wait for its
//! pidfile, never sleep), and `losetup --find --show --sector-size 4096` makes a loop device of it.

use std::io::ErrorKind;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

/// Where attach records go unless `--state-dir` says otherwise.
pub const DEFAULT_STATE_DIR: &str = "/run/zbd";

const READY_TIMEOUT: Duration = Duration::from_secs(30);
const POLL_INTERVAL: Duration = Duration::from_millis(20);

#[derive(clap::Args, Debug)]
pub struct AttachArgs {
    /// Unix socket of the NBD server (`zbd serve --socket`).
    #[arg(long, required_unless_present_any = ["from_list", "uri"])]
    pub socket: Option<PathBuf>,
    /// A server on TCP instead (`zbd serve --listen`): nbd://HOST[:PORT][/EXPORT].
    #[arg(long, conflicts_with_all = ["socket", "from_list"])]
    pub uri: Option<String>,
    /// Attach the volume named NAME in the volume list (`--list`): its socket and read-only
    /// setting, and a link /dev/zbd/NAME to the device (what `zbd-attach@NAME.service` runs).
    #[arg(long, value_name = "NAME", conflicts_with = "socket")]
    pub from_list: Option<String>,
    /// The volume list read by `--from-list`.
    #[arg(long, value_name = "FILE", default_value = crate::volumes::DEFAULT_LIST)]
    pub list: PathBuf,
    /// Export name to ask for (empty: the default export).
    #[arg(long, default_value = "")]
    pub export: String,
    /// How to make the block device.
    #[arg(long, value_enum, default_value_t = Method::Auto)]
    pub method: Method,
    /// Attach read-only.
    #[arg(long)]
    pub read_only: bool,
    /// Let the loop device (nbdfuse method) read and write through the page cache. By default
    /// it uses direct I/O, so that no second page cache sits between the filesystem on top and
    /// the server: memory limits and cache drops then apply to the whole chain.
    #[arg(long)]
    pub buffered: bool,
    /// Directory for attach records and nbdfuse mount points.
    #[arg(long, default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Seconds to wait for a server that is still starting (its socket missing or not yet
    /// answering); 0 tries once.
    #[arg(long, default_value_t = 30)]
    pub wait: u64,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// Kernel nbd client if /dev/nbd0 and nbd-client exist, else nbdfuse + loop device.
    Auto,
    Kernel,
    Fuse,
}

/// What attach did, in the order detach must undo it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Attachment {
    Kernel {
        device: PathBuf,
    },
    Fuse {
        /// Loop device we created (`losetup -d` it first).
        device: PathBuf,
        /// FUSE mount point of nbdfuse (`fusermount3 -u` it next).
        mountpoint: PathBuf,
        /// nbdfuse's PID, from its own pidfile (stopped last, only if unmounting did not).
        nbdfuse_pid: u32,
        /// Directory attach created for the mount point, pidfile and log (removed at the end).
        work_dir: PathBuf,
    },
}

impl Attachment {
    pub fn device(&self) -> &Path {
        match self {
            Attachment::Kernel { device } | Attachment::Fuse { device, .. } => device,
        }
    }
}

/// File recording the attachment of `device` (e.g. `/run/zbd/attach-loop3.json`).
pub fn record_path(state_dir: &Path, device: &Path) -> PathBuf {
    let name = device
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "device".into());
    state_dir.join(format!("attach-{name}.json"))
}

/// An attach record: what was done, and which server it attached (`zbd list` shows the device
/// beside its server). Records written before `server` existed read with it unset.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Record {
    #[serde(flatten)]
    pub attachment: Attachment,
    /// The server's Unix socket (canonical), or its `nbd://` URI.
    #[serde(default)]
    pub server: Option<String>,
}

pub fn read_record(state_dir: &Path, device: &Path) -> Result<Attachment> {
    let path = record_path(state_dir, device);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "no attach record {} for {}: zbd detach only undoes what zbd attach did",
            path.display(),
            device.display()
        )
    })?;
    let record: Record = serde_json::from_str(&text)
        .with_context(|| format!("corrupt attach record {}", path.display()))?;
    Ok(record.attachment)
}

/// Every readable attach record in `state_dir` (`zbd list`); unreadable ones are skipped.
pub fn read_records(state_dir: &Path) -> Vec<Record> {
    let Ok(listing) = std::fs::read_dir(state_dir) else {
        return Vec::new();
    };
    listing
        .filter_map(|item| item.ok().map(|item| item.path()))
        .filter(|path| {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            name.is_some_and(|n| n.starts_with("attach-") && n.ends_with(".json"))
        })
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .filter_map(|text| serde_json::from_str(&text).ok())
        .collect()
}

fn write_record(state_dir: &Path, record: &Record) -> Result<()> {
    let path = record_path(state_dir, record.attachment.device());
    let temporary = path.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(record)?;
    std::fs::write(&temporary, text)
        .with_context(|| format!("cannot write {}", temporary.display()))?;
    std::fs::rename(&temporary, &path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// How a record names the server at `socket` (and how `zbd list` matches it).
pub fn socket_key(socket: &Path) -> String {
    std::fs::canonicalize(socket)
        .unwrap_or_else(|_| socket.to_path_buf())
        .display()
        .to_string()
}

/// Directory of the `/dev/zbd/NAME` links made for list entries.
pub const LINK_DIR: &str = "/dev/zbd";

pub fn run(mut args: AttachArgs) -> Result<std::process::ExitCode> {
    let mut link = None;
    if let Some(name) = &args.from_list {
        let entry = crate::volumes::find(&args.list, name)?;
        if !entry.attach()? {
            println!(
                "{}: attach=no in {}, nothing to attach",
                entry.name, entry.origin
            );
            return Ok(std::process::ExitCode::SUCCESS);
        }
        args.socket = Some(entry.socket());
        args.read_only |= entry.option("read-only").is_some();
        if let Some(Some(export)) = entry.option("export") {
            args.export = export.to_string();
        }
        link = Some(Path::new(LINK_DIR).join(&entry.name));
    }
    let tcp = args.uri.as_deref().map(parse_tcp_uri).transpose()?;
    if let Some(tcp) = &tcp {
        if !tcp.export.is_empty() {
            args.export = tcp.export.clone();
        }
    }
    let args = &args;
    match &tcp {
        Some(tcp) => wait_for_tcp_server(tcp, Duration::from_secs(args.wait))?,
        None => wait_for_server(args.socket(), Duration::from_secs(args.wait))?,
    }
    std::fs::create_dir_all(&args.state_dir)
        .with_context(|| format!("cannot create --state-dir {}", args.state_dir.display()))?;
    let kernel = match args.method {
        Method::Kernel => true,
        Method::Fuse => false,
        Method::Auto => Path::new("/dev/nbd0").exists() && which("nbd-client").is_some(),
    };
    let attachment = if kernel {
        attach_kernel(args)?
    } else {
        attach_fuse(args)?
    };
    let record = Record {
        attachment,
        server: Some(match &args.uri {
            Some(uri) => uri.clone(),
            None => socket_key(args.socket()),
        }),
    };
    write_record(&args.state_dir, &record)?;
    let attachment = record.attachment;
    if let Some(link) = &link {
        make_link(link, attachment.device())?;
    }
    println!("{}", attachment.device().display());
    Ok(std::process::ExitCode::SUCCESS)
}

impl AttachArgs {
    fn socket(&self) -> &Path {
        self.socket.as_deref().unwrap_or(Path::new(""))
    }
}

/// Points `link` (`/dev/zbd/NAME`) at `device`, replacing a link left by an earlier attach, so
/// fstab can name the volume's filesystem by a stable path.
fn make_link(link: &Path, device: &Path) -> Result<()> {
    if let Some(parent) = link.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    if std::fs::symlink_metadata(link).is_ok_and(|m| m.file_type().is_symlink()) {
        std::fs::remove_file(link).with_context(|| format!("cannot replace {}", link.display()))?;
    }
    std::os::unix::fs::symlink(device, link)
        .with_context(|| format!("cannot link {} to {}", link.display(), device.display()))
}

pub(crate) fn which(tool: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(tool))
        .find(|candidate| candidate.is_file())
}

fn require(tool: &str, package: &str) -> Result<PathBuf> {
    which(tool).with_context(|| format!("`{tool}` not found: install {package}"))
}

/// Runs a tool and returns its stdout; its stderr goes in the error.
pub(crate) fn run_tool(command: &mut Command) -> Result<String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {command:?}"))?;
    if !output.status.success() {
        bail!(
            "{command:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn attach_kernel(args: &AttachArgs) -> Result<Attachment> {
    let client = require("nbd-client", "nbd-client")?;
    let device = (0..256)
        .map(|n| PathBuf::from(format!("/dev/nbd{n}")))
        .take_while(|d| d.exists())
        .find(|d| {
            let name = d.file_name().map(|n| n.to_string_lossy().into_owned());
            name.is_some_and(|n| !Path::new(&format!("/sys/block/{n}/pid")).exists())
        })
        .context("no free /dev/nbd* device")?;
    let mut command = Command::new(client);
    match args.uri.as_deref().map(parse_tcp_uri).transpose()? {
        Some(tcp) => command.arg(&tcp.host).arg(tcp.port.to_string()),
        None => command.arg("-unix").arg(args.socket()),
    };
    command.arg(&device).args(["-b", "4096"]);
    if !args.export.is_empty() {
        command.arg("-N").arg(&args.export);
    }
    if args.read_only {
        command.arg("-readonly");
    }
    run_tool(&mut command)?;
    Ok(Attachment::Kernel { device })
}

fn attach_fuse(args: &AttachArgs) -> Result<Attachment> {
    let nbdfuse = require("nbdfuse", "libnbd-bin")?;
    require("fusermount3", "fuse3")?;
    let losetup = require("losetup", "util-linux")?;
    // Absolute, so detach works from any directory.
    let state_dir = std::fs::canonicalize(&args.state_dir)
        .with_context(|| format!("--state-dir {}", args.state_dir.display()))?;
    let work_dir = unique_dir(&state_dir)?;
    let mountpoint = work_dir.join("mnt");
    std::fs::create_dir(&mountpoint)
        .with_context(|| format!("cannot create {}", mountpoint.display()))?;
    let pidfile = work_dir.join("nbdfuse.pid");
    let log = std::fs::File::create(work_dir.join("nbdfuse.log"))?;
    let mut command = Command::new(nbdfuse);
    command.arg("-P").arg(&pidfile);
    if args.read_only {
        command.arg("-r");
    }
    command
        .arg(mountpoint.join("disk"))
        .arg(match &args.uri {
            Some(tcp) => tcp.clone(),
            None => uri(args.socket(), &args.export),
        })
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // Its own process group, so a Ctrl-C aimed at `zbd attach` later does not reach it.
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command.spawn().context("cannot start nbdfuse")?;

    let nbdfuse_pid = match wait_for_pidfile(&pidfile, &mut child) {
        Ok(pid) => pid,
        Err(error) => {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg(&mountpoint)
                .output();
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(work_dir.join("nbdfuse.log")).unwrap_or_default();
            let _ = std::fs::remove_dir_all(&work_dir);
            return Err(error.context(format!("nbdfuse did not start: {}", log.trim())));
        }
    };
    let mut losetup_command = Command::new(losetup);
    losetup_command.args(["--find", "--show", "--sector-size", "4096"]);
    if args.read_only {
        losetup_command.arg("--read-only");
    }
    if !args.buffered {
        losetup_command.arg("--direct-io=on");
    }
    losetup_command.arg(mountpoint.join("disk"));
    let device = match run_tool(&mut losetup_command) {
        Ok(out) => PathBuf::from(out.trim()),
        Err(error) => {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg(&mountpoint)
                .output();
            let _ = child.wait();
            let _ = std::fs::remove_dir_all(&work_dir);
            return Err(error);
        }
    };
    if !args.buffered && !loop_direct_io(&device) {
        // losetup leaves the device buffered when the file refuses O_DIRECT: it works, only
        // with the second page cache; say so rather than fail.
        eprintln!(
            "zbd: note: {} uses the page cache (the kernel refused direct I/O on the FUSE file)",
            device.display()
        );
    }
    Ok(Attachment::Fuse {
        device,
        mountpoint,
        nbdfuse_pid,
        work_dir,
    })
}

/// Whether the loop device does direct I/O (`/sys/block/loopN/loop/dio`).
fn loop_direct_io(device: &Path) -> bool {
    let Some(name) = device.file_name() else {
        return false;
    };
    std::fs::read_to_string(Path::new("/sys/block").join(name).join("loop/dio"))
        .is_ok_and(|v| v.trim() == "1")
}

fn uri(socket: &Path, export: &str) -> String {
    let socket = std::fs::canonicalize(socket).unwrap_or_else(|_| socket.to_path_buf());
    format!("nbd+unix:///{export}?socket={}", socket.display())
}

fn unique_dir(state_dir: &Path) -> Result<PathBuf> {
    for attempt in 0..1000u32 {
        let dir = state_dir.join(format!("fuse-{}-{attempt}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", dir.display())),
        }
    }
    bail!("cannot create a work directory in {}", state_dir.display())
}

/// Waits until nbdfuse writes its pidfile (it does once the FUSE file is ready to serve).
fn wait_for_pidfile(pidfile: &Path, child: &mut std::process::Child) -> Result<u32> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Ok(text) = std::fs::read_to_string(pidfile) {
            if let Ok(pid) = text.trim().parse::<u32>() {
                return Ok(pid);
            }
        }
        if let Some(status) = child.try_wait()? {
            bail!("nbdfuse exited ({status})");
        }
        if Instant::now() > deadline {
            bail!("nbdfuse wrote no pidfile within {READY_TIMEOUT:?}");
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Waits, at most `wait`, until a server accepts connections on `socket` (`zbd serve` started
/// just before may still be opening its volume); then says in one line what is wrong.
fn wait_for_server(socket: &Path, wait: Duration) -> Result<()> {
    let deadline = Instant::now() + wait;
    loop {
        let error = match UnixStream::connect(socket) {
            Ok(_) => return Ok(()),
            Err(error) => error,
        };
        if Instant::now() >= deadline {
            return Err(server_absent(socket, &error, wait));
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// One line saying why no server answers on `socket`.
fn server_absent(socket: &Path, error: &std::io::Error, wait: Duration) -> anyhow::Error {
    let shown = socket.display();
    let waited = if wait.is_zero() {
        String::new()
    } else {
        format!(" after waiting {}s", wait.as_secs())
    };
    match std::fs::symlink_metadata(socket) {
        Err(_) => {
            let parent = socket.parent().filter(|p| !p.as_os_str().is_empty());
            match parent.filter(|p| !p.is_dir()) {
                Some(parent) => anyhow!(
                    "no NBD server socket at {shown}: directory {} does not exist",
                    parent.display()
                ),
                None => anyhow!(
                    "no NBD server socket at {shown}{waited} (start one with `zbd serve --socket`)"
                ),
            }
        }
        Ok(meta) if !meta.file_type().is_socket() => {
            anyhow!("{shown} is not a socket (--socket takes the one `zbd serve` listens on)")
        }
        Ok(_) if error.kind() == ErrorKind::ConnectionRefused => anyhow!(
            "stale socket {shown}: no server listens on it{waited} (the server that made it \
             exited; `zbd serve` replaces it when started again)"
        ),
        Ok(_) => anyhow!("cannot connect to {shown}{waited}: {error}"),
    }
}

/// A server on TCP, from `--uri nbd://HOST[:PORT][/EXPORT]`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TcpServer {
    host: String,
    port: u16,
    export: String,
}

/// The NBD port when a URI names none.
const NBD_PORT_DEFAULT: u16 = 10809;

fn parse_tcp_uri(text: &str) -> Result<TcpServer> {
    let bad = || anyhow!("--uri {text:?}: expected nbd://HOST[:PORT][/EXPORT]");
    let rest = text.strip_prefix("nbd://").ok_or_else(bad)?;
    let (authority, export) = rest.split_once('/').unwrap_or((rest, ""));
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || host.starts_with('[') => {
            (host, port.parse::<u16>().map_err(|_| bad())?)
        }
        _ => (authority, NBD_PORT_DEFAULT),
    };
    if host.is_empty() || export.contains('?') {
        return Err(bad());
    }
    Ok(TcpServer {
        host: host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        port,
        export: export.to_string(),
    })
}

/// Waits, at most `wait`, until the TCP server accepts connections.
fn wait_for_tcp_server(server: &TcpServer, wait: Duration) -> Result<()> {
    use std::net::{TcpStream, ToSocketAddrs};
    let deadline = Instant::now() + wait;
    let shown = format!("{}:{}", server.host, server.port);
    loop {
        let error = match (server.host.as_str(), server.port).to_socket_addrs() {
            Ok(mut addresses) => match addresses.next() {
                Some(address) => match TcpStream::connect_timeout(&address, POLL_INTERVAL * 50) {
                    Ok(_) => return Ok(()),
                    Err(error) => error.to_string(),
                },
                None => "the host has no address".to_string(),
            },
            Err(error) => error.to_string(),
        };
        if Instant::now() >= deadline {
            bail!("no NBD server answers at {shown} ({error})");
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_uris_parse_with_defaults() {
        let parsed = parse_tcp_uri("nbd://127.0.0.1:10810/vol").expect("uri");
        assert_eq!(
            parsed,
            TcpServer {
                host: "127.0.0.1".into(),
                port: 10810,
                export: "vol".into()
            }
        );
        let parsed = parse_tcp_uri("nbd://localhost").expect("uri");
        assert_eq!(
            (parsed.port, parsed.export.as_str()),
            (NBD_PORT_DEFAULT, "")
        );
        for bad in [
            "nbd+unix:///?socket=/s",
            "nbd://:1/",
            "nbd://h:port/",
            "http://h/",
        ] {
            assert!(parse_tcp_uri(bad).is_err(), "{bad}");
        }
    }
}
