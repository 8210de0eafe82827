//! The public volume handle: the engine ([`Inner`]) plus its background cleaner thread.

use crate::backend::Storage;
use crate::cleaner::PassResult;
use crate::engine::{AllocState, CheckReport, DeviceInfo, Inner, OpenOptions};
use crate::error::{Error, Result};
use crate::format::{Superblock, DEFAULT_DEVICE};
use crate::layout::CreateOptions;
use crate::map::DeviceSpace;
use crate::stats::{Space, Stats};
use crate::Codec;
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the cleaner thread looks at the watermarks when nobody wakes it.
const CLEANER_POLL: Duration = Duration::from_millis(200);

/// Bumped whenever space may have been freed (a trim or zeroing, a cleaner round that freed
/// extents): writers waiting for room (`Volume::wait_for_space`) try again.
#[derive(Default)]
struct Room {
    generation: Mutex<u64>,
    freed: Condvar,
}

impl Room {
    fn freed(&self) {
        *self.generation.lock() += 1;
        self.freed.notify_all();
    }
}

#[derive(Default)]
struct Signal {
    stop: bool,
    kick: bool,
    /// A write asked for a checkpoint (`Inner::checkpoint_asked`).
    checkpoint: bool,
}

/// A compressed block volume. `Send + Sync`: share it as `Arc<Volume>`.
pub struct Volume {
    inner: Arc<Inner>,
    signal: Arc<(Mutex<Signal>, Condvar)>,
    /// Whether a background thread was started (`cleaner` may have been joined since).
    background: bool,
    /// The background thread, until joined (on drop, or by `close_grown`).
    cleaner: Mutex<Option<JoinHandle<()>>>,
    room: Arc<Room>,
}

impl Volume {
    fn wrap(inner: Inner, background: bool) -> Volume {
        let inner = Arc::new(inner);
        let signal = Arc::new((Mutex::new(Signal::default()), Condvar::new()));
        let room = Arc::new(Room::default());
        let cleaner = background.then(|| {
            let inner = Arc::clone(&inner);
            let signal = Arc::clone(&signal);
            let room = Arc::clone(&room);
            std::thread::Builder::new()
                .name("zbd-cleaner".into())
                .spawn(move || cleaner_loop(&inner, &signal, &room))
                .ok()
        });
        let cleaner = cleaner.flatten();
        inner.checkpoint_in_background(cleaner.is_some());
        Volume {
            inner,
            signal,
            background: cleaner.is_some(),
            cleaner: Mutex::new(cleaner),
            room,
        }
    }

    /// Formats `storage` as a new volume and opens it.
    pub fn create(storage: Box<dyn Storage>, opts: &CreateOptions) -> Result<Volume> {
        Volume::create_with(storage, opts, OpenOptions::default())
    }

    /// Formats `storage` as a new volume and opens it with `open_opts`.
    pub fn create_with(
        storage: Box<dyn Storage>,
        opts: &CreateOptions,
        open_opts: OpenOptions,
    ) -> Result<Volume> {
        let background = open_opts.background_cleaner;
        Ok(Volume::wrap(
            Inner::create_with(storage, opts, open_opts)?,
            background,
        ))
    }

    /// Opens a volume, recovering from a crash if needed.
    pub fn open(storage: Box<dyn Storage>, opts: OpenOptions) -> Result<Volume> {
        let background = opts.background_cleaner && !opts.read_only;
        Ok(Volume::wrap(Inner::open(storage, opts)?, background))
    }

    /// Opens a volume read-only.
    pub fn open_read_only(storage: Box<dyn Storage>) -> Result<Volume> {
        Ok(Volume::wrap(Inner::open_read_only(storage)?, false))
    }

    /// Logical size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    /// The superblock (geometry).
    pub fn superblock(&self) -> &Superblock {
        self.inner.superblock()
    }

    /// Codec used for new writes.
    pub fn codec(&self) -> Codec {
        self.inner.codec()
    }

    /// Reads `buf.len()` bytes at byte `offset` of the default device.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_in(DEFAULT_DEVICE, offset, buf)
    }

    /// Writes `data` at byte `offset` of the default device; with `fua`, returns once it is
    /// durable.
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.write_in(DEFAULT_DEVICE, offset, data, fua)
    }

    /// Writes zeros over a range of the default device (whole blocks become zero-state
    /// entries, no data stored).
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.write_zeroes_in(DEFAULT_DEVICE, offset, len)
    }

    /// Discards a range of the default device; it reads back as zeros and its space is
    /// reclaimable at once.
    pub fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.trim_in(DEFAULT_DEVICE, offset, len)
    }

    /// The devices of the volume (design.md, "Devices"), in id order; one, the default,
    /// unless `create_device` made more.
    pub fn devices(&self) -> Vec<DeviceInfo> {
        self.inner.devices()
    }

    /// Stored bytes each device references and the part only it references (what deleting
    /// it would free), computed by a walk of the trees (design.md, "Stat"); in id order.
    pub fn device_space(&self) -> Result<Vec<DeviceSpace>> {
        self.inner.device_space()
    }

    /// Makes a new writable device `name` of `size` bytes (a multiple of 4 KiB), all
    /// unmapped, in one checkpoint; returns its id. Needs a volume with metadata pages and
    /// 64-byte records (format bits 10 and 11); sets bit 13.
    pub fn create_device(&self, name: &str, size: u64) -> Result<u32> {
        self.inner.create_device(name, size)
    }

    /// Deletes device `name` (not the default one): a writable device is first trimmed, in
    /// logged steps as any trim; then its row is marked as being deleted and its map given
    /// up in checkpointed steps, the last of which drops the row. A crash or an error
    /// between leaves it listed as "deleting", and deleting it again finishes.
    pub fn delete_device(&self, name: &str) -> Result<()> {
        let r = self.inner.delete_device(name);
        self.room.freed();
        r
    }

    /// Goes on with a delete a crash or an error stopped (device `id`, listed as "deleting")
    /// until it is done (true) or `until` has passed, between two of its checkpointed steps
    /// (false: call again). `zbd serve` finishes stopped deletes this way, a second of steps
    /// at a time, so a grow or a shutdown waits at most that long.
    pub fn finish_delete(&self, id: u32, until: std::time::Instant) -> Result<bool> {
        let r = self.inner.finish_delete(id, until);
        self.room.freed();
        r
    }

    /// Takes snapshot `name` of writable device `origin` (design.md, "Copy on write"): a
    /// read-only device that keeps what `origin` holds now, in one checkpoint, at O(1) cost
    /// (a row and a count); `origin` copies each map page the first time it changes it
    /// afterwards. Returns its id.
    pub fn snapshot(&self, origin: &str, name: &str) -> Result<u32> {
        self.inner.snapshot(origin, name)
    }

    /// Makes writable device `name` from snapshot `snapshot`, sharing its pages: instant, and
    /// independent of the snapshot from then on (deleting the snapshot keeps it).
    pub fn clone_snapshot(&self, snapshot: &str, name: &str) -> Result<u32> {
        self.inner.clone_snapshot(snapshot, name)
    }

    /// Clone `name` stops listing its origin, as `rbd flatten` ends a clone's dependence on
    /// its parent. Here a clone never depends on its snapshot (it holds its own references to
    /// every page and block it shares, and deleting the snapshot keeps them), so nothing is
    /// copied: one row change, in one checkpoint. Whether it listed an origin before.
    pub fn flatten(&self, name: &str) -> Result<bool> {
        self.inner.flatten(name)
    }

    /// Rolls writable device `name` back to `snapshot`, one of its own snapshots: what it
    /// wrote since is given up (through the trim path), then it shares the snapshot's pages.
    pub fn rollback(&self, name: &str, snapshot: &str) -> Result<()> {
        let r = self.inner.rollback(name, snapshot);
        self.room.freed();
        r
    }

    /// [`Volume::rollback`], asking `ready(device id)` before the device is marked and again
    /// once the mark is durable and no new client can find it; a refusal puts the mark back
    /// as it was (a server: "no NBD client has it open").
    pub fn rollback_when(
        &self,
        name: &str,
        snapshot: &str,
        ready: &dyn Fn(u32) -> Result<()>,
    ) -> Result<()> {
        let r = self.inner.rollback_when(name, snapshot, ready);
        self.room.freed();
        r
    }

    /// Has a rollback that is emptying its device stop at its next chunk (1 GiB of written
    /// blocks) with an error, and any later one before it starts emptying: a server that is
    /// closing does not wait for a large device. The stopped rollback is listed as "rolling
    /// back" and the next open finishes it, as after a power cut.
    pub fn stop_rollbacks(&self) {
        self.inner.stop_rollbacks();
    }

    /// Finishes the stopped rollback of device `name` to the snapshot its mark names, if it
    /// is still unfinished when the device operations' turn comes (another may have finished
    /// it since it was listed); the snapshot's name when it finished one.
    pub fn finish_rollback(&self, name: &str) -> Result<Option<String>> {
        let r = self.inner.finish_rollback(name);
        self.room.freed();
        r
    }

    /// Rollbacks a crash or an error stopped part way, as (device, snapshot) names: each
    /// device is listed as "rolling back" and may read part emptied until `rollback` with the
    /// same names finishes it.
    pub fn unfinished_rollbacks(&self) -> Vec<(String, String)> {
        self.inner.unfinished_rollbacks()
    }

    /// Byte ranges (offset, length) where devices `a` and `b` (of one size: a device and its
    /// snapshots, or two snapshots) differ; pages they share are not read.
    pub fn diff(&self, a: &str, b: &str) -> Result<Vec<(u64, u64)>> {
        self.inner.diff(a, b)
    }

    /// Reads `buf.len()` bytes at byte `offset` of `device`.
    pub fn read_in(&self, device: u32, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read(device, offset, buf)
    }

    /// [`Volume::write`] on `device`.
    pub fn write_in(&self, device: u32, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        let r = self.inner.write(device, offset, data, fua);
        self.kick_checkpoint_if_asked();
        self.kick_if_low();
        r
    }

    /// [`Volume::write_zeroes`] on `device`.
    pub fn write_zeroes_in(&self, device: u32, offset: u64, len: u64) -> Result<()> {
        let r = self.inner.write_zeroes(device, offset, len);
        self.kick_checkpoint_if_asked();
        self.room.freed();
        r
    }

    /// [`Volume::trim`] on `device`.
    pub fn trim_in(&self, device: u32, offset: u64, len: u64) -> Result<()> {
        let r = self.inner.trim(device, offset, len);
        self.kick_checkpoint_if_asked();
        self.room.freed();
        r
    }

    /// Writes like [`Volume::write`], but a write that finds no space (`NoSpace`) waits for
    /// room instead of failing at once (`zbd serve --when-full queue`, as dm-thin queues I/O
    /// when its pool is full): it wakes the cleaner and tries again each time space may have
    /// been freed (a trim or zeroing, a cleaner round that freed extents), until `deadline`;
    /// then it fails with `NoSpace`. A failed write changed nothing another try would not
    /// write again, so trying again is safe.
    pub fn write_or_wait(
        &self,
        offset: u64,
        data: &[u8],
        fua: bool,
        deadline: Instant,
    ) -> Result<()> {
        self.write_or_wait_while(DEFAULT_DEVICE, offset, data, fua, deadline, &|| true)
    }

    /// [`Volume::write_or_wait`] that also gives up (with `NoSpace`) once `keep_waiting` says
    /// no, checked after every failed try: a server about to close the volume (online grow)
    /// makes it say no and calls [`Volume::wake_waiters`], so that no write waits for room
    /// inside a volume that is closing; the server then tries the write again on the volume it
    /// opens.
    pub fn write_or_wait_while(
        &self,
        device: u32,
        offset: u64,
        data: &[u8],
        fua: bool,
        deadline: Instant,
        keep_waiting: &dyn Fn() -> bool,
    ) -> Result<()> {
        loop {
            let seen = *self.room.generation.lock();
            match self.write_in(device, offset, data, fua) {
                Err(Error::NoSpace) if Instant::now() < deadline && keep_waiting() => {}
                other => return other,
            }
            if self.background {
                let (m, cv) = &*self.signal;
                m.lock().kick = true;
                cv.notify_one();
            }
            let mut generation = self.room.generation.lock();
            while *generation == seen {
                if self
                    .room
                    .freed
                    .wait_until(&mut generation, deadline)
                    .timed_out()
                {
                    break;
                }
            }
            if *generation == seen {
                return Err(Error::NoSpace);
            }
        }
    }

    /// Wakes every write waiting for room (`write_or_wait_while`), which tries again and asks
    /// its `keep_waiting`.
    pub fn wake_waiters(&self) {
        self.room.freed();
    }

    /// Makes everything written so far durable.
    pub fn flush(&self) -> Result<()> {
        self.inner.flush()
    }

    /// Writes a checkpoint now.
    pub fn checkpoint(&self) -> Result<()> {
        self.inner.checkpoint()
    }

    /// Allocation state of a byte range of the default device, as runs of (length, state).
    pub fn allocation(&self, offset: u64, len: u64) -> Result<Vec<(u64, AllocState)>> {
        self.allocation_in(DEFAULT_DEVICE, offset, len)
    }

    /// [`Volume::allocation`] on `device`.
    pub fn allocation_in(
        &self,
        device: u32,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(u64, AllocState)>> {
        self.inner.allocation(device, offset, len)
    }

    /// Current statistics.
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }

    /// Sets the space reserve after opening (`OpenOptions::space_reserve_bytes`, e.g. as a
    /// share of the data area, known only once open): lends it at once if the volume is at it,
    /// as an open does. True when lent.
    pub fn set_space_reserve(&self, bytes: u64) -> bool {
        self.inner.set_space_reserve(bytes)
    }

    /// How full the data area is (cheap: no walk of the extent table, unlike `stats`).
    pub fn space(&self) -> Space {
        self.inner.space()
    }

    /// Verifies metadata and every stored block.
    pub fn check(&self, progress: &dyn Fn(u64, u64)) -> CheckReport {
        self.inner.check(progress)
    }

    /// Verifies every stored block of a volume in use at a bounded rate (bytes per second of
    /// stored data read; `None` = unbounded) and records when it ran and what it found.
    pub fn scrub(&self, rate: Option<u64>, progress: &dyn Fn(u64, u64)) -> CheckReport {
        self.inner.scrub(rate, progress)
    }

    /// Runs one background-style cleaning round now (if below the low watermark).
    pub fn clean(&self) -> Result<()> {
        self.inner.background_round()
    }

    /// Offline compaction of every extent with dead space.
    pub fn compact(&self, progress: &dyn Fn(u64, u64)) -> Result<PassResult> {
        self.inner.compact(progress)
    }

    /// One post-process deduplication pass (offline: nothing else may write meanwhile):
    /// blocks equal byte for byte to an earlier block become references to its stored copy.
    /// Needs a volume with metadata pages (format bits 10 and 11); sets bit 12.
    pub fn dedup(&self, progress: &dyn Fn(u64, u64)) -> Result<crate::DedupReport> {
        self.inner.dedup(progress)
    }

    /// The inline dedup index of this open as bytes, for the next open of the same volume to
    /// begin with ([`Volume::restore_dedup_index`]); `None` when dedup is off in this open.
    /// The index holds hints only, so an image may be stale or lost without harm.
    pub fn dedup_index_image(&self) -> Option<Vec<u8>> {
        self.inner.dedup_index_image()
    }

    /// Starts the inline dedup index from `image` (made by [`Volume::dedup_index_image`] of this
    /// volume, with the same `--dedup-index` budget); the hooks it holds, or why it was refused
    /// (another volume, another budget, damaged, or dedup off in this open). A refused image
    /// leaves the index as it was.
    pub fn restore_dedup_index(&self, image: &[u8]) -> std::result::Result<u64, String> {
        self.inner.restore_dedup_index(image)
    }

    /// Trains and installs a new dictionary from `samples` now (tests: a forced retrain).
    /// Says whether a new dictionary serves new blocks from now on, and if not, why.
    #[doc(hidden)]
    pub fn retrain_dictionary(&self, samples: Vec<Vec<u8>>) -> Result<crate::Retrained> {
        self.inner.retrain_with(samples)
    }

    /// Stops the cleaner, writes back the extent buffer and writes a final checkpoint.
    pub fn close(&self) -> Result<()> {
        self.stop_cleaner();
        self.inner.close()
    }

    /// Closes the volume cleanly and upgrades it in place to the current format (v2 -> v3,
    /// offline: `zbd upgrade`); returns the new superblock; reopen to use the volume. A volume
    /// already current or of format 1 is refused before anything is written (the handle stays
    /// open); after a failed write the volume is the old format or the new one, never neither.
    pub fn close_upgraded(&self) -> Result<Superblock> {
        self.stop_cleaner();
        self.inner.close_upgraded()
    }

    /// Closes the volume cleanly and writes its settings (`format::SB_SETTING_*`: what opens do
    /// unless their options say otherwise) into both superblock copies, as `close_grown` writes
    /// a grown geometry; returns the new superblock. Refused before anything is written (the
    /// handle stays open) when the volume is read-only, failed or closed, or a setting needs a
    /// format the volume lacks (dedup: metadata pages).
    pub fn close_with_settings(&self, settings: u32) -> Result<Superblock> {
        let new = self.inner.plan_settings(settings)?;
        self.close_rewritten(new)
    }

    /// Stops the background thread, closes cleanly and writes `new` over the superblock.
    fn close_rewritten(&self, new: Superblock) -> Result<Superblock> {
        self.stop_cleaner();
        if let Some(thread) = self.cleaner.lock().take() {
            let _ = thread.join();
        }
        self.inner.close_rewritten(&new)?;
        Ok(new)
    }

    /// Closes the volume cleanly and grows it in place to a logical size of `logical_bytes`
    /// and/or a data area of `capacity_bytes` (`layout::grow`; `zbd grow` of a served volume,
    /// whose server then opens it again); returns the new superblock. Call it with no request
    /// in flight, as `close`.
    ///
    /// Refused before anything is written, the handle staying open and usable (see
    /// [`Volume::is_closed`]), when `layout::grow` refuses the sizes, the volume is read-only,
    /// failed or closed, or the storage is shorter than the grown volume (extend it first, e.g.
    /// `FileStorage::extend_to`). Past those checks the handle is closed whatever happens: the
    /// background thread is joined (nothing of this handle writes after the new superblock), a
    /// final checkpoint written, then the superblock copies as `layout::write_superblock_update`
    /// writes them. A crash or an error at any point leaves a volume that opens as it was or
    /// grown, with every write the close made durable.
    pub fn close_grown(
        &self,
        logical_bytes: Option<u64>,
        capacity_bytes: Option<u64>,
    ) -> Result<Superblock> {
        let grown = self.inner.plan_grow(logical_bytes, capacity_bytes)?;
        self.close_rewritten(grown)
    }

    /// Why [`Volume::close_grown`] would refuse this open at any size (read-only, failed,
    /// closed, metadata pages), if it would: asked before the storage is extended.
    pub fn growable(&self) -> Result<()> {
        self.inner.growable()
    }

    /// Whether the handle is closed (`close`, `close_grown`, `abandon`): it serves nothing more.
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Drops the handle without writing anything more, like a killed process (buffered,
    /// unflushed writes are lost; the next open recovers). For tests and crash drills.
    pub fn abandon(self) {
        self.inner.mark_closed();
    }

    fn kick_if_low(&self) {
        if self.background && self.inner.below_low_watermark() {
            let (m, cv) = &*self.signal;
            m.lock().kick = true;
            cv.notify_one();
        }
    }

    /// Hands a checkpoint a write asked for to the background thread.
    fn kick_checkpoint_if_asked(&self) {
        if self.inner.take_checkpoint_request() {
            let (m, cv) = &*self.signal;
            m.lock().checkpoint = true;
            cv.notify_one();
        }
    }

    fn stop_cleaner(&self) {
        let (m, cv) = &*self.signal;
        m.lock().stop = true;
        cv.notify_all();
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        self.stop_cleaner();
        if let Some(t) = self.cleaner.get_mut().take() {
            let _ = t.join();
        }
        // Best effort: a volume dropped without close() is recovered on the next open anyway.
        let _ = self.inner.close();
    }
}

fn cleaner_loop(inner: &Inner, signal: &(Mutex<Signal>, Condvar), room: &Room) {
    let (m, cv) = signal;
    loop {
        let checkpoint = {
            let mut s = m.lock();
            if !s.stop && !s.kick && !s.checkpoint {
                cv.wait_for(&mut s, CLEANER_POLL);
            }
            if s.stop {
                return;
            }
            s.kick = false;
            std::mem::take(&mut s.checkpoint)
        };
        // After a failed checkpoint the next allocation from the low queue asks again, and a
        // write that finds the queue empty writes one itself (`State::alloc`) and sees the
        // error. A failed sync has tripped the fence: every later write and flush fails.
        if checkpoint {
            if let Err(e) = inner.checkpoint_unlocked(true) {
                tracing::warn!("background checkpoint failed: {e}");
            }
        }
        // Errors (e.g. NoSpace while relocating) end this round; host writes see them directly.
        let free = inner.free_extents();
        let _ = inner.background_round();
        if checkpoint || inner.free_extents() > free {
            room.freed();
        }
    }
}
