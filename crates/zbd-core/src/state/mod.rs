//! What ties the engine together under the volume's state lock: a block goes into the extent
//! buffer (`buffer/`), its new location into the map (`map/`), with exact live accounting per
//! extent; flush and checkpoint make it durable. Compression, decompression and storage reads
//! happen outside the lock (engine/write.rs, engine/read.rs).

use crate::backend::Storage;
use crate::buffer::{ExtentBuffer, Prepared};
mod checkpoint;
mod place;
mod share;

pub use checkpoint::InFlight;
pub use place::Consumer;
pub use share::{Hit, StoredCopy};

use crate::error::{Error, Result};
use crate::extents::{ExtentTable, Extents, FreeList};
use crate::format::{
    BlockState, DictEntry, MapEntry, QueueEntry, Record, RecordKind, Superblock, BLOCK_BYTES,
    DICT_ENTRIES, MAP_ENTRIES_PER_PAGE, SECTOR_BYTES,
};
use crate::map::VolumeMap;
use crate::stats::Counters;
use parking_lot::RwLock;
use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;

/// Leaves a zero or trim step settles at most on a page-tree map (the design's step budget).
pub const STEP_LEAVES: u64 = 64;
/// Map leaves a trim or zero step settles on a volume with shared items: each block it drops
/// may dirty another SBT leaf (a reference to an item far away), so a step of 64 leaves could
/// dirty 16,320 pages and pass the pair-state list's capacity (review of 2a, second helper);
/// two leaves dirty at most 510 SBT leaves beside their own, within the window's margin.
pub const STEP_LEAVES_SHARED: u64 = 2;

/// Everything behind the state lock.
pub struct State {
    /// Logical block -> location.
    pub map: VolumeMap,
    /// Where the persisted extent table is (v2).
    pub table: ExtentTable,
    /// Per-extent accounting, with the pending-free set and the counts per state.
    pub extents: Extents,
    /// Free extents not in the allocation queue.
    pub free: FreeList,
    /// Allocation queue of the durable checkpoint (extents not yet opened).
    pub queue: VecDeque<QueueEntry>,
    /// Next record write sequence.
    pub next_seq: u64,
    /// Sequence of the durable checkpoint.
    pub ckpt_seq: u64,
    /// Next allocation sequence.
    pub next_alloc_seq: u64,
    /// Lifetime counters.
    pub counters: Counters,
    /// The extent buffer: the open extents.
    pub buffer: ExtentBuffer,
    /// Records replayed at open.
    pub replayed: u64,
    /// Dictionary directory: what the next checkpoint lists (dicts.rs; entries are added by an
    /// install and removed by the checkpoint that retires them).
    pub dicts: [DictEntry; DICT_ENTRIES],
    /// Dictionaries retired (dropped from the directory) by the checkpoint of the given
    /// sequence: their id and region bytes stay reserved until a later checkpoint commits, so
    /// both checkpoint slots no longer list them (dicts.rs, "Retirement order").
    pub retiring: Vec<(DictEntry, u64)>,
    /// Dictionary of the block `put_block` is placing (0: none). Placing it may write a
    /// checkpoint (opening an extent: `alloc`, `make_space`) before its map entry counts it,
    /// and that checkpoint must not retire the dictionary (`retire_dicts`).
    pub placing_dict: u8,
    /// Extents the cleaner could not read (twice): it no longer chooses them; one leaves the
    /// list when a checkpoint frees it (no live block left).
    pub unreadable: Vec<u32>,
    /// Victims of a cleaning pass that reads them without the state lock
    /// (`cleaner::pass_unlocked`): not released by a checkpoint, not chosen by another pass.
    pub cleaning: Vec<u32>,
    /// Checkpoints carry `CKPT_FLAG_COMPRESSION_UNITS`: set (durably) before the first unit
    /// record is written, so only volumes that use units have it.
    pub units_flag: bool,
    /// Checkpoints carry `CKPT_FLAG_SHARED_ITEMS`: set by the first promotion (a dedup step),
    /// kept from then on (design.md, build order 2a).
    pub shared_items: bool,
    /// Bumped when foreground cleaning takes the listed victims back (`cleaner::make_space`):
    /// a pass that started under an older value drops its work at commit.
    pub clean_gen: u64,
    /// Extents opened for writing since the volume was opened (paces `Volume::clean_ahead`).
    pub extents_opened: u64,
    /// Times placement cleaned with the state lock held (`make_space`; never on bit 10), in
    /// this open.
    pub locked_cleanings: u64,
    /// Times a writer found space short and cleaned with the lock released before placing
    /// again (bit 10), in this open.
    pub space_short_rounds: u64,
    /// Set for one `put_block` after a round that found nothing to clean
    /// (`after_round`): that placement may take free extents down to the cleaner's
    /// (`Consumer::AfterCleaning`), so both formats keep the same overwrite guarantee.
    pub below_host_floor: bool,
    /// Whether phase 1 may carve metadata extents (bit 10, a writable volume once replay is
    /// done: replay itself writes no checkpoint, and carves nothing).
    pub carving: bool,
    /// A durable checkpoint carries `CKPT_FLAG_SHARED_ITEMS` (this open's or the one it
    /// opened): ref records are written only after one does, as unit records after the units
    /// flag, so no build that lacks bit 12 meets a ref in a log.
    pub shared_items_durable: bool,
    /// An offline dedup step promoted an item since the last locked checkpoint (`share_block`
    /// writes no record): `put_ref` writes a checkpoint before it references a shared item,
    /// since a ref's replay must find its target in the SBT it starts from or rebuild it
    /// from a record.
    pub promoted_unlogged: bool,
    /// The extent the last data item `put_block` placed went to (the dedup index learns where
    /// stored blocks are without a map lookup).
    pub placed_extent: u32,
    /// Checkpoint commits that released extents, in this open: an extent is reused only
    /// after one, so a dedup candidate noted under an unchanged count still holds the bytes
    /// read from it (`put_ref`).
    pub reuses: u64,
    /// A checkpoint between its snapshot and its commit (`begin_checkpoint`).
    pub inflight: Option<InFlight>,
    /// A checkpoint should come soon (the queue runs low, dirty map pages pile up): the next
    /// caller that can let the state lock go writes it (`Volume::checkpoint_unlocked`).
    pub ckpt_wanted: bool,
    /// The allocation queue asks for its refill early (not when the last checkpoint left it
    /// low: nothing was free to add, and asking again after every write would only sync).
    pub refill_early: bool,
    /// Free extents host writes leave untouched (`OpenOptions::space_reserve_bytes`), beyond
    /// the cleaner's last one: a filesystem that met ENOSPC can replay its journal in them.
    pub space_reserve: usize,
    /// The reserve is lent to host writes (`place.rs`, `lend_reserve_if_full`): this open found
    /// the volume at its reserve. Taken back once free space is well above it again.
    pub reserve_lent: bool,
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
    /// Log segments are padded to this many bytes (the storage's `write_align`: 4 KiB on a
    /// 4 KiB-sector device), so no device write covers part of a logical block.
    pub write_align: usize,
    /// How this open lays out the segments it writes (`SegmentForm::for_volume`).
    pub form: crate::format::SegmentForm,
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
    /// A host change of the map entry of `lba` (copy on write where its device shares
    /// pages), keeping extent accounting exact.
    pub fn set_entry(&mut self, lba: u64, new: MapEntry) -> Result<()> {
        self.change_entry(lba, new, false)
    }

    /// A content-preserving change of the map entry of `lba` (a cleaner move, a damage mark,
    /// an offline dedup step): in the page that holds it, for every device that shares it.
    pub fn set_entry_in_place(&mut self, lba: u64, new: MapEntry) -> Result<()> {
        self.change_entry(lba, new, true)
    }

    fn change_entry(&mut self, lba: u64, new: MapEntry, in_place: bool) -> Result<()> {
        if self.shared_items {
            // The SBT entry a shared slot names is read before the slot changes, so a failed
            // read fails the change with nothing done (review of 2a, finding 1).
            let old = self.map.get(lba)?;
            self.map.resolve(old)?;
        }
        let changed = if in_place {
            self.map.set_in_place(lba, new)
        } else {
            self.map.set(lba, new)
        };
        self.account_promoted();
        if let Some(old) = changed? {
            self.account(old, new)?;
        }
        Ok(())
    }

    /// Moves the extent charges of the items copy on write made shared: from their direct
    /// blocks to the items (each charged whole, once).
    pub(crate) fn account_promoted(&mut self) {
        for p in self.map.take_promoted() {
            for &(_, old) in &p.blocks {
                self.account_direct(old, MapEntry::shared(p.key, old.unit_index));
            }
            self.charge_item(&p.value);
        }
    }

    /// Moves one block's live accounting from `old`'s extent to `new`'s; a shared `old` drops
    /// its reference, and the item's charge leaves its extent when that was the last
    /// ("Death at 0"). A shared `new` charges nothing: the reference was counted by whoever
    /// made it (`share_block`).
    ///
    /// The direct accounting comes first: a reference drop that fails (its SBT page unreadable
    /// after all) then leaves the count one high, a leak `zbd check` names, never a copy whose
    /// extent is not charged for it, which a later overwrite would free under live blocks.
    pub(crate) fn account(&mut self, old: MapEntry, new: MapEntry) -> Result<()> {
        self.account_direct(old, new);
        if let Some(key) = old.sbt_key() {
            if let Some(dead) = self.map.drop_ref(key)? {
                self.uncharge_item(&dead);
            }
        }
        Ok(())
    }

    /// Moves one direct block's live accounting from `old`'s extent to `new`'s (entries in
    /// other states charge nothing here).
    pub(crate) fn account_direct(&mut self, old: MapEntry, new: MapEntry) {
        if old.state == BlockState::Data && old.extent < self.extents.len() as u32 {
            self.table.touch(old.extent);
        }
        if new.state == BlockState::Data {
            self.table.touch(new.extent);
        }
        if old.state == BlockState::Data {
            self.extents
                .remove_block(old.extent, crate::units::share(&old));
        }
        if new.state == BlockState::Data {
            // Only recovery maps blocks into extents that are not open.
            self.extents
                .add_block(new.extent, crate::units::share(&new));
        }
    }

    /// Whether a block may name dictionary `dict` now: none, or one the directory lists (a
    /// retired dictionary must not gain blocks again; writers that compressed with it before
    /// it was retired compress again).
    pub fn lists_dict(&self, dict: u8) -> bool {
        dict == 0 || self.dicts.iter().any(|d| d.id == u16::from(dict))
    }

    /// Hands out the next record write sequence.
    pub fn take_seq(&mut self) -> u64 {
        let s = self.next_seq;
        self.next_seq += 1;
        s
    }

    /// Room in the map for changing blocks `lba .. lba + count` to `to` (`None`: data),
    /// before it is logged: a change the map refused after its record was appended would come
    /// back at replay (a failed write that reappears). A tree short of page ids for it first
    /// gets the checkpoint that returns the ids freed since the last one and carves more;
    /// still short, the change fails with `NoSpace` and nothing is changed.
    pub(crate) fn map_room(
        &mut self,
        cx: &Ctx,
        lba: u64,
        count: u64,
        to: Option<MapEntry>,
    ) -> Result<()> {
        if self.map.short_for(lba, count, to)? {
            self.checkpoint(cx)?;
            if self.map.short_for(lba, count, to)? {
                return Err(Error::NoSpace);
            }
        }
        Ok(())
    }

    /// A placement (`put_block`, `put_ref`) by a writer back from a "space short" round: with
    /// `below_host_floor` (the round freed nothing) it alone may take extents down to the
    /// cleaner's floor, as v2's does after `make_space`.
    pub fn after_round<T>(
        &mut self,
        below_host_floor: bool,
        place: impl FnOnce(&mut State) -> Result<T>,
    ) -> Result<T> {
        self.below_host_floor = below_host_floor;
        let put = place(self);
        self.below_host_floor = false;
        put
    }

    /// Stores one prepared block (or unit: its blocks from `lba`).
    pub fn put_block(&mut self, cx: &Ctx, lba: u64, p: &Prepared) -> Result<()> {
        match *p {
            Prepared::Zero => self.map_room(cx, lba, 1, Some(MapEntry::ZERO))?,
            Prepared::Data { blocks, .. } => self.map_room(cx, lba, u64::from(blocks), None)?,
        }
        match *p {
            Prepared::Zero => {
                let logged = self.log_range(cx, RecordKind::Zero, lba, 1)?;
                self.set_entry(lba, MapEntry::ZERO)?;
                if !logged {
                    self.checkpoint(cx)?;
                }
            }
            Prepared::Data {
                codec,
                ref bytes,
                crc,
                seeded,
                blocks,
                dict,
                fingerprints,
            } => {
                debug_assert!(self.lists_dict(dict), "dictionary {dict} is not listed");
                // The caller checked that `dict` is listed (a writer compressed with it outside
                // the lock), but what follows may write checkpoints before the map entry below
                // counts the block: the units flag's, and opening an extent's (the queue ran
                // dry, `make_space`). If no mapped block named `dict` (the block's last version
                // moved to the newer one), such a checkpoint would retire it and the next one
                // unload it, and the block would name a dictionary that is gone: a corrupt
                // block for good (issue 26). So it is kept listed while the block is placed.
                self.placing_dict = dict;
                let placed = self.place_block(cx, bytes.len(), blocks);
                self.placing_dict = 0;
                let slot = placed?;
                debug_assert!(self.lists_dict(dict), "dictionary {dict} retired meanwhile");
                let n = usize::from(blocks);
                let offset = self.buffer.next_offset(slot);
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
                        seeded,
                        fingerprint: fingerprints[usize::from(i)],
                        ..Record::new(RecordKind::Data, lba + u64::from(i), 1, seq)
                    });
                }
                let used = self.next_seq;
                let extent = self.buffer.get(slot).extent;
                self.placed_extent = extent;
                let nearly_full = self.buffer.append(slot, bytes, records, used) < SECTOR_BYTES;
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
                        seeded,
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

    /// The open extent for a block of `blocks` blocks (`len` stored bytes), after the units
    /// flag's checkpoint when it is the first unit (`put_block`).
    fn place_block(&mut self, cx: &Ctx, len: usize, blocks: u8) -> Result<usize> {
        if blocks > 1 && !self.units_flag {
            // Durable before any record that needs it.
            self.units_flag = true;
            self.checkpoint(cx)?;
        }
        self.place(cx, len, usize::from(blocks))
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

    /// Where the zero or trim step that starts at `lba` ends, for a range ending at `end`. On
    /// a page-tree map a step settles at most `STEP_LEAVES` leaves (design, "Steps and
    /// admission"): a 4 GiB trim would otherwise free ~4,100 leaves in one lock hold while
    /// every other request waits, and pile them into one checkpoint's window. v2's map takes
    /// the whole range at once, as before.
    pub fn range_step_end(&self, lba: u64, end: u64) -> u64 {
        if !self.cleans_unlocked() {
            return end;
        }
        let leaf = MAP_ENTRIES_PER_PAGE as u64;
        let leaves = if self.shared_items {
            STEP_LEAVES_SHARED
        } else {
            STEP_LEAVES
        };
        end.min((lba / leaf + leaves) * leaf)
    }

    /// Records a zero or trim range and applies it to the map.
    pub fn put_range(&mut self, cx: &Ctx, kind: RecordKind, lba: u64, count: u64) -> Result<()> {
        let entry = if kind == RecordKind::Zero {
            MapEntry::ZERO
        } else {
            MapEntry::UNMAPPED
        };
        self.map_room(cx, lba, count, Some(entry))?;
        let mut done = 0;
        let mut logged = true;
        while done < count && logged {
            let n = (count - done).min(u64::from(u32::MAX));
            logged = self.log_range(cx, kind, lba + done, n as u32)?;
            done += n;
        }
        self.apply_range(lba, count, entry)?;
        if !logged {
            self.checkpoint(cx)?;
        }
        self.checkpoint_if_map_full(cx)
    }

    /// Sets blocks `lba .. lba + count` to `entry` (zero or unmapped) in the map, with their
    /// accounting: what a zero or trim record does, live (`put_range`, after logging it) and
    /// at replay. As one range, never block by block: whole subtrees become summaries, so
    /// replay makes no page the live run did not (a 16 GiB zeroing replayed block by block
    /// made a leaf per 255 blocks and ran the page pool out: review 13).
    pub fn apply_range(&mut self, lba: u64, count: u64, entry: MapEntry) -> Result<()> {
        let mut olds = Vec::new();
        // A range that fails part way leaves its first part changed: that part is accounted
        // all the same, every block of it, before the error is returned.
        let changed = self.map.set_range(lba, count, entry, |old| olds.push(old));
        self.account_promoted();
        let mut first_error = None;
        for old in olds {
            if let Err(e) = self.account(old, entry) {
                first_error.get_or_insert(e);
            }
        }
        changed?;
        first_error.map_or(Ok(()), Err)
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
        // Not on a page-tree map (R7-D1): a record there covers one step, whose counted pages
        // and blocks are its own.
        let last_seq = self.next_seq.wrapping_sub(1);
        if !self.cleans_unlocked() && self.buffer.extend_range(kind, lba, count, last_seq) {
            return Ok(());
        }
        let slot = self.place(cx, 0, 1)?;
        let seq = self.take_seq();
        let used = self.next_seq;
        // As for a data append (put_block): last used at the sequence after its record, else it
        // ties with the extent whose block took the sequence before it, and LRU may close this.
        let record = Record::new(kind, lba, count, seq);
        self.buffer.append(slot, &[], vec![record], used);
        Ok(())
    }
}

/// Whether a 4 KiB block is all zeros.
pub fn is_zero(block: &[u8]) -> bool {
    debug_assert_eq!(block.len(), BLOCK_BYTES);
    block.iter().all(|&b| b == 0)
}
