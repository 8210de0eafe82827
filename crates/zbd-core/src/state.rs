//! The engine's in-memory state and the operations that change it: placing blocks into open
//! extents (the extent buffer), map updates with exact live accounting, segment write-back,
//! flush and checkpoint. Everything here runs under the volume's state lock; compression,
//! decompression and storage reads happen outside it (see volume.rs).

use crate::error::{Error, Result};
use crate::format::{
    encode_map_page, seal_segment, segment_padded_len, BlockState, Checkpoint, DictEntry, MapEntry,
    QueueEntry, Record, RecordKind, SegmentHeader, Superblock, BLOCK_BYTES,
    CKPT_FLAG_COMPRESSION_UNITS, DICT_ENTRIES, MAP_ENTRIES_PER_PAGE, SECTOR_BYTES,
    SEGMENT_HEADER_BYTES,
};
use crate::units::UnitRefs;
use crate::stats::Counters;
use crate::storage::Storage;
use parking_lot::RwLock;
use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Free extents host writes never take: what the cleaner compacts partly dead extents into (one
/// is enough: a pass reuses the victims it drains, see `cleaner::stream`).
const CLEANER_EXTENTS_MIN: usize = 1;

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

/// Per-extent accounting (kept exact: every map change adjusts it).
#[derive(Clone, Copy, Debug)]
pub struct ExtentInfo {
    /// Sum of stored lengths of live blocks (a compression unit counts once while any of its
    /// blocks is live).
    pub live_bytes: u32,
    /// Part of `live_bytes` held only by the dead blocks of partly live units: what rewriting
    /// them would give back (units.rs).
    pub unit_waste: u32,
    /// Live blocks.
    pub live_blocks: u32,
    /// Life cycle state.
    pub state: ExtentState,
    /// Write sequence when it was last written (cleaner age; 0 after recovery).
    pub stamp: u64,
}

/// An extent in the extent buffer.
pub struct OpenExtent {
    /// Extent index.
    pub extent: u32,
    /// Allocation sequence its segments carry.
    pub alloc_seq: u64,
    /// Format version of its segments (the volume's).
    pub version: u32,
    /// The extent's bytes (durable part and pending segment).
    pub buf: Vec<u8>,
    /// Bytes already written to storage (sector aligned).
    pub durable_end: usize,
    /// Payload bytes in the pending segment.
    pub payload_len: usize,
    /// Records of the pending segment.
    pub records: Vec<Record>,
    /// When it was opened (aging timeout).
    pub opened: Instant,
    /// Last append (LRU eviction).
    pub last_used: Instant,
}

impl OpenExtent {
    /// Bytes used if the pending segment grew by `payload` bytes and `records` records.
    fn end_with(&self, payload: usize, records: usize) -> usize {
        let n = self.records.len() + records;
        if n == 0 {
            return self.durable_end;
        }
        self.durable_end + segment_padded_len(self.version, self.payload_len + payload, n) as usize
    }

    fn fits(&self, payload: usize, records: usize, extent_bytes: usize) -> bool {
        self.end_with(payload, records) <= extent_bytes
    }

    /// Free space left for one more block's payload.
    fn free_bytes(&self, extent_bytes: usize) -> usize {
        extent_bytes.saturating_sub(self.end_with(0, 1))
    }
}

/// A block ready to be stored.
pub enum Prepared {
    /// All zeros: map state only.
    Zero,
    /// Stored bytes with codec id and checksum: one block, or a compression unit of `blocks`
    /// consecutive blocks.
    Data {
        /// Codec id.
        codec: u8,
        /// Stored bytes.
        bytes: Vec<u8>,
        /// CRC32C of `bytes`.
        crc: u32,
        /// Logical blocks they hold (1, or a unit's size).
        blocks: u8,
    },
}

/// Tunables applied at open time.
#[derive(Clone, Debug)]
pub struct BufferConfig {
    /// Maximum extents open in the extent buffer.
    pub max_open: usize,
    /// Maximum time an extent stays open.
    pub aging: Duration,
    /// Extents host writes leave to the cleaner (they may use them only when cleaning fails).
    pub reserve: usize,
}

/// Everything behind the state lock.
pub struct State {
    /// Logical block -> location.
    pub map: Vec<MapEntry>,
    /// Current slot of each map page in the durable checkpoint.
    pub page_slots: Vec<u8>,
    /// Map pages changed since the last checkpoint.
    pub dirty_pages: BTreeSet<u32>,
    /// Per-extent accounting.
    pub extents: Vec<ExtentInfo>,
    /// Free extents not in the allocation queue.
    pub free: VecDeque<u32>,
    /// Allocation queue of the durable checkpoint (extents not yet opened).
    pub queue: VecDeque<QueueEntry>,
    /// The extent buffer.
    pub open: Vec<OpenExtent>,
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
    /// Dictionary directory of the checkpoint, carried through unchanged (reserved, v2).
    pub dicts: [DictEntry; DICT_ENTRIES],
    /// Live blocks of each stored compression unit.
    pub units: UnitRefs,
    /// Checkpoints carry `CKPT_FLAG_COMPRESSION_UNITS`: set (durably) before the first unit
    /// record is written, so only volumes that use units have it.
    pub units_flag: bool,
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
    /// Codec of new writes (the cleaner recompresses the live blocks of mostly dead units).
    pub codec: crate::codec::Codec,
}

impl State {
    /// Sets the map entry of `lba`, keeping extent accounting exact.
    pub fn set_entry(&mut self, lba: u64, new: MapEntry) {
        if self.replace_entry(lba, new) {
            self.dirty_pages
                .insert((lba / MAP_ENTRIES_PER_PAGE as u64) as u32);
        }
    }

    /// Replaces an entry with exact accounting; false (and nothing done) if it is unchanged.
    fn replace_entry(&mut self, lba: u64, new: MapEntry) -> bool {
        let i = lba as usize;
        let old = self.map[i];
        if old == new {
            return false;
        }
        if old.state == BlockState::Data {
            let d = self.units.remove(&old);
            if let Some(x) = self.extents.get_mut(old.extent as usize) {
                x.live_bytes -= d.bytes;
                x.unit_waste = (i64::from(x.unit_waste) + d.waste) as u32;
                x.live_blocks -= 1;
                if x.live_blocks == 0 && x.state == ExtentState::Closed {
                    x.state = ExtentState::PendingFree;
                }
            }
        }
        if new.state == BlockState::Data {
            let d = self.units.add(&new);
            let x = &mut self.extents[new.extent as usize];
            x.live_bytes += d.bytes;
            x.unit_waste = (i64::from(x.unit_waste) + d.waste) as u32;
            x.live_blocks += 1;
            if x.state == ExtentState::PendingFree || x.state == ExtentState::Free {
                // Only recovery maps blocks into non-open extents.
                x.state = ExtentState::Closed;
            }
        }
        self.map[i] = new;
        true
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
                self.set_entry(lba, MapEntry::ZERO);
                if !logged {
                    self.checkpoint(cx)?;
                }
            }
            Prepared::Data {
                codec,
                bytes,
                crc,
                blocks,
            } => {
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
                        ..Record::new(RecordKind::Data, lba + u64::from(i), 1, seq)
                    });
                }
                let oe = &mut self.open[slot];
                oe.buf[offset..offset + bytes.len()].copy_from_slice(&bytes);
                oe.payload_len += bytes.len();
                oe.records.extend(records);
                oe.last_used = Instant::now();
                let extent = oe.extent;
                let nearly_full = oe.free_bytes(ext_bytes) < SECTOR_BYTES;
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
                        dict: 0,
                    };
                    self.set_entry(lba + u64::from(i), entry);
                }
                if nearly_full {
                    self.close_open(cx, slot)?;
                }
            }
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
        // Ranges can span the whole volume (mkfs discards everything): one dirty-page insert per
        // page, none for blocks already in that state.
        let mut last_page = None;
        for l in lba..lba + count {
            let page = (l / MAP_ENTRIES_PER_PAGE as u64) as u32;
            if self.replace_entry(l, entry) && last_page != Some(page) {
                self.dirty_pages.insert(page);
                last_page = Some(page);
            }
        }
        if !logged {
            self.checkpoint(cx)?;
        }
        Ok(())
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
        let oe = &mut self.open[slot];
        oe.records.push(Record::new(kind, lba, count, seq));
        oe.last_used = Instant::now();
        Ok(())
    }

    /// Chooses the open extent for `len` payload bytes and `records` records: best fit
    /// (fullest extent that still has room), else a new extent, evicting the least recently
    /// used one when the buffer is full.
    fn place(&mut self, cx: &Ctx, len: usize, records: usize) -> Result<usize> {
        let ext_bytes = cx.sb.extent_bytes as usize;
        let best = self
            .open
            .iter()
            .enumerate()
            .filter(|(_, o)| o.fits(len, records, ext_bytes))
            .min_by_key(|(_, o)| o.free_bytes(ext_bytes))
            .map(|(i, _)| i);
        if let Some(i) = best {
            return Ok(i);
        }
        if self.open.len() >= self.buffer.max_open.max(1) {
            let lru = self
                .open
                .iter()
                .enumerate()
                .min_by_key(|(_, o)| o.last_used)
                .map(|(i, _)| i);
            if let Some(i) = lru {
                self.close_open(cx, i)?;
            }
        }
        self.open_new(cx)?;
        Ok(self.open.len() - 1)
    }

    fn open_new(&mut self, cx: &Ctx) -> Result<()> {
        if self.free_now() <= self.buffer.reserve.max(CLEANER_EXTENTS_MIN) {
            // Space is short: host writes wait for the cleaner (run inline, under the lock).
            crate::cleaner::make_space(self, cx)?;
        }
        // The last free extents belong to the cleaner even when cleaning could not help just
        // now: with nothing left to compact into, dead space made later (the host trims or
        // overwrites half of every extent) could never be reclaimed and NoSpace would stick
        // although the live data fits. Zero and trim ranges need no extent (`log_range`).
        if self.free_now() <= CLEANER_EXTENTS_MIN {
            return Err(Error::NoSpace);
        }
        let q = self.alloc(cx)?;
        self.extents[q.extent as usize].state = ExtentState::Open;
        let now = Instant::now();
        self.open.push(OpenExtent {
            extent: q.extent,
            alloc_seq: q.alloc_seq,
            version: cx.sb.version,
            buf: vec![0; cx.sb.extent_bytes as usize],
            durable_end: 0,
            payload_len: 0,
            records: Vec::new(),
            opened: now,
            last_used: now,
        });
        Ok(())
    }

    /// Extents free now (queued or free).
    pub fn free_now(&self) -> usize {
        self.queue.len() + self.free.len()
    }

    /// Takes the next extent of the allocation queue, refilling the queue with a checkpoint
    /// (which also releases extents freed since the last one).
    pub fn alloc(&mut self, cx: &Ctx) -> Result<QueueEntry> {
        if self.queue.is_empty() {
            self.checkpoint(cx)?;
        }
        self.queue.pop_front().ok_or(Error::NoSpace)
    }

    /// Writes the pending segment of open extent `i` (no sync).
    fn write_segment(&mut self, cx: &Ctx, i: usize) -> Result<()> {
        let oe = &mut self.open[i];
        if oe.records.is_empty() {
            return Ok(());
        }
        let h = SegmentHeader {
            version: cx.sb.version,
            alloc_seq: oe.alloc_seq,
            extent: oe.extent,
            seg_offset: oe.durable_end as u32,
            payload_len: oe.payload_len as u32,
            record_count: oe.records.len() as u32,
            durable_seq: cx.durable_seq.load(Ordering::SeqCst),
        };
        let n = seal_segment(&mut oe.buf, &cx.sb.uuid, &h, &oe.records);
        let start = oe.durable_end;
        cx.storage.write_at(
            cx.sb.extent_offset(oe.extent) + start as u64,
            &oe.buf[start..start + n],
        )?;
        oe.durable_end += n;
        oe.payload_len = 0;
        oe.records.clear();
        self.counters.data_bytes_written += n as u64;
        Ok(())
    }

    /// Writes back open extent `i` and drops it from the buffer.
    pub fn close_open(&mut self, cx: &Ctx, i: usize) -> Result<()> {
        self.write_segment(cx, i)?;
        let oe = self.open.swap_remove(i);
        let stamp = self.next_seq;
        let x = &mut self.extents[oe.extent as usize];
        x.state = if x.live_blocks == 0 {
            ExtentState::PendingFree
        } else {
            ExtentState::Closed
        };
        x.stamp = stamp;
        Ok(())
    }

    /// Closes extents past the aging timeout.
    pub fn age(&mut self, cx: &Ctx) -> Result<()> {
        let now = Instant::now();
        while let Some(i) = self
            .open
            .iter()
            .position(|o| now.duration_since(o.opened) > self.buffer.aging)
        {
            self.close_open(cx, i)?;
        }
        Ok(())
    }

    /// Writes every pending segment (no sync). Extents too full to take another block are closed.
    pub fn write_pending(&mut self, cx: &Ctx) -> Result<()> {
        let ext_bytes = cx.sb.extent_bytes as usize;
        let mut i = 0;
        while i < self.open.len() {
            self.write_segment(cx, i)?;
            if self.open[i].free_bytes(ext_bytes) < SECTOR_BYTES {
                self.close_open(cx, i)?;
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Makes every write so far durable.
    pub fn flush(&mut self, cx: &Ctx) -> Result<()> {
        self.write_pending(cx)?;
        let covered = self.next_seq - 1;
        cx.storage.sync()?;
        cx.durable_seq.fetch_max(covered, Ordering::SeqCst);
        self.counters.flushes += 1;
        Ok(())
    }

    /// Writes a checkpoint: pending segments, dirty map pages (copy-on-write into the slot the
    /// durable checkpoint does not use), then the checkpoint itself with a fresh allocation queue.
    /// Extents that became free are released only after it is durable.
    pub fn checkpoint(&mut self, cx: &Ctx) -> Result<()> {
        self.flush(cx)?;
        let seq = self.ckpt_seq + 1;
        let mut slots = self.page_slots.clone();
        let dirty: Vec<u32> = self.dirty_pages.iter().copied().collect();
        for &p in &dirty {
            let slot = if slots[p as usize] == 1 { 2 } else { 1 };
            let start = p as usize * MAP_ENTRIES_PER_PAGE;
            let end = (start + MAP_ENTRIES_PER_PAGE).min(self.map.len());
            let page = encode_map_page(p, seq, &self.map[start..end]);
            // Every copy (v2: two, a metadata half apart): one bad sector loses nothing.
            for copy in 0..cx.sb.metadata_copies() {
                cx.storage
                    .write_at(cx.sb.map_page_offset(p, slot - 1, copy), &page)?;
                self.counters.metadata_bytes_written += page.len() as u64;
            }
            slots[p as usize] = slot;
        }
        // Extents free once this checkpoint is durable: no map entry references them.
        let released: Vec<u32> = (0..self.extents.len() as u32)
            .filter(|&e| self.extents[e as usize].state == ExtentState::PendingFree)
            .collect();
        let mut queue: Vec<QueueEntry> = self
            .open
            .iter()
            .map(|o| QueueEntry {
                extent: o.extent,
                alloc_seq: o.alloc_seq,
            })
            .collect();
        queue.extend(self.queue.iter().copied());
        let mut free = self.free.clone();
        free.extend(released.iter().copied());
        let mut next_alloc = self.next_alloc_seq;
        while queue.len() < cx.sb.queue_len as usize {
            let Some(e) = free.pop_front() else { break };
            queue.push(QueueEntry {
                extent: e,
                alloc_seq: next_alloc,
            });
            next_alloc += 1;
        }
        self.counters.checkpoints += 1;
        let ck = Checkpoint {
            seq,
            write_seq: self.next_seq - 1,
            next_alloc_seq: next_alloc,
            counters: self.counters.to_array(),
            queue: queue.clone(),
            page_slots: slots.clone(),
            dicts: self.dicts,
            flags: if self.units_flag {
                CKPT_FLAG_COMPRESSION_UNITS
            } else {
                0
            },
            ..Checkpoint::empty(cx.sb)
        };
        let bytes = ck.encode(cx.sb);
        cx.storage.sync()?;
        for copy in 0..cx.sb.metadata_copies() {
            cx.storage
                .write_at(cx.sb.checkpoint_slot_offset(seq, copy), &bytes)?;
            self.counters.metadata_bytes_written += bytes.len() as u64;
        }
        cx.storage.sync()?;
        // Durable: commit in RAM.
        self.ckpt_seq = seq;
        self.page_slots = slots;
        self.dirty_pages.clear();
        self.next_alloc_seq = next_alloc;
        let open_count = self.open.len();
        self.queue = queue.into_iter().skip(open_count).collect();
        self.free = free;
        // Every released extent is already in the free list (and maybe the new queue): mark them
        // all free before anything can fail, or a leftover "pending free" one would be released
        // (and queued) again by the next checkpoint and handed out twice.
        for &e in &released {
            self.extents[e as usize].state = ExtentState::Free;
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

/// Whether a 4 KiB block is all zeros.
pub fn is_zero(block: &[u8]) -> bool {
    debug_assert_eq!(block.len(), BLOCK_BYTES);
    block.iter().all(|&b| b == 0)
}
