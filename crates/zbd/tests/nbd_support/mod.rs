//! Guards for the NBD integration tests: a `zbd serve` process, an attached block device, a
//! mount. Each undoes itself when dropped, so a failing test still cleans up; each waits on a
//! condition (pidfile, socket, process exit) with a deadline, never a bare sleep.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

#[allow(unused_imports)]
pub use zbd_testkit::process::{run, stdout, tools};

pub const ZBD: &str = env!("CARGO_BIN_EXE_zbd");
const DEADLINE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(20);

/// True if we may mount and make loop devices (root in CI); prints why not otherwise.
pub fn can_mount() -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    if !root {
        eprintln!("SKIPPED: needs root for losetup and mount");
    }
    root && Path::new("/dev/fuse").exists()
}

pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(POLL);
    }
}

#[allow(unused_imports)]
pub use zbd_testkit::pseudo_random;

pub fn create_volume(path: &Path, size: &str, codec: &str) {
    run(Command::new(ZBD)
        .arg("create")
        .arg(path)
        .args(["--size", size, "--codec", codec]));
}

/// A running `zbd serve`. Dropping it sends SIGTERM and waits for exit.
pub struct Served {
    pub child: Option<Child>,
    pub socket: PathBuf,
    pub volume: PathBuf,
    pidfile: PathBuf,
}

impl Served {
    pub fn start(volume: &Path, dir: &Path) -> Served {
        Self::start_with(volume, dir, &[])
    }

    pub fn start_with(volume: &Path, dir: &Path, extra: &[&str]) -> Served {
        let socket = dir.join("zbd.sock");
        let pidfile = dir.join("zbd.pid");
        let _ = std::fs::remove_file(&pidfile);
        let log = std::fs::File::create(dir.join("serve.log")).expect("log");
        let child = Command::new(ZBD)
            .arg("serve")
            .arg(volume)
            .arg("--socket")
            .arg(&socket)
            .arg("--pidfile")
            .arg(&pidfile)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start zbd serve");
        let mut served = Served {
            child: Some(child),
            socket,
            volume: volume.to_path_buf(),
            pidfile,
        };
        let log_path = dir.join("serve.log");
        wait_until("zbd serve's pidfile", || {
            if let Some(Ok(Some(status))) = served.child.as_mut().map(Child::try_wait) {
                panic!(
                    "zbd serve exited ({status}): {}",
                    std::fs::read_to_string(&log_path).unwrap_or_default()
                );
            }
            served.pidfile.exists()
        });
        served
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).expect("running")
    }

    /// SIGTERM, then wait; returns whether it exited with 0.
    pub fn stop(&mut self) -> bool {
        let Some(child) = self.child.take() else {
            return true;
        };
        zbd_testkit::process::terminate(child, DEADLINE).is_some_and(|s| s.success())
    }

    /// SIGKILL: a crash. The dead server's control socket is removed so tests leave nothing in
    /// /run/zbd (a restarted server on the same path would replace it anyway).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_file(control_socket(&self.volume));
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `nbdinfo --size` of `uri`: the size a client connecting now is told.
pub fn nbdinfo_size(uri: &str) -> u64 {
    let output = run(Command::new("timeout").args(["30", "nbdinfo", "--size", uri]));
    let text = stdout(&output);
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("nbdinfo printed {text:?}: {e}"))
}

/// The control socket `zbd serve` uses for `volume` (docs/nbd.md: FNV-1a 64 of the canonical
/// path, in /run/zbd).
pub fn control_socket(volume: &Path) -> PathBuf {
    let canonical = std::fs::canonicalize(volume).unwrap_or_else(|_| volume.to_path_buf());
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in canonical.as_os_str().as_encoded_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    PathBuf::from(format!("/run/zbd/ctl-{hash:016x}.sock"))
}

/// A block device made by `zbd attach`; dropping it runs `zbd detach`.
pub struct Attached {
    pub device: PathBuf,
    state_dir: PathBuf,
    detached: bool,
}

impl Attached {
    pub fn new(socket: &Path, state_dir: &Path) -> Attached {
        let output = run(Command::new(ZBD)
            .arg("attach")
            .arg("--socket")
            .arg(socket)
            .arg("--state-dir")
            .arg(state_dir));
        let device = PathBuf::from(stdout(&output).trim());
        assert!(device.starts_with("/dev/"), "attach printed {device:?}");
        Attached {
            device,
            state_dir: state_dir.to_path_buf(),
            detached: false,
        }
    }

    pub fn detach(&mut self) -> Output {
        self.detached = true;
        Command::new(ZBD)
            .arg("detach")
            .arg(&self.device)
            .arg("--state-dir")
            .arg(&self.state_dir)
            .stdin(Stdio::null())
            .output()
            .expect("run zbd detach")
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        if !self.detached {
            let output = self.detach();
            if !output.status.success() {
                eprintln!(
                    "cleanup: zbd detach failed: {}",
                    String::from_utf8_lossy(&output.stderr)
                );
            }
        }
    }
}

/// A mounted filesystem; dropping it unmounts.
pub struct Mounted {
    pub dir: PathBuf,
    mounted: bool,
}

impl Mounted {
    pub fn new(device: &Path, dir: &Path) -> Mounted {
        std::fs::create_dir_all(dir).expect("mount dir");
        run(Command::new("mount").arg(device).arg(dir));
        Mounted {
            dir: dir.to_path_buf(),
            mounted: true,
        }
    }

    /// Unmounts a filesystem whose device died (I/O errors are expected); lazily if need be.
    pub fn unmount_after_failure(&mut self) {
        if self.mounted {
            let ok = Command::new("umount")
                .arg(&self.dir)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                run(Command::new("umount").arg("-l").arg(&self.dir));
            }
            self.mounted = false;
        }
    }

    pub fn unmount(&mut self) {
        if self.mounted {
            run(Command::new("umount").arg(&self.dir));
            self.mounted = false;
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(&self.dir).status();
        }
    }
}

/// Every regular file and symlink under `root`, relative, sorted.
pub fn tree(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(relative) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(root.join(&relative)) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = relative.join(entry.file_name());
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() || kind.is_symlink() {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Content hash of a file or a symlink's target (FNV-1a 64 over the bytes plus the length).
pub fn fingerprint(path: &Path) -> (u64, u64) {
    let meta =
        std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let bytes = if meta.file_type().is_symlink() {
        std::fs::read_link(path)
            .expect("link")
            .into_os_string()
            .into_encoded_bytes()
    } else {
        std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
    };
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in &bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash, bytes.len() as u64)
}

/// A disk that forgets unflushed writes: `nbdkit --filter=cache file IMG cache=writeback`.
/// Writes sit in nbdkit's cache until a flush; killing nbdkit (a power cut) loses them.
pub struct VolatileDisk {
    child: Option<Child>,
    pub socket: PathBuf,
}

impl VolatileDisk {
    pub fn start(image: &Path, dir: &Path) -> VolatileDisk {
        std::fs::create_dir_all(dir).expect("disk dir");
        let socket = dir.join("disk.sock");
        let pidfile = dir.join("nbdkit.pid");
        let _ = std::fs::remove_file(&pidfile);
        let _ = std::fs::remove_file(&socket);
        let log = std::fs::File::create(dir.join("nbdkit.log")).expect("log");
        let child = Command::new("nbdkit")
            .args(["-f", "-U"])
            .arg(&socket)
            .arg("-P")
            .arg(&pidfile)
            .args(["--filter=cache", "file"])
            .arg(format!("file={}", image.display()))
            .arg("cache=writeback")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start nbdkit");
        let mut disk = VolatileDisk {
            child: Some(child),
            socket,
        };
        wait_until("nbdkit's pidfile", || {
            if let Some(Ok(Some(status))) = disk.child.as_mut().map(Child::try_wait) {
                panic!("nbdkit exited ({status})");
            }
            pidfile.exists()
        });
        disk
    }

    /// Power cut: SIGKILL, so the cache is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for VolatileDisk {
    fn drop(&mut self) {
        self.kill();
    }
}
