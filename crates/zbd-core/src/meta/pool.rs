//! The page pool: every bit-10 metadata page kind (map leaves and interior pages, SBT, PCT,
//! pair-state and directory pages) in one LRU pool of frames (docs/design.md, "Steps and
//! admission": "The page pool"; build step 1b.1).
//!
//! A frame is **pinned** while it is dirty or written by the checkpoint in flight (until a
//! checkpoint that writes it commits) or held (by the step that has the state lock, for the
//! leaf it applies; by the repair list while listed); pinned frames are never evicted. A step
//! waiting for the lock holds nothing: its prefetched frames are plain LRU frames (R15-C1). The encoded copies a checkpoint in flight holds are not
//! frames keyed by id but count in the pool all the same ([`PagePool::reserve`]). Eviction takes
//! the least recently used unpinned frame, whatever its kind: no kind has a share.
//!
//! The pool never grows past its frames. What keeps pinned + reserved within them is the
//! **floor** ([`Floor`]), the most the engine can pin or reserve at once, which a bit-10 open
//! checks against `--page-cache` and refuses when it does not fit. A pool that meets every frame
//! pinned anyway is a broken bound, reported as an error, never a silent growth.

use std::collections::HashMap;

use lru::LruCache;

use super::geometry::{ListBounds, MetaGeometry, WINDOW_PAGES_MAX};
use super::repairs::REPAIR_LIST_MAX;
use crate::error::{Error, Result};
use crate::format::PageKind;

/// RAM one frame stands for: a 4 KiB page and its bookkeeping (id, kind, flags, LRU links,
/// index slot).
pub const FRAME_BYTES: u64 = 4144;

/// Default `--page-cache`: 24,291 frames, about 2.5 times the floor of a 16 TiB volume, so a
/// step's prefetch keeps its frames under a dedup discard (design.md, "The page pool").
pub const PAGE_CACHE_BYTES_DEFAULT: u64 = 96 << 20;

/// The encoded copy of the checkpoint in flight: at most one interval's counted pages.
const CHECKPOINT_COPY_FRAMES: usize = 2048;
/// One step's working set under the lock: the pages it faulted or re-checked for the leaf it
/// applies and the pages that leaf creates (2 x 1,024).
const STEP_FRAMES: usize = 2 * 1024;

/// What can be pinned or reserved at once: the window's 4,096 counted pages, the encoded copy
/// of the checkpoint in flight (2,048), one step's working set under the lock (2,048), the repair list (64), the
/// fixed kinds' encoded copies (`F`), the directory pages a checkpoint writes, pinned and
/// encoded (`2 S`), and on small lists the resident pair-state pages and their encoded copies
/// (`2 R`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Floor {
    /// `F`: pages of the fixed kinds a checkpoint may write (device table, release queue, list
    /// pages, extent-table summaries).
    pub fixed_pages: u32,
    /// `S`: pair-state directory pages.
    pub directory_pages: u32,
    /// `R`: pair-state pages kept resident on small lists; 0 on large ones.
    pub resident_pair_state_pages: u32,
}

impl Floor {
    /// The floor of a volume with this id space and list.
    pub fn new(geometry: &MetaGeometry, bounds: &ListBounds) -> Floor {
        let resident = if bounds.small() {
            geometry.pair_state_pages() as u32
        } else {
            0
        };
        Floor {
            fixed_pages: bounds.fixed_pages,
            directory_pages: geometry.directory_pages(),
            resident_pair_state_pages: resident,
        }
    }

    /// `8,192 + 64 + F + 2 S + 2 R` frames.
    pub fn frames(&self) -> usize {
        WINDOW_PAGES_MAX as usize
            + CHECKPOINT_COPY_FRAMES
            + STEP_FRAMES
            + REPAIR_LIST_MAX // its frames stay resident while listed
            + self.fixed_pages as usize
            + 2 * self.directory_pages as usize
            + 2 * self.resident_pair_state_pages as usize
    }

    /// The `--page-cache` bytes that hold it.
    pub fn bytes(&self) -> u64 {
        self.frames() as u64 * FRAME_BYTES
    }
}

/// How the pool has done since it was made, and what it holds now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolStats {
    /// Lookups that found their page resident.
    pub hits: u64,
    /// Lookups that did not (the caller faults the page in).
    pub misses: u64,
    /// Clean frames evicted to make room.
    pub evictions: u64,
    /// Frames resident now.
    pub resident: u64,
    /// Resident frames changed since the last snapshot.
    pub dirty: u64,
    /// Resident frames in the snapshot of the checkpoint in flight and unchanged since.
    pub writing: u64,
    /// Resident frames pinned (dirty, writing or held).
    pub pinned: u64,
    /// Frames' worth the encoded copies of a checkpoint in flight hold.
    pub reserved: u64,
    /// The pool's size in frames.
    pub frames: u64,
    /// The volume's floor in frames.
    pub floor: u64,
}

struct Frame<P> {
    kind: PageKind,
    page: P,
    /// Changed since the last snapshot: the next checkpoint writes it.
    dirty: bool,
    /// In the snapshot of the checkpoint in flight, unchanged since: clean at its commit.
    writing: bool,
    /// Holds of the step that has the lock (pages it faulted or re-checked for the leaf it
    /// applies, a listed repair), given back before the lock is (design R15-E2).
    holds: u32,
}

impl<P> Frame<P> {
    fn pinned(&self) -> bool {
        self.dirty || self.writing || self.holds > 0
    }
}

/// Whether [`PagePool::install`] installed the frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Install {
    /// The page is resident now, as given.
    Installed,
    /// A clean page (a read, a hint) whose id was already resident: the resident frame is
    /// newer or equal and stays, the new one is dropped.
    AlreadyResident,
}

/// The frames of one volume's metadata pages, keyed by page id. `P` is the page as held.
///
/// The pool keeps the checkpoint bookkeeping itself (R15-A2, E3): [`PagePool::change`] and a
/// dirty install mark a frame dirty, [`PagePool::snapshot`] turns every dirty frame into one
/// the checkpoint in flight writes, [`PagePool::commit`] makes those clean unless they changed
/// again, [`PagePool::abort`] makes them dirty again. A page freed and created again while a
/// checkpoint is in flight is a new frame, dirty, so its commit cannot clean it.
///
/// Resident frames never pass the frames less what is reserved: [`PagePool::install`] evicts
/// or refuses, and [`PagePool::reserve`] refuses what pinned frames leave no room for.
pub struct PagePool<P> {
    /// Unpinned frames, least recently used first: the only ones eviction may take.
    clean: LruCache<u32, Frame<P>>,
    /// Dirty, writing or held frames. Page ids are ours, not an attacker's: a fast hash (std's
    /// SipHash here was a few per cent of the dedup write path's time).
    pinned: HashMap<u32, Frame<P>, foldhash::fast::RandomState>,
    frames: usize,
    floor: usize,
    reserved: usize,
    dirty: usize,
    writing: usize,
    hits: u64,
    misses: u64,
    evictions: u64,
}

/// The refusal of a pool smaller than the floor, naming the option that fixes it.
fn too_small(frames: usize, floor: usize) -> Error {
    let mib = |f: usize| (f as u64 * FRAME_BYTES).div_ceil(1 << 20);
    Error::Invalid(format!(
        "--page-cache holds {frames} pages ({} MiB); this volume can pin {floor} at once: give \
         --page-cache {}M or more",
        mib(frames),
        mib(floor)
    ))
}

impl<P> PagePool<P> {
    /// A pool of `bytes` (`--page-cache`) for a volume whose floor is `floor` frames; refused
    /// when the floor does not fit.
    pub fn new(bytes: u64, floor: usize) -> Result<PagePool<P>> {
        let frames = usize::try_from(bytes / FRAME_BYTES).unwrap_or(usize::MAX);
        if frames < floor {
            return Err(too_small(frames, floor));
        }
        Ok(PagePool {
            clean: LruCache::unbounded(),
            pinned: HashMap::default(),
            frames,
            floor,
            reserved: 0,
            dirty: 0,
            writing: 0,
            hits: 0,
            misses: 0,
            evictions: 0,
        })
    }

    /// Checks a larger floor (a grown volume, a device-table page about to be added) before
    /// the operation that needs it is queued; the pool keeps its floor when it is refused.
    pub fn set_floor(&mut self, floor: usize) -> Result<()> {
        if self.frames < floor {
            return Err(too_small(self.frames, floor));
        }
        self.floor = floor;
        Ok(())
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            hits: self.hits,
            misses: self.misses,
            evictions: self.evictions,
            resident: self.resident() as u64,
            dirty: self.dirty as u64,
            writing: self.writing as u64,
            pinned: self.pinned.len() as u64,
            reserved: self.reserved as u64,
            frames: self.frames as u64,
            floor: self.floor as u64,
        }
    }

    /// Whether what is pinned and reserved now leaves one step's working set of the floor
    /// free: true at every release of the state lock unless a bound the floor rests on broke
    /// (the engine asserts it in debug builds; R15-C1).
    pub fn within_floor(&self) -> bool {
        self.pinned.len() + self.reserved + STEP_FRAMES <= self.floor
    }

    /// Frames resident now.
    pub fn resident(&self) -> usize {
        self.clean.len() + self.pinned.len()
    }

    pub fn contains(&self, id: u32) -> bool {
        self.pinned.contains_key(&id) || self.clean.contains(&id)
    }

    /// Whether a checkpoint writes `id`: the next one (dirty) or the one in flight (writing).
    pub fn is_dirty(&self, id: u32) -> bool {
        self.pinned.get(&id).is_some_and(|f| f.dirty || f.writing)
    }

    /// The kind the frame of `id` was installed as.
    pub fn kind_of(&self, id: u32) -> Option<PageKind> {
        match self.pinned.get(&id) {
            Some(f) => Some(f.kind),
            None => self.clean.peek(&id).map(|f| f.kind),
        }
    }

    /// The page `id` without counting a lookup or touching its recency (a checkpoint encoding
    /// its snapshot).
    pub fn peek(&self, id: u32) -> Option<&P> {
        match self.pinned.get(&id) {
            Some(f) => Some(&f.page),
            None => self.clean.peek(&id).map(|f| &f.page),
        }
    }

    /// The page `id`, marked most recently used; `None` is a miss the caller faults in.
    pub fn get(&mut self, id: u32, kind: PageKind) -> Option<&P> {
        let frame = match self.pinned.get(&id) {
            Some(f) => Some(f),
            None => self.clean.get(&id),
        };
        match frame {
            Some(f) => {
                debug_assert_eq!(f.kind, kind, "page {id} asked for as another kind");
                self.hits += 1;
                Some(&f.page)
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// The page `id` to change: the one way to change a resident page's content, so every
    /// change leaves the frame dirty, pinned until a checkpoint that writes it commits.
    pub fn change(&mut self, id: u32, kind: PageKind) -> Option<&mut P> {
        if let Some(f) = self.clean.pop(&id) {
            self.pinned.insert(id, f);
        }
        let f = self.pinned.get_mut(&id)?;
        debug_assert_eq!(f.kind, kind, "page {id} changed as another kind");
        if !f.dirty {
            f.dirty = true;
            self.dirty += 1;
        }
        Some(&mut f.page)
    }

    /// Changes what the frame of `id` records about its page, never its content: no dirtying
    /// (the store moves a page's known slot at the commit that wrote it).
    pub fn annotate(&mut self, id: u32, f: impl FnOnce(&mut P)) {
        let frame = match self.pinned.get_mut(&id) {
            Some(fr) => Some(fr),
            None => self.clean.peek_mut(&id),
        };
        if let Some(fr) = frame {
            f(&mut fr.page);
        }
    }

    /// Makes `page` resident as `id`: dirty (a page just created) or clean (read from its
    /// current slot, or a hint that passed its re-check), held `holds` times. A clean page
    /// whose id is resident is dropped ([`Install::AlreadyResident`]) and the holds go to the
    /// resident frame, so the caller's later releases match; a dirty one is an error (an id
    /// created while in use). Evicts the least recently used clean frame when the pool
    /// is full; an error when every frame is pinned or reserved (the floor did not hold).
    pub fn install(
        &mut self,
        id: u32,
        kind: PageKind,
        page: P,
        dirty: bool,
        holds: u32,
    ) -> Result<Install> {
        if self.contains(id) {
            if dirty {
                return Err(Error::CorruptMetadata(format!(
                    "metadata page {id} created while it is in the page pool"
                )));
            }
            for _ in 0..holds {
                self.hold(id);
            }
            return Ok(Install::AlreadyResident);
        }
        while self.resident() >= self.room() {
            if !self.evict_one() {
                return Err(self.exhausted());
            }
        }
        let f = Frame {
            kind,
            page,
            dirty,
            writing: false,
            holds,
        };
        if f.pinned() {
            self.dirty += usize::from(dirty);
            self.pinned.insert(id, f);
        } else {
            self.clean.put(id, f);
        }
        Ok(Install::Installed)
    }

    /// Keeps `id` resident until a matching [`PagePool::release`]; false when it is not
    /// resident.
    pub fn hold(&mut self, id: u32) -> bool {
        if let Some(f) = self.clean.pop(&id) {
            self.pinned.insert(id, f);
        }
        match self.pinned.get_mut(&id) {
            Some(f) => {
                f.holds += 1;
                true
            }
            None => false,
        }
    }

    /// Gives back one hold of `id`; nothing when the id was freed meanwhile (a free drops its
    /// frame with every hold on it).
    pub fn release(&mut self, id: u32) {
        if let Some(f) = self.pinned.get_mut(&id) {
            debug_assert!(f.holds > 0, "release of page {id} without a hold");
            f.holds = f.holds.saturating_sub(1);
            self.unpin_if_free(id);
        }
    }

    /// Phase 1 of a checkpoint: every dirty frame becomes one the checkpoint writes; returns
    /// their ids, ascending. Frames changed from now on are dirty again and stay pinned past
    /// this checkpoint's commit.
    pub fn snapshot(&mut self) -> Vec<u32> {
        debug_assert_eq!(
            self.writing, 0,
            "a snapshot while another checkpoint is in flight"
        );
        let mut ids = Vec::with_capacity(self.dirty);
        for (&id, f) in self.pinned.iter_mut() {
            if f.dirty {
                f.dirty = false;
                f.writing = true;
                ids.push(id);
            }
        }
        self.writing += ids.len();
        self.dirty = 0;
        ids.sort_unstable();
        ids
    }

    /// The checkpoint in flight is durable: what it wrote and nobody changed since is clean.
    pub fn commit(&mut self) {
        self.end_writing(false);
    }

    /// The checkpoint in flight failed: what it was writing is dirty again.
    pub fn abort(&mut self) {
        self.end_writing(true);
    }

    fn end_writing(&mut self, dirty_again: bool) {
        let mut ids: Vec<u32> = self
            .pinned
            .iter()
            .filter(|(_, f)| f.writing)
            .map(|(&id, _)| id)
            .collect();
        // Frames unpinned together enter the LRU in id order: deterministic, whatever the
        // hash map's order.
        ids.sort_unstable();
        for id in ids {
            let f = self.pinned.get_mut(&id).expect("listed");
            f.writing = false;
            self.writing -= 1;
            if dirty_again && !f.dirty {
                f.dirty = true;
                self.dirty += 1;
            }
            self.unpin_if_free(id);
        }
    }

    /// Drops `id` whatever its state (its page was freed: a whole-page trim, a released page):
    /// dirty, writing and held alike, so a page created again under the id is a new frame.
    pub fn remove(&mut self, id: u32) -> Option<P> {
        if let Some(f) = self.pinned.remove(&id) {
            self.dirty -= usize::from(f.dirty);
            self.writing -= usize::from(f.writing);
            return Some(f.page);
        }
        self.clean.pop(&id).map(|f| f.page)
    }

    /// Counts `frames` held outside the pool (the encoded copies of the checkpoint in flight)
    /// from now on, replacing what was reserved before, and evicts clean frames to make room;
    /// an error, reserving nothing, when pinned frames leave no room for them.
    pub fn reserve(&mut self, frames: usize) -> Result<()> {
        if self.pinned.len() + frames > self.frames {
            return Err(Error::Failed(format!(
                "page pool: {} pinned frames and a checkpoint copy of {frames} pass its {} frames \
                 (floor {})",
                self.pinned.len(),
                self.frames,
                self.floor
            )));
        }
        self.reserved = frames;
        while self.resident() > self.room() && self.evict_one() {}
        Ok(())
    }

    /// Frames the pool may keep resident now.
    fn room(&self) -> usize {
        self.frames - self.reserved
    }

    fn unpin_if_free(&mut self, id: u32) {
        if self.pinned.get(&id).is_some_and(|f| !f.pinned()) {
            let f = self.pinned.remove(&id).expect("present");
            // Unpinned frames start as the most recently used: they were in use until now.
            self.clean.put(id, f);
        }
    }

    /// Evicts the least recently used unpinned frame; false when every frame is pinned.
    fn evict_one(&mut self) -> bool {
        let evicted = self.clean.pop_lru().is_some();
        self.evictions += u64::from(evicted);
        evicted
    }

    fn exhausted(&self) -> Error {
        Error::Failed(format!(
            "page pool exhausted: {} of its {} frames pinned and {} reserved (floor {})",
            self.pinned.len(),
            self.frames,
            self.reserved,
            self.floor
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const K: PageKind = PageKind::MapLeaf;

    fn pool(frames: u64) -> PagePool<u32> {
        PagePool::new(frames * FRAME_BYTES, 0).expect("pool")
    }

    /// 16 TiB logical at 128 KiB extents with 1,000 devices: the design's worked example.
    #[test]
    fn the_floor_at_16_tib_is_the_designs() {
        let mut o = crate::layout::CreateOptions::new(16 << 40);
        o.extent_bytes = 128 * 1024;
        let sb = crate::layout::plan(&o).expect("layout");
        let g = MetaGeometry::at_enable(&sb).expect("geometry");
        let b = ListBounds::new(
            ListBounds::created_capacity(sb.extent_count),
            sb.extent_table_pages,
            1000,
        );
        let floor = Floor::new(&g, &b);
        assert_eq!(floor.fixed_pages, 1309);
        assert_eq!(floor.directory_pages, 157);
        assert_eq!(floor.resident_pair_state_pages, 0, "a large list");
        assert_eq!(floor.frames(), 9879);
        assert!(floor.bytes() < PAGE_CACHE_BYTES_DEFAULT / 2);
    }

    /// A small list keeps its pair-state pages resident, twice in the floor.
    #[test]
    fn a_small_list_adds_its_resident_pair_state_pages_twice() {
        let mut o = crate::layout::CreateOptions::new(10 << 30);
        o.extent_bytes = 128 * 1024;
        let sb = crate::layout::plan(&o).expect("layout");
        let g = MetaGeometry::at_enable(&sb).expect("geometry");
        let b = ListBounds::new(
            ListBounds::created_capacity(sb.extent_count),
            sb.extent_table_pages,
            1,
        );
        assert!(b.small());
        let floor = Floor::new(&g, &b);
        assert_eq!(floor.resident_pair_state_pages as u64, g.pair_state_pages());
        assert_eq!(
            floor.frames(),
            8192 + 64
                + b.fixed_pages as usize
                + 2 * g.directory_pages() as usize
                + 2 * g.pair_state_pages() as usize
        );
    }

    #[test]
    fn a_pool_below_its_floor_is_refused_naming_the_option() {
        let e = PagePool::<u32>::new(8 << 20, 9879).err().expect("refused");
        let msg = e.to_string();
        assert!(msg.contains("--page-cache"), "{msg}");
        assert!(msg.contains("9879"), "{msg}");
        // The size it asks for holds the floor.
        let asked: u64 = msg
            .split("--page-cache ")
            .nth(2)
            .and_then(|t| t.split('M').next())
            .and_then(|n| n.parse().ok())
            .expect("a size in MiB");
        assert!(PagePool::<u32>::new(asked << 20, 9879).is_ok());
        assert!(PagePool::<u32>::new(9879 * FRAME_BYTES, 9879).is_ok());
    }

    #[test]
    fn a_larger_floor_is_refused_and_the_old_one_kept() {
        let mut p: PagePool<u32> = PagePool::new(100 * FRAME_BYTES, 50).expect("pool");
        assert!(p.set_floor(101).is_err());
        assert_eq!(p.stats().floor, 50);
        p.set_floor(100).expect("fits");
        assert_eq!(p.stats().floor, 100);
    }

    #[test]
    fn eviction_takes_the_least_recently_used_clean_frame() {
        let mut p = pool(3);
        for id in 1..=3 {
            p.install(id, K, id, false, 0).expect("room");
        }
        assert_eq!(p.get(1, K), Some(&1)); // 2 is now the oldest
        p.install(4, K, 4, false, 0).expect("evicts");
        assert!(!p.contains(2));
        assert!(p.contains(1) && p.contains(3) && p.contains(4));
        assert_eq!(p.stats().evictions, 1);
    }

    #[test]
    fn pinned_frames_stay_and_a_full_pool_is_an_error_not_growth() {
        let mut p = pool(3);
        p.install(1, K, 1, true, 0).expect("room");
        p.install(2, K, 2, false, 1).expect("room");
        p.install(3, K, 3, false, 0).expect("room");
        *p.change(3, K).expect("resident") = 30;
        let e = p.install(4, K, 4, false, 0).expect_err("all pinned");
        assert!(e.to_string().contains("exhausted"), "{e}");
        assert_eq!(p.resident(), 3);
        // A checkpoint takes 1 and 3; 3 changes again before the commit, so only 1 is clean
        // after it. The step gives back its hold on 2: 1 and 2 may go, 1 first (unpinned
        // first), 3 stays.
        assert_eq!(p.snapshot(), vec![1, 3]);
        *p.change(3, K).expect("resident") = 31;
        p.commit();
        p.release(2);
        p.install(4, K, 4, false, 0).expect("evicts 1");
        assert!(!p.contains(1) && p.contains(2));
        assert_eq!(p.get(3, K), Some(&31));
        assert!(p.is_dirty(3));
    }

    /// R15-A2: a page freed and created again while a checkpoint is in flight is not cleaned
    /// by that checkpoint's commit; an aborted checkpoint leaves its pages dirty.
    #[test]
    fn a_page_created_again_during_a_checkpoint_stays_dirty_past_its_commit() {
        let mut p = pool(4);
        p.install(1, K, 1, true, 0).expect("room");
        assert_eq!(p.snapshot(), vec![1]);
        assert_eq!(p.remove(1), Some(1));
        p.install(1, K, 2, true, 0)
            .expect("a new page under the freed id");
        p.commit();
        assert!(p.is_dirty(1), "the new page was never written");
        assert_eq!(p.snapshot(), vec![1]);
        p.abort();
        assert!(p.is_dirty(1));
        assert_eq!(
            p.snapshot(),
            vec![1],
            "an aborted checkpoint's pages are taken again"
        );
        p.commit();
        assert!(!p.is_dirty(1));
        let e = p
            .install(1, K, 3, true, 0)
            .expect_err("created while resident");
        assert!(e.to_string().contains("created while"), "{e}");
    }

    /// Review 15's adversarial pass (F6): a held install of a resident page keeps its hold, so
    /// the caller's release does not take away another holder's (a repair list's).
    #[test]
    fn a_held_install_of_a_resident_page_keeps_its_hold() {
        let mut p = pool(2);
        p.install(1, K, 1, false, 0).expect("room");
        assert!(p.hold(1));
        assert_eq!(
            p.install(1, K, 1, false, 1).expect("ok"),
            Install::AlreadyResident
        );
        p.release(1);
        p.install(2, K, 2, false, 0).expect("room");
        assert!(p.install(3, K, 3, false, 0).is_ok(), "2 is evicted");
        assert!(p.contains(1), "a held frame was evicted");
    }

    #[test]
    fn a_resident_page_is_not_replaced_by_an_install() {
        let mut p = pool(2);
        p.install(1, K, 1, false, 0).expect("room");
        *p.change(1, K).expect("resident") = 10;
        assert_eq!(
            p.install(1, K, 99, false, 0).expect("ok"),
            Install::AlreadyResident
        );
        assert_eq!(p.get(1, K), Some(&10));
    }

    #[test]
    fn a_reservation_evicts_clean_frames_and_is_refused_past_the_pinned() {
        let mut p = pool(4);
        p.install(1, K, 1, true, 0).expect("room");
        p.install(2, K, 2, true, 0).expect("room");
        p.install(3, K, 3, false, 0).expect("room");
        p.install(4, K, 4, false, 0).expect("room");
        p.reserve(1).expect("one clean frame goes");
        assert_eq!(p.resident(), 3);
        assert!(!p.contains(3), "the older clean frame leaves");
        assert!(
            p.reserve(3).is_err(),
            "two pinned + 3 reserved pass 4 frames"
        );
        assert_eq!(
            p.stats().reserved,
            1,
            "a refused reservation changes nothing"
        );
        p.reserve(2).expect("fits");
        assert_eq!(p.resident(), 2);
        p.reserve(0).expect("the checkpoint committed");
        p.install(5, K, 5, false, 0).expect("room again");
        p.install(6, K, 6, false, 0).expect("room again");
        assert_eq!(p.resident(), 4);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Install { id: u32, dirty: bool, held: bool },
        Get(u32),
        Change(u32),
        Hold(u32),
        Release(u32),
        Snapshot,
        Commit,
        Abort,
        Remove(u32),
        Reserve(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        let id = 0u32..12;
        prop_oneof![
            4 => (id.clone(), any::<bool>(), proptest::bool::weighted(0.2))
                .prop_map(|(id, dirty, held)| Op::Install { id, dirty, held }),
            3 => id.clone().prop_map(Op::Get),
            2 => id.clone().prop_map(Op::Change),
            1 => id.clone().prop_map(Op::Hold),
            2 => id.clone().prop_map(Op::Release),
            1 => Just(Op::Snapshot),
            1 => Just(Op::Commit),
            1 => Just(Op::Abort),
            1 => id.prop_map(Op::Remove),
            1 => (0usize..4).prop_map(Op::Reserve),
        ]
    }

    #[derive(Clone, Copy)]
    struct F {
        id: u32,
        value: u32,
        dirty: bool,
        writing: bool,
        holds: u32,
    }

    impl F {
        fn pinned(&self) -> bool {
            self.dirty || self.writing || self.holds > 0
        }
    }

    /// The pool against a plain list in recency order: same residents, same dirt, same errors.
    #[derive(Default)]
    struct Model {
        /// Least recently used first.
        frames: Vec<F>,
        reserved: usize,
        in_flight: bool,
    }

    impl Model {
        fn find(&self, id: u32) -> Option<usize> {
            self.frames.iter().position(|f| f.id == id)
        }
        fn touch(&mut self, i: usize) {
            let f = self.frames.remove(i);
            self.frames.push(f);
        }
        fn pinned(&self) -> usize {
            self.frames.iter().filter(|f| f.pinned()).count()
        }
        /// Evicts the first unpinned frame in recency order.
        fn evict(&mut self) -> bool {
            match self.frames.iter().position(|f| !f.pinned()) {
                Some(i) => {
                    self.frames.remove(i);
                    true
                }
                None => false,
            }
        }
        /// Frames that just stopped being pinned become the most recent.
        fn unpinned(&mut self, ids: &[u32]) {
            for &id in ids {
                if let Some(i) = self.find(id).filter(|&i| !self.frames[i].pinned()) {
                    self.touch(i);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn the_pool_behaves_as_an_lru_list_with_pins(ops in proptest::collection::vec(op(), 1..200)) {
            const FRAMES: usize = 6;
            let mut p = pool(FRAMES as u64);
            let mut m = Model::default();
            for (n, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Install { id, dirty, held } => {
                        let got = p.install(id, K, n as u32, dirty, u32::from(held));
                        if let Some(i) = m.find(id) {
                            if dirty {
                                prop_assert!(got.is_err());
                            } else {
                                prop_assert_eq!(got.ok(), Some(Install::AlreadyResident));
                                // The caller's holds go to the resident frame.
                                m.frames[i].holds += u32::from(held);
                            }
                        } else {
                            let mut ok = true;
                            while m.frames.len() >= FRAMES - m.reserved {
                                if !m.evict() { ok = false; break; }
                            }
                            prop_assert_eq!(got.is_ok(), ok);
                            if ok {
                                m.frames.push(F { id, value: n as u32, dirty, writing: false, holds: u32::from(held) });
                            }
                        }
                    }
                    Op::Get(id) => {
                        let want = m.find(id).map(|i| { let v = m.frames[i].value; m.touch(i); v });
                        prop_assert_eq!(p.get(id, K).copied(), want);
                    }
                    Op::Change(id) => {
                        let got = p.change(id, K).map(|v| { *v += 1000; *v });
                        let want = m.find(id).map(|i| {
                            m.frames[i].value += 1000;
                            m.frames[i].dirty = true;
                            m.frames[i].value
                        });
                        prop_assert_eq!(got, want);
                    }
                    Op::Hold(id) => {
                        let want = m.find(id).map(|i| m.frames[i].holds += 1).is_some();
                        prop_assert_eq!(p.hold(id), want);
                    }
                    Op::Release(id) => {
                        if let Some(i) = m.find(id).filter(|&i| m.frames[i].holds > 0) {
                            m.frames[i].holds -= 1;
                            m.unpinned(&[id]);
                            p.release(id);
                        }
                    }
                    Op::Snapshot => {
                        if !m.in_flight {
                            let mut want: Vec<u32> = Vec::new();
                            for f in m.frames.iter_mut().filter(|f| f.dirty) {
                                f.dirty = false;
                                f.writing = true;
                                want.push(f.id);
                            }
                            want.sort_unstable();
                            prop_assert_eq!(p.snapshot(), want);
                            m.in_flight = true;
                        }
                    }
                    Op::Commit | Op::Abort => {
                        let abort = matches!(op, Op::Abort);
                        let mut ids = Vec::new();
                        for f in m.frames.iter_mut().filter(|f| f.writing) {
                            f.writing = false;
                            f.dirty |= abort;
                            ids.push(f.id);
                        }
                        // Frames unpinned together become the most recent in id order.
                        ids.sort_unstable();
                        m.unpinned(&ids);
                        if abort { p.abort() } else { p.commit() }
                        m.in_flight = false;
                    }
                    Op::Remove(id) => {
                        let want = m.find(id).map(|i| m.frames.remove(i).value);
                        prop_assert_eq!(p.remove(id), want);
                    }
                    Op::Reserve(r) => {
                        let ok = m.pinned() + r <= FRAMES;
                        prop_assert_eq!(p.reserve(r).is_ok(), ok);
                        if ok {
                            m.reserved = r;
                            while m.frames.len() > FRAMES - r && m.evict() {}
                        }
                    }
                }
                let s = p.stats();
                prop_assert_eq!(s.resident as usize, m.frames.len());
                prop_assert!(s.resident as usize <= FRAMES - m.reserved);
                prop_assert_eq!(s.pinned as usize, m.pinned());
                prop_assert_eq!(s.dirty as usize, m.frames.iter().filter(|f| f.dirty).count());
                prop_assert_eq!(s.writing as usize, m.frames.iter().filter(|f| f.writing).count());
                for id in 0..12 {
                    prop_assert_eq!(p.contains(id), m.find(id).is_some(), "page {}", id);
                    prop_assert_eq!(
                        p.is_dirty(id),
                        m.find(id).is_some_and(|i| m.frames[i].dirty || m.frames[i].writing)
                    );
                }
            }
        }
    }
}
