//! `zbd serve PATH`: open a volume and serve it over NBD until SIGTERM/SIGINT, then finish the
//! requests in flight, flush, close the volume cleanly and exit 0.
//!
//! While serving, the volume file is locked, so `zbd stat` asks this process instead: it answers
//! on a small control socket whose path derives from the volume's path
//! ([`control_socket_path`]).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::metrics::{Op, Requests};
use crate::served::{ServedVolume, ThinArgs};
use crate::target::{CephArgs, Target};
use anyhow::{bail, Context, Result};
use zbd_core::format::DEFAULT_DEVICE;
use zbd_core::{AllocState, FileStorage, OpenOptions, Volume};
use zbd_nbd::{
    ErrorKind, Export, ExportError, ExportResult, Extent, Listen, Server, ServerConfig,
    ShutdownHandle,
};

/// Directory for default sockets (NBD and control) of served volumes.
pub const RUN_DIR: &str = "/run/zbd";

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Volume to serve (made by `zbd create`): file, block device or rados:POOL/NAME.
    #[arg(required_unless_present = "from_list")]
    pub path: Option<PathBuf>,
    /// Serve the volume named NAME in the volume list (`--list`) with its options instead
    /// (what `zbd@NAME.service` runs).
    #[arg(long, value_name = "NAME", conflicts_with = "path")]
    pub from_list: Option<String>,
    /// The volume list read by `--from-list`.
    #[arg(long, value_name = "FILE", default_value = crate::volumes::DEFAULT_LIST)]
    pub list: PathBuf,
    #[command(flatten)]
    pub ceph: CephArgs,
    /// Unix socket to listen on [default: /run/zbd/<volume file name>-<hash of its path>.sock].
    #[arg(long, conflicts_with = "listen")]
    pub socket: Option<PathBuf>,
    /// Listen on TCP instead: HOST:PORT, or just PORT for 127.0.0.1:PORT.
    #[arg(long)]
    pub listen: Option<String>,
    /// Export name clients may ask for (the empty name always works).
    #[arg(long, default_value = "")]
    pub export: String,
    /// Serve read-only.
    #[arg(long)]
    pub read_only: bool,
    /// Open the backing file or device with O_DIRECT (no page cache; see docs/design.md).
    #[arg(long)]
    pub direct: bool,
    /// Write the server's PID here once clients can connect (removed on exit).
    #[arg(long)]
    pub pidfile: Option<PathBuf>,
    /// Threads serving each connection: also the most requests one client has in flight
    /// (more wait in its socket).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Memory that requests in flight on all connections together may hold (K/M/G suffixes);
    /// a client over it waits. Also caps the largest request (at most 32M).
    #[arg(long, default_value = "256M")]
    pub inflight_mem: String,
    /// Connections served at once; more wait to be accepted.
    #[arg(long, default_value_t = zbd_nbd::limits::CONNECTIONS_MAX_DEFAULT)]
    pub max_connections: usize,
    /// RAM for map pages (K/M/G suffixes): the map is paged, pages beyond this are read from
    /// the volume on demand; changed pages bring a checkpoint forward as they fill it.
    #[arg(long, default_value = "64M")]
    pub map_cache: String,
    /// RAM for stored block bytes recently read (K/M/G suffixes; 0: none). Small by default so
    /// that the server's RAM stays within the map cache + 64 MiB (docs/design.md).
    #[arg(long, default_value = "8M")]
    pub read_cache: String,
    /// Trained dictionaries for new writes (lz4, zstd): `on` trains one from the first
    /// compressible blocks written and uses it; `off` writes without (stored ones still read)
    /// [default: as set by `zbd create --dict`].
    #[arg(long, value_parser = ["on", "off"])]
    pub dict: Option<String>,
    /// Inline deduplication of new writes (volumes with metadata pages): `on` makes a block
    /// equal to one already stored a reference to it [default: as set by `zbd create --dedup`].
    #[arg(long, value_parser = ["on", "off"])]
    pub dedup: Option<String>,
    /// RAM budget of the dedup index (K/M/G; at least 64K): past it the index samples and
    /// forgets, so dedup finds less but writes never fail or wait for it.
    #[arg(long, default_value = "64M")]
    pub dedup_index: String,
    /// Log format: `text` (one line per event) or `json` (one JSON object per line, for
    /// journald's structured fields or a collector).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Serve Prometheus metrics over HTTP at ADDR (`/metrics`): PORT binds 127.0.0.1:PORT,
    /// HOST:PORT binds as given (give a host to expose them beyond this machine).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Log a warning (and show it in `zbd stat` and the metrics) when live data and map pages
    /// reach this % of what writes may fill (the data area less the free extents kept for the
    /// cleaner and the reserve: 100 % is ENOSPC); logged again after falling back below and
    /// crossing again.
    #[arg(long, value_name = "PCT", default_value_t = crate::thin::WARN_USED_PCT_DEFAULT,
          value_parser = clap::value_parser!(u8).range(1..=100))]
    pub warn_used: u8,
    /// Free space host writes leave for the repair of a filesystem that met ENOSPC (journal
    /// replay, fsck): a size, a % of the data area, or `auto` (1/32 of the data area,
    /// 16M..64G, at most 1/8 of it); 0: none. The next open of a full volume lends it to writes.
    #[arg(long, value_name = "SIZE", default_value = "auto")]
    pub reserve: String,
    /// When the data area is full: `error` fails writes with ENOSPC at once; `queue` makes them
    /// wait (up to --when-full-timeout) for the cleaner or a trim to make room.
    #[arg(long, value_enum, default_value_t = crate::thin::WhenFull::Error)]
    pub when_full: crate::thin::WhenFull,
    /// Seconds a write waits for room with `--when-full queue` before it fails with ENOSPC.
    #[arg(long, value_name = "SECONDS",
          default_value_t = crate::thin::WHEN_FULL_TIMEOUT_SECONDS_DEFAULT)]
    pub when_full_timeout: u64,
}

/// How long an exiting server waits for its last log lines to be written.
const LOG_FLUSH_TIMEOUT: Duration = Duration::from_secs(1);

impl ServeArgs {
    /// The volume served (`path`, or the list entry's once [`resolve_list`] ran).
    pub fn volume(&self) -> &Path {
        self.path.as_deref().unwrap_or(Path::new(""))
    }
}

/// `zbd serve --from-list NAME`: the list entry's volume and options, parsed as if given on the
/// command line (so they are checked as flags are), errors naming the list's line.
fn resolve_list(args: ServeArgs) -> Result<ServeArgs> {
    let Some(name) = &args.from_list else {
        return Ok(args);
    };
    #[derive(clap::Parser)]
    struct Line {
        #[command(flatten)]
        serve: ServeArgs,
    }
    let entry = crate::volumes::find(&args.list, name)?;
    let argv = std::iter::once(std::ffi::OsString::from("serve")).chain(entry.serve_args());
    let line = <Line as clap::Parser>::try_parse_from(argv).map_err(|e| {
        let said = e.to_string();
        let first = said
            .lines()
            .next()
            .unwrap_or_default()
            .trim_start_matches("error: ");
        anyhow::anyhow!("{}: {first}", entry.origin)
    })?;
    Ok(line.serve)
}

/// Exit status of a server whose volume fenced itself (stopped writing after a failed write or
/// sync: docs/design.md, "Failed syncs"). `zbd@.service` lists it in RestartPreventExitStatus=,
/// so systemd does not restart onto a disk that just failed; an admin looks first
/// (docs/operations.md).
pub const EXIT_FENCED: u8 = 3;

/// Smallest `--map-cache`: a few map pages.
const MAP_CACHE_MIN: u64 = 16 << 10;

fn map_cache_bytes(args: &ServeArgs) -> Result<usize> {
    let bytes = super::size_arg("--map-cache", &args.map_cache)?;
    if bytes < MAP_CACHE_MIN {
        bail!("--map-cache '{}': must be at least 16K", args.map_cache);
    }
    usize::try_from(bytes)
        .map_err(|_| anyhow::anyhow!("--map-cache '{}': too large", args.map_cache))
}

/// Smallest `--inflight-mem`: one 1 MiB request, or a full BLOCK_STATUS reply, must fit.
const INFLIGHT_MEM_MIN: u64 = 1 << 20;

fn server_config(args: &ServeArgs) -> Result<ServerConfig> {
    let inflight = super::size_arg("--inflight-mem", &args.inflight_mem)?;
    if inflight < INFLIGHT_MEM_MIN {
        bail!(
            "--inflight-mem '{}': must be at least 1M",
            args.inflight_mem
        );
    }
    if args.max_connections == 0 {
        bail!("--max-connections 0: must be at least 1");
    }
    let mut config = ServerConfig {
        export_name: args.export.clone(),
        inflight_bytes_max: inflight,
        connections_max: args.max_connections,
        ..ServerConfig::default()
    };
    if let Some(threads) = args.threads {
        config.threads_per_connection = threads.max(1);
    }
    Ok(config)
}

/// Serves `zbd_core::Volume` through the NBD server's `Export` trait, counting and timing every
/// request for the metrics. Each request runs on the served volume through its gate
/// (`ServedVolume::with`), so an online grow waits for it and it waits for the grow.
pub struct VolumeExport {
    served: Arc<ServedVolume>,
    /// The volume's device this export is (`zbd device`; the default one is the default export).
    device: u32,
    read_only: bool,
    requests: Arc<Requests>,
    /// `--when-full queue`: how long a write waits for room (None: ENOSPC at once).
    queue_when_full: Option<Duration>,
    /// The log lines that say writes wait for room (`--when-full queue`) and that they fail
    /// with ENOSPC.
    waiting_logged: LogLimit,
    failing_logged: LogLimit,
    /// Counts this export's connection on its device (not for the default export).
    _open: Option<OpenGuard>,
}

/// Writes that wait for room, or fail for want of it, are logged at most this often.
const FULL_LOG_PERIOD: Duration = Duration::from_secs(60);

/// When a line of one kind was last logged: at most one per `FULL_LOG_PERIOD`.
#[derive(Default)]
struct LogLimit(std::sync::Mutex<Option<Instant>>);

impl LogLimit {
    /// Whether a line is due now (and, if so, counts it as logged).
    fn due(&self) -> bool {
        let Ok(mut last) = self.0.lock() else {
            return false;
        };
        if last.is_some_and(|at| at.elapsed() < FULL_LOG_PERIOD) {
            return false;
        }
        *last = Some(Instant::now());
        true
    }
}

impl VolumeExport {
    /// Runs one request of `op` over `bytes`, recording its outcome and time.
    fn timed<T>(
        &self,
        op: Op,
        bytes: u64,
        call: impl FnOnce() -> ExportResult<T>,
    ) -> ExportResult<T> {
        let started = Instant::now();
        let result = call();
        self.requests.record(op, bytes, started, result.is_ok());
        result
    }
}

fn export_error(error: zbd_core::Error) -> ExportError {
    let kind = match error.errno() {
        zbd_core::error::errno::ENOSPC => ErrorKind::NoSpace,
        zbd_core::error::errno::EINVAL => ErrorKind::Invalid,
        zbd_core::error::errno::EROFS => ErrorKind::Permission,
        _ => ErrorKind::Io,
    };
    ExportError::new(kind, error.to_string())
}

impl Export for VolumeExport {
    fn size(&self) -> u64 {
        if self.device == DEFAULT_DEVICE {
            return self.served.size_bytes();
        }
        self.served
            .with(|v| v.devices().into_iter().find(|d| d.id == self.device))
            .ok()
            .flatten()
            .map_or(0, |d| d.size_bytes)
    }
    fn is_read_only(&self) -> bool {
        self.read_only
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> ExportResult<()> {
        let bytes = buf.len() as u64;
        self.timed(Op::Read, bytes, || {
            self.on_volume(|v| v.read_in(self.device, offset, buf))
        })
    }
    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> ExportResult<()> {
        self.timed(Op::Write, data.len() as u64, || {
            match self.queue_when_full {
                None => self.on_volume(|v| v.write_in(self.device, offset, data, fua)),
                Some(wait) => self.write_or_wait(offset, data, fua, Instant::now() + wait),
            }
        })
    }
    fn flush(&self) -> ExportResult<()> {
        self.timed(Op::Flush, 0, || self.flush_volume())
    }
    fn trim(&self, offset: u64, length: u64, fua: bool) -> ExportResult<()> {
        self.timed(Op::Trim, length, || {
            self.on_volume(|v| v.trim_in(self.device, offset, length))?;
            if fua {
                self.flush_volume()?;
            }
            Ok(())
        })
    }
    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        _may_trim: bool,
        fua: bool,
    ) -> ExportResult<()> {
        // Zero blocks become a map state with no data either way; block status reports them as
        // allocated zeroes (not holes), which also honours NBD_CMD_FLAG_NO_HOLE.
        self.timed(Op::WriteZeroes, length, || {
            self.on_volume(|v| v.write_zeroes_in(self.device, offset, length))?;
            if fua {
                self.flush_volume()?;
            }
            Ok(())
        })
    }
    fn block_status(&self, offset: u64, length: u64) -> ExportResult<Vec<Extent>> {
        self.timed(Op::BlockStatus, length, || self.allocation(offset, length))
    }
}

/// The volume's other devices as NBD exports of their names (`zbd device`), each found at
/// the handshake that names it; its requests go to the same volume through the same gate.
struct VolumeDirectory {
    served: Arc<ServedVolume>,
    read_only: bool,
    requests: Arc<Requests>,
    queue_when_full: Option<Duration>,
    open: Arc<OpenExports>,
}

/// Connections open on each device other than the default one (a device is not deleted under
/// a client: `zbd device delete` of a served volume), and the default export's name (no
/// device may take it).
struct OpenExports {
    devices: std::sync::Mutex<std::collections::HashMap<u32, OpenState>>,
    default_name: String,
}

/// One device's connections, and whether a delete hides it from new ones.
#[derive(Default)]
struct OpenState {
    clients: usize,
    hidden: bool,
}

impl OpenExports {
    fn new(default_name: &str) -> OpenExports {
        OpenExports {
            devices: Default::default(),
            default_name: default_name.to_owned(),
        }
    }

    fn with<T>(&self, device: u32, f: impl FnOnce(&mut OpenState) -> T) -> T {
        let mut m = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        f(m.entry(device).or_default())
    }

    fn count(&self, device: u32) -> usize {
        self.with(device, |o| o.clients)
    }

    fn hidden(&self, device: u32) -> bool {
        self.with(device, |o| o.hidden)
    }

    /// Hides `device` from clients that look it up from now on, if none has it open (else
    /// the number that do): a delete empties a writable device before its row is marked, and
    /// a client that found it meanwhile would read the holes. `find` counts a client before
    /// it looks the device up a second time, so either this sees the client or the client
    /// sees the device hidden.
    fn hide_if_idle(self: &Arc<Self>, device: u32) -> std::result::Result<Hidden, usize> {
        self.with(device, |o| match o.clients {
            0 => {
                o.hidden = true;
                Ok(Hidden(Arc::clone(self), device))
            }
            n => Err(n),
        })
    }
}

/// Keeps a device hidden from new clients while it lives (`OpenExports::hide_if_idle`).
struct Hidden(Arc<OpenExports>, u32);

impl Drop for Hidden {
    fn drop(&mut self) {
        self.0.with(self.1, |o| o.hidden = false);
    }
}

/// Counts one connection on a device while it lives (dropped with the connection's export).
struct OpenGuard(Arc<OpenExports>, u32);

impl OpenGuard {
    fn new(open: &Arc<OpenExports>, device: u32) -> OpenGuard {
        open.with(device, |o| o.clients += 1);
        OpenGuard(Arc::clone(open), device)
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0
            .with(self.1, |o| o.clients = o.clients.saturating_sub(1));
    }
}

/// Whether a device of `kind` is offered: not one being deleted, nor one a rollback is
/// emptying (or left part emptied: it would read with holes where its data was).
fn exported(kind: &str) -> bool {
    kind != "deleting" && kind != "rolling back"
}

impl zbd_nbd::Directory for VolumeDirectory {
    fn names(&self) -> Vec<String> {
        let devices = self.served.with(|v| v.devices()).unwrap_or_default();
        devices
            .into_iter()
            .filter(|d| d.id != DEFAULT_DEVICE && exported(d.kind) && !self.open.hidden(d.id))
            .map(|d| d.name)
            .collect()
    }

    fn find(&self, name: &str) -> Option<Arc<dyn Export>> {
        let offered = |id: Option<u32>| {
            let devices = self.served.with(|v| v.devices()).ok()?;
            devices.into_iter().find(|d| {
                d.name == name
                    && d.id != DEFAULT_DEVICE
                    && exported(d.kind)
                    && id.is_none_or(|id| d.id == id)
            })
        };
        let d = offered(None)?;
        // Counted first, then looked up again: a rollback marks the device (no longer offered)
        // and a delete hides it, then each counts its clients, so either it sees this one or
        // this one sees the mark.
        let guard = OpenGuard::new(&self.open, d.id);
        offered(Some(d.id)).filter(|_| !self.open.hidden(d.id))?;
        Some(Arc::new(VolumeExport {
            served: Arc::clone(&self.served),
            device: d.id,
            read_only: self.read_only || !d.writable,
            requests: Arc::clone(&self.requests),
            queue_when_full: self.queue_when_full,
            waiting_logged: LogLimit::default(),
            failing_logged: LogLimit::default(),
            _open: Some(guard),
        }))
    }
}

impl VolumeExport {
    /// Runs one engine call on the served volume (through its gate); a volume no longer served
    /// (a failed grow, the server stopping) fails it with EIO and the reason. ENOSPC is logged
    /// before it goes back: the warning threshold first, if the watch thread has not seen it
    /// crossed yet, then that writes fail.
    fn on_volume<T>(&self, call: impl FnOnce(&Volume) -> zbd_core::Result<T>) -> ExportResult<T> {
        let result = self
            .served
            .with(call)
            .map_err(ExportError::io)?
            .map_err(export_error);
        if matches!(&result, Err(e) if e.kind == ErrorKind::NoSpace) {
            self.served.watch_space();
            if self.failing_logged.due() {
                crate::log::line(
                    "zbd: the data area is full: requests fail with ENOSPC; free space (trim, \
                     zbd snapshot delete) or zbd grow --capacity",
                );
            }
        }
        result
    }

    /// `--when-full queue`: a write waits for room until `deadline`. An online grow stops the
    /// wait inside the volume it closes; the write then waits at the gate and tries again on
    /// the grown volume (whose new extents may be the room it waited for).
    fn write_or_wait(
        &self,
        offset: u64,
        data: &[u8],
        fua: bool,
        deadline: Instant,
    ) -> ExportResult<()> {
        let logged = std::cell::Cell::new(false);
        loop {
            let stopped = std::cell::Cell::new(false);
            // Asked after each try that found no room, before the write waits.
            let keep_waiting = || {
                let growing = self.served.is_growing();
                stopped.set(stopped.get() || growing);
                if !growing && !logged.replace(true) {
                    self.log_waiting();
                }
                !growing
            };
            let result = self.on_volume(|v| {
                v.write_or_wait_while(self.device, offset, data, fua, deadline, &keep_waiting)
            });
            match result {
                Err(e)
                    if e.kind == ErrorKind::NoSpace
                        && stopped.get()
                        && Instant::now() < deadline => {}
                other => return other,
            }
        }
    }

    /// One line when writes start waiting for room (an admin frees space or grows the data
    /// area), at most one per `FULL_LOG_PERIOD`.
    fn log_waiting(&self) {
        if self.waiting_logged.due() {
            crate::log::line(format!(
                "zbd: the data area is full: writes wait for room (--when-full queue, up to {} s \
                 each); free space (trim) or zbd grow --capacity",
                self.queue_when_full.unwrap_or_default().as_secs()
            ));
        }
    }

    fn flush_volume(&self) -> ExportResult<()> {
        if self.read_only {
            return Ok(());
        }
        self.on_volume(|v| v.flush())
    }

    fn allocation(&self, offset: u64, length: u64) -> ExportResult<Vec<Extent>> {
        let runs = self.on_volume(|v| v.allocation_in(self.device, offset, length))?;
        Ok(runs
            .into_iter()
            .map(|(length, state)| match state {
                AllocState::Data => Extent::data(length),
                AllocState::Zero => Extent {
                    length,
                    hole: false,
                    zero: true,
                },
                AllocState::Hole => Extent::hole(length),
            })
            .collect())
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// FNV-1a hash of a volume's canonical path: stable across builds and versions, unlike std's
/// hasher, so a restarted server (or another zbd command) finds the same socket names.
fn path_hash(volume: &Path) -> u64 {
    let canonical = std::fs::canonicalize(volume).unwrap_or_else(|_| volume.to_path_buf());
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in canonical.as_os_str().as_encoded_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// Control socket of a volume served from `volume`: `/run/zbd/ctl-<hash of its canonical path>`
/// (a hash keeps it under the 108-byte limit of socket paths).
pub fn control_socket_path(volume: &Path) -> PathBuf {
    Path::new(RUN_DIR).join(format!("ctl-{:016x}.sock", path_hash(volume)))
}

/// Longest volume name kept in a default socket name (socket paths end at 108 bytes).
const SOCKET_NAME_CHARS_MAX: usize = 48;

/// Default NBD socket of a volume: `/run/zbd/<file name>-<8 hex digits of its full path's
/// hash>.sock`, readable, and distinct for two volumes with the same file name.
pub fn default_socket_path(volume: &Path) -> PathBuf {
    let name: String = volume
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "volume".into())
        .chars()
        .take(SOCKET_NAME_CHARS_MAX)
        .collect();
    let short = path_hash(volume) as u32;
    Path::new(RUN_DIR).join(format!("{name}-{short:08x}.sock"))
}

/// Sends one request to the server serving `volume` and returns its whole reply, waiting up to
/// `timeout` for it; None if no server listens for the volume.
pub fn ask_control(
    volume: &Path,
    request: &str,
    timeout: Duration,
) -> Option<std::io::Result<String>> {
    let mut stream = UnixStream::connect(control_socket_path(volume)).ok()?;
    let answer = stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.write_all(format!("{request}\n").as_bytes()))
        .and_then(|()| {
            let mut reply = String::new();
            std::io::Read::read_to_string(&mut stream, &mut reply).map(|_| reply)
        });
    Some(answer)
}

/// Sends one request (`stats json`, `stats text`, `metrics`) to the server serving `volume`
/// and returns its reply; None if no server answers for it.
pub fn query_control(volume: &Path, request: &str) -> Option<String> {
    let mut stream = UnixStream::connect(control_socket_path(volume)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    stream.write_all(format!("{request}\n").as_bytes()).ok()?;
    let mut reply = String::new();
    std::io::Read::read_to_string(&mut stream, &mut reply).ok()?;
    (!reply.is_empty()).then_some(reply)
}

/// How long `zbd grow` waits for a server to grow its volume: the requests in flight end, the
/// volume closes (a checkpoint) and opens again; minutes mean something is stuck.
const REMOTE_GROW_TIMEOUT: Duration = Duration::from_secs(300);

/// Asks the server serving `volume` to grow it (`zbd grow` of a served volume) and waits until
/// the grown volume serves; None if no server answers for the volume (grow it offline then).
pub fn remote_grow(
    volume: &Path,
    request: &super::grow::GrowRequest,
) -> Option<Result<super::grow::Reply>> {
    let mut stream = UnixStream::connect(control_socket_path(volume)).ok()?;
    let asked = stream
        .set_read_timeout(Some(REMOTE_GROW_TIMEOUT))
        .and_then(|()| stream.write_all(format!("{}\n", request.to_control()).as_bytes()));
    if let Err(e) = asked {
        return Some(Err(anyhow::anyhow!(
            "cannot ask the server of {} to grow it: {e}",
            volume.display()
        )));
    }
    let mut line = String::new();
    let answer = match BufReader::new(&stream).read_line(&mut line) {
        Ok(0) => Err(anyhow::anyhow!(
            "the server of {} closed the connection without an answer (see its log)",
            volume.display()
        )),
        Ok(_) if line.starts_with("unknown control request") => Err(anyhow::anyhow!(
            "{} is served by an older zbd that cannot grow it online: stop the server, grow, \
             start it again",
            volume.display()
        )),
        Ok(_) => super::grow::Reply::from_line(&line),
        Err(e) => Err(anyhow::anyhow!(
            "no answer from the server of {} within {} s ({e}); it may still be growing the \
             volume: see its log",
            volume.display(),
            REMOTE_GROW_TIMEOUT.as_secs()
        )),
    };
    Some(answer)
}

/// Asks the server serving `volume` to scrub it at `rate` bytes per second (0: unbounded);
/// `progress(done, total)` follows it. None if no server answers for the volume.
pub fn remote_scrub(
    volume: &Path,
    rate: u64,
    mut progress: impl FnMut(u64, u64),
) -> Option<Result<zbd_core::CheckReport>> {
    let mut stream = UnixStream::connect(control_socket_path(volume)).ok()?;
    if stream
        .write_all(format!("scrub {rate}\n").as_bytes())
        .is_err()
    {
        return None;
    }
    let mut lines = BufReader::new(stream).lines();
    let result = loop {
        let line = match lines.next() {
            Some(Ok(line)) => line,
            Some(Err(e)) => break Err(anyhow::anyhow!("scrub: lost the server: {e}")),
            None => break Err(anyhow::anyhow!("scrub: the server closed the connection")),
        };
        if let Some(rest) = line.strip_prefix("progress ") {
            let mut it = rest.split(' ').filter_map(|v| v.parse::<u64>().ok());
            if let (Some(done), Some(total)) = (it.next(), it.next()) {
                progress(done, total);
            }
        } else if let Some(json) = line.strip_prefix("report ") {
            break serde_json::from_str(json).context("scrub: unreadable report from the server");
        } else {
            break Err(anyhow::anyhow!("scrub: the server says: {line}"));
        }
    };
    Some(result)
}

/// Runs a scrub for a control connection: progress lines while it runs, then the report as
/// one JSON line. Its own thread, so `zbd stat` keeps answering meanwhile.
fn serve_scrub(stream: UnixStream, served: Arc<ServedVolume>, rate: &str) {
    let Ok(rate) = rate.parse::<u64>() else {
        let mut s = &stream;
        let _ = s.write_all(format!("bad scrub rate {rate:?}\n").as_bytes());
        return;
    };
    let _ = stream.set_write_timeout(None);
    let _ = std::thread::Builder::new()
        .name("zbd-scrub".into())
        .spawn(move || {
            let last = std::sync::Mutex::new(std::time::Instant::now());
            let scrubbed = served.maintain(|volume| {
                // Logged once the scrub holds off grows (`maintain`), before it reads anything.
                crate::log::line(match rate {
                    0 => "zbd: scrub started (unbounded rate)".to_string(),
                    rate => format!("zbd: scrub started at {}/s", super::human(rate)),
                });
                volume.scrub((rate > 0).then_some(rate), &|done, total| {
                    let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
                    if done == total || last.elapsed() >= Duration::from_millis(200) {
                        *last = std::time::Instant::now();
                        let mut s = &stream;
                        let _ = s.write_all(format!("progress {done} {total}\n").as_bytes());
                    }
                })
            });
            let report = match scrubbed {
                Ok(report) => report,
                Err(why) => {
                    let mut s = &stream;
                    let _ = s.write_all(format!("the volume is not served: {why}\n").as_bytes());
                    return;
                }
            };
            crate::log::line(format!(
                "zbd: scrub finished: {} blocks verified, {} damaged, {} metadata problems",
                report.blocks_checked,
                report.damaged_blocks.len(),
                report.metadata_problems.len()
            ));
            let reply = serde_json::to_string(&report)
                .map(|json| format!("report {json}\n"))
                .unwrap_or_else(|e| format!("cannot encode the report: {e}\n"));
            let mut s = &stream;
            let _ = s.write_all(reply.as_bytes());
        });
}

/// Does a device operation (`zbd device` of a served volume) for a control connection, on its
/// own thread (a delete trims the whole device) while I/O goes on; the answer is one JSON line
/// (`device::Reply`). A device an NBD client has open is not deleted.
fn serve_device(stream: UnixStream, served: Arc<ServedVolume>, json: &str, open: Arc<OpenExports>) {
    use super::device::{apply, Reply, Request};
    let json = json.to_string();
    let _ = stream.set_write_timeout(None);
    let _ = std::thread::Builder::new()
        .name("zbd-device".into())
        .spawn(move || {
            let reply = match serde_json::from_str::<Request>(&json) {
                Err(e) => Reply::Error(format!("unreadable device request: {e}")),
                Ok(request) => served
                    .with(|v| {
                        // A device a client has open is neither deleted nor rolled back under it
                        // (the default export's clients are not counted: it is never deleted,
                        // and is rolled back offline only).
                        let busy = match &request {
                            Request::Delete { name } => Some(name),
                            Request::Rollback { device, .. } => Some(device),
                            _ => None,
                        };
                        let open_by = |name: &str, n: usize| {
                            format!(
                                "device {name:?} is open by {n} NBD connection(s): disconnect \
                                 them first"
                            )
                        };
                        let idle = |name: &str, id: u32| match open.count(id) {
                            0 => Ok(()),
                            n => Err(zbd_core::Error::Invalid(open_by(name, n))),
                        };
                        // Held until the delete returns: no client finds the device meanwhile.
                        let mut _hidden = None;
                        if let Some(name) = busy {
                            let d = v.devices().into_iter().find(|d| &d.name == name);
                            if d.as_ref().is_some_and(|d| d.id == DEFAULT_DEVICE) {
                                return Reply::Error(
                                    "the default device is exported: roll it back offline".into(),
                                );
                            }
                            // A rollback asks under the device-operation lock instead
                            // (`Volume::rollback_when`, below).
                            let deleting = matches!(request, Request::Delete { .. });
                            if let Some(d) = d.filter(|_| deleting) {
                                match open.hide_if_idle(d.id) {
                                    Ok(hidden) => _hidden = Some(hidden),
                                    Err(n) => return Reply::Error(open_by(name, n)),
                                }
                            }
                        }
                        // The default export's name is not a device's (a client asking for
                        // it would get the default device).
                        let named = match &request {
                            Request::Create { name, .. }
                            | Request::Snapshot { name, .. }
                            | Request::Clone { name, .. } => Some(name),
                            _ => None,
                        };
                        let export_name = &open.default_name;
                        if named.is_some_and(|n| !export_name.is_empty() && n == export_name) {
                            return Reply::Error(format!(
                                "{export_name:?} is the default export's name (zbd serve --export)"
                            ));
                        }
                        let reply = match &request {
                            // Asked again under the device-operation lock, and once the device
                            // is marked and offered no more (`Volume::rollback_when`).
                            Request::Rollback { device, snapshot } => v
                                .rollback_when(device, snapshot, &|id| idle(device, id))
                                .map_or_else(
                                    |e| Reply::Error(e.to_string()),
                                    |()| Reply::RolledBack,
                                ),
                            _ => apply(v, &request),
                        };
                        if !matches!(reply, Reply::List(_) | Reply::Diff(_) | Reply::Error(_)) {
                            crate::log::line(format!("zbd: device operation done: {json}"));
                        }
                        reply
                    })
                    .unwrap_or_else(|why| Reply::Error(format!("the volume is not served: {why}"))),
            };
            let line = serde_json::to_string(&reply).unwrap_or_else(|e| format!("{e}"));
            let mut s = &stream;
            let _ = s.write_all(format!("{line}\n").as_bytes());
        });
}

/// Grows the served volume for a control connection (`zbd grow`), on its own thread so that
/// `zbd stat` keeps answering meanwhile; the answer is one line (`grow::Reply`), sent once
/// the grown volume serves.
fn serve_grow(stream: UnixStream, served: Arc<ServedVolume>, request: &str) {
    let request = request.to_string();
    let _ = stream.set_write_timeout(None);
    let _ = std::thread::Builder::new()
        .name("zbd-grow".into())
        .spawn(move || {
            use super::grow::{describe, GrowRequest, Reply};
            let result = GrowRequest::from_control(&request)
                .map_err(|e| format!("{e:#}"))
                .and_then(|request| served.grow(&request))
                .map(|grown| match grown {
                    crate::served::Grown::Unchanged(now) => Reply::Unchanged(describe(&now)),
                    crate::served::Grown::Grew { before, after } => {
                        let (before, after) = (describe(&before), describe(&after));
                        crate::log::line(format!(
                            "zbd: grew the served volume: {before} -> {after}; NBD clients that \
                             connect from now on see the new size"
                        ));
                        Reply::Grew { before, after }
                    }
                });
            if let Err(why) = &result {
                crate::log::line(format!("zbd: grow refused or failed: {why}"));
            }
            let mut s = &stream;
            let _ = s.write_all(Reply::to_line(&result).as_bytes());
        });
}

/// Answers `stats json` / `stats text` (the reply runs to EOF), `scrub RATE` and `grow SIZE
/// CAPACITY` on the control socket, one request per connection, until the process exits.
/// The thread holds the volume weakly: once `run` drops its handles the volume is dropped, which
/// releases its storage (and a RADOS volume's lock) before the process exits.
fn spawn_control(
    listener: UnixListener,
    served: std::sync::Weak<ServedVolume>,
    info: ServedInfo,
    requests: Arc<Requests>,
    open: Arc<OpenExports>,
) -> std::io::Result<()> {
    let name = info.volume.clone();
    std::thread::Builder::new()
        .name("zbd-control".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                let _ = stream.set_write_timeout(Some(Duration::from_secs(10)));
                let mut request = String::new();
                if BufReader::new(&stream).read_line(&mut request).is_err() {
                    continue;
                }
                let Some(served) = served.upgrade() else {
                    break;
                };
                if let Some(rate) = request.trim().strip_prefix("scrub ") {
                    serve_scrub(stream, served, rate);
                    continue;
                }
                if let Some(sizes) = request.trim().strip_prefix("grow ") {
                    serve_grow(stream, served, sizes);
                    continue;
                }
                if let Some(json) = request.trim().strip_prefix("device ") {
                    serve_device(stream, served, json, Arc::clone(&open));
                    continue;
                }
                let thin = served.thin();
                let stats = || served.with(|v| v.stats());
                let reply = match request.trim() {
                    "stats json" => stats()
                        .map(|stats| {
                            serde_json::to_string_pretty(&super::stat::Report::of(&stats, &thin))
                                .map(|text| text + "\n")
                                .unwrap_or_else(|e| format!("cannot encode statistics: {e}\n"))
                        })
                        .unwrap_or_else(|why| format!("the volume is not served: {why}\n")),
                    "stats text" => stats()
                        .map(|stats| super::stat::render(&name, &stats, &thin))
                        .unwrap_or_else(|why| format!("the volume is not served: {why}\n")),
                    "metrics" => stats()
                        .map(|stats| crate::metrics::render(&name, &stats, &thin, Some(&requests)))
                        .unwrap_or_else(|why| format!("the volume is not served: {why}\n")),
                    "info" => serde_json::to_string(&info)
                        .map(|text| text + "\n")
                        .unwrap_or_else(|e| format!("cannot encode info: {e}\n")),
                    other => format!("unknown control request {other:?}\n"),
                };
                let mut stream = &stream;
                let _ = stream.write_all(reply.as_bytes());
            }
        })?;
    Ok(())
}

fn listen_address(args: &ServeArgs) -> Result<Listen> {
    if let Some(text) = &args.listen {
        let with_host = if text.contains(':') {
            text.clone()
        } else {
            format!("127.0.0.1:{text}")
        };
        let address: SocketAddr = with_host
            .to_socket_addrs()
            .with_context(|| format!("--listen {text:?}: expected HOST:PORT or PORT"))?
            .next()
            .with_context(|| format!("--listen {text:?}: the host has no address"))?;
        return Ok(Listen::Tcp(address));
    }
    let socket = match &args.socket {
        Some(socket) => {
            let parent = socket.parent().filter(|p| !p.as_os_str().is_empty());
            if let Some(parent) = parent.filter(|p| !p.is_dir()) {
                bail!(
                    "--socket {}: directory {} does not exist",
                    socket.display(),
                    parent.display()
                );
            }
            socket.clone()
        }
        None => {
            std::fs::create_dir_all(RUN_DIR).with_context(|| format!("cannot create {RUN_DIR}"))?;
            default_socket_path(args.volume())
        }
    };
    Ok(Listen::Unix(socket))
}

fn uri(listen: &Listen, export: &str) -> String {
    match listen {
        Listen::Unix(path) => format!("nbd+unix:///{export}?socket={}", path.display()),
        Listen::Tcp(address) => format!("nbd://{address}/{export}"),
    }
}

/// Removes a file when dropped (pidfile, control socket), whatever way `run` leaves.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn dedup_index_bytes(args: &ServeArgs) -> Result<u64> {
    let bytes = super::size_arg("--dedup-index", &args.dedup_index)?;
    if bytes < zbd_core::dedup::INDEX_BYTES_MIN {
        anyhow::bail!("--dedup-index '{}': at least 64K", args.dedup_index);
    }
    Ok(bytes)
}

fn read_cache_bytes(args: &ServeArgs) -> Result<usize> {
    let bytes = super::size_arg("--read-cache", &args.read_cache)?;
    usize::try_from(bytes)
        .map_err(|_| anyhow::anyhow!("--read-cache '{}': too large", args.read_cache))
}

/// glibc gives each thread that contends for malloc its own arena (up to 8 per core), and
/// memory freed in one arena is not reused by the others: with connection, I/O and compression
/// threads all allocating request and page buffers, arenas held about 90 MiB more than the
/// budgets in the 1 TiB benchmark (239 MiB peak; 149 MiB with these settings, same run
/// otherwise). One arena, and fixed mmap and trim thresholds (glibc otherwise raises them as
/// large buffers are freed, without bound), keep RSS close to what the budgets hold.
/// The mmap threshold sits above a 1 MiB request's buffers (its reply, the stored bytes it
/// reads): at 128 KiB, each was a fresh mapping whose page faults and zeroing took about a fifth
/// of `zbd serve`'s CPU in a sequential read; from the heap they are reused, and at most the
/// trim threshold of freed memory stays mapped at its top.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn limit_malloc_arenas() {
    // SAFETY: mallopt only sets allocator parameters (under glibc's own lock); it is called
    // before any other thread exists and touches no memory of ours. A refused value (return 0)
    // leaves glibc's default, which is only less frugal.
    #[allow(unsafe_code)]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 8 << 20);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn limit_malloc_arenas() {}

/// Opens the volume to serve; for a file or block device also returns its storage, shared
/// with the engine (an online grow extends it and reopens the volume on it, never letting its
/// lock go), and the options a grow reopens it with.
fn open_volume(
    args: &ServeArgs,
    map_cache_bytes: usize,
) -> Result<(Volume, Option<Arc<FileStorage>>, OpenOptions)> {
    let target = Target::parse(args.volume())?;
    if target.file().is_some_and(|path| !path.exists()) {
        bail!("no volume at {target} (make one with `zbd create`)");
    }
    let (storage, file): (Box<dyn zbd_core::Storage>, _) =
        match target.open_file(args.direct, !args.read_only) {
            Some(file) => {
                let file = Arc::new(file.with_context(|| format!("cannot open volume {target}"))?);
                (Box::new(Arc::clone(&file)), Some(file))
            }
            None => {
                let storage = if args.direct {
                    target.open_direct(!args.read_only)
                } else {
                    target.open(&args.ceph, !args.read_only)
                }
                .with_context(|| format!("cannot open volume {target}"))?;
                (storage, None)
            }
        };
    let options = OpenOptions {
        read_only: args.read_only,
        map_cache_bytes,
        read_cache_bytes: read_cache_bytes(args)?,
        // Unset: the volume's own setting (`zbd create --dict`).
        dictionary: args.dict.as_deref().map(|d| d == "on"),
        // Unset: the volume's own setting (`zbd create --dedup`).
        dedup: args.dedup.as_deref().map(|d| d == "on"),
        dedup_index_bytes: dedup_index_bytes(args)?,
        ..OpenOptions::default()
    };
    let volume = Volume::open(storage, options.clone())
        .with_context(|| format!("cannot open volume {target}"))?;
    crate::dedup_index::restore(&volume, target.file());
    Ok((volume, file, options))
}

/// How long the thread finishing stopped deletes holds the served volume at a time.
const FINISH_DELETE_HOLD: Duration = Duration::from_secs(1);

/// What the control socket's `info` request answers (`zbd list`), one JSON line.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ServedInfo {
    /// The volume as given to `zbd serve`.
    pub volume: String,
    /// NBD URI clients connect to.
    pub uri: String,
    /// Unix socket served on (None: TCP).
    pub socket: Option<PathBuf>,
    /// The server's process.
    pub pid: u32,
    pub read_only: bool,
    /// `--metrics` address bound, if any.
    pub metrics: Option<String>,
}

/// Finishes each rollback a crash or an error stopped part way (a device listed as "rolling
/// back", part emptied: served, it would read with holes where its data was). The default
/// device's comes first, before the pidfile says the server is ready: it is always exported,
/// and writes to it would be wiped by a finish that came later, so while it stays part
/// emptied (the finish failed again, or the serve is read-only) the server does not start.
/// Other devices are not exported while listed so; theirs finish on a thread of their own
/// beside the rest of the start (a large device's would hold it past a service manager's
/// timeout), and one that fails again is logged and stays listed.
fn finish_rollbacks(served: &Arc<ServedVolume>, read_only: bool, volume: &Path) -> Result<()> {
    let stopped = served
        .with(|v| v.unfinished_rollbacks())
        .unwrap_or_default();
    let default = served
        .with(|v| v.devices())
        .unwrap_or_default()
        .into_iter()
        .find(|d| d.id == DEFAULT_DEVICE)
        .map(|d| d.name);
    let (first, later): (Vec<_>, Vec<_>) = stopped
        .into_iter()
        .partition(|(device, _)| Some(device) == default.as_ref());
    if let Some((device, snapshot)) = first.first() {
        if read_only || !finish_rollback(served, device, snapshot) {
            let why = if read_only {
                "a read-only serve cannot finish it"
            } else {
                "finishing it failed"
            };
            bail!(
                "the default device of {} is part emptied by a rollback that stopped (listed \
                 as \"rolling back\"), and {why}: run `zbd rollback {}@{snapshot}` offline \
                 first",
                volume.display(),
                volume.display()
            );
        }
    }
    if read_only || later.is_empty() {
        return Ok(());
    }
    let weak = Arc::downgrade(served);
    std::thread::Builder::new()
        .name("zbd-rollbacks".into())
        .spawn(move || {
            for (device, snapshot) in later {
                let Some(served) = weak.upgrade() else { return };
                finish_rollback(&served, &device, &snapshot);
            }
        })
        .context("cannot start the thread that finishes stopped rollbacks")?;
    Ok(())
}

/// Finishes the stopped rollback of `device` (to `snapshot`, as listed), logging what
/// happens; true when it is done, by this call or another since it was listed.
fn finish_rollback(served: &ServedVolume, device: &str, snapshot: &str) -> bool {
    if served.with(|_| ()).is_err() {
        return false; // shutting down: the next start goes on
    }
    crate::log::line(format!(
        "zbd: finishing the rollback of {device:?} to {snapshot:?}, which stopped part way"
    ));
    match served.with(|v| v.finish_rollback(device)) {
        Ok(Ok(Some(to))) => {
            crate::log::line(format!("zbd: rolled {device:?} back to {to:?}"));
            true
        }
        Ok(Ok(None)) => {
            crate::log::line(format!(
                "zbd: the rollback of {device:?} was finished by another request"
            ));
            true
        }
        Ok(Err(e)) => {
            crate::log::line(format!(
                "zbd: the rollback of {device:?} to {snapshot:?} stopped again: {e} (it is not \
                 served; `zbd rollback VOL@{snapshot}` retries)"
            ));
            false
        }
        Err(_) => false, // shutting down (or a failed grow): the next start goes on
    }
}

/// Finishes, on its own thread while I/O goes on, each delete that a crash or an error stopped
/// part way (devices listed as "deleting"): until then its space stays taken, and nobody may
/// remember to repeat the delete. By id, in checkpointed steps, holding the served volume a
/// second of steps at a time ([`FINISH_DELETE_HOLD`]), so a grow or a shutdown waits at most
/// that long (a shutdown leaves the rest to the next start).
fn spawn_finish_deletes(served: &Arc<ServedVolume>) -> Result<()> {
    let stopped: Vec<(u32, String)> = served
        .with(|v| v.devices())
        .unwrap_or_default()
        .into_iter()
        .filter(|d| d.kind == "deleting")
        .map(|d| (d.id, d.name))
        .collect();
    if stopped.is_empty() {
        return Ok(());
    }
    let weak = Arc::downgrade(served);
    std::thread::Builder::new()
        .name("zbd-deletes".into())
        .spawn(move || {
            for (id, name) in stopped {
                crate::log::line(format!(
                    "zbd: finishing the delete of {name:?}, which stopped part way"
                ));
                loop {
                    let Some(served) = weak.upgrade() else { return };
                    let until = Instant::now() + FINISH_DELETE_HOLD;
                    match served.with(|v| v.finish_delete(id, until)) {
                        Ok(Ok(true)) => {
                            crate::log::line(format!("zbd: deleted {name:?}"));
                            break;
                        }
                        Ok(Ok(false)) => {}
                        Ok(Err(e)) => {
                            crate::log::line(format!(
                                "zbd: the delete of {name:?} stopped again: {e} (`zbd device \
                                 delete` of it retries)"
                            ));
                            break;
                        }
                        Err(_) => return, // shutting down (or a failed grow): the next start goes on
                    }
                }
            }
        })
        .context("cannot start the thread that finishes stopped deletes")?;
    Ok(())
}

/// Binds the control socket and starts answering on it; the guard removes the socket.
fn start_control(
    served: &Arc<ServedVolume>,
    path: &Path,
    info: ServedInfo,
    requests: &Arc<Requests>,
    open: &Arc<OpenExports>,
) -> Result<RemoveOnDrop> {
    let control_path = control_socket_path(path);
    if let Some(parent) = control_path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    // A control socket left by a server that died: the volume lock we hold proves it is stale.
    let _ = std::fs::remove_file(&control_path);
    let control = UnixListener::bind(&control_path)
        .with_context(|| format!("cannot listen on control socket {}", control_path.display()))?;
    let guard = RemoveOnDrop(control_path);
    spawn_control(
        control,
        Arc::downgrade(served),
        info,
        Arc::clone(requests),
        Arc::clone(open),
    )?;
    Ok(guard)
}

/// One line saying what opening found: the recovery's work, a fence, known damage.
pub fn log_opened(path: &Path, stats: &zbd_core::Stats) {
    let split = super::stat::Savings::of(stats);
    let mut line = format!(
        "zbd: opened {} (format {}, {} logical, {} of data stored in {})",
        path.display(),
        stats.format_version,
        super::human(stats.logical_bytes),
        super::human(split.data_logical_bytes),
        super::human(split.data_stored_bytes)
    );
    if stats.recovery_records_replayed > 0 {
        line += &format!(
            "; recovered: replayed {} log records since the last checkpoint",
            stats.recovery_records_replayed
        );
    }
    if stats.damaged_blocks > 0 {
        line += &format!("; {} blocks known damaged", stats.damaged_blocks);
    }
    crate::log::line(line);
}

/// What the thin-provisioning flags ask for (the reserve is sized from the data area when the
/// volume opens, and again after a grow).
fn thin_args(args: &ServeArgs) -> ThinArgs {
    ThinArgs {
        warn_used_pct: args.warn_used,
        reserve: args.reserve.clone(),
        when_full: args.when_full,
        when_full_timeout: Duration::from_secs(args.when_full_timeout),
    }
}

/// Serves `--metrics` on its own thread; returns the address bound.
fn start_metrics(
    address: &str,
    served: &Arc<ServedVolume>,
    path: &Path,
    requests: &Arc<Requests>,
) -> Result<SocketAddr> {
    let address = crate::metrics::parse_address(address)?;
    let weak = Arc::downgrade(served);
    let name = path.display().to_string();
    let requests = Arc::clone(requests);
    let bound = crate::metrics::spawn_http(address, move || {
        let served = weak.upgrade()?;
        let stats = served.with(|v| v.stats()).ok()?;
        Some(crate::metrics::render(
            &name,
            &stats,
            &served.thin(),
            Some(&requests),
        ))
    })?;
    crate::log::line(format!("zbd: metrics on http://{bound}/metrics"));
    Ok(bound)
}

/// SIGTERM and SIGINT start a graceful shutdown, and stop a rollback in progress (the next
/// open finishes it) so that the close does not wait for it; returns the handle that stops
/// listening.
fn stop_on_signals(
    stop: ShutdownHandle,
    served: Arc<ServedVolume>,
) -> Result<(signal_hook::iterator::Handle, JoinHandle<()>)> {
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])
    .context("cannot install signal handlers")?;
    let handle = signals.handle();
    let thread = std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            served.stop_rollbacks();
            stop.shutdown();
        }
    });
    Ok((handle, thread))
}

/// The server logs one line per connection and per rejected request; `ZBD_LOG` filters
/// (default `info`, e.g. `ZBD_LOG=zbd_nbd=debug`). Lines go through [`crate::log`]'s queue, so
/// a slow or closed stderr never blocks or kills a server thread.
fn init_logging(format: LogFormat) {
    crate::log::install();
    let filter = tracing_subscriber::EnvFilter::try_from_env("ZBD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_writer(|| crate::log::QueueWriter)
        .log_internal_errors(false)
        .with_env_filter(filter);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        LogFormat::Json => {
            crate::log::set_json(true);
            builder.json().with_ansi(false).try_init()
        }
    };
}

pub fn run(args: ServeArgs) -> Result<ExitCode> {
    let args = &resolve_list(args)?;
    limit_malloc_arenas();
    init_logging(args.log_format);
    // A pidfile left by a server killed with SIGKILL would tell a script waiting for this one
    // that it is ready before it is: gone from the start, written again once clients can connect.
    if let Some(pidfile) = &args.pidfile {
        match std::fs::remove_file(pidfile) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot remove --pidfile {}", pidfile.display()))
            }
        }
    }
    let config = server_config(args)?;
    let listen = listen_address(args)?;
    let (volume, file, options) = open_volume(args, map_cache_bytes(args)?)?;
    // A client asking for the default export by name must get the default device, never a
    // device of that name shadowed by it.
    if volume
        .devices()
        .iter()
        .any(|d| d.id != DEFAULT_DEVICE && d.name == args.export)
    {
        bail!(
            "--export {:?}: the volume has a device of that name (zbd device list); choose \
             another export name",
            args.export
        );
    }
    log_opened(args.volume(), &volume.stats());
    let served = ServedVolume::new(volume, args.volume(), file, options, thin_args(args))?;
    let thin = served.thin();
    crate::thin::spawn_watch(Arc::downgrade(&served))
        .context("cannot start the data area watch")?;
    let requests = Arc::new(Requests::default());
    let queue_when_full =
        (thin.when_full == crate::thin::WhenFull::Queue).then_some(thin.when_full_timeout);
    let export = Arc::new(VolumeExport {
        served: Arc::clone(&served),
        device: DEFAULT_DEVICE,
        read_only: args.read_only,
        requests: Arc::clone(&requests),
        queue_when_full,
        waiting_logged: LogLimit::default(),
        failing_logged: LogLimit::default(),
        _open: None,
    });
    let mut server = Server::bind(&listen, export, config)?;
    let open = Arc::new(OpenExports::new(&args.export));
    server.set_directory(Arc::new(VolumeDirectory {
        served: Arc::clone(&served),
        read_only: args.read_only,
        requests: Arc::clone(&requests),
        queue_when_full,
        open: Arc::clone(&open),
    }));
    let metrics = match &args.metrics {
        Some(address) => Some(start_metrics(address, &served, args.volume(), &requests)?),
        None => None,
    };
    let info = ServedInfo {
        volume: args.volume().display().to_string(),
        uri: uri(server.listen(), &args.export),
        socket: match server.listen() {
            Listen::Unix(path) => Some(std::path::absolute(path).unwrap_or_else(|_| path.clone())),
            Listen::Tcp(_) => None,
        },
        pid: std::process::id(),
        read_only: args.read_only,
        metrics: metrics.map(|bound| bound.to_string()),
    };
    let _control = start_control(&served, args.volume(), info, &requests, &open)?;
    finish_rollbacks(&served, args.read_only, args.volume())?;
    if !args.read_only {
        spawn_finish_deletes(&served)?;
    }
    let (signals, signal_thread) = stop_on_signals(server.shutdown_handle(), Arc::clone(&served))?;
    // Written last: once it exists, clients can connect and signals stop us gracefully.
    let _pidfile = match &args.pidfile {
        Some(pidfile) => {
            std::fs::write(pidfile, format!("{}\n", std::process::id()))
                .with_context(|| format!("cannot write --pidfile {}", pidfile.display()))?;
            Some(RemoveOnDrop(pidfile.clone()))
        }
        None => None,
    };
    crate::log::line(format!(
        "zbd: serving {} ({} bytes) on {}",
        args.volume().display(),
        served.size_bytes(),
        uri(server.listen(), &args.export)
    ));
    crate::notify::notify(&format!("READY=1\nMAINPID={}", std::process::id()));
    let serve_result = server.serve();
    crate::notify::notify("STOPPING=1");
    signals.close();
    let _ = signal_thread.join();
    // A failed online grow left no volume to close: it exits as a fenced one (not restarted
    // by zbd@.service; the admin looks first).
    let failed_grow = served.failure();
    let volume = served.shut_down();
    let fenced = volume.as_ref().and_then(|v| v.stats().failed);
    let closed = match &volume {
        Some(volume) => volume.close().context("cannot close the volume cleanly"),
        None => Ok(()),
    };
    if let (Some(volume), Ok(()), Ok(target)) = (&volume, &closed, Target::parse(args.volume())) {
        crate::dedup_index::save(volume, target.file());
    }
    // The last handles: dropping them releases the storage (its lock) now.
    drop(volume);
    drop(served);
    if let Some(why) = failed_grow {
        crate::log::line(format!(
            "zbd: stopped; the volume was not served since a failed grow ({why}) (exit \
             {EXIT_FENCED}: not restarted by zbd@.service; see docs/operations.md)"
        ));
        crate::log::flush(LOG_FLUSH_TIMEOUT);
        return Ok(ExitCode::from(EXIT_FENCED));
    }
    // A fence tripped by the final flush fails `served` too: the fence decides the exit.
    if let Some(why) = fenced {
        crate::log::line(format!(
            "zbd: stopped; the volume fenced itself after {why} (exit {EXIT_FENCED}: not \
             restarted by zbd@.service; see docs/operations.md)"
        ));
        crate::log::flush(LOG_FLUSH_TIMEOUT);
        return Ok(ExitCode::from(EXIT_FENCED));
    }
    serve_result.context("NBD server failed")?;
    closed?;
    crate::log::line("zbd: stopped, volume closed cleanly");
    crate::log::flush(LOG_FLUSH_TIMEOUT);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A delete hides an idle device from new clients until it returns, and refuses one a
    /// client has open; `find` counts a client before its second lookup, so a client counted
    /// after the hide finds the device hidden.
    #[test]
    fn a_delete_hides_an_idle_device_and_refuses_an_open_one() {
        let open = Arc::new(OpenExports::new(""));
        let client = OpenGuard::new(&open, 7);
        assert_eq!(open.hide_if_idle(7).err(), Some(1));
        assert!(!open.hidden(7), "a refused delete hides nothing");
        drop(client);
        let hidden = open.hide_if_idle(7).expect("no client has it open");
        let late = OpenGuard::new(&open, 7);
        assert!(open.hidden(7), "a client counted after the hide sees it");
        assert!(!open.hidden(8), "only that device");
        drop(late);
        drop(hidden);
        assert!(!open.hidden(7), "shown again once the delete returned");
        assert_eq!(open.count(7), 0);
    }
}
