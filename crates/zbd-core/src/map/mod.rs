//! The translation map: logical block -> where its stored bytes are (docs/design.md, "Map").
//!
//! The map is paged: only a bounded cache of map pages is in RAM ([`Map::open`]'s budget,
//! `zbd serve --map-cache`); a page not in the cache is read on demand from its slot of the
//! durable checkpoint (copy 0, else copy 1; both damaged: its blocks read as errors). Pages
//! changed since the last checkpoint are pinned in the cache until the checkpoint writes them,
//! copy-on-write into the slot the durable checkpoint does not use, in every metadata copy;
//! [`Map::wants_checkpoint`] tells the state when they approach the budget.
//!
//! Every page also has a summary (all unmapped, all zero, or mixed), kept for pages out of the
//! cache and persisted in the checkpoint (v2): summarized pages are answered without reading
//! them, and a range that covers whole pages (mkfs discarding a TiB) changes only summaries.
//! Volume counters (data, zero, raw, damaged blocks, live bytes) are kept exact on every change
//! so `stats()` needs no scan.
//!
//! A checkpoint takes a snapshot of the dirty pages ([`Map::snapshot`], under the state lock),
//! writes it with the lock released, and commits it ([`Map::commit`]): pages changed again in
//! between stay dirty, and pages of the snapshot stay pinned until the commit.
//!
//! Page faults happen under the state lock (a first version: a fault is one 4 KiB read).

mod cache;
mod counters;
pub mod cow;
mod pager;
mod shared;
mod space;
mod tree;
mod volume_map;

use crate::backend::Storage;
use crate::error::Result;
use crate::format::{
    encode_map_page, BlockState, Checkpoint, MapEntry, PageSlot, Superblock, BLOCK_BYTES,
    MAP_ENTRIES_PER_PAGE, PAGE_NONE, SECTOR_BYTES, UNIT_BLOCKS_MAX,
};
pub use cache::MAP_CACHE_BYTES_DEFAULT;
use cache::{Cache, Frame};
pub use counters::{MapCounters, DICT_IDS, UNIT_SIZE_CLASSES};
use pager::{PageRead, Pager};
pub use shared::SharedTotals;
pub use space::DeviceSpace;
use std::collections::BTreeSet;
use std::sync::Arc;
pub use tree::TreeMap;
pub use volume_map::{MapSnapshot, VolumeMap};

/// Summary of a page: unknown or mixed (read it to know).
pub const SUMMARY_MIXED: u8 = 0;
/// Summary of a page: every entry unmapped.
pub const SUMMARY_HOLE: u8 = 1;
/// Summary of a page: every entry zero.
pub const SUMMARY_ZERO: u8 = 2;

/// Dirty pages a checkpoint may wait for even when the cache budget is smaller (256 KiB): a
/// checkpoint costs three syncs, a tiny cache must not turn every few writes into one.
const DIRTY_PAGES_MIN: usize = 64;

/// Dirty pages that bring a checkpoint forward whatever the budget (8 MiB of pages, 16 MiB
/// written with both copies). Scattered writes dirty one page each: after a crash, replay faults
/// in and the recovery checkpoint writes every page dirtied since the last checkpoint, and a
/// checkpoint holds a copy of the pages it writes, so this bounds both reopen time and the RAM
/// a checkpoint needs beyond the cache (issue 9: 3/4 of 64 MiB took 3.2 s to reopen).
const DIRTY_PAGES_MAX: usize = 2048;

/// Map page holding `lba`.
pub fn page_of(lba: u64) -> u32 {
    (lba / MAP_ENTRIES_PER_PAGE as u64) as u32
}

/// The part of a block range inside one map page.
struct Span {
    page: u32,
    /// First block of the page.
    start: u64,
    /// Blocks `lo..hi` of the range are in this page.
    lo: u64,
    hi: u64,
}

/// `first..first + count` cut at map page boundaries.
fn spans(first: u64, count: u64) -> impl Iterator<Item = Span> {
    let per = MAP_ENTRIES_PER_PAGE as u64;
    let end = first + count;
    let mut lba = first;
    std::iter::from_fn(move || {
        (lba < end).then(|| {
            let page = page_of(lba);
            let start = u64::from(page) * per;
            let span = Span {
                page,
                start,
                lo: lba,
                hi: (start + per).min(end),
            };
            lba = span.hi;
            span
        })
    })
}

/// How the map cache has done since open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MapCacheStats {
    /// Lookups answered from the cache or a page summary.
    pub hits: u64,
    /// Pages read from storage.
    pub faults: u64,
    /// Bytes of map pages read from storage.
    pub bytes_read: u64,
    /// Pages resident now.
    pub resident_pages: u64,
    /// Dirty pages now (resident or summarized).
    pub dirty_pages: u64,
    /// Budget in pages.
    pub budget_pages: u64,
    /// Pages' worth of RAM that the encoded pages of a checkpoint in flight hold, counted in the
    /// budget (resident + reserved stays within it unless pinned pages alone exceed it).
    pub reserved_pages: u64,
}

/// The map of one volume.
pub struct Map {
    /// Reads pages from their durable slots: the only part of the map that does I/O.
    pager: Pager,
    sb: Superblock,
    /// Summary of each page out of the cache (`SUMMARY_*`); for a resident page, of its
    /// durable content when clean.
    summary: Vec<u8>,
    cache: Cache,
    /// Pages to write at the next checkpoint (one bit each).
    dirty: Vec<u64>,
    dirty_count: usize,
    /// Pages of the snapshot a checkpoint in flight is writing (one bit each): pinned in the
    /// cache until it commits.
    writing: Vec<u64>,
    /// Pages with no intact copy (their blocks are state `Corrupt`).
    damaged: BTreeSet<u32>,
    /// Pages whose first copy was damaged and the second intact (rewritten by the next
    /// checkpoint).
    repaired: BTreeSet<u32>,
    counters: MapCounters,
    stats: MapCacheStats,
}

/// One page write of a checkpoint: storage offset, bytes.
/// Where a page goes and its bytes, shared by its copies (a checkpoint holds them until written).
pub type PageWrite = (u64, Arc<[u8]>);

/// Map pages written for a checkpoint that is not durable yet (see [`Map::snapshot`]): only the
/// pages of the snapshot (at most `DIRTY_PAGES_MAX` and a third, not an array over the whole
/// map: 2 MiB per TiB).
pub struct WrittenPages {
    /// (page, its slot and its summary once the checkpoint is durable), in page order.
    pub pages: Vec<(u32, PageSlot, u8)>,
    /// Bytes written.
    pub bytes: u64,
}

impl Map {
    /// The map of checkpoint `ck`, with a cache of at most `cache_bytes` of pages (at least one
    /// page; pinned dirty pages may exceed it until the next checkpoint). Reads nothing: pages
    /// come in on demand. Without persisted counters (v1, or a writer that did not keep them)
    /// the caller runs [`Map::recount`].
    pub fn open(
        storage: Arc<dyn Storage>,
        sb: &Superblock,
        ck: &Checkpoint,
        cache_bytes: usize,
    ) -> Map {
        let pages = sb.map_pages as usize;
        let summary = (0..pages)
            .map(|p| match ck.page_slots[p] {
                PAGE_NONE => SUMMARY_HOLE,
                _ => match ck.page_summaries.get(p) {
                    Some(&s @ (SUMMARY_HOLE | SUMMARY_ZERO)) => s,
                    _ => SUMMARY_MIXED,
                },
            })
            .collect();
        Map {
            pager: Pager::new(storage, sb, ck.seq, ck.page_slots.clone()),
            sb: sb.clone(),
            summary,
            cache: Cache::new(cache_bytes),
            dirty: vec![0; pages.div_ceil(64)],
            dirty_count: 0,
            writing: vec![0; pages.div_ceil(64)],
            damaged: BTreeSet::new(),
            repaired: BTreeSet::new(),
            counters: MapCounters::of_checkpoint(ck),
            stats: MapCacheStats::default(),
        }
    }

    /// Logical blocks.
    pub fn blocks(&self) -> u64 {
        self.sb.logical_blocks
    }

    fn entries_in(&self, p: u32) -> usize {
        let start = u64::from(p) * MAP_ENTRIES_PER_PAGE as u64;
        MAP_ENTRIES_PER_PAGE.min((self.blocks() - start) as usize)
    }

    /// Exact counters of the whole map.
    pub fn counters(&self) -> MapCounters {
        self.counters
    }

    /// Cache statistics.
    pub fn cache_stats(&self) -> MapCacheStats {
        MapCacheStats {
            resident_pages: self.cache.len() as u64,
            dirty_pages: self.dirty_count as u64,
            budget_pages: self.cache.budget() as u64,
            reserved_pages: self.cache.reserved() as u64,
            faults: self.pager.faults,
            bytes_read: self.pager.bytes_read,
            ..self.stats
        }
    }

    /// Bytes of RAM the map uses now (cache, a checkpoint's encoded pages, slots, summaries,
    /// dirty bits).
    pub fn ram_bytes(&self) -> u64 {
        ((self.cache.len() + self.cache.reserved()) * cache::FRAME_BYTES
            + self.pager.slots().len() * 2
            + self.dirty.len() * 8) as u64
    }

    /// Pages found with no intact copy so far.
    pub fn damaged_pages(&self) -> Vec<u32> {
        self.damaged.iter().copied().collect()
    }

    /// Pages found with one damaged copy so far.
    pub fn repaired_pages(&self) -> Vec<u32> {
        self.repaired.iter().copied().collect()
    }

    fn is_dirty(&self, p: u32) -> bool {
        bit(&self.dirty, p)
    }

    /// Dirty, or in the snapshot of the checkpoint in flight: must stay resident.
    fn is_pinned(&self, p: u32) -> bool {
        bit(&self.dirty, p) || bit(&self.writing, p)
    }

    fn set_dirty(&mut self, p: u32) {
        if !self.is_dirty(p) {
            self.dirty[p as usize / 64] |= 1 << (p % 64);
            self.dirty_count += 1;
        }
    }

    /// Whether enough dirty pages are pinned in the cache that a checkpoint should come now:
    /// three quarters of the budget, but never fewer than `DIRTY_PAGES_MIN` (a tiny cache would
    /// otherwise checkpoint after nearly every write) nor more than 3/4 of `DIRTY_PAGES_MAX`.
    pub fn wants_checkpoint(&self) -> bool {
        self.cache.dirty() >= self.soft_limit()
    }

    fn soft_limit(&self) -> usize {
        let budget = self.cache.budget();
        // The hard limit (a third above) stays within `DIRTY_PAGES_MAX`.
        (budget - budget / 4).clamp(DIRTY_PAGES_MIN, DIRTY_PAGES_MAX * 3 / 4)
    }

    /// Whether pinned pages reached the whole budget (a quarter above [`Map::wants_checkpoint`]):
    /// a checkpoint must come now, even under the state lock. A checkpoint brought forward at
    /// the soft limit runs outside the lock, and pages keep being dirtied meanwhile.
    pub fn needs_checkpoint(&self) -> bool {
        let soft = self.soft_limit();
        self.cache.dirty() >= soft + (soft / 3).max(1)
    }

    /// Reads page `p` from its durable slot: copy 0, else the others. A page with no intact
    /// copy has every entry `Corrupt`.
    fn read_page(&mut self, p: u32) -> Result<Box<[MapEntry]>> {
        let n = self.entries_in(p);
        let mut entries = vec![MapEntry::UNMAPPED; n].into_boxed_slice();
        match self.pager.read(p, &mut entries)? {
            PageRead::Intact => {}
            PageRead::Repaired => {
                if self.repaired.insert(p) {
                    // Rewritten, both copies, by the next checkpoint.
                    self.set_dirty(p);
                }
            }
            PageRead::Damaged => {
                if self.damaged.insert(p) {
                    // What the page held is lost, its blocks are damaged from now on.
                    self.counters.damaged_blocks += n as u64;
                }
            }
        }
        Ok(entries)
    }

    /// What a summarized page holds, without reading it.
    fn summarized(&self, p: u32) -> Option<MapEntry> {
        match self.summary[p as usize] {
            SUMMARY_HOLE => Some(MapEntry::UNMAPPED),
            SUMMARY_ZERO => Some(MapEntry::ZERO),
            _ => None,
        }
    }

    /// The entries of page `p` as they are now, resident or not (a clean page is not added to
    /// the cache for this).
    fn entries_now(&mut self, p: u32) -> Result<Box<[MapEntry]>> {
        if let Some(f) = self.cache.get(p) {
            return Ok(f.entries.clone());
        }
        match self.summarized(p) {
            Some(e) => Ok(vec![e; self.entries_in(p)].into_boxed_slice()),
            None => self.read_page(p),
        }
    }

    /// Frame of page `p`, reading it (or expanding its summary) if it is not resident.
    fn frame(&mut self, p: u32) -> Result<&mut Frame> {
        if self.cache.contains(p) {
            self.stats.hits += 1;
        } else {
            let entries = match self.summarized(p) {
                Some(e) => {
                    self.stats.hits += 1;
                    vec![e; self.entries_in(p)].into_boxed_slice()
                }
                None => self.read_page(p)?,
            };
            let pinned = self.is_pinned(p);
            if let Some(evicted) = self.cache.insert(p, entries, pinned) {
                self.summary[evicted.page as usize] = summarize(&evicted.entries);
            }
        }
        Ok(self.cache.get(p).expect("page just made resident"))
    }

    /// The entry of `lba`.
    pub fn get(&mut self, lba: u64) -> Result<MapEntry> {
        let p = page_of(lba);
        let i = (lba % MAP_ENTRIES_PER_PAGE as u64) as usize;
        if !self.cache.contains(p) {
            if let Some(e) = self.summarized(p) {
                self.stats.hits += 1;
                return Ok(e);
            }
        }
        Ok(self.frame(p)?.entries[i])
    }

    /// The entries of `count` blocks from `first`, appended to `out`: one page lookup per map
    /// page rather than per block (a 1 MiB read touches 256 blocks, usually one or two pages).
    pub fn get_run(&mut self, first: u64, count: u64, out: &mut Vec<MapEntry>) -> Result<()> {
        let per_page = MAP_ENTRIES_PER_PAGE as u64;
        let mut lba = first;
        let end = first + count;
        while lba < end {
            let p = page_of(lba);
            let i = (lba % per_page) as usize;
            let n = ((per_page - i as u64).min(end - lba)) as usize;
            match (!self.cache.contains(p))
                .then(|| self.summarized(p))
                .flatten()
            {
                Some(e) => {
                    self.stats.hits += n as u64;
                    out.extend(std::iter::repeat_n(e, n));
                }
                None => {
                    // Counted as `n` lookups, like `get`: the hit rate stays per block.
                    self.stats.hits += n as u64 - 1;
                    out.extend_from_slice(&self.frame(p)?.entries[i..i + n]);
                }
            }
            lba += n as u64;
        }
        Ok(())
    }

    /// Sets the entry of `lba`; returns the old entry if it changed (its page is then dirty,
    /// pinned in the cache until the next checkpoint).
    pub fn set(&mut self, lba: u64, new: MapEntry) -> Result<Option<MapEntry>> {
        let p = page_of(lba);
        let i = (lba % MAP_ENTRIES_PER_PAGE as u64) as usize;
        if !self.cache.contains(p) && self.summarized(p) == Some(new) {
            return Ok(None);
        }
        let f = self.frame(p)?;
        let old = f.entries[i];
        if old == new {
            return Ok(None);
        }
        f.entries[i] = new;
        self.cache.mark_dirty(p);
        self.set_dirty(p);
        self.counters.replace(&old, &new, 1);
        Ok(Some(old))
    }

    /// Sets `count` entries from `first` to `new` (unmapped or zero); `freed(old)` sees every
    /// data entry replaced. Whole pages only change their summary: the cost is per page, and a
    /// page is read only if it may hold data (its old entries are needed for the accounting).
    pub fn set_range(
        &mut self,
        first: u64,
        count: u64,
        new: MapEntry,
        mut freed: impl FnMut(MapEntry),
    ) -> Result<()> {
        let target = match new.state {
            BlockState::Unmapped => SUMMARY_HOLE,
            BlockState::Zero => SUMMARY_ZERO,
            _ => SUMMARY_MIXED,
        };
        for Span {
            page: p,
            start: page_start,
            lo: lba,
            hi: stop,
        } in spans(first, count)
        {
            let page_end = page_start + self.entries_in(p) as u64;
            if target == SUMMARY_MIXED || lba != page_start || stop != page_end {
                for l in lba..stop {
                    if let Some(old) = self.set(l, new)? {
                        if old.state == BlockState::Data {
                            freed(old);
                        }
                    }
                }
                continue;
            }
            // The whole page.
            let resident = self.cache.contains(p);
            if resident || self.summary[p as usize] != target {
                let old = match (resident, self.summarized(p)) {
                    (false, Some(e)) => {
                        self.counters.sub(&e, page_end - page_start);
                        None
                    }
                    _ => Some(self.entries_now(p)?),
                };
                for e in old.iter().flat_map(|o| o.iter()) {
                    self.counters.sub(e, 1);
                    if e.state == BlockState::Data {
                        freed(*e);
                    }
                }
                self.counters.add(&new, page_end - page_start);
                self.cache.remove(p);
                self.summary[p as usize] = target;
                self.set_dirty(p);
            }
        }
        Ok(())
    }

    /// Marks pages for rewriting (both copies) by the next checkpoint.
    pub fn mark_dirty(&mut self, pages: impl IntoIterator<Item = u32>) {
        for p in pages {
            self.set_dirty(p);
        }
    }

    /// Slot of every page in the durable checkpoint.
    pub fn slots(&self) -> &[PageSlot] {
        self.pager.slots()
    }

    /// Calls `f(lba, entry)` for every block in state `Data` in `first..first + count`, in LBA
    /// order; summarized pages are skipped without reading them.
    pub fn for_each_data_in(
        &mut self,
        first: u64,
        count: u64,
        mut f: impl FnMut(u64, &MapEntry),
    ) -> Result<()> {
        for Span {
            page,
            start,
            lo,
            hi,
        } in spans(first, count)
        {
            if self.cache.contains(page) || self.summarized(page).is_none() {
                let frame = self.frame(page)?;
                for l in lo..hi {
                    let e = &frame.entries[(l - start) as usize];
                    if e.state == BlockState::Data {
                        f(l, e);
                    }
                }
            }
        }
        Ok(())
    }

    /// Rebuilds the counters by reading every page (volumes whose checkpoint does not carry
    /// them); `data(entry)` sees every data entry.
    pub fn recount(&mut self, mut data: impl FnMut(&MapEntry)) -> Result<()> {
        let mut c = MapCounters {
            savings_known: true,
            ..MapCounters::default()
        };
        for p in 0..self.sb.map_pages {
            let n = self.entries_in(p) as u64;
            match (self.cache.contains(p), self.summarized(p)) {
                (false, Some(e)) => c.add(&e, n),
                _ => {
                    for e in self.frame(p)?.entries.iter() {
                        c.add(e, 1);
                        if e.state == BlockState::Data {
                            data(e);
                        }
                    }
                }
            }
        }
        self.counters = c;
        Ok(())
    }

    /// Calls `f(state, blocks)` for each run of blocks of one state in `first..first + count`;
    /// summarized pages count as one run each without being read.
    pub fn runs(
        &mut self,
        first: u64,
        count: u64,
        mut f: impl FnMut(BlockState, u64),
    ) -> Result<()> {
        let mut run: Option<(BlockState, u64)> = None;
        let mut push = |s: BlockState, n: u64| match &mut run {
            Some((rs, rn)) if *rs == s => *rn += n,
            _ => {
                if let Some((rs, rn)) = run.take() {
                    f(rs, rn);
                }
                run = Some((s, n));
            }
        };
        for Span {
            page,
            start,
            lo,
            hi,
        } in spans(first, count)
        {
            match (self.cache.contains(page), self.summarized(page)) {
                (false, Some(e)) => push(e.state, hi - lo),
                _ => {
                    let frame = self.frame(page)?;
                    for l in lo..hi {
                        push(frame.entries[(l - start) as usize].state, 1);
                    }
                }
            }
        }
        if let Some((s, n)) = run {
            f(s, n);
        }
        Ok(())
    }

    /// Encodes every dirty page for checkpoint `seq`, for the slot the durable checkpoint does
    /// not use, in every metadata copy: returns the (storage offset, bytes) writes and what the
    /// checkpoint records. A page that is all unmapped is not written: its slot becomes "never
    /// written", which every reader takes as all unmapped. The pages leave the dirty set for the
    /// snapshot (pages changed from now on are dirty again for the next checkpoint); nothing
    /// else changes until [`Map::commit`] (or [`Map::abort`]). One snapshot at a time.
    pub fn snapshot(&mut self, seq: u64) -> Result<(Vec<PageWrite>, WrittenPages)> {
        debug_assert!(
            self.writing.iter().all(|&w| w == 0),
            "one snapshot at a time"
        );
        let mut pages = Vec::with_capacity(self.dirty_count);
        let mut bytes = 0u64;
        let mut encoded = 0usize;
        let mut writes = Vec::new();
        for w in 0..self.dirty.len() {
            let mut bits = self.dirty[w];
            while bits != 0 {
                let p = (w * 64) as u32 + bits.trailing_zeros();
                bits &= bits - 1;
                let entries = self.entries_now(p)?;
                let sum = summarize(&entries);
                if sum == SUMMARY_HOLE {
                    pages.push((p, PAGE_NONE, sum));
                    continue;
                }
                let slot = if self.pager.slots()[p as usize] == 1 {
                    2
                } else {
                    1
                };
                let page: Arc<[u8]> = encode_map_page(p, seq, &entries).into();
                encoded += page.len();
                // Every copy (v2: two, a metadata half apart): one bad sector loses nothing.
                for copy in 0..self.sb.metadata_copies() {
                    bytes += page.len() as u64;
                    writes.push((
                        self.sb.map_page_offset(p, slot - 1, copy),
                        Arc::clone(&page),
                    ));
                }
                pages.push((p, slot, sum));
            }
        }
        // A page read above may have been found repaired (dirty now): it is in the snapshot.
        self.writing = std::mem::replace(&mut self.dirty, vec![0; self.writing.len()]);
        self.dirty_count = 0;
        // The encoded pages (one buffer shared by the copies, and by the I/O queue that writes
        // them) are map RAM until the commit: the cache gives up room for them (issue 9: with
        // 2048 pages in flight the map used its budget + 8 MiB).
        self.reserve(encoded.div_ceil(cache::FRAME_BYTES));
        Ok((writes, WrittenPages { pages, bytes }))
    }

    /// Counts `frames` of map RAM outside the cache in its budget (0: none).
    fn reserve(&mut self, frames: usize) {
        for evicted in self.cache.reserve(frames) {
            self.summary[evicted.page as usize] = summarize(&evicted.entries);
        }
    }

    /// Page slots and summaries of the whole map as checkpoint `written` records them (for its
    /// encoding; dropped after).
    pub fn checkpoint_arrays(&self, written: &WrittenPages) -> (Vec<PageSlot>, Vec<u8>) {
        let mut slots = self.pager.slots().to_vec();
        let mut summaries = self.summary.clone();
        for &(p, slot, sum) in &written.pages {
            slots[p as usize] = slot;
            summaries[p as usize] = sum;
        }
        (slots, summaries)
    }

    /// The checkpoint `seq` that `written` belongs to is durable: pages of its snapshot not
    /// changed since are clean now and may leave the cache.
    pub fn commit(&mut self, seq: u64, written: WrittenPages) {
        // Slots change only here, and summaries of pages outside the snapshot are the durable
        // ones in both: take the snapshot's, except for a page changed again since that is not
        // resident (its summary is its content now, e.g. a whole-page trim).
        for &(p, _, sum) in &written.pages {
            if !self.is_dirty(p) || self.cache.contains(p) {
                self.summary[p as usize] = sum;
            }
        }
        self.pager.commit(seq, &written.pages);
        self.writing.fill(0);
        // The snapshot's pages are gone (written): their room goes back to the cache.
        self.reserve(0);
        let dirty = &self.dirty;
        for evicted in self.cache.clean_except(|p| bit(dirty, p)) {
            self.summary[evicted.page as usize] = summarize(&evicted.entries);
        }
    }

    /// The checkpoint of the snapshot failed: its pages are dirty again.
    pub fn abort(&mut self) {
        self.reserve(0);
        for (d, w) in self.dirty.iter_mut().zip(self.writing.iter_mut()) {
            *d |= std::mem::take(w);
        }
        self.dirty_count = self.dirty.iter().map(|w| w.count_ones() as usize).sum();
    }
}

fn bit(bits: &[u64], p: u32) -> bool {
    bits[p as usize / 64] & (1 << (p % 64)) != 0
}

/// Summary of a page's entries.
fn summarize(entries: &[MapEntry]) -> u8 {
    if entries.iter().all(|e| *e == MapEntry::UNMAPPED) {
        SUMMARY_HOLE
    } else if entries.iter().all(|e| *e == MapEntry::ZERO) {
        SUMMARY_ZERO
    } else {
        SUMMARY_MIXED
    }
}

/// Decodes map page `p` into `out`, checking every entry's bounds.
pub fn decode_page(
    page_bytes: &[u8],
    p: u32,
    sb: &Superblock,
    max_gen: u64,
    out: &mut [MapEntry],
) -> bool {
    crate::format::decode_map_page(page_bytes, p, max_gen, out).is_ok()
        && out.iter().all(|e| entry_in_bounds(e, sb))
}

/// Whether a map entry points inside the data area and has a unit shape a writer produces (a
/// unit is stored compressed, at least a sector below its raw size): anything else is treated as damage.
pub fn entry_in_bounds(e: &MapEntry, sb: &Superblock) -> bool {
    let n = usize::from(e.unit_blocks);
    let max_len = if n == 1 {
        BLOCK_BYTES
    } else {
        n * BLOCK_BYTES - SECTOR_BYTES
    };
    e.state != BlockState::Data
        || (e.extent < sb.extent_count
            && e.len as usize <= max_len
            && e.len > 0
            && (1..=UNIT_BLOCKS_MAX).contains(&e.unit_blocks)
            && e.unit_index < e.unit_blocks
            && e.offset as u64 + u64::from(e.len) <= u64::from(sb.extent_bytes))
}
