//! The volume's exclusive lock (docs/ceph.md, "The lock and fencing").
//!
//! - Taking it: the opener first watches the header object, then takes the `cls_lock` lock
//!   on it. A lock held by a holder that is gone (its PID is dead on this host, or it has no
//!   watch on the header any more: its watch expired) is taken over: the holder is
//!   blocklisted first, then its lock broken. A holder that answers a notify is alive: the
//!   open is refused. One that has a watch but does not answer is waited for, up to the
//!   lease, until its watch expires.
//! - Keeping it ([`Keeper`]): a thread re-asserts the lock every quarter lease (and renews
//!   the watch if it broke); every sync asserts it too; a write is not issued when the lock
//!   was last confirmed more than half a lease ago (the process was paused, or the checks
//!   fail) until it is confirmed again. Once the lock is lost, every write and sync fails, so
//!   the engine's fence stops the volume.

use crate::client::{Completion, IoCtx, Locker, Watch};
use crate::error::{errno_text, RadosError};
use crate::RadosTarget;
use parking_lot::Mutex;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Name of the `cls_lock` lock on the header object.
pub(crate) const LOCK_NAME: &str = "zbd";
/// How long a holder has to answer the notify that asks whether it is alive.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(3);
/// Shortest lease: librados pings a watch every 5 s (`objecter_tick_interval`), so a shorter
/// watch timeout would expire between pings of a healthy holder.
const LEASE_MIN: Duration = Duration::from_secs(10);

/// Whole seconds of `d`, at least 1.
fn seconds(d: Duration) -> u32 {
    u32::try_from(d.as_secs()).unwrap_or(u32::MAX).max(1)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Start time of process `pid` (clock ticks after boot, field 22 of /proc/PID/stat): with
/// the PID it names one process of this boot, even after the PID is reused.
fn start_time(pid: &str) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19).map(str::to_string)
}

/// `zbd:HOST:PID:START-NANOS`: who holds the lock, for messages ([`crate::describe`]) and to
/// tell whether its process is still there.
fn new_cookie() -> String {
    let pid = std::process::id().to_string();
    let start = start_time(&pid).unwrap_or_default();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("zbd:{}:{pid}:{start}-{nanos:08x}", hostname())
}

/// Why the process a cookie names is gone, if it ran on this host and has exited.
fn dead_on_this_host(cookie: &str, host: &str) -> Option<String> {
    let parts: Vec<&str> = cookie.split(':').collect();
    let ["zbd", their_host, pid, rest] = parts[..] else {
        return None;
    };
    if their_host != host || pid.parse::<u32>().is_err() {
        return None;
    }
    match start_time(pid) {
        None => Some(format!("its process (PID {pid}) on this host has exited")),
        // Cookies of older versions carry no start time: the PID is all we know.
        Some(now) => match rest.split_once('-') {
            Some((start, _)) if !start.is_empty() && start != now => Some(format!(
                "its process (PID {pid}) on this host has exited (the PID is another process now)"
            )),
            _ => None,
        },
    }
}

/// What became of a lock's holder.
enum Holder {
    /// It answered a notify: it is serving.
    Alive,
    /// It has a watch but did not answer: paused, hung or cut off; its watch expires a
    /// lease after its last ping.
    Unresponsive,
    /// It is gone (why): its lock may be taken over.
    Gone(String),
}

fn assess(io: &IoCtx, target: &RadosTarget, holder: &Locker) -> Result<Holder, RadosError> {
    if let Some(why) = dead_on_this_host(&holder.cookie, &hostname()) {
        return Ok(Holder::Gone(why));
    }
    let Some(id) = holder
        .client
        .strip_prefix("client.")
        .and_then(|id| id.parse::<u64>().ok())
    else {
        // Not a client we can ask: leave it to `zbd unlock`.
        return Ok(Holder::Alive);
    };
    let notified = match io.notify(&target.header_object(), NOTIFY_TIMEOUT) {
        Ok(notified) => notified,
        // Nobody's answer is known: never take that for the holder being gone.
        Err(rc) if rc == -libc::ETIMEDOUT => return Ok(Holder::Unresponsive),
        Err(rc) => {
            let what = "asking the lock holder whether it is alive";
            return Err(op_error(io, target, what, rc));
        }
    };
    if notified.acked.iter().any(|&(client, _)| client == id) {
        Ok(Holder::Alive)
    } else if notified.missed.iter().any(|&(client, _)| client == id) {
        Ok(Holder::Unresponsive)
    } else {
        Ok(Holder::Gone(
            "it has no watch on the volume any more (its watch expired: it died or lost the cluster)"
                .into(),
        ))
    }
}

/// Blocklists `holder`, then breaks its lock: from then on the OSDs refuse all its requests,
/// in flight or later, so it can never write to the volume again.
pub(crate) fn take_over(
    io: &IoCtx,
    target: &RadosTarget,
    holder: &Locker,
    blocklist_seconds: u32,
) -> Result<(), RadosError> {
    io.cluster()
        .blocklist(&holder.address, blocklist_seconds)
        .map_err(|e| match e {
            RadosError::Op { reason, .. } => RadosError::Op {
                what: format!(
                    "{target}: blocklisting {} (its lock is left as is)",
                    holder.address
                ),
                reason,
            },
            e => e,
        })?;
    match io.break_lock(&target.header_object(), LOCK_NAME, holder) {
        // Someone else broke it meanwhile.
        Err(rc) if rc == -libc::ENOENT => Ok(()),
        Err(rc) => Err(op_error(io, target, "breaking the lock", rc)),
        Ok(()) => Ok(()),
    }
}

/// Who holds the volume's lock.
pub(crate) fn lockers(io: &IoCtx, target: &RadosTarget) -> Result<Vec<Locker>, RadosError> {
    io.lockers(&target.header_object(), LOCK_NAME)
        .map_err(|rc| op_error(io, target, "listing the volume's lock", rc))
}

pub(crate) fn op_error(io: &IoCtx, target: &RadosTarget, what: &str, rc: i32) -> RadosError {
    if rc == -libc::EACCES || rc == -libc::EPERM {
        return RadosError::Permission {
            user: io.cluster().user().to_string(),
            what: format!("{what} of {target}"),
        };
    }
    RadosError::Op {
        what: format!("{target}: {what}"),
        reason: errno_text(rc),
    }
}

/// Takes the volume's lock (module doc), taking over from a holder that is gone; `creating`:
/// the header object may not exist yet (taking the lock creates it).
pub(crate) fn acquire(
    io: &Arc<IoCtx>,
    target: &RadosTarget,
    lease: Duration,
    creating: bool,
) -> Result<Keeper, RadosError> {
    let lease = lease.max(LEASE_MIN);
    let header = target.header_object();
    // Watch first: a lock holder always has a watch, so a new opener never mistakes one that
    // is still starting for a dead one.
    let mut watch = match io.watch(&header, seconds(lease)) {
        Ok(watch) => Some(watch),
        Err(rc) if rc == -libc::ENOENT && creating => None,
        Err(rc) if rc == -libc::ENOENT => return Err(RadosError::NoVolume(target.to_string())),
        // Part of taking the lock (needs the same caps): name it so.
        Err(rc) => return Err(op_error(io, target, "locking the volume", rc)),
    };
    let cookie = new_cookie();
    // An unresponsive holder's watch expires at most a lease after its last ping.
    let deadline = Instant::now() + lease + NOTIFY_TIMEOUT * 2;
    let in_use = |holder: String| RadosError::InUse {
        volume: target.to_string(),
        holder,
    };
    loop {
        match io.lock_exclusive(&header, LOCK_NAME, &cookie) {
            Ok(()) => break,
            Err(rc) if rc == -libc::EBUSY || rc == -libc::EEXIST => {}
            Err(rc) => return Err(op_error(io, target, "locking the volume", rc)),
        }
        let holders = lockers(io, target)?;
        let Some(holder) = holders.first() else {
            if Instant::now() >= deadline {
                return Err(in_use("another client (it just let go: retry)".into()));
            }
            // It let go between our lock and our look: try again, after a pause so that a
            // lock that keeps changing hands is not hammered.
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        match assess(io, target, holder)? {
            Holder::Alive => return Err(in_use(crate::describe(holder))),
            Holder::Unresponsive if Instant::now() >= deadline => {
                return Err(in_use(format!(
                    "{}, which does not answer but keeps its watch",
                    crate::describe(holder)
                )))
            }
            // The notify waited NOTIFY_TIMEOUT: ask again.
            Holder::Unresponsive => continue,
            // Bounded like the rest: a lock that keeps being retaken by others is in use.
            Holder::Gone(_) if Instant::now() >= deadline => {
                return Err(in_use(crate::describe(holder)))
            }
            Holder::Gone(why) => {
                take_over(io, target, holder, 0)?;
                tracing::warn!(
                    "{target}: took over the lock of {}: {why}; blocklisted {}",
                    crate::describe(holder),
                    holder.address
                );
            }
        }
    }
    if watch.is_none() {
        match io.watch(&header, seconds(lease)) {
            Ok(w) => watch = Some(w),
            Err(rc) => {
                let _ = io.unlock(&header, LOCK_NAME, &cookie);
                return Err(op_error(io, target, "locking the volume", rc));
            }
        }
    }
    Ok(Keeper::start(Arc::clone(io), target, cookie, watch, lease))
}

/// What the lock keeper shares with its thread.
struct Shared {
    io: Arc<IoCtx>,
    target: RadosTarget,
    cookie: String,
    lease: Duration,
    watch: Mutex<Option<Watch>>,
    /// When the lock was last confirmed.
    confirmed: Mutex<Instant>,
    /// Why the lock is lost; sticky.
    lost: Mutex<Option<String>>,
    /// One confirmation at a time.
    confirming: Mutex<()>,
}

impl Shared {
    /// Records the result of an assertion of the lock: `Err(rc)` from librados, or Ok.
    fn record(&self, result: Result<(), i32>) -> Result<(), String> {
        let rc = match result {
            Ok(()) => {
                *self.confirmed.lock() = Instant::now();
                return Ok(());
            }
            Err(rc) => rc,
        };
        let why = match -rc {
            libc::EBUSY => "another client holds it now",
            libc::ENOENT => "it was broken",
            libc::ESHUTDOWN => "this server was blocklisted",
            libc::EINVAL => "it was taken with another type or tag",
            // Not an answer about the lock (a timeout, an OSD down): no verdict yet.
            _ => {
                return Err(format!(
                    "{}: cannot confirm the volume's lock: {}",
                    self.target,
                    errno_text(rc)
                ))
            }
        };
        let mut lost = self.lost.lock();
        if lost.is_none() {
            let message = format!(
                "{}: lost the volume's lock ({why}: another server took the volume over)",
                self.target
            );
            tracing::error!("{message}; this server writes nothing more");
            *lost = Some(message);
        }
        Err(lost.clone().unwrap_or_default())
    }

    fn assert_locked(&self) -> Result<Completion, i32> {
        self.io
            .aio_assert_locked(&self.target.header_object(), LOCK_NAME, &self.cookie)
    }

    /// Asserts the lock now (one round trip).
    fn confirm(&self) -> Result<(), String> {
        let rc = self.assert_locked().and_then(|c| match c.wait() {
            rc if rc < 0 => Err(rc),
            _ => Ok(()),
        });
        self.record(rc)
    }

    /// The timer's work: renew a broken watch, then confirm the lock.
    fn refresh(&self) {
        if self.lost.lock().is_some() {
            return;
        }
        {
            let mut watch = self.watch.lock();
            let broken = match &*watch {
                Some(w) => self.io.watch_check(w).is_err(),
                None => true,
            };
            if broken {
                *watch = None;
                *watch = self
                    .io
                    .watch(&self.target.header_object(), seconds(self.lease))
                    .ok();
            }
        }
        let _one = self.confirming.lock();
        let _ = self.confirm();
    }
}

/// Keeps the lock while the volume is open (module doc); dropping it stops the timer,
/// unwatches and releases the lock.
pub(crate) struct Keeper {
    shared: Arc<Shared>,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Keeper {
    fn start(
        io: Arc<IoCtx>,
        target: &RadosTarget,
        cookie: String,
        watch: Option<Watch>,
        lease: Duration,
    ) -> Keeper {
        let shared = Arc::new(Shared {
            io,
            target: target.clone(),
            cookie,
            lease,
            watch: Mutex::new(watch),
            confirmed: Mutex::new(Instant::now()),
            lost: Mutex::new(None),
            confirming: Mutex::new(()),
        });
        let (stop, stopped) = mpsc::channel::<()>();
        let interval = (lease / 4).max(Duration::from_millis(500));
        let timer = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("zbd-rados-lock".into())
            .spawn(move || {
                // Until the keeper drops its sender.
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                    timer.refresh();
                }
            })
            .ok();
        Keeper {
            shared,
            stop: Some(stop),
            thread,
        }
    }

    /// Ok if a write may be issued: the lock is not lost and was confirmed within half a
    /// lease (if not, it is confirmed now).
    pub(crate) fn writable(&self) -> Result<(), String> {
        let fresh = || self.shared.confirmed.lock().elapsed() <= self.shared.lease / 2;
        if let Some(why) = &*self.shared.lost.lock() {
            return Err(why.clone());
        }
        if fresh() {
            return Ok(());
        }
        let _one = self.shared.confirming.lock();
        if fresh() {
            return Ok(());
        }
        self.shared.confirm()
    }

    /// Starts asserting the lock (for a sync: [`Keeper::finish_assert`] waits for it).
    pub(crate) fn start_assert(&self) -> Result<Completion, i32> {
        self.shared.assert_locked()
    }

    /// The result of an assertion [`Keeper::start_assert`] started.
    pub(crate) fn finish_assert(&self, started: Result<Completion, i32>) -> Result<(), String> {
        let rc = started.and_then(|c| match c.wait() {
            rc if rc < 0 => Err(rc),
            _ => Ok(()),
        });
        self.shared.record(rc)
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        drop(self.shared.watch.lock().take());
        let _ = self.shared.io.unlock(
            &self.shared.target.header_object(),
            LOCK_NAME,
            &self.shared.cookie,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cookie_names_this_process_which_is_alive() {
        let cookie = new_cookie();
        let host = hostname();
        assert!(cookie.starts_with(&format!("zbd:{host}:{}:", std::process::id())));
        assert_eq!(dead_on_this_host(&cookie, &host), None);
    }

    #[test]
    fn a_holder_is_dead_only_on_this_host_with_its_process_gone() {
        let host = hostname();
        // PIDs are below 2^22 on Linux.
        let gone = format!("zbd:{host}:99999999:123-0badcafe");
        assert!(dead_on_this_host(&gone, &host).is_some());
        assert_eq!(dead_on_this_host(&gone, "another-host"), None);
        // PID 1 is alive, but started at another time than the cookie says.
        let reused = format!("zbd:{host}:1:x-0badcafe");
        let why = dead_on_this_host(&reused, &host);
        assert!(why.is_some_and(|w| w.contains("another process")));
        // An old cookie (no start time) with a live PID: alive.
        assert_eq!(
            dead_on_this_host(&format!("zbd:{host}:1:0badcafe"), &host),
            None
        );
        assert_eq!(dead_on_this_host("not-zbd", &host), None);
    }
}
