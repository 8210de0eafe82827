//! `zbd detach DEV`: undo exactly what `zbd attach` recorded for DEV, in reverse order: refuse if
//! mounted, `losetup -d` our loop device, `fusermount3 -u` our mount point, and stop nbdfuse by
//! its PID only if unmounting did not end it. Never touches loop devices we did not create.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::attach::{read_record, record_path, run_tool, which, Attachment, DEFAULT_STATE_DIR};

const RELEASE_TIMEOUT: Duration = Duration::from_secs(20);
const POLL_INTERVAL: Duration = Duration::from_millis(20);

#[derive(clap::Args, Debug)]
pub struct DetachArgs {
    /// Block device printed by `zbd attach` (e.g. /dev/loop3), or its /dev/zbd/NAME link.
    pub device: PathBuf,
    /// Directory of attach records (as given to `zbd attach`).
    #[arg(long, default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
}

pub fn run(mut args: DetachArgs) -> Result<std::process::ExitCode> {
    // `/dev/zbd/NAME` (made by `zbd attach --from-list`): detach its device, then remove it.
    let link = std::fs::symlink_metadata(&args.device)
        .is_ok_and(|m| m.file_type().is_symlink())
        .then(|| args.device.clone());
    if let Some(link) = &link {
        args.device = std::fs::canonicalize(link)
            .with_context(|| format!("{} points nowhere", link.display()))?;
    }
    let args = &args;
    let attachment = read_record(&args.state_dir, &args.device)?;
    if let Some(target) = mounted_at(attachment.device())? {
        bail!(
            "{} is mounted on {}: unmount it first",
            attachment.device().display(),
            target
        );
    }
    match &attachment {
        Attachment::Kernel { device } => {
            let client = which("nbd-client").context("`nbd-client` not found")?;
            run_tool(Command::new(client).arg("-d").arg(device))?;
        }
        Attachment::Fuse {
            device,
            mountpoint,
            nbdfuse_pid,
            work_dir,
        } => detach_fuse(device, mountpoint, *nbdfuse_pid, work_dir)?,
    }
    let record = record_path(&args.state_dir, &args.device);
    std::fs::remove_file(&record).with_context(|| format!("cannot remove {}", record.display()))?;
    if let Some(link) = &link {
        let _ = std::fs::remove_file(link);
    }
    Ok(std::process::ExitCode::SUCCESS)
}

fn detach_fuse(device: &Path, mountpoint: &Path, pid: u32, work_dir: &Path) -> Result<()> {
    let name = device
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .context("bad device path")?;
    let backing = PathBuf::from(format!("/sys/block/{name}/loop/backing_file"));
    let ours = mountpoint.join("disk");
    match std::fs::read_to_string(&backing) {
        // Still bound to our nbdfuse file: detach it and wait until the kernel lets go.
        Ok(file) if Path::new(file.trim()) == ours => {
            run_tool(Command::new("losetup").arg("-d").arg(device))?;
            wait_until("loop device to release", || !backing.exists())?;
        }
        // Bound to someone else's file: the record is stale and the device is not ours.
        Ok(file) => bail!(
            "{} now belongs to {} (not {}): leaving it alone",
            device.display(),
            file.trim(),
            ours.display()
        ),
        // Already detached.
        Err(_) => {}
    }
    if is_mountpoint(mountpoint)? {
        let deadline = Instant::now() + RELEASE_TIMEOUT;
        loop {
            match run_tool(Command::new("fusermount3").arg("-u").arg(mountpoint)) {
                Ok(_) => break,
                // The loop device may hold the file for a moment after `losetup -d`.
                Err(_) if Instant::now() < deadline => std::thread::sleep(POLL_INTERVAL),
                Err(error) => return Err(error),
            }
        }
    }
    // Unmounting makes nbdfuse exit by itself; stop it by PID only if it does not.
    if wait_until("nbdfuse to exit", || !is_nbdfuse(pid)).is_err() {
        let _ = Command::new("kill").arg(pid.to_string()).status();
        wait_until("nbdfuse to stop", || !is_nbdfuse(pid))?;
    }
    std::fs::remove_dir_all(work_dir)
        .with_context(|| format!("cannot remove {}", work_dir.display()))?;
    Ok(())
}

/// Where `device` is mounted, if anywhere (by major:minor, so any name for it matches).
fn mounted_at(device: &Path) -> Result<Option<String>> {
    let Ok(meta) = std::fs::metadata(device) else {
        return Ok(None);
    };
    let rdev = std::os::unix::fs::MetadataExt::rdev(&meta);
    // Linux dev_t layout (glibc gnu_dev_major/minor).
    let major = (rdev >> 8 & 0xfff) | (rdev >> 32 & !0xfff);
    let minor = (rdev & 0xff) | (rdev >> 12 & !0xff);
    let wanted = format!("{major}:{minor}");
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(mountinfo.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        (fields.get(2) == Some(&wanted.as_str())).then(|| fields.get(4).unwrap_or(&"?").to_string())
    }))
}

fn is_mountpoint(path: &Path) -> Result<bool> {
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let canonical = canonical.to_string_lossy();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(mountinfo
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(&*canonical)))
}

/// True while `pid` is a live nbdfuse (not some later process that reused the PID, nor a zombie).
fn is_nbdfuse(pid: u32) -> bool {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let zombie = stat
        .rsplit_once(')')
        .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
    comm.trim() == "nbdfuse" && !zombie
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + RELEASE_TIMEOUT;
    while !done() {
        if Instant::now() > deadline {
            bail!("timed out after {RELEASE_TIMEOUT:?} waiting for {what}");
        }
        std::thread::sleep(POLL_INTERVAL);
    }
    Ok(())
}
