//! What ties the engine together under the volume's state lock: a block goes into the extent
//! buffer (`buffer/`), its new location into the map (`map/`), with exact live accounting per
//! extent; flush and checkpoint make it durable. Compression, decompression and storage reads
//! happen outside the lock (see volume.rs).

use crate::backend::Storage;
use crate::buffer::{BufferConfig, OpenExtent, Prepared};
use crate::error::{Error, Result};
use crate::extent_table::{ExtentTable, WrittenTable};
use crate::format::{
    BlockState, Checkpoint, DictEntry, MapEntry, QueueEntry, Record, RecordKind, Superblock,
    BLOCK_BYTES, CKPT_FLAG_COMPRESSION_UNITS, CKPT_FLAG_DICTIONARIES, CKPT_FLAG_DICT_COUNTS,
    CKPT_FLAG_EXTENT_TABLE, CKPT_FLAG_SAVINGS_COUNTERS, CKPT_FLAG_VOLUME_COUNTERS, DICT_ENTRIES,
    SECTOR_BYTES, SEGMENT_HEADER_BYTES,
};
use crate::free_list::FreeList;
use crate::map::{Map, PageWrite, WrittenPages};
use crate::stats::Counters;
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Life cycle of an extent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtentState {
    /// Holds nothing the durable metadata needs; may be queued for allocation.
    Free,
    /// In the extent buffer, receiving blocks.
    Open,
    /// Written; may hold live blocks.
    Closed,
    /// Closed with no live block left; becomes free once a checkpoint no longer references it.
    PendingFree,
}

/// Per-extent accounting (kept exact: every map change adjusts it). Packed: 13 bytes per
/// extent, not 16 (a 1 TiB volume has a million or more; issue 9). Fields are read and written
/// by value (safe Rust refuses references to unaligned fields).
#[derive(Clone, Copy, Debug)]
#[repr(C, packed)]
pub struct ExtentInfo {
    /// Sum of stored lengths of live blocks (a block of a compression unit counts its share of
    /// the unit, `units::share`).
    pub live_bytes: u32,
    /// Live blocks.
    pub live_blocks: u32,
    /// Life cycle state.
    pub state: ExtentState,
    /// Write sequence when it was last written, its low 32 bits (cleaner age, taken modulo
    /// 2^32: an extent older than 4 G writes only looks younger to the cleaner's heuristic; 4
    /// bytes, not 8, keep `ExtentInfo` at 13 bytes per extent; 0 after recovery).
    pub stamp: u32,
}

/// Everything behind the state lock.
pub struct State {
    /// Logical block -> location.
    pub map: Map,
    /// Where the persisted extent table is (v2).
    pub table: ExtentTable,
    /// Per-extent accounting.
    pub extents: Vec<ExtentInfo>,
    /// Free extents not in the allocation queue.
    pub free: FreeList,
    /// Allocation queue of the durable checkpoint (extents not yet opened).
    pub queue: VecDeque<QueueEntry>,
    /// The extent buffer.
    pub open: Vec<OpenExtent>,
    /// The room of `open[i]` for every `i`, kept beside `open` by every change to an open
    /// extent (`State::note_room`): `place` scans these few bytes, not the extents themselves.
    pub room: Vec<crate::buffer::Room>,
    /// Next record write sequence.
    pub next_seq: u64,
    /// Sequence of the durable checkpoint.
    pub ckpt_seq: u64,
    /// Next allocation sequence.
    pub next_alloc_seq: u64,
    /// Lifetime counters.
    pub counters: Counters,
    /// Buffer tunables.
    pub buffer: BufferConfig,
    /// Records replayed at open.
    pub replayed: u64,
    /// Dictionary directory: what the next checkpoint lists (dicts.rs; entries are added by an
    /// install and removed by the checkpoint that retires them).
    pub dicts: [DictEntry; DICT_ENTRIES],
    /// Dictionaries retired (dropped from the directory) by the checkpoint of the given
    /// sequence: their id and region bytes stay reserved until a later checkpoint commits, so
    /// both checkpoint slots no longer list them (dicts.rs, "Retirement order").
    pub retiring: Vec<(DictEntry, u64)>,
    /// Victims of a cleaning pass that reads them without the state lock
    /// (`cleaner::pass_unlocked`): not released by a checkpoint, not chosen by another pass.
    pub cleaning: Vec<u32>,
    /// Checkpoints carry `CKPT_FLAG_COMPRESSION_UNITS`: set (durably) before the first unit
    /// record is written, so only volumes that use units have it.
    pub units_flag: bool,
    /// Bumped when foreground cleaning takes the listed victims back (`cleaner::make_space`):
    /// a pass that started under an older value drops its work at commit.
    pub clean_gen: u64,
    /// Extents opened for writing since the volume was opened (paces `Volume::clean_ahead`).
    pub extents_opened: u64,
    /// A checkpoint between its snapshot and its commit (`begin_checkpoint`).
    pub inflight: Option<InFlight>,
    /// A checkpoint should come soon (the queue runs low, dirty map pages pile up): the next
    /// caller that can let the state lock go writes it (`Volume::checkpoint_unlocked`).
    pub ckpt_wanted: bool,
    /// The allocation queue asks for its refill early (not when the last checkpoint left it
    /// low: nothing was free to add, and asking again after every write would only sync).
    pub refill_early: bool,
}

/// Read-only context the state operations need.
pub struct Ctx<'a> {
    /// Storage.
    pub storage: &'a dyn Storage,
    /// Readers of extents hold this shared; reusing an extent takes it exclusively, so a read
    /// that looked up an extent never sees it rewritten under it.
    pub gate: &'a RwLock<()>,
    /// Geometry.
    pub sb: &'a Superblock,
    /// Highest write sequence covered by a completed sync; every segment carries it (v2), so
    /// recovery can tell a damaged durable segment from one torn by the crash.
    pub durable_seq: &'a AtomicU64,
    /// Stored bytes recently read; reused extents must be forgotten (under the gate).
    pub cache: &'a crate::readcache::ReadCache,
    /// Sealed segments waiting to be issued to the storage (outside the state lock).
    pub outbox: &'a crate::writeback::Outbox,
    /// Frees extents when host writes run short (the cleaner's foreground pass; passed in so
    /// the state does not depend on the cleaner).
    pub make_space: fn(&mut State, &Ctx) -> Result<()>,
    /// Codec of new writes (the cleaner recompresses the live blocks of mostly dead units).
    pub codec: crate::codec::Codec,
    /// Loaded dictionaries (the cleaner decodes and recompresses units with them).
    pub dicts: &'a crate::dicts::Dicts,
}

impl State {
    /// Sets the map entry of `lba`, keeping extent accounting exact.
    pub fn set_entry(&mut self, lba: u64, new: MapEntry) -> Result<()> {
        if let Some(old) = self.map.set(lba, new)? {
            self.account(old, new);
        }
        Ok(())
    }

    /// Moves one block's live accounting from `old`'s extent to `new`'s.
    fn account(&mut self, old: MapEntry, new: MapEntry) {
        if old.state == BlockState::Data && old.extent < self.extents.len() as u32 {
            self.table.touch(old.extent);
        }
        if new.state == BlockState::Data {
            self.table.touch(new.extent);
        }
        if old.state == BlockState::Data {
            if let Some(x) = self.extents.get_mut(old.extent as usize) {
                x.live_bytes -= crate::units::share(&old);
                x.live_blocks -= 1;
                if x.live_blocks == 0 && x.state == ExtentState::Closed {
                    x.state = ExtentState::PendingFree;
                }
            }
        }
        if new.state == BlockState::Data {
            let x = &mut self.extents[new.extent as usize];
            x.live_bytes += crate::units::share(&new);
            x.live_blocks += 1;
            if x.state == ExtentState::PendingFree || x.state == ExtentState::Free {
                // Only recovery maps blocks into non-open extents.
                x.state = ExtentState::Closed;
            }
        }
    }

    /// Whether a block may name dictionary `dict` now: none, or one the directory lists (a
    /// retired dictionary must not gain blocks again; writers that compressed with it before
    /// it was retired compress again).
    pub fn lists_dict(&self, dict: u8) -> bool {
        dict == 0 || self.dicts.iter().any(|d| d.id == u16::from(dict))
    }

    /// Drops from the directory every dictionary no live block names, other than the one new
    /// blocks use and any not loaded (an install lists its dictionary before loading it), when
    /// the per-dictionary counts are known. Called by the snapshot of checkpoint `seq`, which
    /// is the first not to list them.
    fn retire_dicts(&mut self, cx: &Ctx, seq: u64) {
        let counts = self.map.counters();
        if !counts.savings_known {
            return;
        }
        let current = cx.dicts.current_id();
        for e in self.dicts.iter_mut() {
            if e.id == 0
                || Some(e.id) == current
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

    /// Hands out the next record write sequence.
    pub fn take_seq(&mut self) -> u64 {
        let s = self.next_seq;
        self.next_seq += 1;
        s
    }

    /// Stores one prepared block (or unit: its blocks from `lba`).
    pub fn put_block(&mut self, cx: &Ctx, lba: u64, p: Prepared) -> Result<()> {
        match p {
            Prepared::Zero => {
                let logged = self.log_range(cx, RecordKind::Zero, lba, 1)?;
                self.set_entry(lba, MapEntry::ZERO)?;
                if !logged {
                    self.checkpoint(cx)?;
                }
            }
            Prepared::Data {
                codec,
                bytes,
                crc,
                blocks,
                dict,
            } => {
                debug_assert!(self.lists_dict(dict), "dictionary {dict} is not listed");
                if blocks > 1 && !self.units_flag {
                    // Durable before any record that needs it.
                    self.units_flag = true;
                    self.checkpoint(cx)?;
                }
                let n = usize::from(blocks);
                let slot = self.place(cx, bytes.len(), n)?;
                let ext_bytes = cx.sb.extent_bytes as usize;
                let offset = {
                    let oe = &self.open[slot];
                    oe.durable_end + SEGMENT_HEADER_BYTES + oe.payload_len
                };
                // One record per block, all naming the unit's bytes (format.md).
                let mut records = Vec::with_capacity(n);
                for i in 0..blocks {
                    let seq = self.take_seq();
                    records.push(Record {
                        codec,
                        len: bytes.len() as u32,
                        offset: offset as u32,
                        crc,
                        unit_index: i,
                        unit_blocks: u16::from(blocks),
                        dict: u16::from(dict),
                        ..Record::new(RecordKind::Data, lba + u64::from(i), 1, seq)
                    });
                }
                let used = self.next_seq;
                let oe = &mut self.open[slot];
                oe.buf[offset..offset + bytes.len()].copy_from_slice(&bytes);
                oe.payload_len += bytes.len();
                oe.records.extend(records);
                oe.last_used = used;
                let extent = oe.extent;
                let nearly_full = self.note_room(slot, ext_bytes) < SECTOR_BYTES;
                for i in 0..blocks {
                    let entry = MapEntry {
                        state: BlockState::Data,
                        codec,
                        len: bytes.len() as u16,
                        extent,
                        offset: offset as u32,
                        crc,
                        unit_index: i,
                        unit_blocks: blocks,
                        dict,
                    };
                    self.set_entry(lba + u64::from(i), entry)?;
                }
                if nearly_full {
                    self.close_open(cx, slot)?;
                }
            }
        }
        self.checkpoint_if_map_full(cx)
    }

    /// Brings the next checkpoint forward when dirty map pages fill most of the map cache
    /// (they stay pinned until a checkpoint writes them): asks for one outside the lock at
    /// three quarters of the budget, writes one here, lock held, only at the whole budget
    /// (pages kept being dirtied while the one asked for was written).
    pub fn checkpoint_if_map_full(&mut self, cx: &Ctx) -> Result<()> {
        if self.map.needs_checkpoint() {
            self.checkpoint(cx)?;
        } else if self.map.wants_checkpoint() && self.inflight.is_none() {
            self.ckpt_wanted = true;
        }
        Ok(())
    }

    /// Records a zero or trim range and applies it to the map.
    pub fn put_range(&mut self, cx: &Ctx, kind: RecordKind, lba: u64, count: u64) -> Result<()> {
        let mut done = 0;
        let mut logged = true;
        while done < count && logged {
            let n = (count - done).min(u64::from(u32::MAX));
            logged = self.log_range(cx, kind, lba + done, n as u32)?;
            done += n;
        }
        let entry = if kind == RecordKind::Zero {
            MapEntry::ZERO
        } else {
            MapEntry::UNMAPPED
        };
        let mut olds = Vec::new();
        self.map.set_range(lba, count, entry, |old| {
            if old.state == BlockState::Data {
                olds.push(old);
            }
        })?;
        for old in olds {
            self.account(old, entry);
        }
        if !logged {
            self.checkpoint(cx)?;
        }
        self.checkpoint_if_map_full(cx)
    }

    /// Logs a zero or trim range; false when the data area is so full that no extent can take
    /// even a record. The caller then applies the range to the map and writes a checkpoint,
    /// which makes it durable without a record (and releases the space it freed): zeroing and
    /// trimming free space, so they must never fail for lack of it, or a full volume could not
    /// be emptied again.
    fn log_range(&mut self, cx: &Ctx, kind: RecordKind, lba: u64, count: u32) -> Result<bool> {
        match self.append_range(cx, kind, lba, count) {
            Ok(()) => Ok(true),
            Err(Error::NoSpace) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn append_range(&mut self, cx: &Ctx, kind: RecordKind, lba: u64, count: u32) -> Result<()> {
        // Extend the previous record when nothing was recorded in between (sequential zeroing).
        let last_seq = self.next_seq.wrapping_sub(1);
        for oe in self.open.iter_mut() {
            if let Some(r) = oe.records.last_mut() {
                if r.kind == kind && r.seq == last_seq && r.lba + u64::from(r.count) == lba {
                    if let Some(c) = r.count.checked_add(count) {
                        r.count = c;
                        return Ok(());
                    }
                }
            }
        }
        let slot = self.place(cx, 0, 1)?;
        let seq = self.take_seq();
        let used = self.next_seq;
        let oe = &mut self.open[slot];
        oe.records.push(Record::new(kind, lba, count, seq));
        // As for a data append (put_block): the sequence after its record, else it ties with
        // the extent whose block took the sequence before it, and LRU may close this one.
        oe.last_used = used;
        self.note_room(slot, cx.sb.extent_bytes as usize);
        Ok(())
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
        let (mut writes, pages) = self.map.snapshot(seq)?;
        self.counters.metadata_bytes_written += pages.bytes;
        let v2 = cx.sb.version >= 2;
        let (table_writes, table) = self.table.snapshot(cx.sb, &self.extents, seq);
        writes.extend(table_writes);
        self.counters.metadata_bytes_written += table.bytes;
        // Extents free once this checkpoint is durable: no map entry of the snapshot references
        // them. Extents that become pending free from now on wait for the next checkpoint.
        let released: Vec<u32> = (0..self.extents.len() as u32)
            .filter(|&e| {
                self.extents[e as usize].state == ExtentState::PendingFree
                    && !self.cleaning.contains(&e)
            })
            .collect();
        // The new queue lists every extent writers may open before the next checkpoint is
        // durable: the open ones, the rest of the current queue (writers go on taking from it
        // until the commit) and fresh ones.
        let mut queue: Vec<QueueEntry> = self
            .open
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
        let want = (cx.sb.queue_len as usize).saturating_sub(queue.len());
        let mut next_alloc = self.next_alloc_seq;
        let mut fresh = Vec::new();
        for e in self.free.iter().chain(released.iter().copied()).take(want) {
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
            },
            volume_counters: self.map.counters().to_array(),
            extent_table_slots: table.slots.clone(),
            dicts: self.dicts,
        };
        let bytes = ck.encode(cx.sb);
        let bytes: Arc<[u8]> = bytes.into();
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
        for _ in 0..f.fresh.len() {
            self.free.pop_front();
        }
        self.queue.extend(f.fresh);
        self.refill_early = self.queue.len() > crate::buffer::refill_at(cx.sb);
        // Every released extent is already in the free list (and maybe the new queue): mark them
        // all free before anything can fail, or a leftover "pending free" one would be released
        // (and queued) again by the next checkpoint and handed out twice. Nothing turned them
        // into anything else meanwhile: only recovery maps blocks into extents not open.
        let released = f.released;
        for &e in &released {
            debug_assert_eq!(self.extents[e as usize].state, ExtentState::PendingFree);
            self.extents[e as usize].state = ExtentState::Free;
        }
        if released.is_empty() {
            return Ok(());
        }
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
    pages: WrittenPages,
    table: WrittenTable,
    /// Queue entries added to the current queue at commit: the first ones of the free list
    /// followed by `released`.
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
    /// Checkpoint order (docs/design.md): segments, sync; map and table pages, sync; the
    /// checkpoint copies, sync. Everything goes through the fence: the first error stops the
    /// volume, and the checkpoint is not committed.
    pub fn run(&self, cx: &Ctx) -> Result<()> {
        let r = self.write(cx);
        self.done.0.set(r.is_ok());
        r
    }

    fn write(&self, cx: &Ctx) -> Result<()> {
        cx.outbox.issue_all(cx.storage)?;
        cx.storage.sync()?;
        cx.durable_seq.fetch_max(self.watermark, Ordering::SeqCst);
        let pages = std::mem::take(&mut *self.pages.lock());
        for (offset, bytes) in pages {
            cx.storage.write_shared(offset, &bytes)?;
        }
        cx.storage.sync()?;
        for (offset, bytes) in &self.checkpoint {
            cx.storage.write_shared(*offset, bytes)?;
        }
        cx.storage.sync()
    }
}

/// Whether a 4 KiB block is all zeros.
pub fn is_zero(block: &[u8]) -> bool {
    debug_assert_eq!(block.len(), BLOCK_BYTES);
    block.iter().all(|&b| b == 0)
}
