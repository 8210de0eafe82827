//! The bit-10 map (docs/design.md, "Map trees, pages and pairs"; "Build order" 1b, "Wiring
//! (with 1b.2 on)"): [`Map`](super::Map)'s API over the default device's page tree in the
//! volume's [`Catalog`] (its pages on the medium and in the pool), with the same exact volume
//! counters ([`MapCounters`]).
//!
//! An open of a bit-10 volume builds a `TreeMap` from the extension and counters its
//! checkpoint carries ([`TreeMap::open`]); `zbd create` with metadata pages makes one
//! ([`TreeMap::create`]); each checkpoint writes what [`TreeMap::checkpoint`] returns after
//! v2's header ([`VolumeMap`](super::VolumeMap) chooses between the two maps).
//!
//! The counters move only with what the tree reports: the old entry `MapTree::set` returns,
//! and the [`Replaced`] runs of `MapTree::set_range`, which name every block whose entry
//! changed (each run: `count` blocks leave `entry` for the range's new entry). Its tests run
//! one random op sequence on a v2 `Map` and on a `TreeMap` and compare every answer.

use std::sync::Arc;

use super::cow::{CatalogSharing, CowPromotion};
use super::MapCounters;
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::format::{
    key_device, key_lba, BlockState, Checkpoint, DeviceRow, ExtensionBody, MapEntry, PageAddress,
    PageKind, Superblock, MAP_ENTRIES_PER_PAGE, ROW_FLAG_DELETING, ROW_FLAG_FLATTENED,
    ROW_FLAG_ROLLBACK_TARGET,
};
use crate::meta::catalog::Catalog;
use crate::meta::devices::{default_row, DEFAULT_DEVICE, DEVICES_MAX};
use crate::meta::map_tree::MapTree;
use crate::meta::map_tree::{summary_slot, Replaced};
use crate::meta::page::Page;
use crate::meta::pool::{Floor, PagePool, PoolStats, FRAME_BYTES};
use crate::meta::store::{FrameWrite, MetaCheckpoint, MetaStore};
use crate::meta::{ListBounds, MetaGeometry};
use std::cell::RefCell;

/// List entries kept out of the window's count: the directory, pair-state and fixed pages a
/// checkpoint adds, and the pages one step dirties past the check.
const LIST_MARGIN: usize = 256;

/// Frames the pool has beyond its floor at least, so lookups of a volume served with a small
/// map cache still find clean frames to fault into.
const POOL_FRAMES_ABOVE_FLOOR: u64 = 256;

/// Pages a checkpoint's fold may create at once: a pair-state page and its directory page.
const FOLD_PAGES: usize = 2;

/// The list bounds of a bit-10 volume whose list holds `capacity` entries.
fn list_bounds(sb: &Superblock, capacity: u32) -> ListBounds {
    ListBounds::new(capacity, sb.extent_table_pages, DEVICES_MAX as u32)
}

/// A pool of `cache_bytes`, raised to its floor and a little above when smaller.
fn pool(
    geometry: &MetaGeometry,
    bounds: &ListBounds,
    cache_bytes: usize,
) -> Result<PagePool<Page>> {
    let floor = Floor::new(geometry, bounds);
    let least = floor.bytes() + POOL_FRAMES_ABOVE_FLOOR * FRAME_BYTES;
    PagePool::new((cache_bytes as u64).max(least), floor.frames())
}

/// A key of no live device: a request checked against its device cannot name one.
fn no_device(key: u64) -> Error {
    Error::Invalid(format!(
        "block key {key} names no device ({})",
        key_device(key)
    ))
}

/// What a range change replaced, into the counters: `r.count` blocks leave `r.entry` for
/// `new` (damaged blocks are taken off `damaged_blocks` by the caller, after the leaves found
/// lost meanwhile are counted).
fn replaced_into(counters: &mut MapCounters, damaged: &mut u64, r: &Replaced, new: &MapEntry) {
    if r.entry.state == BlockState::Corrupt {
        *damaged += r.count;
        counters.add(new, r.count);
    } else {
        counters.replace(&r.entry, new, r.count);
    }
}

/// What a checkpoint of a [`TreeMap`] carries, all as of its phase 1: the volume counters, the
/// extension (pair-state and directory lists, device table, SBT and PCT roots), and the
/// interval an open after it writes in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeCheckpoint {
    pub counters: MapCounters,
    pub ext: ExtensionBody,
    pub interval: u64,
}

/// The map of one device as a tree of metadata pages, in the volume's [`Catalog`].
pub struct TreeMap {
    pub(super) catalog: Catalog,
    counters: MapCounters,
    /// Shared items and their references (`map/shared.rs`), counted from the SBT when first
    /// asked, then kept with every change.
    shared: Option<super::shared::SharedTotals>,
    /// Items copy on write made shared since the caller last took them (`take_promoted`):
    /// their extent charges are the caller's to move.
    promoted: Vec<CowPromotion>,
}

impl TreeMap {
    /// The map of `catalog`'s default device; `counters` are the volume counters of the
    /// checkpoint the catalog came from.
    pub fn new(catalog: Catalog, counters: MapCounters) -> TreeMap {
        TreeMap {
            catalog,
            counters,
            shared: None,
            promoted: Vec::new(),
        }
    }

    /// The map of a volume just laid out (`sb`), its metadata pages to come from the carved
    /// extents `metadata_extents` (copy 0 of each pair): the default device of the volume's
    /// logical size, all unmapped, exact (zero) counters. Its first checkpoint is the volume's
    /// first, sequence 1.
    pub fn create(
        storage: Arc<dyn Storage>,
        sb: &Superblock,
        metadata_extents: impl IntoIterator<Item = u32>,
        list_capacity: u32,
        cache_bytes: usize,
    ) -> Result<TreeMap> {
        let geometry = MetaGeometry::at_enable(sb)?;
        let bounds = list_bounds(sb, list_capacity);
        let store = MetaStore::open(
            storage,
            sb,
            geometry,
            metadata_extents,
            &MetaCheckpoint::default(),
            1,
        )?;
        let pool = pool(&geometry, &bounds, cache_bytes)?;
        let catalog = Catalog::create(
            store,
            pool,
            &geometry,
            &bounds,
            default_row(sb.logical_blocks, 0),
        )?;
        let counters = MapCounters {
            savings_known: true,
            ..MapCounters::default()
        };
        Ok(TreeMap::new(catalog, counters))
    }

    /// The map durable checkpoint `ck` (with bit 10) names, its pages read on demand through
    /// a pool of `cache_bytes` (at least the floor), from the metadata extents the extent
    /// table lists (`metadata_extents`: every extent in state metadata; copy 1 is ignored).
    pub fn open(
        storage: Arc<dyn Storage>,
        sb: &Superblock,
        ck: &Checkpoint,
        metadata_extents: impl IntoIterator<Item = u32>,
        cache_bytes: usize,
    ) -> Result<TreeMap> {
        let ext = ck.extension.as_ref().ok_or_else(|| {
            Error::CorruptMetadata("a bit-10 checkpoint without its extension".into())
        })?;
        let geometry = MetaGeometry::from_extension(&ext.header, sb)?;
        let bounds = list_bounds(sb, ext.header.list_capacity);
        let pool = pool(&geometry, &bounds, cache_bytes)?;
        let copy0 = metadata_extents.into_iter().filter(|&e| e < geometry.h);
        let catalog = Catalog::open(
            storage,
            sb,
            geometry,
            copy0,
            ext,
            // The next checkpoint is `ck.seq + 1`: its pages carry that sequence.
            ck.seq + 1,
            pool,
            &bounds,
        )?;
        Ok(TreeMap::new(catalog, MapCounters::of_checkpoint(ck)))
    }

    /// Logical blocks of the default device.
    pub fn blocks(&self) -> u64 {
        self.catalog.trees[&DEFAULT_DEVICE].blocks()
    }

    /// Logical blocks of `device`; `None` for no live device.
    pub fn blocks_of(&self, device: u32) -> Option<u64> {
        if self.deleting(device) {
            return None;
        }
        self.catalog.trees.get(&device).map(|t| t.blocks())
    }

    /// Whether some map page has more than one parent (the PCT holds a count).
    pub fn shares_pages(&self) -> bool {
        !self.catalog.pct.is_empty()
    }

    /// Device `id`'s row.
    pub fn row(&self, id: u32) -> Option<&DeviceRow> {
        self.catalog.devices.get(id)
    }

    /// The catalog's devices (rows in id order).
    pub fn devices(&self) -> Vec<DeviceRow> {
        self.catalog.devices.rows().cloned().collect()
    }

    /// Adds a device (`Catalog::add_device`); its id.
    pub fn add_device(&mut self, row: DeviceRow) -> Result<u32> {
        self.catalog.add_device(row)
    }

    /// Removes device `id`, whose blocks must all be unmapped (`Catalog::remove_device`).
    pub fn remove_device(&mut self, id: u32) -> Result<DeviceRow> {
        self.catalog.remove_device(id)
    }

    /// The tree of the device block key `key` names, with the pool and the store, and the
    /// key's LBA in it; an error for a key of no live device.
    fn tree_at(
        &mut self,
        key: u64,
    ) -> Result<(&mut MapTree, &mut PagePool<Page>, &mut MetaStore, u64)> {
        let device = key_device(key);
        let (tree, pool, store) = self
            .catalog
            .map_of(device)
            .ok_or_else(|| Error::Invalid(format!("block key {key} names no device ({device})")))?;
        Ok((tree, pool, store, key_lba(key)))
    }

    /// Exact counters of the whole map.
    pub fn counters(&self) -> MapCounters {
        self.counters
    }

    /// Pages the open window may count before a checkpoint must come: half the list's room,
    /// so the window a crash leaves (the checkpoint in flight and what came after it, both
    /// replayed into one recovery checkpoint) fits the slot's list too.
    fn window_max(&self) -> usize {
        (self.list_capacity() as usize).saturating_sub(LIST_MARGIN) / 2
    }

    /// The pair-state list's capacity `C`, as the volume's extension names it.
    pub fn list_capacity(&self) -> u32 {
        self.catalog.list_capacity()
    }

    /// Whether the next checkpoint's list nears what the open window may count (a checkpoint
    /// must come now, lock held).
    pub fn window_full(&self) -> bool {
        self.catalog.store.window(&self.catalog.pool) >= self.window_max()
    }

    /// Whether the window is half way there (a checkpoint is asked for outside the lock).
    pub fn window_half_full(&self) -> bool {
        self.catalog.store.window(&self.catalog.pool) >= self.window_max() / 2
    }

    /// Whether the window is three quarters there (writers wait for the checkpoint in flight
    /// before they take the lock: `VolumeMap::checkpoint_pressed`).
    pub fn window_pressed(&self) -> bool {
        self.catalog.store.window(&self.catalog.pool) >= self.window_max() * 3 / 4
    }

    /// Discards the page slots no page needs (`MetaStore::discard_stale_slots`).
    pub fn discard_stale_slots(
        &mut self,
        discard: impl FnMut(u64, u64) -> Result<()>,
    ) -> Result<u64> {
        let c = &mut self.catalog;
        c.store.discard_stale_slots(&mut c.pool, discard)
    }

    /// Pairs of the carved metadata extents no page uses, and all of theirs
    /// (`PairAllocator::free_of_carved`).
    pub fn carved_pairs_free(&self) -> (u64, u64) {
        self.catalog.store.alloc.free_of_carved()
    }

    /// Whether allocation may be short of ids for some map change (the cheap mark before
    /// `short_for` counts): a set or a range change creates at most the pages of two
    /// root-to-leaf paths, and a fold in a checkpoint placing may write takes two more.
    fn short_of_ids(&self) -> bool {
        self.catalog.store.alloc.allocatable() <= self.short_at()
    }

    /// Whether the allocatable ids may not cover the change of blocks `first .. first +
    /// count` to `to` (unmapped or zero; `None`: data, one block or unit): only when
    /// `short_of_ids`, the pages the change creates at most are counted on its paths
    /// (`MapTree::pages_needed`), so a change that creates none (most trims) is never short.
    pub fn short_for(&mut self, first: u64, count: u64, to: Option<MapEntry>) -> Result<bool> {
        if !self.short_of_ids() {
            return Ok(false);
        }
        let to = to.and_then(summary_slot);
        let (tree, pool, store, lba) = self.tree_at(first)?;
        let mut needed = tree.pages_needed(pool, store, lba, lba.saturating_add(count), to)?;
        if needed > 0 {
            // Placing a data block may write a checkpoint (the queue ran dry, the first
            // unit) between this check and the change, and its fold may take a new
            // pair-state page and its directory page from the same ids (review 13). A change
            // that creates nothing needs no margin: trims never fail for ids.
            needed += FOLD_PAGES;
        }
        let last = lba.saturating_add(count.max(1) - 1);
        let leaves = crate::meta::tree::position(last, 0) - crate::meta::tree::position(lba, 0) + 1;
        needed += self.cow_margin(leaves);
        let a = &self.catalog.store.alloc;
        Ok(a.allocatable() < a.floor(self.catalog.store.usage) + a.claimed() + needed)
    }

    /// Pages a change spanning `leaves` map leaves may take for copy on write beyond its
    /// path's own, while pages are shared: per level a copy and the PCT or SBT leaves its
    /// counts split (an interior copy counts 1,020 children, a leaf copy shares up to 255
    /// items), and the promotions of the leaves it may give up, at most the 64 of one range
    /// step (about three SBT leaves each). Asked before the change, so that no copy stops half
    /// way for want of an id (first form: a margin, where the design admits steps by their
    /// worst case). Sized by the span (two paths past one leaf: its ends' paths may part):
    /// when every change asked for a 64-leaf step's 252 ids, a small volume's whole stock,
    /// one-block writes failed with ENOSPC with 13 % of the extents free. The most one change
    /// was seen to take is 15 ids in the snapshot tests and 33 with 260 snapshots piling items
    /// on one leaf's births (their SBT inserts split full leaves); 63 are asked for one leaf.
    fn cow_margin(&self, leaves: u64) -> usize {
        if self.catalog.pct.is_empty() {
            return 0;
        }
        let leaves = leaves.clamp(1, 64) as usize;
        let per_path = 10 * usize::from(crate::meta::tree::DEPTH_MAX);
        (per_path * leaves.min(2) + 3 * leaves).min(per_path + 64 * 3)
    }

    /// Allocatable ids at or below which one map change may find none (`short_of_ids`).
    fn short_at(&self) -> usize {
        let store = &self.catalog.store;
        let a = &store.alloc;
        a.floor(store.usage)
            + a.claimed()
            + self.cow_margin(64)
            + 2 * usize::from(crate::meta::tree::DEPTH_MAX)
            + FOLD_PAGES
    }

    /// Extent pairs the stock carver wants at this phase 1: none while the allocatable ids
    /// are at or above the low watermark and above `short_of_ids`; else enough to bring them
    /// to the high watermark (and past the short mark).
    pub fn carve_wanted(&self) -> u32 {
        let a = &self.catalog.store.alloc;
        let (low, high) = a.watermarks();
        let have = a.allocatable();
        let short = self.short_at();
        if have >= low && have > short {
            return 0;
        }
        let want = high.max(short + 1) - have;
        want.div_ceil(self.catalog.store.geometry().pairs_per_extent as usize) as u32
    }

    /// Phase 1 gives back to data, at most `max` at a time, the carved extent pairs no page
    /// uses while the allocatable ids stay at or above the high watermark (and past the short
    /// mark) without them, so the carver, which starts below the low one, does not take them
    /// again at once. Create's stock (the last extents below `H`, sized for the default
    /// device's interior pages) stays: returning it would make the carver take it back, 64
    /// pairs a checkpoint, as the device fills. Their ids leave allocation now; the extents
    /// are the caller's to free.
    pub fn return_excess(&mut self, max: usize, look: usize) -> Result<Vec<u32>> {
        let keep = self.short_at() + 1;
        let g = self.catalog.store.geometry();
        let stock_from = g.h - g.stock_extents(self.blocks());
        let a = &mut self.catalog.store.alloc;
        let keep = keep.max(a.watermarks().1);
        let extents = a.returnable(keep, stock_from, max, look);
        for &e in &extents {
            a.withdraw(e)?;
        }
        Ok(extents)
    }

    /// The extent holding copy 0 of page `id` (copy 1 is `H` above it); `None` in region 0.
    pub fn home_extent(&self, id: u32) -> Option<u32> {
        match self.catalog.store.geometry().home(id)? {
            crate::meta::PairHome::Extent { extent, .. } => Some(extent),
            crate::meta::PairHome::Region0 { .. } => None,
        }
    }

    /// `H`: carved pairs have copy 0 below it and copy 1 in the extent `H` above.
    pub fn partner_offset(&self) -> u32 {
        self.catalog.store.geometry().h
    }

    /// Phase 1 carved extent `e` and its partner (their table state is metadata): their ids
    /// become allocatable when this checkpoint commits.
    pub fn carve(&mut self, e: u32) -> Result<()> {
        self.catalog.store.alloc.carve(e)
    }

    /// The pages of a device's tree whose range starts in block keys `first .. first + count`
    /// (and, with `first` 0, the pair-state and directory pages), each with the offsets of its
    /// durable copies; pages the next checkpoint writes anyway are left out. For the scrub.
    pub fn durable_copies_in(
        &mut self,
        first: u64,
        count: u64,
    ) -> Result<Vec<(PageAddress, [u64; 2])>> {
        let mut pages = Vec::new();
        if first == 0 {
            pages = self.catalog.devices.page_addresses();
        }
        let (tree, pool, store, lba) = self.tree_at(first)?;
        tree.pages_in(pool, store, lba, count, &mut |at| pages.push(at))?;
        let mut out = Vec::with_capacity(pages.len());
        for at in pages {
            if let Some(copies) = store.durable_copies(pool, at.id)? {
                out.push((at, copies));
            }
        }
        if first == 0 {
            let store = &self.catalog.store;
            out.extend(store.own_pages_copies(&self.catalog.pool)?);
        }
        Ok(out)
    }

    /// Whether page `at` is still where the scrub read it: `copies` are its durable copies.
    pub fn still_at(&mut self, at: &PageAddress, copies: [u64; 2]) -> bool {
        if matches!(at.kind, PageKind::PairState | PageKind::PairStateDirectory) {
            let store = &self.catalog.store;
            return (store.own_pages_copies(&self.catalog.pool).ok())
                .is_some_and(|own| own.contains(&(*at, copies)));
        }
        let (pool, store) = (&mut self.catalog.pool, &mut self.catalog.store);
        let resident_elsewhere = pool.peek(at.id).is_some_and(|p| p.address(at.id) != *at);
        !resident_elsewhere && store.durable_copies(pool, at.id).ok().flatten() == Some(copies)
    }

    /// Whether page `at` is resident as that page with its content (a leaf standing in for
    /// one with no intact copy is not its content). Directory pages always are: the store
    /// keeps their entries, and a checkpoint encodes the page from them.
    pub fn resident(&self, at: &PageAddress) -> bool {
        if at.kind == PageKind::PairStateDirectory {
            let k = at.position as u32;
            let dir = self.catalog.store.states.directory_page(k);
            return dir.is_some_and(|(id, _)| id == at.id);
        }
        (self.catalog.pool.peek(at.id)).is_some_and(|p| p.address(at.id) == *at)
            && !self.catalog.store.lost.contains(at)
    }

    /// Queues page `at`, found with a damaged copy, for a rewrite of both copies by a phase 1.
    pub fn queue_rewrite(&mut self, at: PageAddress) {
        self.catalog.store.scrub_found(at);
    }

    /// Leaves found with no intact copy since open (the first 1,024).
    pub fn lost_leaves(&self) -> &[PageAddress] {
        &self.catalog.store.lost
    }

    /// Pages read from copy 1 since open because copy 0 failed (the first 1,024).
    pub fn bad_copies_seen(&self) -> &[PageAddress] {
        &self.catalog.store.bad_seen
    }

    /// The page pool's statistics (pinned frames tell when a checkpoint must come).
    pub fn pool_stats(&self) -> PoolStats {
        self.catalog.pool.stats()
    }

    /// The catalog and the counters, for the shared-item operations (`map/shared.rs`).
    pub(super) fn parts(
        &mut self,
    ) -> (
        &mut Catalog,
        &mut MapCounters,
        &mut Option<super::shared::SharedTotals>,
    ) {
        (&mut self.catalog, &mut self.counters, &mut self.shared)
    }

    /// The entry of `lba`.
    pub fn get(&mut self, key: u64) -> Result<MapEntry> {
        if self
            .blocks_of(key_device(key))
            .is_none_or(|blocks| key_lba(key) >= blocks)
        {
            // Only a stale name can get here (requests are checked against their device): a
            // dedup candidate in a deleted device, or a ref's birth block named under another
            // device than its own (state/share.rs), which name nothing.
            return Ok(MapEntry::UNMAPPED);
        }
        let (tree, pool, store, lba) = self.tree_at(key)?;
        let r = tree.get(pool, store, lba);
        self.count_lost();
        r
    }

    /// Counts the blocks of leaves found with no intact copy since the last call as damaged,
    /// as v2 counts a lost map page's (what their entries counted before is unknown).
    fn count_lost(&mut self) {
        let blocks = self.blocks();
        for at in self.catalog.store.lost_new.drain(..) {
            let first = at.position * MAP_ENTRIES_PER_PAGE as u64;
            self.counters.damaged_blocks += blocks
                .saturating_sub(first)
                .min(MAP_ENTRIES_PER_PAGE as u64);
        }
    }

    /// The entries of `count` blocks from `first`, appended to `out`: one walk for the range,
    /// summaries answered without a page. A range past the device is an error.
    pub fn get_run(&mut self, first: u64, count: u64, out: &mut Vec<MapEntry>) -> Result<()> {
        let (tree, pool, store, first) = self.tree_at(first)?;
        let r = tree.scan(pool, store, first, count, &mut |_, n, e| {
            out.extend(std::iter::repeat_n(e, n as usize))
        });
        self.count_lost();
        r
    }

    /// A host change of the entry of `key` (copy on write of the pages its device shares:
    /// `MapTree::write`); returns the old entry if it changed (its leaf is then dirty, pinned
    /// in the pool until a checkpoint writes it).
    pub fn set(&mut self, key: u64, new: MapEntry) -> Result<Option<MapEntry>> {
        let device = key_device(key);
        let counters = RefCell::new(self.counters);
        let old =
            match self.catalog.cow(device).map(|parts| {
                CatalogSharing::of(parts, &counters, &mut self.shared, &mut self.promoted)
            }) {
                Some((tree, pool, store, mut share)) => {
                    tree.write(pool, store, &mut share, key_lba(key), new)
                }
                None => Err(no_device(key)),
            };
        self.counters = counters.into_inner();
        self.count_lost();
        let old = old?;
        if old == new {
            return Ok(None);
        }
        self.counters.replace(&old, &new, 1);
        Ok(Some(old))
    }

    /// A content-preserving change of the entry of `key` (a cleaner move, a damage mark, a
    /// promotion): in place, every device that shares the page sees it.
    pub fn set_in_place(&mut self, key: u64, new: MapEntry) -> Result<Option<MapEntry>> {
        let (tree, pool, store, lba) = self.tree_at(key)?;
        let old = tree.set(pool, store, lba, new);
        self.count_lost();
        let old = old?;
        if old == new {
            return Ok(None);
        }
        self.counters.replace(&old, &new, 1);
        Ok(Some(old))
    }

    /// Sets `count` entries from `first` to `new`, unmapped or zero (any other entry is
    /// refused: a range holds one summary); `freed(old)` sees every data and shared entry
    /// replaced (each a block's charge or a reference to drop), in
    /// block order. Whole subtrees only change a summary slot; the range stops at the device's
    /// end.
    pub fn set_range(
        &mut self,
        first: u64,
        count: u64,
        new: MapEntry,
        mut freed: impl FnMut(MapEntry),
    ) -> Result<()> {
        let Some(to) = summary_slot(new) else {
            return Err(Error::Invalid(format!(
                "a map range is set to unmapped or zero, not {new:?}"
            )));
        };
        let device = key_device(first);
        let counters = RefCell::new(self.counters);
        // Damaged entries replaced are taken off once a leaf found lost meanwhile is counted.
        let mut damaged = 0;
        let r =
            match self.catalog.cow(device).map(|parts| {
                CatalogSharing::of(parts, &counters, &mut self.shared, &mut self.promoted)
            }) {
                Some((tree, pool, store, mut share)) => tree.set_range(
                    pool,
                    store,
                    &mut share,
                    key_lba(first),
                    count,
                    to,
                    &mut |r: Replaced| {
                        replaced_into(&mut counters.borrow_mut(), &mut damaged, &r, &new);
                        if matches!(r.entry.state, BlockState::Data | BlockState::Shared) {
                            // Data is only ever a leaf entry, and equal shared entries of
                            // neighbouring blocks (references to one block) make runs: each is
                            // one reference.
                            for _ in 0..r.count {
                                freed(r.entry);
                            }
                        }
                    },
                ),
                None => Err(no_device(first)),
            };
        self.counters = counters.into_inner();
        self.count_lost();
        self.counters.damaged_blocks = self.counters.damaged_blocks.saturating_sub(damaged);
        r
    }

    /// `zbd check`'s recount of page counts: every page's parents (device rows and interior
    /// slots, each interior page once) against the PCT (no entry: 1); one line per problem,
    /// at most 16.
    pub fn check_page_counts(&mut self) -> Result<Vec<String>> {
        use crate::format::PctEntry;
        let Catalog {
            trees,
            pool,
            store,
            pct,
            ..
        } = &mut self.catalog;
        let mut parents: std::collections::HashMap<(u64, u32), u32> = Default::default();
        let mut seen = std::collections::HashSet::new();
        for tree in trees.values() {
            tree.links(pool, store, &mut seen, &mut |level, pos, id| {
                *parents.entry((PctEntry::key(level, pos), id)).or_default() += 1;
            })?;
        }
        let mut stored: std::collections::HashMap<(u64, u32), u32> = Default::default();
        pct.scan(pool, store, (0, 0), &mut |k, v| {
            stored.insert(k, v);
            true
        })?;
        let mut problems = Vec::new();
        for (k, &n) in &parents {
            let count = stored.remove(k).unwrap_or(1);
            if count != n {
                problems.push(format!(
                    "map page {} (key {:#x}): count {count} but {n} parents name it",
                    k.1, k.0
                ));
            }
        }
        for (k, count) in stored {
            problems.push(format!(
                "map page {} (key {:#x}): count {count} but no parent names it",
                k.1, k.0
            ));
        }
        problems.truncate(16);
        Ok(problems)
    }

    /// The items copy on write made shared since the last call (their extent charges move
    /// from their direct blocks to the items).
    pub fn take_promoted(&mut self) -> Vec<CowPromotion> {
        std::mem::take(&mut self.promoted)
    }

    /// A snapshot of writable device `source` (`kind` snapshot), or a clone of snapshot
    /// `source` (`kind` clone), named `name`, made at write sequence `seq` and Unix time
    /// `at`: a new row sharing the source's pages (`Catalog::add_shared_device`). Its id.
    pub fn add_shared_device(
        &mut self,
        source: u32,
        kind: crate::format::DeviceKind,
        name: &str,
        created: (u64, u64),
    ) -> Result<u32> {
        let (id, zeros) = self
            .catalog
            .add_shared_device(source, kind, name, created)?;
        self.counters.add(&MapEntry::ZERO, zeros);
        Ok(id)
    }

    /// Device `id` (emptied: its root a summary) names snapshot `snapshot`'s tree from now on,
    /// one parent more for its root; its epoch goes up (a rollback).
    pub fn share_tree(&mut self, snapshot: u32, id: u32) -> Result<()> {
        let zeros = self.catalog.share_tree(snapshot, id)?;
        self.counters.add(&MapEntry::ZERO, zeros);
        Ok(())
    }

    /// The runs of blocks (LBA, count) where devices `a` and `b` (of one size) differ; pages
    /// both trees name are not read.
    pub fn diff(&mut self, a: u32, b: u32) -> Result<Vec<(u64, u64)>> {
        if self.deleting(a) || self.deleting(b) {
            return Err(Error::Invalid(
                "a device being deleted is compared with nothing (delete it again to finish)"
                    .into(),
            ));
        }
        let (ta, tb) = match (self.catalog.trees.get(&a), self.catalog.trees.get(&b)) {
            (Some(&ta), Some(&tb)) => (ta, tb),
            _ => return Err(Error::Invalid("no such device".into())),
        };
        if ta.blocks() != tb.blocks() || ta.depth() != tb.depth() {
            return Err(Error::Invalid(
                "devices of different sizes are not compared block by block".into(),
            ));
        }
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let Catalog { pool, store, .. } = &mut self.catalog;
        crate::meta::map_tree::diff(pool, store, &ta, &tb, &mut |lba, n| match runs.last_mut() {
            Some((s, m)) if *s + *m == lba => *m += n,
            _ => runs.push((lba, n)),
        })?;
        Ok(runs)
    }

    /// Deletes device `id` (not the default one) and gives up its tree: every page no other
    /// device names is freed, `freed(entry)` hearing each data or shared entry of their leaves
    /// (a direct item dies, a reference goes); pages other devices keep only lose a count.
    pub fn release_device(&mut self, id: u32, freed: impl FnMut(MapEntry)) -> Result<()> {
        let done = self.release_device_step(id, u64::MAX, freed)?;
        debug_assert!(done, "an unbounded release finishes");
        Ok(())
    }

    /// `release_device` in steps (`MapTree::release_step`, `budget` pages and entries each):
    /// the row stays, marked [`ROW_FLAG_DELETING`] (`mark_deleting`), until the step that
    /// finishes, which removes it. Whether it finished.
    pub fn release_device_step(
        &mut self,
        id: u32,
        mut budget: u64,
        mut freed: impl FnMut(MapEntry),
    ) -> Result<bool> {
        if id == crate::meta::devices::DEFAULT_DEVICE {
            return Err(Error::Invalid("the default device is never deleted".into()));
        }
        let counters = RefCell::new(self.counters);
        let mut damaged = 0;
        let r =
            match self.catalog.cow(id).map(|parts| {
                CatalogSharing::of(parts, &counters, &mut self.shared, &mut self.promoted)
            }) {
                Some((tree, pool, store, mut share)) => {
                    let blocks = tree.blocks();
                    if tree.root() == crate::format::ChildSlot::AllZero {
                        let mut c = counters.borrow_mut();
                        c.sub(&MapEntry::ZERO, blocks);
                    }
                    let replaced = &mut |r: Replaced| {
                        replaced_into(
                            &mut counters.borrow_mut(),
                            &mut damaged,
                            &r,
                            &MapEntry::UNMAPPED,
                        );
                        if matches!(r.entry.state, BlockState::Data | BlockState::Shared) {
                            for _ in 0..r.count {
                                freed(r.entry);
                            }
                        }
                    };
                    tree.release_step(pool, store, &mut share, &mut budget, replaced)
                }
                None => Err(Error::Invalid(format!("no device {id} to delete"))),
            };
        self.counters = counters.into_inner();
        // A leaf the step found lost (its blocks reported damaged, above) is counted damaged
        // first: counted only by the next map call, after it was given up, it would stay
        // counted with no device naming it.
        self.count_lost();
        self.counters.damaged_blocks = self.counters.damaged_blocks.saturating_sub(damaged);
        let done = r?;
        if done {
            self.catalog.remove_device(id)?;
        }
        Ok(done)
    }

    /// Marks device `id` as being deleted ([`ROW_FLAG_DELETING`]): from now on it is never
    /// read, written or served (`blocks_of` knows no such device), and its tree may be given
    /// up in steps, each made durable by a checkpoint.
    pub fn mark_deleting(&mut self, id: u32) -> Result<()> {
        self.catalog
            .devices
            .update(id, |r| r.flags |= ROW_FLAG_DELETING)
    }

    /// Stops listing clone `id`'s origin ([`ROW_FLAG_FLATTENED`]); a row change only, since a
    /// clone holds its own references to everything it shares. Whether the row changed (false:
    /// already flattened).
    pub fn flatten(&mut self, id: u32) -> Result<bool> {
        let row = self
            .row(id)
            .ok_or_else(|| Error::Invalid(format!("no device {id} in this volume")))?;
        if row.kind != crate::format::DeviceKind::Clone {
            return Err(Error::Invalid(format!(
                "{:?} is not a clone: only clones have an origin to flatten away",
                row.name
            )));
        }
        if row.flags & ROW_FLAG_DELETING != 0 {
            return Err(Error::Invalid(format!("{:?} is being deleted", row.name)));
        }
        if row.flags & ROW_FLAG_FLATTENED != 0 {
            return Ok(false);
        }
        self.catalog
            .devices
            .update(id, |r| r.flags |= ROW_FLAG_FLATTENED)?;
        Ok(true)
    }

    /// Marks `target` (a snapshot of `device`, or none) as the snapshot `device` is being
    /// rolled back to ([`ROW_FLAG_ROLLBACK_TARGET`]), clearing the mark on every other
    /// snapshot of `device`: a row change the caller's checkpoint makes durable.
    pub fn mark_rollback(&mut self, device: u32, target: Option<u32>) -> Result<()> {
        let marked: Vec<u32> = self
            .catalog
            .devices
            .rows()
            .filter(|r| r.parent == device && r.flags & ROW_FLAG_ROLLBACK_TARGET != 0)
            .map(|r| r.id)
            .collect();
        for id in marked.into_iter().filter(|&id| Some(id) != target) {
            self.catalog
                .devices
                .update(id, |r| r.flags &= !ROW_FLAG_ROLLBACK_TARGET)?;
        }
        if let Some(t) = target {
            self.catalog
                .devices
                .update(t, |r| r.flags |= ROW_FLAG_ROLLBACK_TARGET)?;
        }
        Ok(())
    }

    /// Rollbacks a crash or an error stopped: (device, snapshot) ids, from the marked
    /// snapshots whose origin is still there.
    pub fn unfinished_rollbacks(&self) -> Vec<(u32, u32)> {
        self.catalog
            .devices
            .rows()
            .filter(|r| r.flags & ROW_FLAG_ROLLBACK_TARGET != 0)
            .filter(|r| self.row(r.parent).is_some() && !self.deleting(r.parent))
            .map(|r| (r.parent, r.id))
            .collect()
    }

    /// Whether device `id` is being deleted.
    pub fn deleting(&self, id: u32) -> bool {
        self.row(id)
            .is_some_and(|r| r.flags & ROW_FLAG_DELETING != 0)
    }

    /// Calls `f(lba, entry)` for every block in state `Data` in `first..first + count`, in LBA
    /// order; summary subtrees are skipped without reading them.
    pub fn for_each_data_in(
        &mut self,
        first: u64,
        count: u64,
        mut f: impl FnMut(u64, &MapEntry),
    ) -> Result<()> {
        let base = first - key_lba(first);
        let (tree, pool, store, first) = self.tree_at(first)?;
        let r = tree.scan(pool, store, first, count, &mut |lba, n, e| {
            if e.state == BlockState::Data {
                for l in lba..lba + n {
                    f(base + l, &e);
                }
            }
        });
        self.count_lost();
        r
    }

    /// Rebuilds the counters by reading the whole tree (an open whose extent table could not
    /// be read); `data(entry)` sees every data entry, and each shared item once as one entry
    /// of its whole stored length (`SbtValue::whole`).
    pub fn recount(&mut self, mut data: impl FnMut(&MapEntry)) -> Result<()> {
        let mut c = MapCounters {
            savings_known: true,
            ..MapCounters::default()
        };
        self.visit(&mut |_, n, e| {
            c.add(&e, n);
            if e.state == BlockState::Data {
                for _ in 0..n {
                    data(&e);
                }
            }
        })?;
        // Each shared item's stored bytes count once, at its SBT entry, charged to its extent
        // as one block of its whole length.
        self.catalog.for_each_shared(&mut |_, v| {
            c.add_item(&v);
            data(&v.whole());
            true
        })?;
        // The recount saw every damaged entry, those of leaves found lost on the way too.
        self.catalog.store.lost_new.clear();
        self.counters = c;
        Ok(())
    }

    /// Calls `f(key, n, entry)` for the blocks of every live page once, over every device's
    /// tree in id order (`MapTree::visit`): a page devices share is visited through the first
    /// tree that reaches it, with that device's keys.
    pub fn visit(&mut self, f: &mut impl FnMut(u64, u64, MapEntry)) -> Result<()> {
        let Catalog {
            trees, pool, store, ..
        } = &mut self.catalog;
        let mut seen = std::collections::HashSet::new();
        for (&id, tree) in trees.iter() {
            let base = crate::format::block_key(id, 0);
            tree.visit(pool, store, &mut seen, &mut |lba, n, e| f(base + lba, n, e))?;
        }
        Ok(())
    }

    /// Calls `f(state, blocks)` for each run of blocks of one state in `first..first + count`;
    /// a summary subtree is one run, read without a page.
    pub fn runs(
        &mut self,
        first: u64,
        count: u64,
        mut f: impl FnMut(BlockState, u64),
    ) -> Result<()> {
        let mut run: Option<(BlockState, u64)> = None;
        let (tree, pool, store, first) = self.tree_at(first)?;
        let r = tree.scan(pool, store, first, count, &mut |_, n, e| match &mut run {
            Some((s, m)) if *s == e.state => *m += n,
            _ => {
                if let Some((s, m)) = run.replace((e.state, n)) {
                    f(s, m);
                }
            }
        });
        self.count_lost();
        r?;
        if let Some((s, m)) = run {
            f(s, m);
        }
        Ok(())
    }

    /// The page id of the leaf holding block key `key`'s entry; `None` under a summary.
    pub fn leaf_id(&mut self, key: u64) -> Result<Option<u32>> {
        let (tree, pool, store, lba) = self.tree_at(key)?;
        let r = tree.leaf_id(pool, store, lba);
        self.count_lost();
        r
    }

    /// The first block key in `first .. first + count` that is not unmapped, or `None`
    /// (`MapTree::first_mapped`).
    pub fn first_mapped(&mut self, first: u64, count: u64) -> Result<Option<u64>> {
        let base = first - key_lba(first);
        let (tree, pool, store, lba) = self.tree_at(first)?;
        let r = tree.first_mapped(pool, store, lba, count);
        self.count_lost();
        Ok(r?.map(|lba| base + lba))
    }

    /// Phases 1 and 2 of a checkpoint ([`Catalog::checkpoint`]): every dirty page is written
    /// into the other slot of its pair and synced. Returns what the checkpoint carries for the
    /// map, as of phase 1. Changes may go on until [`TreeMap::commit`] or [`TreeMap::abort`];
    /// one checkpoint at a time. On an error it is aborted already.
    pub fn checkpoint(&mut self) -> Result<TreeCheckpoint> {
        let (ck, writes) = self.prepare()?;
        let (store, pool) = (&mut self.catalog.store, &mut self.catalog.pool);
        store.write_prepared(pool, &writes)?;
        Ok(ck)
    }

    /// Phase 1 of a checkpoint ([`Catalog::prepare`]): what the checkpoint carries and the
    /// frame writes its phase 2 must make durable before the slot names them.
    pub fn prepare(&mut self) -> Result<(TreeCheckpoint, Vec<FrameWrite>)> {
        let counters = self.counters;
        let (ext, writes) = self.catalog.prepare()?;
        let ck = TreeCheckpoint {
            counters,
            ext,
            interval: self.catalog.store.interval(),
        };
        Ok((ck, writes))
    }

    /// The checkpoint in flight is durable: its pair-state flips and frees take effect, its
    /// pages not changed since are clean.
    pub fn commit(&mut self) {
        self.catalog.commit();
    }

    /// The checkpoint in flight failed: its pages are dirty again, no pair state changed.
    pub fn abort(&mut self) {
        self.catalog.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{MemStorage, Storage};
    use crate::codec::id as codec;
    use crate::format::{
        Checkpoint, Superblock, BLOCK_BYTES, CKPT_FLAG_DICT_COUNTS, CKPT_FLAG_SAVINGS_COUNTERS,
        CKPT_FLAG_VOLUME_COUNTERS, MAP_ENTRIES_PER_PAGE,
    };
    use crate::layout::{plan, CreateOptions};
    use crate::map::Map;
    use crate::meta::devices::default_row;
    use crate::meta::page::Page;
    use crate::meta::pool::{PagePool, FRAME_BYTES};
    use crate::meta::store::{MetaCheckpoint, MetaStore};
    use crate::meta::tree::blocks_under;
    use crate::meta::{ListBounds, MetaGeometry};
    use proptest::prelude::*;
    use std::collections::BTreeSet;
    use std::sync::Arc;

    const LEAF: u64 = MAP_ENTRIES_PER_PAGE as u64;

    /// The volume the tree's pages live on, as store.rs's tests build one: 8 MiB, so region 0
    /// is its 9 map pages, with 1 MiB extents of 128 pairs. A device of more blocks than 9
    /// leaves hold puts its other pages in metadata extents.
    struct Volume {
        storage: Arc<dyn Storage>,
        sb: Superblock,
        geometry: MetaGeometry,
    }

    fn tree_volume_sb() -> Superblock {
        plan(&CreateOptions {
            extent_bytes: 1 << 20,
            capacity_bytes: Some(8 << 20),
            ..CreateOptions::new(8 << 20)
        })
        .expect("plan")
    }

    fn volume() -> Volume {
        let sb = tree_volume_sb();
        let geometry = MetaGeometry::at_enable(&sb).expect("geometry");
        Volume {
            storage: Arc::new(MemStorage::new(sb.total_bytes())),
            sb,
            geometry,
        }
    }

    /// Blocks region 0's leaves hold.
    fn region0_blocks() -> u64 {
        let g = MetaGeometry::at_enable(&tree_volume_sb()).expect("geometry");
        u64::from(g.pairs0) * LEAF
    }

    /// A device of two levels (a root over leaves) reaching 8 leaves past region 0, the last
    /// one partial.
    fn small() -> u64 {
        region0_blocks() + 8 * LEAF - 100
    }

    /// A device of three levels: one whole level-1 subtree, then a few leaves, the last one
    /// partial.
    fn large() -> u64 {
        blocks_under(1) + 3 * LEAF + 100
    }

    fn pool(frames: u64) -> PagePool<Page> {
        PagePool::new(frames * FRAME_BYTES, 0).expect("pool")
    }

    /// v2's map of a created volume of `blocks` blocks (an empty checkpoint with exact
    /// counters), with a cache that holds every page it dirties: it never reads a page nor
    /// needs a checkpoint.
    fn v2_map(blocks: u64) -> Map {
        let sb = plan(&CreateOptions {
            extent_bytes: 1 << 20,
            capacity_bytes: Some(4 << 20),
            ..CreateOptions::new(blocks * BLOCK_BYTES as u64)
        })
        .expect("plan");
        let ck = Checkpoint {
            flags: CKPT_FLAG_VOLUME_COUNTERS | CKPT_FLAG_SAVINGS_COUNTERS | CKPT_FLAG_DICT_COUNTS,
            ..Checkpoint::empty(&sb)
        };
        Map::open(
            Arc::new(MemStorage::new(sb.total_bytes())),
            &sb,
            &ck,
            64 << 20,
        )
    }

    /// A small list: every phase 1 folds it whole and its pair-state pages stay held.
    fn bounds() -> ListBounds {
        ListBounds::new(4096, 17, 1)
    }

    /// A created tree map, with the counters `like` starts with.
    fn created(v: &Volume, blocks: u64, frames: u64, like: &Map) -> TreeMap {
        let store = MetaStore::open(
            v.storage.clone(),
            &v.sb,
            v.geometry,
            0..v.geometry.h,
            &MetaCheckpoint::default(),
            1,
        )
        .expect("store");
        let catalog = Catalog::create(
            store,
            pool(frames),
            &v.geometry,
            &bounds(),
            default_row(blocks, 0),
        )
        .expect("catalog");
        TreeMap::new(catalog, like.counters())
    }

    /// An open from what checkpoint `ck` carried: a new pool, the catalog from its extension.
    fn reopen(v: &Volume, ck: &TreeCheckpoint, blocks: u64, frames: u64) -> TreeMap {
        let catalog = Catalog::open(
            v.storage.clone(),
            &v.sb,
            v.geometry,
            0..v.geometry.h,
            &ck.ext,
            ck.interval,
            pool(frames),
            &bounds(),
        )
        .expect("catalog");
        let t = TreeMap::new(catalog, ck.counters);
        assert_eq!(t.blocks(), blocks, "the row names the device's size");
        t
    }

    /// The checkpoint in flight (if any) and one more commit, then a cold open from what the
    /// last one carried: nothing changed since its phase 1, so it is the map as it is.
    fn cold(v: &Volume, mut t: TreeMap, in_flight: bool, blocks: u64, frames: u64) -> TreeMap {
        if in_flight {
            t.commit();
        }
        let ck = t.checkpoint().expect("checkpoint");
        t.commit();
        drop(t);
        reopen(v, &ck, blocks, frames)
    }

    fn tree_runs(t: &mut TreeMap, first: u64, count: u64) -> Vec<(BlockState, u64)> {
        let mut out = Vec::new();
        t.runs(first, count, |s, n| out.push((s, n))).expect("tree");
        out
    }

    fn v2_runs(m: &mut Map, first: u64, count: u64) -> Vec<(BlockState, u64)> {
        let mut out = Vec::new();
        m.runs(first, count, |s, n| out.push((s, n))).expect("v2");
        out
    }

    fn tree_data(t: &mut TreeMap) -> Vec<(u64, MapEntry)> {
        let mut out = Vec::new();
        t.for_each_data_in(0, t.blocks(), |l, e| out.push((l, *e)))
            .expect("tree");
        out
    }

    fn v2_data(m: &mut Map) -> Vec<(u64, MapEntry)> {
        let mut out = Vec::new();
        m.for_each_data_in(0, m.blocks(), |l, e| out.push((l, *e)))
            .expect("v2");
        out
    }

    fn same_entries(
        t: &mut TreeMap,
        m: &mut Map,
        first: u64,
        count: u64,
    ) -> std::result::Result<(), TestCaseError> {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        t.get_run(first, count, &mut a).expect("tree");
        m.get_run(first, count, &mut b).expect("v2");
        prop_assert_eq!(a.len() as u64, count);
        prop_assert!(a == b, "entries of {} + {} differ", first, count);
        Ok(())
    }

    /// The whole device: every block's state, and every data entry whole.
    fn same_device(t: &mut TreeMap, m: &mut Map) -> std::result::Result<(), TestCaseError> {
        let blocks = t.blocks();
        prop_assert_eq!(tree_runs(t, 0, blocks), v2_runs(m, 0, blocks));
        prop_assert_eq!(tree_data(t), v2_data(m));
        prop_assert_eq!(t.counters(), m.counters());
        Ok(())
    }

    fn data(
        codec: u8,
        len: u16,
        (unit_blocks, unit_index): (u8, u8),
        dict: u8,
        extent: u32,
    ) -> MapEntry {
        MapEntry {
            state: BlockState::Data,
            codec,
            len,
            extent,
            offset: extent.wrapping_mul(4096) & 0xF_FFFF,
            crc: u32::from(len) ^ extent.rotate_left(7),
            unit_index,
            unit_blocks,
            dict,
            seeded: extent % 2 == 1,
        }
    }

    const CORRUPT: MapEntry = MapEntry {
        state: BlockState::Corrupt,
        ..MapEntry::UNMAPPED
    };

    /// Entries of every class the counters keep: data raw or compressed, single blocks and
    /// units of each size class, with and without a dictionary; zero, unmapped and damaged.
    fn entry() -> impl Strategy<Value = MapEntry> {
        let unit = prop_oneof![
            Just((1u8, 0u8)),
            (0u8..2).prop_map(|i| (2, i)),
            (0u8..3).prop_map(|i| (3, i)),
            (0u8..4).prop_map(|i| (4, i)),
            (0u8..5).prop_map(|i| (5, i)),
            (0u8..16).prop_map(|i| (16, i)),
        ];
        let codecs = vec![codec::RAW, codec::LZ4, codec::ZSTD, codec::ZLIB, codec::LZO];
        let d = (
            prop::sample::select(codecs),
            1u16..=4096,
            unit,
            prop::sample::select(vec![0u8, 0, 1, 9, 127]),
            0u32..8,
        )
            .prop_map(|(c, len, u, dict, extent)| data(c, len, u, dict, extent));
        prop_oneof![
            6 => d,
            1 => Just(MapEntry::ZERO),
            1 => Just(MapEntry::UNMAPPED),
            1 => Just(CORRUPT),
        ]
    }

    #[derive(Clone, Debug)]
    enum Op {
        Set(u64, MapEntry),
        /// Sets a block to the entry it holds: no change, `None` from both.
        Again(u64),
        /// `set_range` to zero (true) or unmapped.
        Range(u64, u64, bool),
        Get(u64),
        GetRun(u64, u64),
        ForEachData,
        /// The tree map only: a checkpoint's phases 1 and 2; ops go on while it is in flight.
        Begin,
        /// The tree map only: the checkpoint in flight commits (true) or fails.
        End(bool),
        /// The tree map only: a committed checkpoint and a cold open from what it carried.
        Cold,
    }

    /// Blocks around leaf boundaries, region 0's end, the level-1 boundary (three levels) and
    /// the device's end, and anywhere.
    fn lba(blocks: u64) -> impl Strategy<Value = u64> {
        let mut bases = vec![0, LEAF - 5, region0_blocks() - 300, blocks - 400];
        if blocks > blocks_under(1) {
            bases.push(blocks_under(1) - 300);
        }
        let near = (prop::sample::select(bases), 0u64..600)
            .prop_map(move |(b, o)| (b + o).min(blocks - 1));
        // Anywhere: more leaves than a small pool holds.
        prop_oneof![3 => near, 1 => 0..blocks]
    }

    fn op(blocks: u64) -> impl Strategy<Value = Op> {
        // Small, multi-leaf, whole-device, to the end, and across a level-1 subtree.
        let range = prop_oneof![
            6 => (lba(blocks), 1u64..600),
            3 => (lba(blocks), LEAF..3000),
            1 => (Just(0), Just(blocks)),
            1 => (lba(blocks), Just(u64::MAX)),
            1 => (lba(blocks), 250_000u64..270_000),
        ];
        prop_oneof![
            12 => (lba(blocks), entry()).prop_map(|(l, e)| Op::Set(l, e)),
            1 => lba(blocks).prop_map(Op::Again),
            // The engine bounds requests by the device's size.
            4 => (range, any::<bool>())
                .prop_map(move |((l, n), z)| Op::Range(l, n.min(blocks - l), z)),
            2 => lba(blocks).prop_map(Op::Get),
            2 => (lba(blocks), 1u64..700).prop_map(move |(l, n)| Op::GetRun(l, n.min(blocks - l))),
            1 => Just(Op::ForEachData),
            2 => Just(Op::Begin),
            2 => any::<bool>().prop_map(Op::End),
            1 => Just(Op::Cold),
        ]
    }

    /// One op sequence on v2's map and on the tree map: the same return values, the same
    /// `freed` entries in the same order, equal counters, and equal entries for every block an
    /// op named and around every range, after every op; the whole device after every cold open
    /// and at the end.
    fn run(blocks: u64, frames: u64, ops: Vec<Op>) -> std::result::Result<(), TestCaseError> {
        let v = volume();
        let mut m = v2_map(blocks);
        prop_assert_eq!(m.blocks(), blocks);
        let mut t = created(&v, blocks, frames, &m);
        let mut in_flight = false;
        let mut touched: BTreeSet<u64> = BTreeSet::new();
        for op in ops {
            // The engine checkpoints before pinned pages fill the pool; so does the test.
            if t.pool_stats().pinned * 2 > frames {
                if std::mem::take(&mut in_flight) {
                    t.commit();
                }
                t.checkpoint().expect("checkpoint");
                t.commit();
            }
            match op {
                Op::Set(l, e) => {
                    touched.insert(l);
                    let got = t.set(l, e).expect("tree");
                    prop_assert_eq!(got, m.set(l, e).expect("v2"), "set {} to {:?}", l, e);
                }
                Op::Again(l) => {
                    touched.insert(l);
                    let e = m.get(l).expect("v2");
                    prop_assert_eq!(t.set(l, e).expect("tree"), None);
                    prop_assert_eq!(m.set(l, e).expect("v2"), None);
                }
                Op::Range(first, count, zero) => {
                    let new = if zero {
                        MapEntry::ZERO
                    } else {
                        MapEntry::UNMAPPED
                    };
                    let (mut a, mut b) = (Vec::new(), Vec::new());
                    t.set_range(first, count, new, |e| a.push(e)).expect("tree");
                    m.set_range(first, count, new, |e| b.push(e)).expect("v2");
                    prop_assert!(a == b, "freed entries differ: {:?} against {:?}", a, b);
                    let end = first + count;
                    touched.extend([first, end - 1]);
                    // The range and a block either side as runs of states, its ends entry by
                    // entry.
                    let (lo, hi) = (first.saturating_sub(1), (end + 1).min(blocks));
                    prop_assert_eq!(tree_runs(&mut t, lo, hi - lo), v2_runs(&mut m, lo, hi - lo));
                    same_entries(&mut t, &mut m, lo, (hi - lo).min(300))?;
                    let tail = hi.saturating_sub(300).max(lo);
                    same_entries(&mut t, &mut m, tail, hi - tail)?;
                }
                Op::Get(l) => {
                    touched.insert(l);
                    prop_assert_eq!(t.get(l).expect("tree"), m.get(l).expect("v2"));
                }
                Op::GetRun(first, count) => {
                    touched.insert(first);
                    same_entries(&mut t, &mut m, first, count)?;
                }
                Op::ForEachData => prop_assert_eq!(tree_data(&mut t), v2_data(&mut m)),
                Op::Begin => {
                    if !in_flight {
                        t.checkpoint().expect("checkpoint");
                        in_flight = true;
                    }
                }
                Op::End(commit) => {
                    if std::mem::take(&mut in_flight) {
                        if commit {
                            t.commit();
                        } else {
                            t.abort();
                        }
                    }
                }
                Op::Cold => {
                    t = cold(&v, t, std::mem::take(&mut in_flight), blocks, frames);
                    same_device(&mut t, &mut m)?;
                }
            }
            prop_assert_eq!(t.counters(), m.counters());
            for &l in &touched {
                prop_assert_eq!(
                    t.get(l).expect("tree"),
                    m.get(l).expect("v2"),
                    "block {}",
                    l
                );
            }
            prop_assert!(!m.needs_checkpoint(), "v2's map here never checkpoints");
        }
        same_device(&mut t, &mut m)?;
        let mut t = cold(&v, t, in_flight, blocks, frames);
        same_device(&mut t, &mut m)?;
        for &l in &touched {
            prop_assert_eq!(t.get(l).expect("tree"), m.get(l).expect("v2"));
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        /// Two levels, region 0 and 8 leaves past it, a pool that seldom evicts.
        #[test]
        fn the_tree_map_answers_as_v2s_map_does(ops in proptest::collection::vec(op(small()), 1..150)) {
            run(small(), 256, ops)?;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        /// Three levels, whole level-1 subtrees becoming summaries, a pool of 16 frames that
        /// evicts mid-walk.
        #[test]
        fn the_tree_map_answers_as_v2s_map_does_on_three_levels(ops in proptest::collection::vec(op(large()), 1..150)) {
            run(large(), 16, ops)?;
        }
    }

    /// A zeroing over unmapped blocks counts them all as zero, a whole unmapped level-1
    /// subtree and whole unmapped leaves included; a trim frees the data it replaces and
    /// nothing for zeros.
    #[test]
    fn a_zeroing_counts_the_unmapped_blocks_it_reaches() {
        let blocks = large();
        let v = volume();
        let mut m = v2_map(blocks);
        let mut t = created(&v, blocks, 64, &m);
        let d = data(codec::ZSTD, 3000, (4, 1), 9, 3);
        assert_eq!(
            t.set(blocks - 7, d).expect("tree"),
            Some(MapEntry::UNMAPPED)
        );
        assert_eq!(m.set(blocks - 7, d).expect("v2"), Some(MapEntry::UNMAPPED));
        for (new, want_freed, zeros) in [
            (MapEntry::ZERO, vec![d], blocks),
            (MapEntry::UNMAPPED, vec![], 0),
            (MapEntry::ZERO, vec![], blocks),
        ] {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            t.set_range(0, blocks, new, |e| a.push(e)).expect("tree");
            m.set_range(0, blocks, new, |e| b.push(e)).expect("v2");
            assert_eq!(a, want_freed);
            assert_eq!(b, want_freed);
            assert_eq!(t.counters(), m.counters());
            assert_eq!(t.counters().zero_blocks, zeros);
            assert_eq!(t.counters().data_blocks, 0);
        }
        assert!(t.set_range(0, 5, d, |_| {}).is_err(), "a range of data");
    }
}
