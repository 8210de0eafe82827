//! Checkpoints in three phases: a snapshot under the state lock (`begin_checkpoint`), the
//! storage writes and syncs without it (`CheckpointIo::run`), the commit under it
//! (`finish_checkpoint`); dictionaries are retired and freed at checkpoint boundaries.

use super::{Consumer, Ctx, State};
use crate::error::{Error, Result};
use crate::extents::{in_runs, WrittenTable};
use crate::format::{
    Checkpoint, DictEntry, QueueEntry, CKPT_FLAG_COMPRESSION_UNITS, CKPT_FLAG_DICTIONARIES,
    CKPT_FLAG_DICT_COUNTS, CKPT_FLAG_EXTENT_TABLE, CKPT_FLAG_METADATA_PAGES,
    CKPT_FLAG_SAVINGS_COUNTERS, CKPT_FLAG_V3_SEGMENTS, CKPT_FLAG_VOLUME_COUNTERS,
    SEG_FLAG_WIDE_RECORDS,
};
use crate::map::{MapSnapshot, PageWrite};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Free extents below `H` one phase 1 looks at for pairs to carve, and the extent pairs it
/// carves at most: it never walks the whole free list, and a shortfall larger than that is
/// made up over the next checkpoints (the carver asks for them while ids run low).
const CARVE_LOOK_MAX: usize = 16_384;
const CARVE_PAIRS_MAX: usize = 64;
/// Extent pairs one phase 1 returns at most, and the extents with a free id it looks at.
const RETURN_PAIRS_MAX: usize = 64;
const RETURN_LOOK_MAX: usize = 1024;
/// Runs of the free list looked through for a fresh extent's partner (`fresh_extents`).
const PAIR_LOOK_RUNS: usize = 4096;

impl State {
    /// Drops from the directory every dictionary no live block names, other than the one new
    /// blocks use, the one of a block being placed (`placing_dict`: not counted yet) and any
    /// not loaded (an install lists its dictionary before loading it), when the
    /// per-dictionary counts are known. Called by the snapshot of checkpoint `seq`, which is
    /// the first not to list them.
    fn retire_dicts(&mut self, cx: &Ctx, seq: u64) {
        let counts = self.map.counters();
        if !counts.savings_known {
            return;
        }
        let current = cx.dicts.current_id();
        for e in self.dicts.iter_mut() {
            if e.id == 0
                || Some(e.id) == current
                || e.id == u16::from(self.placing_dict)
                || counts.by_dict[usize::from(e.id) % crate::map::DICT_IDS] != 0
                || cx.dicts.get(e.id as u8).is_none()
            {
                continue;
            }
            self.retiring.push((*e, seq));
            *e = DictEntry::default();
        }
    }

    /// After checkpoint `seq` committed: dictionaries retired by an earlier checkpoint are in
    /// neither slot any more, so their id and region bytes are free; they are unloaded under
    /// the reuse gate (a read that looked up a block naming one before it died has finished).
    fn free_retired(&mut self, cx: &Ctx, seq: u64) {
        if !self.retiring.iter().any(|&(_, at)| at < seq) {
            return;
        }
        let _exclusive = cx.gate.write();
        self.retiring.retain(|(e, at)| {
            if *at < seq {
                cx.dicts.remove(e.id as u8);
                false
            } else {
                true
            }
        });
        cx.dicts.resume();
    }

    /// Stock carving, in a first form (design, "Space for metadata"; returns in
    /// `return_stock`; no partner passes, no demand carving for waiting steps yet): at a
    /// phase 1 of a bit-10 volume whose allocatable page ids ran low, takes extents `e < H`
    /// whose partner `e + H` is free too, both from the free list (never from an allocation queue), as metadata, while host
    /// payload stays above its floor after each pair. Their ids become allocatable when this
    /// checkpoint commits, so no window uses a pair its durable checkpoint does not list.
    /// Replay carves nothing (`carving` is set once it is done, before the open's
    /// checkpoint).
    fn carve_stock(&mut self) -> Result<()> {
        if !self.carving {
            return Ok(());
        }
        let (wanted, h) = self.map.carve_wanted();
        let wanted = (wanted as usize).min(CARVE_PAIRS_MAX);
        if wanted == 0 {
            return Ok(());
        }
        for e in self.free.pairs_below(h, wanted, CARVE_LOOK_MAX) {
            if self.free_now() <= self.floor(Consumer::HostWrite) + 2 {
                break;
            }
            self.free.remove(e);
            self.free.remove(e + h);
            // The table's pages hold the state (metadata is the one state live blocks do not
            // imply): written by this checkpoint, or a reopen would see them free.
            for x in [e, e + h] {
                self.extents.carve(x);
                self.table.touch(x);
            }
            self.map.carve(e)?;
        }
        Ok(())
    }

    /// Returns of stock (design, "Space for metadata"), in a first form: at a phase 1, carved
    /// extent pairs no page uses go back to data while the allocatable ids stay at or above
    /// the carver's high watermark without them (after snapshot deletes, say). Each extent of
    /// the pair becomes pending free before `released` is taken, so this checkpoint writes
    /// its table state and releases it at its commit, as it does an emptied data extent: no
    /// data lands in it before a durable checkpoint no longer names it metadata, and no page
    /// does either (its ids left allocation here). Not in replay, like carving.
    fn return_stock(&mut self) -> Result<()> {
        if !self.carving {
            return Ok(());
        }
        let Some(h) = self.map.partner_offset() else {
            return Ok(());
        };
        for e in self.map.return_excess(RETURN_PAIRS_MAX, RETURN_LOOK_MAX)? {
            for x in [e, e + h] {
                self.extents.uncarve(x);
                self.table.touch(x);
            }
        }
        Ok(())
    }

    /// The `want` extents the next allocation queue gains: the free list's first, then the
    /// released ones, and after them their carving partners (`e` and `e + H`) that are free
    /// in the list's first runs, in the same order, so a run of data written in one go still
    /// lands in neighbouring extents (read back in one request). Why the partners: the carver
    /// takes only a pair both of whose extents are free; taken one at a time in list order,
    /// data spent a pair per extent, none was left once half the extents held data, and with
    /// snapshots (whose map pages grow with writes) writes failed with ENOSPC at 62 % of the
    /// data area live. Taken together, a pair goes per two extents.
    fn fresh_extents(&self, released: &[u32], want: usize) -> Vec<u32> {
        let h = self.map.partner_offset().filter(|&h| self.carving && h > 0);
        // Near the front only: the commit takes each fresh extent off the list by a scan.
        let near = match h {
            Some(_) => self.free.front_runs(PAIR_LOOK_RUNS),
            None => Vec::new(),
        };
        let (mut firsts, mut partners) = (Vec::with_capacity(want), Vec::new());
        for e in self.free.iter().chain(released.iter().copied()) {
            if firsts.len() + partners.len() >= want {
                break;
            }
            if partners.contains(&e) {
                continue;
            }
            firsts.push(e);
            let partner = h.and_then(|h| match e.checked_sub(h) {
                None => e.checked_add(h),
                Some(p) => Some(p).filter(|&p| p < h),
            });
            if let Some(p) = partner.filter(|&p| in_runs(&near, p)) {
                if firsts.len() + partners.len() < want && !firsts.contains(&p) {
                    partners.push(p);
                }
            }
        }
        firsts.extend(partners);
        firsts
    }

    /// Writes a checkpoint, all of it under the state lock (the caller holds it and cannot let
    /// it go: the queue ran dry, the map cache is full of pinned pages, recovery, close). A
    /// checkpoint another thread is writing outside the lock is waited for and committed first
    /// (see [`State::begin_checkpoint`]). `Volume::checkpoint_unlocked` is the usual way.
    pub fn checkpoint(&mut self, cx: &Ctx) -> Result<()> {
        let io = self.begin_checkpoint(cx)?;
        let r = io.run(cx);
        self.finish_checkpoint(cx, io.seq, r)
    }

    /// Phase 1 of a checkpoint (state lock held): seals the pending segments into the outbox and
    /// takes a snapshot of everything the checkpoint writes (dirty map pages, changed
    /// extent-table pages, the checkpoint itself with a fresh allocation queue and the extents
    /// it releases). Phase 2, [`CheckpointIo::run`], needs no lock; phase 3,
    /// [`State::finish_checkpoint`], commits under the lock once it is durable. One checkpoint
    /// at a time: one still in flight (another thread's phase 2) is waited for, lock held (its
    /// phase 2 never takes the lock), and committed here.
    pub fn begin_checkpoint(&mut self, cx: &Ctx) -> Result<CheckpointIo> {
        self.join_checkpoint(cx)?;
        self.write_pending(cx)?;
        // It syncs everything sealed so far, like a flush (and counts as one, as it always did).
        self.counters.flushes += 1;
        let seq = self.ckpt_seq + 1;
        let watermark = self.next_seq - 1;
        self.retire_dicts(cx, seq);
        // The directory carries each dictionary's live-block count (docs/format.md).
        let by_dict = self.map.counters().by_dict;
        for e in self.dicts.iter_mut().filter(|e| e.id != 0) {
            e.live_blocks = by_dict[usize::from(e.id) % crate::map::DICT_IDS];
        }
        // Before the snapshots: the slot's extent table names the carved extents as metadata.
        self.carve_stock()?;
        self.return_stock()?;
        let (mut writes, mut pages) = self.map.snapshot(seq)?;
        self.counters.metadata_bytes_written += match &pages {
            MapSnapshot::Pages(p) => p.bytes,
            MapSnapshot::Tree(_) => writes.iter().map(|(_, b)| b.len() as u64).sum(),
        };
        let v2 = cx.sb.version >= 2;
        let (table_writes, table) = self.table.snapshot(cx.sb, self.extents.as_slice(), seq);
        writes.extend(table_writes);
        self.counters.metadata_bytes_written += table.bytes;
        // Extents free once this checkpoint is durable: no map entry of the snapshot references
        // them. Extents that become pending free from now on wait for the next checkpoint.
        // Ascending, from the pending-free set (no walk of the extent table).
        let mut cleaning = self.cleaning.clone();
        cleaning.sort_unstable();
        let released: Vec<u32> = self
            .extents
            .pending()
            .filter(|e| cleaning.binary_search(e).is_err())
            .collect();
        // The new queue lists every extent writers may open before the next checkpoint is
        // durable: the open ones, the rest of the current queue (writers go on taking from it
        // until the commit) and fresh ones.
        let mut queue: Vec<QueueEntry> = self
            .buffer
            .iter()
            .map(|o| QueueEntry {
                extent: o.extent,
                alloc_seq: o.alloc_seq,
            })
            .collect();
        queue.extend(self.queue.iter().copied());
        // Fresh extents come from the free list, then the released ones, in that order; the
        // commit takes the same ones off (nothing else changes the free list meanwhile), so the
        // list is not copied here.
        let mut want = (cx.sb.queue_len as usize).saturating_sub(queue.len());
        if self.carving && self.map.partner_offset().is_some() {
            // The queue holds at most half the free extents (at least one while any is free):
            // the carver takes pairs from the free list only, and a small volume's queue
            // length can pass its free extents, so the queue took them all and left the
            // carver none (on a 16 MiB volume, 302 extents free, every change after a
            // snapshot failed with ENOSPC).
            let free = self.queue.len() + self.free.len() + released.len();
            want = want.min(free.div_ceil(2).saturating_sub(self.queue.len()));
        }
        let mut next_alloc = self.next_alloc_seq;
        let mut fresh = Vec::new();
        for e in self.fresh_extents(&released, want) {
            let q = QueueEntry {
                extent: e,
                alloc_seq: next_alloc,
            };
            queue.push(q);
            fresh.push(q);
            next_alloc += 1;
        }
        self.counters.checkpoints += 1;
        let (page_slots, page_summaries) = self.map.checkpoint_arrays(&pages);
        // The slot carries the extension; the commit needs nothing of it.
        let extension = match &mut pages {
            MapSnapshot::Tree(x) => Some(std::mem::take(x)),
            MapSnapshot::Pages(_) => None,
        };
        let ck = Checkpoint {
            seq,
            write_seq: watermark,
            next_alloc_seq: next_alloc,
            counters: self.counters.to_array(),
            queue,
            page_slots,
            page_summaries: if v2 { page_summaries } else { Vec::new() },
            // Counters and extent table are exact as of this checkpoint: open needs no scan.
            flags: if v2 {
                CKPT_FLAG_VOLUME_COUNTERS
                    | CKPT_FLAG_EXTENT_TABLE
                    | if self.map.counters().savings_known {
                        CKPT_FLAG_SAVINGS_COUNTERS | CKPT_FLAG_DICT_COUNTS
                    } else {
                        0
                    }
            } else {
                0
            } | if self.units_flag {
                CKPT_FLAG_COMPRESSION_UNITS
            } else {
                0
            } | if self.dicts.iter().any(|d| d.id != 0) {
                CKPT_FLAG_DICTIONARIES
            } else {
                0
            } | if extension.is_some() {
                CKPT_FLAG_METADATA_PAGES
            } else {
                0
            } | if cx.form.flags & SEG_FLAG_WIDE_RECORDS != 0 {
                // This open writes bit 11's segments: the open's checkpoint had the bit.
                CKPT_FLAG_V3_SEGMENTS
            } else {
                0
            } | if self.shared_items {
                crate::format::CKPT_FLAG_SHARED_ITEMS
            } else {
                0
            } | if self.map.device_ranges().len() > 1 {
                // Set by the checkpoint that adds the second row, before a record names it.
                crate::format::CKPT_FLAG_DEVICES
            } else {
                0
            } | if self.map.shares_pages() {
                // Set by the snapshot's own checkpoint, with the count it adds.
                crate::format::CKPT_FLAG_SNAPSHOTS
            } else {
                0
            },
            volume_counters: self.map.counters().to_array(),
            extent_table_slots: table.slots.clone(),
            dicts: self.dicts,
            extension,
        };
        let bytes: Arc<[u8]> = match ck.encode(cx.sb) {
            Ok(b) => b.into(),
            Err(e) => {
                // Nothing was written: what the snapshot took is dirty again, as after a failed
                // phase 2.
                self.map.abort();
                self.table.abort();
                return Err(e);
            }
        };
        let copies: Vec<PageWrite> = (0..cx.sb.metadata_copies())
            .map(|copy| (cx.sb.checkpoint_slot_offset(seq, copy), Arc::clone(&bytes)))
            .collect();
        self.counters.metadata_bytes_written += (bytes.len() * copies.len()) as u64;
        let done = Arc::new(Done::default());
        self.inflight = Some(InFlight {
            seq,
            pages,
            table,
            fresh,
            released,
            next_alloc,
            done: Arc::clone(&done),
        });
        self.ckpt_wanted = false;
        Ok(CheckpointIo {
            seq,
            watermark,
            pages: Mutex::new(writes),
            checkpoint: copies,
            done: DoneOnDrop(done),
        })
    }

    /// Waits for the checkpoint in flight, if any (another thread's phase 2), and commits it.
    /// Called with the state lock held: phase 2 never takes it, so this cannot deadlock.
    pub fn join_checkpoint(&mut self, cx: &Ctx) -> Result<()> {
        let Some(f) = &self.inflight else {
            return Ok(());
        };
        let (seq, ok) = (f.seq, f.done.wait());
        let r = if ok {
            Ok(())
        } else {
            Err(Error::Failed(format!(
                "checkpoint {seq} could not be written"
            )))
        };
        self.finish_checkpoint(cx, seq, r)
    }

    /// Phase 3 of a checkpoint (state lock held): `r` is how its phase 2 went. Durable: commit in
    /// RAM. Failed (the fence has tripped, the volume writes nothing more): what the snapshot
    /// took is dirty again. Nothing to do if a thread that waited for it did this already.
    pub fn finish_checkpoint(&mut self, cx: &Ctx, seq: u64, r: Result<()>) -> Result<()> {
        if self.inflight.as_ref().is_none_or(|f| f.seq != seq) {
            return r;
        }
        let f = self.inflight.take().expect("checked above");
        if r.is_err() {
            self.map.abort();
            self.table.abort();
            return r;
        }
        self.ckpt_seq = seq;
        self.free_retired(cx, seq);
        self.map.commit(seq, f.pages);
        self.table.commit(f.table);
        self.next_alloc_seq = f.next_alloc;
        // Writers took extents from the front of the queue meanwhile; what is left of it comes
        // first in the new checkpoint's queue too (after the extents that were open), then the
        // fresh ones. Only checkpoints change the free list, one at a time.
        self.free.extend(f.released.iter().copied());
        for q in &f.fresh {
            let taken = self.free.remove(q.extent);
            debug_assert!(taken, "fresh extent {} was not free", q.extent);
        }
        self.queue.extend(f.fresh);
        self.refill_early = self.queue.len() > crate::buffer::refill_at(cx.sb);
        // Every released extent is already in the free list (and maybe the new queue): mark them
        // all free before anything can fail, or a leftover "pending free" one would be released
        // (and queued) again by the next checkpoint and handed out twice. Nothing turned them
        // into anything else meanwhile: only recovery maps blocks into extents not open.
        let released = f.released;
        self.unreadable.retain(|e| !released.contains(e));
        for &e in &released {
            self.extents.release(e);
        }
        if released.is_empty() {
            return Ok(());
        }
        self.reuses += 1;
        let _exclusive = cx.gate.write();
        cx.cache.forget(&released);
        // `released` is in ascending extent order: neighbouring extents go back in one call, so
        // an overwrite that frees a thousand adjacent extents costs one discard, not a thousand,
        // while the gate is held.
        debug_assert!(released.windows(2).all(|w| w[0] < w[1]));
        for run in released.chunk_by(|a, b| *b == *a + 1) {
            let (Some(&first), count) = (run.first(), run.len() as u64) else {
                continue;
            };
            // Give the space back to the host (sparse file) or the device (discard). Best effort
            // (format.md: a discard may take effect or not): a device that rejects it only keeps
            // the space allocated, so its error must not fail the write that led here.
            let _ = cx.storage.discard(
                cx.sb.extent_offset(first),
                count * u64::from(cx.sb.extent_bytes),
            );
        }
        Ok(())
    }
}

/// What a checkpoint between snapshot and commit needs at its commit.
pub struct InFlight {
    seq: u64,
    pages: MapSnapshot,
    table: WrittenTable,
    /// Queue entries added to the current queue at commit (`State::fresh_extents`: from the
    /// front of the free list, then `released`, each with its free carving partner).
    fresh: Vec<QueueEntry>,
    /// Extents that turn free at commit.
    released: Vec<u32>,
    next_alloc: u64,
    done: Arc<Done>,
}

/// How a checkpoint's phase 2 ended, for a thread waiting to commit it.
#[derive(Default)]
pub struct Done {
    ok: Mutex<Option<bool>>,
    cv: Condvar,
}

impl Done {
    fn set(&self, ok: bool) {
        let mut g = self.ok.lock();
        if g.is_none() {
            *g = Some(ok);
        }
        self.cv.notify_all();
    }

    fn wait(&self) -> bool {
        let mut g = self.ok.lock();
        loop {
            if let Some(ok) = *g {
                return ok;
            }
            self.cv.wait(&mut g);
        }
    }
}

/// Reports failure if phase 2 ends without saying how (a panic): a waiter must not hang.
struct DoneOnDrop(Arc<Done>);

impl Drop for DoneOnDrop {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

/// Phase 2 of a checkpoint: the storage writes and syncs of a snapshot, run without the state
/// lock (reads and writes go on meanwhile).
pub struct CheckpointIo {
    /// Sequence of the checkpoint.
    pub seq: u64,
    /// Highest write sequence sealed into the outbox by phase 1.
    watermark: u64,
    /// Map and extent-table pages, dropped as they are written (with the I/O queue's own copy
    /// they would otherwise be in RAM twice until the commit).
    pages: Mutex<Vec<PageWrite>>,
    /// Every copy of the checkpoint.
    checkpoint: Vec<PageWrite>,
    done: DoneOnDrop,
}

impl CheckpointIo {
    /// Checkpoint order (docs/design.md): segments and the map and table pages, sync; the
    /// checkpoint copies, sync. Everything goes through the fence: the first error stops the
    /// volume, and the checkpoint is not committed.
    pub fn run(&self, cx: &Ctx) -> Result<()> {
        let r = self.write(cx);
        self.done.0.set(r.is_ok());
        r
    }

    fn write(&self, cx: &Ctx) -> Result<()> {
        // One sync covers the segments and the pages: nothing names the new pages until the
        // checkpoint copies below, written only after it, so pages written before their
        // segments are durable are unreachable after a crash (they sit in the slots the
        // durable checkpoint does not use).
        cx.outbox.issue_all(cx.storage)?;
        let pages = std::mem::take(&mut *self.pages.lock());
        for (offset, bytes) in coalesce(pages) {
            cx.storage.write_shared(offset, &bytes)?;
        }
        cx.storage.sync()?;
        cx.durable_seq.fetch_max(self.watermark, Ordering::SeqCst);
        for (offset, bytes) in &self.checkpoint {
            cx.storage.write_shared(*offset, bytes)?;
        }
        cx.storage.sync()
    }
}

/// Page writes in offset order, neighbours joined into one write: a checkpoint's pages are
/// scattered over the map and table regions, but some lie side by side (a page's two slots
/// are adjacent, so page `p` in slot B and `p + 1` in slot A are neighbours), and on a disk
/// that charges per request one write of several pages costs about what one page does.
fn coalesce(mut pages: Vec<PageWrite>) -> Vec<PageWrite> {
    pages.sort_unstable_by_key(|(offset, _)| *offset);
    pages
        .chunk_by(|(a, bytes), (b, _)| a + bytes.len() as u64 == *b)
        .map(|run| match run {
            [(offset, bytes)] => (*offset, Arc::clone(bytes)),
            // `concat` copies whole slices; collecting a byte iterator copied byte by byte
            // (6 % of the server's CPU under random writes).
            _ => (
                run[0].0,
                run.iter()
                    .map(|(_, b)| &b[..])
                    .collect::<Vec<_>>()
                    .concat()
                    .into(),
            ),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(offset: u64, fill: u8) -> PageWrite {
        (offset, vec![fill; 4096].into())
    }

    #[test]
    fn neighbouring_pages_go_out_as_one_write_and_nothing_else_moves() {
        let pages = vec![
            page(3 * 4096, 3),
            page(0, 0),
            page(4096, 1),
            page(9 * 4096, 9),
        ];
        let out = coalesce(pages);
        let shape: Vec<(u64, usize)> = out.iter().map(|(o, b)| (*o, b.len())).collect();
        assert_eq!(shape, [(0, 8192), (3 * 4096, 4096), (9 * 4096, 4096)]);
        assert!(out[0].1[..4096].iter().all(|&b| b == 0));
        assert!(out[0].1[4096..].iter().all(|&b| b == 1));
        assert!(out[1].1.iter().all(|&b| b == 3) && out[2].1.iter().all(|&b| b == 9));
    }
}
