//! The volume `zbd serve` serves, behind a gate, so that `zbd grow` can grow it while served
//! (docs/design.md, "Growing a served volume").
//!
//! The engine's geometry is fixed while a volume is open, so an online grow quiesces the
//! volume, closes it, grows it as the offline `zbd grow` does and opens it again, on the same
//! storage handle (its lock is never let go). Every user of the volume goes through the gate:
//! NBD requests and control requests hold its read side for their call, the grow holds the
//! write side from the quiesce to the reopen. So new requests wait while a grow runs, requests
//! in flight finish before it closes the volume, and nobody sees a volume being closed.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{anyhow, Result};
use parking_lot::{Mutex, RwLock};
use zbd_core::format::Superblock;
use zbd_core::{FileStorage, OpenOptions, Volume};

use crate::commands::grow::{self, GrowRequest};
use crate::thin;

/// The open volume, or why there is none.
enum Slot {
    Open(Arc<Volume>),
    /// A grow that could not open the volume again, or the server stopping: requests fail
    /// with EIO and this message.
    Gone(String),
}

/// What `--reserve` and the other thin-provisioning flags asked for; the reserve in bytes
/// follows the data area, so it is worked out again after a grow.
#[derive(Clone, Debug)]
pub struct ThinArgs {
    pub warn_used_pct: u8,
    pub reserve: String,
    pub when_full: thin::WhenFull,
    pub when_full_timeout: std::time::Duration,
}

/// The served volume (see the module doc).
pub struct ServedVolume {
    slot: RwLock<Slot>,
    /// Size of the volume last opened: what NBD handshakes are told once it is gone.
    size: AtomicU64,
    /// Set while a grow quiesces and swaps the volume: a write waiting for room
    /// (`--when-full queue`) stops waiting inside the old volume and waits at the gate instead.
    growing: AtomicBool,
    /// One grow at a time.
    grow_lock: Mutex<()>,
    /// Scrubs hold the read side for their whole run (they hold the volume outside the gate,
    /// for minutes or hours); a grow takes the write side only if no scrub runs.
    maintenance: RwLock<()>,
    /// A file or block device's storage, shared with the engine and kept across a grow's
    /// reopen; None for RADOS volumes (no online grow).
    file: Option<Arc<FileStorage>>,
    /// The volume as given to `zbd serve`.
    path: PathBuf,
    options: OpenOptions,
    thin_args: ThinArgs,
    thin: Mutex<thin::Settings>,
    /// Which side of the warning threshold the data area was last seen on; held while the
    /// crossing is logged, so that a request that met ENOSPC does not answer before the
    /// warning another one found is in the log.
    threshold: Mutex<thin::Threshold>,
    /// Why the volume is not served any more after a failed grow (the exit status says so).
    failure: Mutex<Option<String>>,
}

/// What an online grow did.
pub enum Grown {
    /// Nothing to change: the volume has those sizes already.
    Unchanged(Superblock),
    Grew {
        before: Superblock,
        after: Superblock,
    },
}

impl ServedVolume {
    /// Wraps a freshly opened `volume` of `path`; sets its space reserve (`thin_args`).
    /// `file` is its storage when it is a file or block device (the same handle the volume
    /// uses), `options` those it was opened with: a grow reopens it with them.
    pub fn new(
        volume: Volume,
        path: &Path,
        file: Option<Arc<FileStorage>>,
        options: OpenOptions,
        thin_args: ThinArgs,
    ) -> Result<Arc<ServedVolume>> {
        let settings = apply_thin(&volume, &thin_args, options.read_only)?;
        Ok(Arc::new(ServedVolume {
            size: AtomicU64::new(volume.size_bytes()),
            slot: RwLock::new(Slot::Open(Arc::new(volume))),
            growing: AtomicBool::new(false),
            grow_lock: Mutex::new(()),
            maintenance: RwLock::new(()),
            file,
            path: path.to_path_buf(),
            options,
            thin_args,
            thin: Mutex::new(settings),
            threshold: Mutex::new(thin::Threshold::default()),
            failure: Mutex::new(None),
        }))
    }

    /// Runs `f` on the open volume, holding the gate's read side: a grow waits for it, and it
    /// waits for a grow. `f` must not come back to the gate (a waiting grow would deadlock it).
    /// Err: why no volume is open.
    pub fn with<T>(&self, f: impl FnOnce(&Volume) -> T) -> Result<T, String> {
        match &*self.slot.read() {
            Slot::Open(volume) => Ok(f(volume)),
            Slot::Gone(why) => Err(why.clone()),
        }
    }

    /// Size of the volume (the last one opened, if none is open now).
    pub fn size_bytes(&self) -> u64 {
        self.with(|v| v.size_bytes())
            .unwrap_or_else(|_| self.size.load(Ordering::SeqCst))
    }

    /// Whether a grow is quiescing or swapping the volume (see `growing`).
    pub fn is_growing(&self) -> bool {
        self.growing.load(Ordering::SeqCst)
    }

    /// The thin-provisioning settings in force (the reserve follows the data area).
    pub fn thin(&self) -> thin::Settings {
        *self.thin.lock()
    }

    /// Stops a rollback in progress (`Volume::stop_rollbacks`) for a server that is stopping.
    /// A recursive read of the gate: a grow waiting for its write side (behind that very
    /// rollback) must not keep the stop from reaching it.
    pub fn stop_rollbacks(&self) {
        if let Slot::Open(volume) = &*self.slot.read_recursive() {
            volume.stop_rollbacks();
        }
    }

    /// Logs a crossing of the warning threshold, either way, since the last look. The watch
    /// thread looks every second; a request that meets ENOSPC looks before its error goes
    /// back, so a volume filled within a second still logs the warning before a client sees
    /// a write fail.
    pub fn watch_space(&self) {
        let warn_used_pct = self.thin().warn_used_pct;
        let mut threshold = self.threshold.lock();
        if let Ok(space) = self.with(|v| v.space()) {
            if let Some(line) = threshold.crossed(&space, warn_used_pct) {
                crate::log::line(line);
            }
        }
    }

    /// Runs a scrub-like job on the open volume outside the gate (it may take hours), with
    /// grows refused meanwhile. Err: why no volume is open.
    pub fn maintain<T>(&self, f: impl FnOnce(&Volume) -> T) -> Result<T, String> {
        let _no_grow = self.maintenance.read();
        let volume = match &*self.slot.read() {
            Slot::Open(volume) => Arc::clone(volume),
            Slot::Gone(why) => return Err(why.clone()),
        };
        Ok(f(&volume))
    }

    /// Why the volume stopped being served after a failed grow, if it did.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().clone()
    }

    /// Takes the volume out for the server's final close; requests from now on fail.
    pub fn shut_down(&self) -> Option<Arc<Volume>> {
        let mut slot = self.slot.write();
        match std::mem::replace(&mut *slot, Slot::Gone("the server is stopping".into())) {
            Slot::Open(volume) => Some(volume),
            Slot::Gone(why) => {
                *slot = Slot::Gone(why);
                None
            }
        }
    }

    /// `zbd grow` of this served volume (`--size`, `--capacity` as typed): checks the request
    /// against the volume as the offline grow does (a refusal changes nothing), extends the
    /// file, then quiesces the volume, closes it, writes the grown superblock and opens it
    /// again (`Volume::close_grown`). Returns once the grown volume serves. The error is one
    /// line for the user.
    pub fn grow(&self, request: &GrowRequest) -> Result<Grown, String> {
        let Some(_one) = self.grow_lock.try_lock() else {
            return Err("another zbd grow of this volume is running".into());
        };
        let Some(_no_scrub) = self.maintenance.try_write() else {
            return Err("a scrub of this volume is running (zbd scrub): grow once it ends".into());
        };
        let Some(file) = &self.file else {
            return Err("online grow works on files and block devices only".into());
        };
        if self.options.read_only {
            return Err(format!(
                "{} is served read-only: stop the server to grow it (zbd grow works offline \
                 then), or serve it writable",
                self.path.display()
            ));
        }
        let (old, failed) = self.with(|v| (v.superblock().clone(), v.stats().failed))?;
        if let Some(why) = failed {
            return Err(format!(
                "the volume stopped writing after {why}: not grown; see docs/operations.md, \
                 \"After a crash\" (exit 3 / fenced)"
            ));
        }
        // Before the file is extended and I/O paused: a volume that cannot grow (metadata
        // pages) kept its requests waiting at the gate only to be refused.
        self.with(|v| v.growable())?.map_err(|e| e.to_string())?;
        let grown = match grow::plan(request, &old).map_err(|e| format!("{e:#}"))? {
            None => return Ok(Grown::Unchanged(old)),
            Some(grown) => grown,
        };
        // The longer file is unused until a superblock says otherwise, so it is extended while
        // the volume still serves (the pause below stays as short as a close and an open).
        file.extend_to(grown.total_bytes(), &self.path)
            .map_err(|e| format!("{}: {e}", self.path.display()))?;

        // Quiesce: writes waiting for room give up their wait (they wait at the gate below and
        // try again on the grown volume), new requests queue on the gate, in-flight ones end.
        self.growing.store(true, Ordering::SeqCst);
        let _ = self.with(|v| v.wake_waiters());
        let mut slot = self.slot.write();
        let result = self.swap(&mut slot, file, request);
        self.growing.store(false, Ordering::SeqCst);
        drop(slot);
        result.map(|after| Grown::Grew { before: old, after })
    }

    /// The grow proper, under the gate's write side: close and grow the volume, open it again.
    fn swap(
        &self,
        slot: &mut Slot,
        file: &Arc<FileStorage>,
        request: &GrowRequest,
    ) -> Result<Superblock, String> {
        let volume = match std::mem::replace(slot, Slot::Gone("being grown".into())) {
            Slot::Open(volume) => volume,
            Slot::Gone(why) => {
                *slot = Slot::Gone(why.clone());
                return Err(why);
            }
        };
        // The reopen starts its dedup index where this open's ends (same volume, same budget).
        let index = volume.dedup_index_image();
        let grown = match volume.close_grown(request.size_bytes(), request.capacity_bytes()) {
            Ok(grown) => grown,
            Err(e) if !volume.is_closed() => {
                // Refused before anything was written: served as before.
                *slot = Slot::Open(volume);
                return Err(format!("{}: {e}", self.path.display()));
            }
            Err(e) => {
                return Err(self.gone(
                    slot,
                    format!(
                        "closing {} to grow it failed ({e}): it is not served any more; \
                         stop the server and start it again (the open recovers the volume, \
                         as it was or grown, with every flushed write)",
                        self.path.display()
                    ),
                ));
            }
        };
        // The old handle wrote its last (close_grown joined its thread): let it go.
        drop(volume);
        let reopened = Volume::open(Box::new(Arc::clone(file)), self.options.clone())
            .map_err(|e| anyhow!("{e}"))
            .and_then(|v| apply_thin(&v, &self.thin_args, false).map(|s| (v, s)));
        match reopened {
            Ok((volume, settings)) => {
                if let Some(image) = index {
                    // Refused only if dedup went off, which a grow does not do: nothing lost.
                    let _ = volume.restore_dedup_index(&image);
                }
                crate::commands::serve::log_opened(&self.path, &volume.stats());
                self.size.store(volume.size_bytes(), Ordering::SeqCst);
                *self.thin.lock() = settings;
                *slot = Slot::Open(Arc::new(volume));
                Ok(grown)
            }
            Err(e) => Err(self.gone(
                slot,
                format!(
                    "{} was grown, but opening it again failed ({e:#}): it is not served any \
                     more; stop the server and start it again",
                    self.path.display()
                ),
            )),
        }
    }

    /// Leaves the volume unserved after a failed grow: requests fail with `why`, which is
    /// logged and kept for the exit status.
    fn gone(&self, slot: &mut Slot, why: String) -> String {
        crate::log::line(format!("zbd: {why}"));
        *self.failure.lock() = Some(why.clone());
        *slot = Slot::Gone(why.clone());
        why
    }
}

/// Sets the space reserve `args` asks for on `volume` (sized from its data area) and logs a
/// reserve the open lent to writes; returns the settings in force.
fn apply_thin(volume: &Volume, args: &ThinArgs, read_only: bool) -> Result<thin::Settings> {
    let space = volume.space();
    let reserve = thin::parse_reserve(&args.reserve, space.data_area_bytes)?;
    if !read_only && volume.set_space_reserve(reserve) {
        crate::log::line(format!(
            "zbd: the volume is full (at its reserve of {}): the reserve is lent to writes so \
             the filesystem on it can be repaired (fsck); free space (trim) or zbd grow \
             --capacity before filling it again",
            crate::commands::human(reserve)
        ));
    }
    Ok(thin::Settings {
        warn_used_pct: args.warn_used_pct,
        // The reserve as the engine keeps it: whole extents.
        reserve_bytes: volume.space().reserve_bytes,
        when_full: args.when_full,
        when_full_timeout: args.when_full_timeout,
        served: true,
    })
}
