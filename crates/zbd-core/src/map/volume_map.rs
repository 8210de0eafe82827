//! The map a volume opens with: v2's paged map ([`Map`]), or, on a volume whose checkpoint
//! sets flag bit 10, the default device's page tree ([`TreeMap`]). One enum with v2's API, so
//! the state, the cleaner, recovery and checks call the map the same way on both.
//!
//! A checkpoint treats both alike: phase 1 seals the dirty pages ([`Map::snapshot`],
//! [`TreeMap::prepare`]) for slots no durable checkpoint names, phase 2 writes them with the
//! segments outside the state lock and syncs before the slot, and phase 3 commits or aborts
//! the map. v2's slot lists its page slots; the tree's carries the catalog's extension.

use super::tree::TreeMap;
use super::{Map, MapCacheStats, MapCounters, PageWrite, WrittenPages};
use crate::error::{Error, Result};
use crate::format::{
    block_key, key_device, key_lba, BlockState, DeviceKind, ExtensionBody, MapEntry, PageSlot,
    DEFAULT_DEVICE,
};
use crate::meta::geometry::WINDOW_PAGES_MAX;

/// Dirty tree pages at which a checkpoint is asked for outside the lock (half the window a
/// checkpoint may count), and at which one is written under it (three quarters): the pool's
/// floor keeps room for the whole window, so a write never finds the pool full. The list's
/// room may bring either forward ([`TreeMap::window_full`]).
const TREE_DIRTY_WANTED: u64 = WINDOW_PAGES_MAX as u64 / 2;
const TREE_DIRTY_NEEDED: u64 = WINDOW_PAGES_MAX as u64 * 3 / 4;

/// Whether tree `t` must checkpoint before it changes more: dirty pages at
/// `TREE_DIRTY_NEEDED` or the window at its bound.
fn tree_at_bound(t: &TreeMap) -> bool {
    t.pool_stats().dirty >= TREE_DIRTY_NEEDED || t.window_full()
}

/// The map of a volume (see the module doc).
pub enum VolumeMap {
    /// Format v2's map pages in region 0, slots listed in the checkpoint.
    Pages(Box<Map>),
    /// Bit 10: the default device's page tree in the volume's catalog.
    Tree(Box<TreeMap>),
}

/// A tree page with no intact copy on the way to `lba`: the block is damaged, as v2 reports
/// blocks of a lost map page (v2 also counts them and lets writes replace them; the tree's
/// repair list, design step 1b, is not built yet).
fn damaged_at(e: Error, lba: u64) -> Error {
    match e {
        Error::CorruptMetadata(_) => Error::Corrupt { lba },
        e => e,
    }
}

/// What a checkpoint's phase 1 took from the map, for its slot and its commit.
pub enum MapSnapshot {
    /// v2: the pages its phase 2 writes and the slots they take.
    Pages(WrittenPages),
    /// Bit 10: the extension naming the pages phase 2 writes.
    Tree(ExtensionBody),
}

impl VolumeMap {
    /// Logical blocks of `device`; `None` for no live device (v2's map has only the default).
    pub fn blocks_of(&self, device: u32) -> Option<u64> {
        match self {
            VolumeMap::Pages(m) => (device == DEFAULT_DEVICE).then(|| m.blocks()),
            VolumeMap::Tree(t) => t.blocks_of(device),
        }
    }

    /// Whether some map page has more than one parent (snapshots, clones: format bit 14).
    pub fn shares_pages(&self) -> bool {
        match self {
            VolumeMap::Pages(_) => false,
            VolumeMap::Tree(t) => t.shares_pages(),
        }
    }

    /// Whether `device` takes writes (a snapshot does not).
    pub fn writable(&self, device: u32) -> bool {
        match self {
            VolumeMap::Pages(_) => device == DEFAULT_DEVICE,
            VolumeMap::Tree(t) => {
                t.row(device)
                    .is_some_and(|r| r.flags & 1 == 0 && r.kind != DeviceKind::Snapshot)
                    && !t.deleting(device)
            }
        }
    }

    /// Whether block key `key` names a block of a live device.
    pub fn holds(&self, key: u64) -> bool {
        self.blocks_of(key_device(key))
            .is_some_and(|blocks| key_lba(key) < blocks)
    }

    /// The key ranges of every live device, in id order: (first key, blocks).
    pub fn device_ranges(&self) -> Vec<(u64, u64)> {
        match self {
            VolumeMap::Pages(m) => vec![(0, m.blocks())],
            VolumeMap::Tree(t) => t
                .devices()
                .iter()
                .map(|r| (block_key(r.id, 0), r.blocks))
                .collect(),
        }
    }

    /// Exact counters of the whole map.
    pub fn counters(&self) -> MapCounters {
        match self {
            VolumeMap::Pages(m) => m.counters(),
            VolumeMap::Tree(t) => t.counters(),
        }
    }

    /// The entry of `lba`.
    pub fn get(&mut self, lba: u64) -> Result<MapEntry> {
        match self {
            VolumeMap::Pages(m) => m.get(lba),
            VolumeMap::Tree(t) => t.get(lba).map_err(|e| damaged_at(e, lba)),
        }
    }

    /// The entries of `count` blocks from `first`, appended to `out`.
    pub fn get_run(&mut self, first: u64, count: u64, out: &mut Vec<MapEntry>) -> Result<()> {
        match self {
            VolumeMap::Pages(m) => m.get_run(first, count, out),
            VolumeMap::Tree(t) => t
                .get_run(first, count, out)
                .map_err(|e| damaged_at(e, first)),
        }
    }

    /// Sets the entry of `lba`; the old entry if it changed.
    pub fn set(&mut self, lba: u64, new: MapEntry) -> Result<Option<MapEntry>> {
        match self {
            VolumeMap::Pages(m) => m.set(lba, new),
            VolumeMap::Tree(t) => t.set(lba, new),
        }
    }

    /// Sets the entry of `lba` in the page that holds it, for every device that shares the
    /// page: a content-preserving change (a cleaner move, a damage mark, a dedup step of the
    /// offline pass). A host change goes through [`VolumeMap::set`] (copy on write).
    pub fn set_in_place(&mut self, lba: u64, new: MapEntry) -> Result<Option<MapEntry>> {
        match self {
            VolumeMap::Pages(m) => m.set(lba, new),
            VolumeMap::Tree(t) => t.set_in_place(lba, new),
        }
    }

    /// The items copy on write made shared since the last call (`TreeMap::take_promoted`).
    pub fn take_promoted(&mut self) -> Vec<super::cow::CowPromotion> {
        match self {
            VolumeMap::Pages(_) => Vec::new(),
            VolumeMap::Tree(t) => t.take_promoted(),
        }
    }

    /// Sets `count` entries from `first` to `new` (unmapped or zero); `freed(old)` sees every
    /// data entry replaced.
    pub fn set_range(
        &mut self,
        first: u64,
        count: u64,
        new: MapEntry,
        freed: impl FnMut(MapEntry),
    ) -> Result<()> {
        match self {
            VolumeMap::Pages(m) => m.set_range(first, count, new, freed),
            VolumeMap::Tree(t) => t.set_range(first, count, new, freed),
        }
    }

    /// Calls `f(lba, entry)` for every data block in `first..first + count`, in LBA order.
    pub fn for_each_data_in(
        &mut self,
        first: u64,
        count: u64,
        f: impl FnMut(u64, &MapEntry),
    ) -> Result<()> {
        match self {
            VolumeMap::Pages(m) => m.for_each_data_in(first, count, f),
            VolumeMap::Tree(t) => t
                .for_each_data_in(first, count, f)
                .map_err(|e| damaged_at(e, first)),
        }
    }

    /// Calls `f(key, entry)` for every data block of every live page once (a page devices
    /// share through the first device that reaches it, with its key).
    pub fn for_each_data(&mut self, mut f: impl FnMut(u64, &MapEntry)) -> Result<()> {
        match self {
            VolumeMap::Pages(m) => {
                let blocks = m.blocks();
                m.for_each_data_in(0, blocks, f)
            }
            VolumeMap::Tree(t) => t.visit(&mut |key, n, e| {
                if e.state == BlockState::Data {
                    for k in key..key + n {
                        f(k, &e);
                    }
                }
            }),
        }
    }

    /// Rebuilds the counters by reading the whole map; `data(entry)` sees every data entry.
    pub fn recount(&mut self, data: impl FnMut(&MapEntry)) -> Result<()> {
        match self {
            VolumeMap::Pages(m) => m.recount(data),
            VolumeMap::Tree(t) => t.recount(data),
        }
    }

    /// Calls `f(state, blocks)` for each run of blocks of one state in `first..first + count`.
    pub fn runs(&mut self, first: u64, count: u64, f: impl FnMut(BlockState, u64)) -> Result<()> {
        match self {
            VolumeMap::Pages(m) => m.runs(first, count, f),
            VolumeMap::Tree(t) => t.runs(first, count, f),
        }
    }

    /// The page id of the leaf holding block `key`'s entry in a page tree (leaves several
    /// devices share have one id); `None` under a summary and in v2's map.
    pub fn leaf_id(&mut self, key: u64) -> Result<Option<u32>> {
        match self {
            VolumeMap::Pages(_) => Ok(None),
            VolumeMap::Tree(t) => t.leaf_id(key),
        }
    }

    /// The first block in `first .. first + count` that is not unmapped, or `None`; v2's map
    /// says `first` (its ranges are one step: nothing to skip).
    pub fn first_mapped(&mut self, first: u64, count: u64) -> Result<Option<u64>> {
        match self {
            VolumeMap::Pages(_) => Ok((count > 0).then_some(first)),
            VolumeMap::Tree(t) => t.first_mapped(first, count),
        }
    }

    /// Whether dirty pages call for a checkpoint soon (outside the lock).
    pub fn wants_checkpoint(&self) -> bool {
        match self {
            VolumeMap::Pages(m) => m.wants_checkpoint(),
            VolumeMap::Tree(t) => t.pool_stats().dirty >= TREE_DIRTY_WANTED || t.window_half_full(),
        }
    }

    /// Whether dirty pages are half way from asking for a checkpoint to needing one under
    /// the lock: a writer then waits for the one in flight before it takes the lock
    /// (`Inner::wait_for_queue_refill`). v2's map never asks.
    pub fn checkpoint_pressed(&self) -> bool {
        match self {
            VolumeMap::Pages(_) => false,
            VolumeMap::Tree(t) => {
                t.pool_stats().dirty >= (TREE_DIRTY_WANTED + TREE_DIRTY_NEEDED) / 2
                    || t.window_pressed()
            }
        }
    }

    /// Whether dirty pages call for a checkpoint now, under the lock.
    pub fn needs_checkpoint(&self) -> bool {
        match self {
            VolumeMap::Pages(m) => m.needs_checkpoint(),
            VolumeMap::Tree(t) => tree_at_bound(t),
        }
    }

    /// Whether a checkpoint must come before the next map change even inside a batch that
    /// otherwise checkpoints only at its end (a cleaner commit): the tree at its bound, where
    /// the checkpoint's list would no longer fit its slot or its pinned pages the pool's
    /// floor (which counts 4,096 for the window, while a list of 16,384 lets the window
    /// reach 8,064). Never for v2, whose pinned pages only cost RAM.
    pub fn window_full(&self) -> bool {
        match self {
            VolumeMap::Pages(_) => false,
            VolumeMap::Tree(t) => tree_at_bound(t),
        }
    }

    /// Whether the page ids may not cover changing blocks `first .. first + count` to `to`
    /// (`None`: data; `TreeMap::short_for`); never on v2, whose map pages are laid out at
    /// create.
    pub fn short_for(&mut self, first: u64, count: u64, to: Option<MapEntry>) -> Result<bool> {
        match self {
            VolumeMap::Pages(_) => Ok(false),
            VolumeMap::Tree(t) => t.short_for(first, count, to),
        }
    }

    /// Extent pairs the metadata carver wants at this phase 1, with `H` (the partner offset);
    /// none on v2, which has no metadata extents.
    pub fn carve_wanted(&self) -> (u32, u32) {
        match self {
            VolumeMap::Pages(_) => (0, 0),
            VolumeMap::Tree(t) => (t.carve_wanted(), t.partner_offset()),
        }
    }

    /// `H`, the offset between a carving pair's extents (`e < H` and `e + H`); none on v2.
    pub fn partner_offset(&self) -> Option<u32> {
        match self {
            VolumeMap::Pages(_) => None,
            VolumeMap::Tree(t) => Some(t.partner_offset()),
        }
    }

    /// Phase 1 returns carved extent pairs no page uses, above the carver's high watermark
    /// (`TreeMap::return_excess`): their copy-0 extents; none on v2.
    pub fn return_excess(&mut self, max: usize, look: usize) -> Result<Vec<u32>> {
        match self {
            VolumeMap::Pages(_) => Ok(Vec::new()),
            VolumeMap::Tree(t) => t.return_excess(max, look),
        }
    }

    /// Phase 1 carved extent `e` and its partner `e + H`.
    pub fn carve(&mut self, e: u32) -> Result<()> {
        match self {
            VolumeMap::Pages(_) => Err(Error::Invalid("a v2 map has no metadata extents".into())),
            VolumeMap::Tree(t) => t.carve(e),
        }
    }

    /// Phase 1 of checkpoint `seq`: the page writes its phase 2 issues and what its slot and
    /// commit need.
    pub fn snapshot(&mut self, seq: u64) -> Result<(Vec<PageWrite>, MapSnapshot)> {
        match self {
            VolumeMap::Pages(m) => {
                let (writes, pages) = m.snapshot(seq)?;
                Ok((writes, MapSnapshot::Pages(pages)))
            }
            VolumeMap::Tree(t) => {
                let (ck, writes) = t.prepare()?;
                Ok((writes, MapSnapshot::Tree(ck.ext)))
            }
        }
    }

    /// v2's page slots and summaries for the slot of `snapshot`'s checkpoint; empty for the
    /// tree, whose slot carries the extension instead.
    pub fn checkpoint_arrays(&self, snapshot: &MapSnapshot) -> (Vec<PageSlot>, Vec<u8>) {
        match (self, snapshot) {
            (VolumeMap::Pages(m), MapSnapshot::Pages(pages)) => m.checkpoint_arrays(pages),
            _ => (Vec::new(), Vec::new()),
        }
    }

    /// Checkpoint `seq` of `snapshot` is durable.
    pub fn commit(&mut self, seq: u64, snapshot: MapSnapshot) {
        match (self, snapshot) {
            (VolumeMap::Pages(m), MapSnapshot::Pages(pages)) => m.commit(seq, pages),
            (VolumeMap::Tree(t), MapSnapshot::Tree(_)) => t.commit(),
            _ => unreachable!("a snapshot commits the map that took it"),
        }
    }

    /// The checkpoint of the last snapshot failed: its pages are dirty again.
    pub fn abort(&mut self) {
        match self {
            VolumeMap::Pages(m) => m.abort(),
            VolumeMap::Tree(t) => t.abort(),
        }
    }

    /// Cache statistics (the tree reports its page pool in the same terms).
    pub fn cache_stats(&self) -> MapCacheStats {
        match self {
            VolumeMap::Pages(m) => m.cache_stats(),
            VolumeMap::Tree(t) => {
                let p = t.pool_stats();
                MapCacheStats {
                    hits: p.hits,
                    faults: p.misses,
                    bytes_read: p.misses * crate::format::MAP_PAGE_BYTES as u64,
                    resident_pages: p.resident,
                    dirty_pages: p.dirty,
                    budget_pages: p.frames,
                    reserved_pages: p.reserved,
                }
            }
        }
    }

    /// Bytes of RAM the map uses now.
    pub fn ram_bytes(&self) -> u64 {
        match self {
            VolumeMap::Pages(m) => m.ram_bytes(),
            VolumeMap::Tree(t) => {
                (t.pool_stats().resident + t.pool_stats().reserved) * crate::meta::pool::FRAME_BYTES
            }
        }
    }

    /// v2 pages found with no intact copy (the tree reports a damaged page as an error on the
    /// access that meets it).
    pub fn damaged_pages(&self) -> Vec<u32> {
        match self {
            VolumeMap::Pages(m) => m.damaged_pages(),
            VolumeMap::Tree(_) => Vec::new(),
        }
    }

    /// Pages found with one damaged copy and the other intact, one line each for `zbd check`
    /// (a writable volume's next checkpoint rewrites them).
    pub fn repaired(&self) -> Vec<String> {
        match self {
            VolumeMap::Pages(m) => m
                .repaired_pages()
                .iter()
                .map(|p| format!("map page {p}: one copy is damaged, the other is intact"))
                .collect(),
            VolumeMap::Tree(t) => t
                .bad_copies_seen()
                .iter()
                .map(|a| {
                    format!(
                        "metadata page {} ({:?}, level {}, position {}): copy 0 is damaged, \
                         copy 1 is intact",
                        a.id, a.kind, a.level, a.position
                    )
                })
                .collect(),
        }
    }

    /// The page tree's scrub ([`TreeMap::durable_copies_in`]); v2 has its own (`slots`).
    pub fn tree(&mut self) -> Option<&mut TreeMap> {
        match self {
            VolumeMap::Pages(_) => None,
            VolumeMap::Tree(t) => Some(t),
        }
    }

    /// Pages with no intact copy, one line each for `zbd check`: v2's map pages, the tree's
    /// leaves (both stand in as pages of damaged entries).
    pub fn lost(&self) -> Vec<String> {
        match self {
            VolumeMap::Pages(m) => (m.damaged_pages().iter())
                .map(|p| format!("map page {p} is damaged; its blocks are unreadable"))
                .collect(),
            VolumeMap::Tree(t) => (t.lost_leaves().iter())
                .map(|a| {
                    format!(
                        "metadata page {} ({:?}, level {}, position {}) has no intact copy; its \
                         blocks are unreadable",
                        a.id, a.kind, a.level, a.position
                    )
                })
                .collect(),
        }
    }

    /// v2's page slots, for the scrub of map pages (the tree's: [`VolumeMap::tree`]).
    pub fn slots(&self) -> &[PageSlot] {
        match self {
            VolumeMap::Pages(m) => m.slots(),
            VolumeMap::Tree(_) => &[],
        }
    }

    /// v2 pages the scrub found with one bad copy: rewritten by the next checkpoint.
    pub fn mark_dirty(&mut self, pages: impl IntoIterator<Item = u32>) {
        if let VolumeMap::Pages(m) = self {
            m.mark_dirty(pages);
        }
    }
}
