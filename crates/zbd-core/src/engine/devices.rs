//! Devices of one volume (design.md, "Devices"; build order step 3, first form): named block
//! devices beside the default one, each with its own size and map tree in the catalog,
//! sharing the data area, the log and (with dedup on) stored blocks. A block of device `d` is
//! the block key `block_key(d, lba)` everywhere below this module (`format::DEVICE_KEY_STRIDE`),
//! so the write and read paths, the log and the cleaner treat all devices alike.
//!
//! A create or a delete is one checkpoint: the row and its tree are in the catalog from that
//! checkpoint on, and checkpoints carry format bit 13 while more than one row exists (written
//! before any record names another device, since the create's own checkpoint carries it).
//! A delete first trims the device's whole range through the ordinary trim path (logged
//! steps, so a crash replays what was freed), then drops the emptied row in its checkpoint.

use super::Inner;
use crate::error::{Error, Result};
use crate::format::{
    block_key, DeviceKind, DeviceRow, BLOCK_BYTES, DEFAULT_DEVICE, DEVICE_KEY_MAX,
    DEVICE_KEY_STRIDE, SEG_FLAG_WIDE_RECORDS,
};
use crate::map::{DeviceSpace, VolumeMap};
use crate::stats::DeviceInfo;
use std::sync::atomic::Ordering;

/// Budget of one step of a device delete, in one hold of the state lock, each step ending in a
/// checkpoint: ~57 full leaves (a few milliseconds of SBT updates), and at most 513 pages freed
/// (`RELEASE_PAGE_COST`): a step starts on a window at most half full (else a checkpoint comes
/// first), so its frees keep the window within what the pair-state list allows (`window_max`,
/// ~2,000 entries on the smallest list).
pub const RELEASE_STEP: u64 = 64 * 256;

impl Inner {
    /// The devices, in id order (a v2 map has only the default one).
    pub fn devices(&self) -> Vec<DeviceInfo> {
        self.devices_of(&self.state.lock().map)
    }

    /// The devices of `map`, this volume's (its state lock held).
    pub(super) fn devices_of(&self, map: &VolumeMap) -> Vec<DeviceInfo> {
        match map {
            VolumeMap::Tree(t) => {
                let rolling: Vec<u32> = t.unfinished_rollbacks().iter().map(|r| r.0).collect();
                t.devices()
                    .iter()
                    .map(|r| DeviceInfo::of(r, rolling.contains(&r.id)))
                    .collect()
            }
            VolumeMap::Pages(_) => vec![DeviceInfo {
                id: DEFAULT_DEVICE,
                name: "default".into(),
                kind: "default",
                made_as: "default",
                size_bytes: self.size_bytes(),
                created_at: 0,
                writable: !self.read_only,
                parent: 0,
            }],
        }
    }

    /// Referenced and unique stored bytes of every device (`Volume::device_space`), by a
    /// walk under the state lock (design.md, "Stat"); a v2 map's one device references and
    /// owns all live bytes.
    pub fn device_space(&self) -> Result<Vec<DeviceSpace>> {
        let mut st = self.state.lock();
        match &mut st.map {
            VolumeMap::Tree(t) => t.space(),
            VolumeMap::Pages(m) => {
                let live = m.counters().live_bytes;
                Ok(vec![DeviceSpace {
                    id: DEFAULT_DEVICE,
                    referenced_bytes: live,
                    unique_bytes: live,
                }])
            }
        }
    }

    /// The id of device `name`.
    pub fn device_id(&self, name: &str) -> Result<u32> {
        self.devices()
            .into_iter()
            .find(|d| d.name == name)
            .map(|d| d.id)
            .ok_or_else(|| Error::Invalid(format!("no device named {name:?} in this volume")))
    }

    /// Size in bytes of `device`, and whether it takes writes (a snapshot does not).
    pub(super) fn device_size(&self, device: u32) -> Result<(u64, bool)> {
        if device == DEFAULT_DEVICE {
            return Ok((self.size_bytes(), true));
        }
        let st = self.state.lock();
        let blocks = st.map.blocks_of(device);
        let writable = st.map.writable(device);
        blocks
            .map(|b| (b * BLOCK_BYTES as u64, writable))
            .ok_or_else(|| Error::Invalid(format!("no device {device} in this volume")))
    }

    /// Makes a new writable device (`Volume::create_device`).
    pub fn create_device(&self, name: &str, size: u64) -> Result<u32> {
        self.check_writable()?;
        let _ops = self.device_ops.lock();
        if size == 0 || !size.is_multiple_of(BLOCK_BYTES as u64) {
            return Err(Error::Invalid(format!(
                "device size {size}: a positive multiple of 4096 bytes"
            )));
        }
        let blocks = size / BLOCK_BYTES as u64;
        if blocks > DEVICE_KEY_STRIDE {
            return Err(Error::Invalid(format!(
                "device size {size}: at most {} bytes",
                DEVICE_KEY_STRIDE * BLOCK_BYTES as u64
            )));
        }
        if self.ctx().form.flags & SEG_FLAG_WIDE_RECORDS == 0 {
            return Err(Error::Invalid(
                "devices need a volume with metadata pages and 64-byte records \
                 (zbd create --metadata-pages)"
                    .into(),
            ));
        }
        let mut st = self.lock_for_write();
        let cx = self.ctx();
        let created_seq = st.next_seq;
        let VolumeMap::Tree(t) = &mut st.map else {
            return Err(Error::Invalid(
                "devices need a volume with metadata pages (zbd create --metadata-pages)".into(),
            ));
        };
        let created_at = unix_now();
        let id = t.add_device(DeviceRow {
            id: 0,
            parent: 0,
            kind: DeviceKind::Other,
            depth: 1,
            flags: 0,
            root: crate::format::ChildSlot::AllUnmapped,
            name: name.to_owned(),
            blocks,
            created_seq,
            created_at,
            bytes_used: 0,
            blocks_used: 0,
            epoch: 0,
            pages_max: 0,
        })?;
        if id > DEVICE_KEY_MAX {
            t.remove_device(id)?;
            return Err(Error::Invalid(format!(
                "device ids are used up (a block key names ids up to {DEVICE_KEY_MAX})"
            )));
        }
        // The row is durable, and bit 13 with it, before any record can name the device.
        st.checkpoint(&cx)?;
        Ok(id)
    }

    /// Deletes device `name` (`Volume::delete_device`). A writable device is emptied through
    /// the trim path first; then the row is marked as being deleted in one checkpoint, and
    /// its tree is given up in steps of [`RELEASE_STEP`] pages and entries, each in one hold
    /// of the state lock and made durable by its own checkpoint, so writers to other devices
    /// wait at most a step and a checkpoint; the last step's checkpoint drops the row. A
    /// crash or an error between steps leaves the row marked ("deleting"): deleting it again
    /// finishes.
    pub fn delete_device(&self, name: &str) -> Result<()> {
        self.check_writable()?;
        let _ops = self.device_ops.lock();
        let id = self.device_id(name)?;
        if id == DEFAULT_DEVICE {
            return Err(Error::Invalid(
                "the default device is the volume's own: it cannot be deleted".into(),
            ));
        }
        if let Some((d, _)) = self
            .unfinished_rollbacks()
            .into_iter()
            .find(|(_, s)| s == name)
        {
            return Err(Error::Invalid(format!(
                "{name:?} is the snapshot an unfinished rollback of {d:?} goes to: roll {d:?} \
                 back to it first (zbd rollback VOL@{name})"
            )));
        }
        if !self.deleting(id) {
            let (size, writable) = self.device_size(id)?;
            if writable {
                // A writable device gives its blocks up through the trim path first, in
                // logged steps: what it made and another device keeps has its items made
                // shared before it is let go (invariant P), everything else is freed.
                self.emptied(id, name, size)?;
            }
            self.checkpoint_first()?;
            let mut st = self.lock_for_write();
            let cx = self.ctx();
            if writable {
                Self::check_empty(&mut st, id, name, size)?;
            }
            // From this checkpoint on no record names the device and no request reaches
            // it: what replay rebuilds never writes under a tree being given up.
            // A rollback of it that stopped part way has nothing left to finish.
            let t = Self::tree_of(&mut st);
            t.mark_rollback(id, None)?;
            t.mark_deleting(id)?;
            st.checkpoint(&cx)?;
        }
        self.release_steps(id, None)
            .or_else(|e| self.gone_is_done(id, e))
            .map(|_| ())
    }

    /// Goes on with the delete of device `id`, marked as being deleted, until it is done
    /// (true) or `until` has passed (false, between two steps; `Volume::finish_delete`).
    /// By id: a device of the same name made since is never touched. True also when no row
    /// of that id is left (another delete finished it).
    pub fn finish_delete(&self, id: u32, until: std::time::Instant) -> Result<bool> {
        self.check_writable()?;
        let _ops = self.device_ops.lock();
        if !self.deleting(id) {
            let not = Error::Invalid(format!("device {id} is not being deleted"));
            return self.gone_is_done(id, not);
        }
        self.release_steps(id, Some(until))
            .or_else(|e| self.gone_is_done(id, e))
    }

    /// Error `e` when device `id` still has a row; done when it has none (a concurrent
    /// delete, `zbd serve` finishing it while the user repeats it, removed the row first).
    fn gone_is_done(&self, id: u32, e: Error) -> Result<bool> {
        match self.devices().iter().any(|d| d.id == id) {
            true => Err(e),
            false => Ok(true),
        }
    }

    /// Gives up the tree of device `id`, marked as being deleted, step by step; each step's
    /// checkpoint makes it durable, the last one drops the row. Stops between steps once
    /// `until` has passed (returns false).
    fn release_steps(&self, id: u32, until: Option<std::time::Instant>) -> Result<bool> {
        loop {
            let mut st = self.lock_for_write();
            let cx = self.ctx();
            if Self::tree_of(&mut st).window_half_full() {
                st.checkpoint(&cx)?;
            }
            let mut freed = Vec::new();
            let step =
                Self::tree_of(&mut st).release_device_step(id, RELEASE_STEP, |e| freed.push(e));
            st.account_promoted();
            // Every entry the tree gave up is accounted, even when one fails or the step
            // stopped on an error: what it gave up is gone from the tree whatever happens
            // here, so stopping at the first failed reference drop would leak every item
            // after it (direct ones with their extent charges), not just that one reference
            // (`State::apply_range` does the same).
            let mut first_error = None;
            for old in freed {
                if let Err(e) = st.account(old, crate::format::MapEntry::UNMAPPED) {
                    first_error.get_or_insert(e);
                }
            }
            let done = step?;
            if let Some(e) = first_error {
                return Err(e);
            }
            st.checkpoint(&cx)?;
            if done {
                return Ok(true);
            }
            if until.is_some_and(|t| std::time::Instant::now() >= t) {
                return Ok(false);
            }
        }
    }

    /// Whether device `id` is being deleted (a delete a crash or an error stopped).
    fn deleting(&self, id: u32) -> bool {
        match &self.state.lock().map {
            VolumeMap::Tree(t) => t.deleting(id),
            VolumeMap::Pages(_) => false,
        }
    }

    /// The page tree map of a volume with devices beside the default one.
    fn tree_of(st: &mut crate::state::State) -> &mut crate::map::TreeMap {
        match &mut st.map {
            VolumeMap::Tree(t) => t,
            VolumeMap::Pages(_) => {
                unreachable!("a device beside the default one lives in a page tree")
            }
        }
    }

    /// Trims the whole of writable device `id` (`name`, `size` bytes). An error keeps its kind
    /// (a full data area is ENOSPC to the caller, not an invalid request); only a refusal
    /// names the device.
    fn emptied(&self, id: u32, name: &str, size: u64) -> Result<()> {
        self.emptied_range(id, name, 0, size)
    }

    fn emptied_range(&self, id: u32, name: &str, offset: u64, len: u64) -> Result<()> {
        self.trim(id, offset, len).map_err(|e| match e {
            Error::Invalid(why) => Error::Invalid(format!("device {name:?}: emptying it: {why}")),
            other => other,
        })
    }

    /// [`Inner::emptied`] for a rollback, in chunks of `ROLLBACK_CHUNK` bytes from each next
    /// mapped block, so that closing the volume (`Volume::stop_rollbacks`) does not wait for
    /// a large device: between chunks it stops with an error, and the rollback's durable mark
    /// has the next open finish it.
    fn emptied_for_rollback(&self, id: u32, name: &str, size: u64) -> Result<()> {
        const ROLLBACK_CHUNK: u64 = 1 << 30;
        let bs = BLOCK_BYTES as u64;
        let base = self.check_range(id, 0, size, true)?;
        let mut at = 0;
        while at < size {
            if self.rollbacks_stopped.load(Ordering::SeqCst) {
                return Err(Error::Invalid(format!(
                    "device {name:?}: its rollback stopped as the volume closes; it is listed \
                     as \"rolling back\" and the next open finishes it"
                )));
            }
            let next = self
                .state
                .lock()
                .map
                .first_mapped(base + at / bs, (size - at).div_ceil(bs))?;
            let Some(key) = next else {
                return Ok(());
            };
            let from = (key - base) * bs;
            let to = size.min(from + ROLLBACK_CHUNK);
            self.emptied_range(id, name, from, to - from)?;
            at = to;
        }
        Ok(())
    }

    /// Every block of device `id` must be unmapped after its trim: one written since (a
    /// request that was in flight) would be lost with the tree without its space being freed.
    fn check_empty(st: &mut crate::state::State, id: u32, name: &str, size: u64) -> Result<()> {
        let mut written = 0u64;
        st.map
            .runs(block_key(id, 0), size / BLOCK_BYTES as u64, |s, n| {
                if s != crate::format::BlockState::Unmapped {
                    written += n;
                }
            })?;
        if written > 0 {
            return Err(Error::Invalid(format!(
                "device {name:?} was written while it was emptied ({written} blocks); \
                 try again"
            )));
        }
        Ok(())
    }

    /// Takes snapshot `name` of writable device `origin` (`Volume::snapshot`): a read-only
    /// device sharing every page of the origin's tree, made in one checkpoint. O(1): one row
    /// and one count; the origin copies a page the first time it changes it afterwards.
    pub fn snapshot(&self, origin: &str, name: &str) -> Result<u32> {
        let source = self.device_id(origin)?;
        self.add_shared(source, DeviceKind::Snapshot, name)
    }

    /// Makes writable device `name` from snapshot `snapshot` (`Volume::clone_snapshot`),
    /// sharing its pages, in one checkpoint.
    pub fn clone_snapshot(&self, snapshot: &str, name: &str) -> Result<u32> {
        let source = self.device_id(snapshot)?;
        self.add_shared(source, DeviceKind::Clone, name)
    }

    /// A checkpoint outside the state lock before a device operation's own, which it writes
    /// with the lock held and every request waits for: that one then carries only the pages
    /// dirtied in between, not a whole interval's (up to 3,072 under random writes).
    fn checkpoint_first(&self) -> Result<()> {
        if self.state.lock().map.cache_stats().dirty_pages == 0 {
            return Ok(());
        }
        self.checkpoint_unlocked(false)
    }

    fn add_shared(&self, source: u32, kind: DeviceKind, name: &str) -> Result<u32> {
        self.check_writable()?;
        let _ops = self.device_ops.lock();
        if self.ctx().form.flags & SEG_FLAG_WIDE_RECORDS == 0 {
            return Err(Error::Invalid(
                "snapshots need a volume with metadata pages and 64-byte records \
                 (zbd create --metadata-pages)"
                    .into(),
            ));
        }
        self.checkpoint_first()?;
        let mut st = self.lock_for_write();
        let cx = self.ctx();
        let created = (st.next_seq, unix_now());
        let VolumeMap::Tree(t) = &mut st.map else {
            return Err(Error::Invalid(
                "snapshots need a volume with metadata pages (zbd create --metadata-pages)".into(),
            ));
        };
        // A device a rollback has emptied part way would give a snapshot or clone its holes.
        if t.unfinished_rollbacks().iter().any(|&(d, _)| d == source) {
            return Err(Error::Invalid(format!(
                "{name:?}: its source is being rolled back (listed as \"rolling back\"): \
                 finish the rollback first"
            )));
        }
        let id = t.add_shared_device(source, kind, name, created)?;
        if id > DEVICE_KEY_MAX {
            t.release_device(id, |_| {})?;
            return Err(Error::Invalid(format!(
                "device ids are used up (a block key names ids up to {DEVICE_KEY_MAX})"
            )));
        }
        // Copies of shared leaves promote their items (format bit 12, which this checkpoint
        // carries), and the row, the count and the origin's epoch are durable together.
        st.shared_items = true;
        st.checkpoint(&cx)?;
        st.shared_items_durable = true;
        Ok(id)
    }

    /// Rolls writable device `name` back to its snapshot `snapshot` (`Volume::rollback`): a
    /// checkpoint marks the snapshot as the target, the device is emptied through the trim
    /// path (its pages given up in logged steps), then names the snapshot's tree and loses
    /// the mark in one checkpoint. A crash or an error between leaves it part emptied,
    /// listed as "rolling back" (`unfinished_rollbacks`); rolling back again finishes.
    pub fn rollback(&self, name: &str, snapshot: &str) -> Result<()> {
        self.rollback_when(name, snapshot, &|_| Ok(()))
    }

    /// `rollback`, asking `ready(device id)` under the device-operation lock before the
    /// device is marked, and again once the mark is durable, when no new client can find the
    /// device any more (it is listed as "rolling back"); a refusal then puts the mark back as
    /// it was and changes nothing else. A server passes "no NBD client has it open": a client
    /// that found the device before the mark is seen the second time.
    pub fn rollback_when(
        &self,
        name: &str,
        snapshot: &str,
        ready: &dyn Fn(u32) -> Result<()>,
    ) -> Result<()> {
        self.check_writable()?;
        let _ops = self.device_ops.lock();
        self.rollback_locked(name, snapshot, ready)
    }

    /// `Volume::stop_rollbacks`.
    pub fn stop_rollbacks(&self) {
        self.rollbacks_stopped.store(true, Ordering::SeqCst);
    }

    /// Finishes the rollback of `name` that a crash or an error stopped, to the snapshot its
    /// mark names, when it is still unfinished: looked up under the device-operation lock,
    /// since another rollback may have finished it after it was listed (rolling it back again
    /// would wipe what was written since). The snapshot's name when it finished one.
    pub fn finish_rollback(&self, name: &str) -> Result<Option<String>> {
        self.check_writable()?;
        let _ops = self.device_ops.lock();
        let Some((_, snapshot)) = self
            .unfinished_rollbacks()
            .into_iter()
            .find(|(d, _)| d == name)
        else {
            return Ok(None);
        };
        self.rollback_locked(name, &snapshot, &|_| Ok(()))?;
        Ok(Some(snapshot))
    }

    fn rollback_locked(
        &self,
        name: &str,
        snapshot: &str,
        ready: &dyn Fn(u32) -> Result<()>,
    ) -> Result<()> {
        if self.rollbacks_stopped.load(Ordering::SeqCst) {
            return Err(Error::Invalid(format!(
                "device {name:?}: no rollback starts while the volume closes"
            )));
        }
        let id = self.device_id(name)?;
        let snap = self.device_id(snapshot)?;
        let row = self
            .devices()
            .into_iter()
            .find(|d| d.id == snap)
            .filter(|d| d.kind == "snapshot" && d.parent == id)
            .ok_or_else(|| Error::Invalid(format!("{snapshot:?} is not a snapshot of {name:?}")))?;
        let (size, writable) = self.device_size(id)?;
        if !writable || row.size_bytes != size {
            return Err(Error::Invalid(format!("{name:?} cannot be rolled back")));
        }
        ready(id)?;
        let marked_before = self.marked_target(id);
        self.checkpoint_first()?;
        {
            let mut st = self.lock_for_write();
            let cx = self.ctx();
            Self::tree_of(&mut st).mark_rollback(id, Some(snap))?;
            st.checkpoint(&cx)?;
        }
        if let Err(e) = ready(id) {
            let mut st = self.lock_for_write();
            let cx = self.ctx();
            Self::tree_of(&mut st).mark_rollback(id, marked_before)?;
            st.checkpoint(&cx)?;
            return Err(e);
        }
        self.emptied_for_rollback(id, name, size)?;
        self.checkpoint_first()?;
        let mut st = self.lock_for_write();
        let cx = self.ctx();
        Self::check_empty(&mut st, id, name, size)?;
        let t = Self::tree_of(&mut st);
        t.share_tree(snap, id)?;
        t.mark_rollback(id, None)?;
        st.checkpoint(&cx)?;
        Ok(())
    }

    /// The snapshot an unfinished rollback of device `id` goes to, if one is marked.
    fn marked_target(&self, id: u32) -> Option<u32> {
        match &self.state.lock().map {
            VolumeMap::Tree(t) => t
                .unfinished_rollbacks()
                .into_iter()
                .find_map(|(d, s)| (d == id).then_some(s)),
            VolumeMap::Pages(_) => None,
        }
    }

    /// Rollbacks a crash or an error stopped, as (device, snapshot) names: `zbd serve`
    /// finishes them before it serves.
    pub fn unfinished_rollbacks(&self) -> Vec<(String, String)> {
        let st = self.state.lock();
        let VolumeMap::Tree(t) = &st.map else {
            return Vec::new();
        };
        let name = |id: u32| t.row(id).map(|r| r.name.clone()).unwrap_or_default();
        t.unfinished_rollbacks()
            .into_iter()
            .map(|(d, s)| (name(d), name(s)))
            .collect()
    }

    /// Clone `name` stops listing its origin (`Volume::flatten`), in one checkpoint; nothing
    /// is copied. Whether it listed one before. The checkpoint is written even when it did
    /// not, so a retry after a failed one makes the flag durable.
    pub fn flatten(&self, name: &str) -> Result<bool> {
        self.check_writable()?;
        let _ops = self.device_ops.lock();
        let id = self.device_id(name)?;
        self.checkpoint_first()?;
        let mut st = self.lock_for_write();
        let cx = self.ctx();
        let VolumeMap::Tree(t) = &mut st.map else {
            return Err(Error::Invalid(format!("{name:?} is not a clone")));
        };
        let changed = t.flatten(id)?;
        st.checkpoint(&cx)?;
        Ok(changed)
    }

    /// The block ranges where devices `a` and `b` differ (`Volume::diff`), as (byte offset,
    /// length); pages both share are not read.
    pub fn diff(&self, a: &str, b: &str) -> Result<Vec<(u64, u64)>> {
        let (a, b) = (self.device_id(a)?, self.device_id(b)?);
        let mut st = self.state.lock();
        let VolumeMap::Tree(t) = &mut st.map else {
            return Ok(Vec::new());
        };
        let bs = BLOCK_BYTES as u64;
        Ok(t.diff(a, b)?
            .into_iter()
            .map(|(lba, n)| (lba * bs, n * bs))
            .collect())
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
