//! Pair states and the ids allocation may hand out (docs/design.md, "Map trees, pages and
//! pairs", "Pair-state list", "Space for metadata": carving, returning, the reserve).
//!
//! [`PairStates`] answers "which slot of id `p` is current": two bits in a pair-state page, then
//! the list entry for `p` if there is one. Every change goes to the list first; folding moves
//! entries into pages without changing any answer, so replay (which does not fold) decides the
//! same. [`PairAllocator`] hands out the lowest allocatable id, and keeps freed ids out of
//! allocation until a checkpoint that no longer names them is durable (R5-D3), and out for good
//! when their extent pair left metadata meanwhile (R6-A2).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::geometry::{MetaGeometry, PairHome};
use super::page::Page;
use super::pool::{Install, PagePool};
use crate::error::{Error, Result};
use crate::format::{
    pair_state_at, set_pair_state_at, DirectoryEntry, PageAddress, PageKind, PairListEntry,
    PairSlot, PairState, DIRECTORY_ENTRIES_PER_PAGE, PAGE_BODY_BYTES, PAIR_STATE_IDS_PER_PAGE,
};

/// Carved free pairs kept back from host writes, promotions, shadows and release steps: device
/// operations (64), a full release queue's pages (33), pair-state and directory pages and cursor
/// paths with slack (31).
pub const METADATA_RESERVE: usize = 128;

/// Area size, in pairs, from which the reserve and its floors are whole; smaller areas scale
/// them down (R13-E6), or a 64-extent area could never allocate for a step.
const RESERVE_FULL_AREA_PAIRS: u64 = 2048;

/// The carver's high watermark on a large area: the dirty cap of one interval (2,048 pages)
/// plus the reserve.
const CARVE_HIGH_FULL: u64 = 2048 + METADATA_RESERVE as u64;

/// Who asks for a page id. The reserve's parts are nested floors on the one count of
/// allocatable pairs (docs/design.md, "Space for metadata", R12-D5): each use allocates only
/// while more than its floor (plus what steps have claimed) remain, so device operations cannot
/// take what a snapshot delete needs for its release-queue page, nor that what allocation itself
/// needs for pair-state pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PairUse {
    /// Device operations (rows, list pages, a new root level): above 64 at full size.
    DeviceOperation,
    /// Release-queue pages and their list page: above 31 at full size.
    ReleaseQueue,
    /// Pair-state and directory pages, release cursors' paths: down to 0.
    Metadata,
    /// Recovery's replay of a window, down to 0: the live run had these pairs, and no step
    /// claims while recovery runs (R14-D5).
    Replay,
}

/// Pairs admission (b) gave a step (R13-E2, R14-E1): only [`PairAllocator::allocate_step`]
/// draws on them, no other use or return can take them, and dropping the value gives back what
/// is left, on every path, the fence's included (R15-D5).
#[derive(Debug)]
pub struct Claim {
    left: usize,
    /// The allocator's count of claimed pairs.
    claimed: Arc<AtomicUsize>,
}

impl Claim {
    /// Pairs still claimed.
    pub fn left(&self) -> usize {
        self.left
    }

    /// Splits `k` pairs off into a claim of their own (a region-0 pair-state page's pair for
    /// the next phase 1: R15-B3); `None` when fewer are left.
    pub fn split(&mut self, k: usize) -> Option<Claim> {
        if k > self.left {
            return None;
        }
        self.left -= k;
        Some(Claim {
            left: k,
            claimed: self.claimed.clone(),
        })
    }

    /// Keeps at most `k` pairs and gives back the rest (a writer at "space short" keeps the
    /// worst case of the leaf it was placing: R15-B1).
    pub fn keep(&mut self, k: usize) {
        let give = self.left.saturating_sub(k);
        self.left -= give;
        self.claimed.fetch_sub(give, Ordering::Relaxed);
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.claimed.fetch_sub(self.left, Ordering::Relaxed);
    }
}

/// A step asked for a pair its [`Claim`] does not hold: a broken worst case. The caller trips
/// the fence before it takes a sequence (R14-D1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverDraw;

impl PairUse {
    /// The floor at full size.
    fn full_floor(self) -> usize {
        match self {
            PairUse::DeviceOperation => 64,
            PairUse::ReleaseQueue => 31,
            PairUse::Metadata | PairUse::Replay => 0,
        }
    }
}

/// The pair-state page covering `id`, and the id's index in it.
fn page_of(id: u32) -> (u32, usize) {
    let per = PAIR_STATE_IDS_PER_PAGE as u32;
    (id / per, (id % per) as usize)
}

/// What a pair-state lookup found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The id's state.
    Known(PairState),
    /// The pair-state page with this index must be read first (it is not resident).
    Fault(u32),
}

/// A list entry: the id's latest state and, for a free, the interval it was freed in (RAM
/// only: the checkpoint writes it as plain free).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    state: PairState,
    freed_in: Option<u64>,
}

/// The list of changes newer than the pair-state pages, and the directory that says where
/// those pages are. The pages themselves are frames of the one page pool (R15-C2): a lookup
/// reads their bits there and asks for a read ([`Lookup::Fault`]) when the page is not
/// resident, and a fold changes them through [`PagePool::change`], so a folded page is dirty,
/// pinned until a checkpoint writes it, and never replaced by an older read.
///
/// The directory (8 bytes per pair-state page: 640 KiB at 16 TiB, 2 MiB for the whole id
/// space) stays resident: every lookup that misses the list starts there. Its own pages are
/// encoded only when a checkpoint writes them.
#[derive(Debug, Default)]
pub struct PairStates {
    /// Entry `j` names pair-state page `j` (ids `j x 16,320 ..`): its id and current slot, or
    /// none (never written: every id it covers is free). A page created since the last commit
    /// names slot B, so that its first write takes slot A like any new page.
    directory: Vec<DirectoryEntry>,
    /// Directory page `k` (entries `k x 510 ..`): its id and current slot, once written.
    directory_pages: Vec<(u32, PairSlot)>,
    /// Directory pages whose entries changed since the last commit.
    directory_dirty: BTreeSet<u32>,
    list: BTreeMap<u32, Entry>,
}

/// Pair-state page `j`'s address: the CRC seed of its frames.
pub fn pair_state_address(id: u32, j: u32) -> PageAddress {
    PageAddress {
        id,
        kind: PageKind::PairState,
        level: 0,
        position: u64::from(j),
    }
}

/// Directory page `k`'s address.
pub fn directory_address(id: u32, k: u32) -> PageAddress {
    PageAddress {
        id,
        kind: PageKind::PairStateDirectory,
        level: 0,
        position: u64::from(k),
    }
}

fn never_written() -> DirectoryEntry {
    DirectoryEntry {
        page: None,
        free: PAIR_STATE_IDS_PER_PAGE as u16,
        slot: PairSlot::A,
    }
}

/// The slot a write of a page whose current slot is `slot` takes.
pub fn other_slot(slot: PairSlot) -> PairSlot {
    match slot {
        PairSlot::A => PairSlot::B,
        PairSlot::B => PairSlot::A,
    }
}

impl PairStates {
    /// The pair states of an id space of `pages` pair-state pages, none written yet.
    pub fn new(pages: u32) -> PairStates {
        PairStates {
            directory: vec![never_written(); pages as usize],
            ..PairStates::default()
        }
    }

    /// The pair states a durable checkpoint names: its directory pages (ids and slots, in
    /// order) and their entries as read, cut or padded to `pages`.
    pub fn from_directory(
        pages: u32,
        directory_pages: Vec<(u32, PairSlot)>,
        mut entries: Vec<DirectoryEntry>,
    ) -> PairStates {
        entries.resize(pages as usize, never_written());
        PairStates {
            directory: entries,
            directory_pages,
            ..PairStates::default()
        }
    }

    /// Where pair-state page `j` is: its id and current slot, if it was ever written.
    /// Every written pair-state page: (`j`, its id, its slot).
    pub fn written_pages(&self) -> impl Iterator<Item = (u32, u32, PairSlot)> + '_ {
        (self.directory.iter().enumerate())
            .filter_map(|(j, e)| e.page.map(|id| (j as u32, id, e.slot)))
    }

    pub fn page_of(&self, j: u32) -> Option<(u32, PairSlot)> {
        let e = self.directory.get(j as usize)?;
        e.page.map(|id| (id, e.slot))
    }

    /// Ids of every pair-state page and directory page: in use, though no pair state says so.
    pub fn own_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.directory
            .iter()
            .filter_map(|e| e.page)
            .chain(self.directory_pages.iter().map(|&(id, _)| id))
    }

    /// The state of `id`: its list entry, else its page's bits in the pool.
    pub fn state(&self, pool: &PagePool<Page>, id: u32) -> Lookup {
        if let Some(e) = self.list.get(&id) {
            return Lookup::Known(e.state);
        }
        let (j, i) = page_of(id);
        match self.page_of(j) {
            None => Lookup::Known(PairState::Free),
            Some((pid, _)) => match pool.peek(pid) {
                Some(p) if p.kind == PageKind::PairState && p.position == u64::from(j) => {
                    Lookup::Known(pair_state_at(&p.body, i))
                }
                _ => Lookup::Fault(j),
            },
        }
    }

    /// Records a change of `id`'s state (an allocation, a slot flip, a free in `interval`).
    pub fn record(&mut self, id: u32, state: PairState, interval: u64) {
        let freed_in = (state == PairState::Free).then_some(interval);
        self.list.insert(id, Entry { state, freed_in });
    }

    /// Entries in the list.
    pub fn list_len(&self) -> usize {
        self.list.len()
    }

    /// The list as the checkpoint writes it: sorted by id, frees plain.
    pub fn list_entries(&self) -> Vec<PairListEntry> {
        self.list
            .iter()
            .map(|(&id, e)| PairListEntry { id, state: e.state })
            .collect()
    }

    /// Loads the list a checkpoint carried (recovery and open); its frees are old enough to be
    /// folded (a checkpoint that no longer names them is durable).
    pub fn load_list(&mut self, entries: &[PairListEntry]) {
        for e in entries {
            self.list.insert(
                e.id,
                Entry {
                    state: e.state,
                    freed_in: None,
                },
            );
        }
    }

    /// Page indexes holding entries a fold may apply now, in order: frees wait until a
    /// checkpoint whose phase 1 came after them (interval `committed` or later) has committed.
    pub fn foldable_pages(&self, committed: u64) -> Vec<u32> {
        let mut out: Vec<u32> = self
            .list
            .iter()
            .filter(|(_, e)| !matches!(e.freed_in, Some(f) if f >= committed))
            .map(|(&id, _)| page_of(id).0)
            .collect();
        out.dedup();
        out
    }

    /// Applies the foldable entries of page `j` to it, in the pool: a page never written is
    /// created there (dirty) under an id from `new_id`. Returns how many it applied, or `None`
    /// when the page must be read into the pool first. No answer of [`state`](Self::state)
    /// changes; the page and its directory entry are written by the next checkpoint.
    pub fn fold_page(
        &mut self,
        pool: &mut PagePool<Page>,
        j: u32,
        committed: u64,
        new_id: impl FnOnce() -> Result<u32>,
    ) -> Result<Option<usize>> {
        let pid = match self.page_of(j) {
            Some((pid, _)) => {
                if !pool.contains(pid) {
                    return Ok(None);
                }
                pid
            }
            None => {
                let pid = new_id()?;
                let body = Box::new([0u8; PAGE_BODY_BYTES]);
                let page = Page::new(PageKind::PairState, 0, u64::from(j), body);
                if pool.install(pid, PageKind::PairState, page, true, 0)? != Install::Installed {
                    return Err(Error::CorruptMetadata(format!(
                        "new pair-state page {pid} is already in the page pool"
                    )));
                }
                self.directory[j as usize] = DirectoryEntry {
                    page: Some(pid),
                    free: PAIR_STATE_IDS_PER_PAGE as u16,
                    slot: PairSlot::B,
                };
                pid
            }
        };
        let per = PAIR_STATE_IDS_PER_PAGE as u32;
        let first = j * per;
        let ids: Vec<u32> = self
            .list
            .range(first..first.saturating_add(per))
            .filter(|(_, e)| !matches!(e.freed_in, Some(f) if f >= committed))
            .map(|(&id, _)| id)
            .collect();
        let page = pool
            .change(pid, PageKind::PairState)
            .expect("checked resident");
        for &id in &ids {
            let e = self.list.remove(&id).expect("listed");
            set_pair_state_at(&mut page.body, page_of(id).1, e.state);
        }
        let free = (0..PAIR_STATE_IDS_PER_PAGE)
            .filter(|&i| pair_state_at(&page.body, i) == PairState::Free)
            .count();
        self.directory[j as usize].free = free as u16;
        self.directory_dirty
            .insert(j / DIRECTORY_ENTRIES_PER_PAGE as u32);
        Ok(Some(ids.len()))
    }

    /// The directory pages a checkpoint writes, with the entries each will hold once it
    /// commits (`flips`: the pair-state pages it writes and the slots they take): changed
    /// pages, and every page below them never written (the directory list is dense).
    pub fn directory_to_write(&self, flips: &[(u32, PairSlot)]) -> Vec<(u32, Vec<DirectoryEntry>)> {
        let per = DIRECTORY_ENTRIES_PER_PAGE;
        let mut dirty = self.directory_dirty.clone();
        dirty.extend(flips.iter().map(|&(j, _)| j / per as u32));
        if let Some(&last) = dirty.last() {
            dirty.extend(self.directory_pages.len() as u32..last);
        }
        dirty
            .into_iter()
            .map(|k| {
                let at = k as usize * per;
                let mut entries = self.directory[at..(at + per).min(self.directory.len())].to_vec();
                for &(j, slot) in flips {
                    if j as usize / per == k as usize {
                        entries[j as usize - at].slot = slot;
                    }
                }
                (k, entries)
            })
            .collect()
    }

    /// Directory page `k` is written again by the next checkpoint (one of its copies is
    /// damaged): both copies, into its other slot.
    pub fn rewrite_directory_page(&mut self, k: u32) {
        if (k as usize) < self.directory_pages.len() {
            self.directory_dirty.insert(k);
        }
    }

    /// Directory page `k`'s id and current slot, if written.
    pub fn directory_page(&self, k: u32) -> Option<(u32, PairSlot)> {
        self.directory_pages.get(k as usize).copied()
    }

    /// A checkpoint committed: the pair-state pages it wrote are in their new slots, and so are
    /// its directory pages (`k`, id, slot; new ones extend the list, in order).
    pub fn commit(&mut self, flips: &[(u32, PairSlot)], directory: &[(u32, u32, PairSlot)]) {
        for &(j, slot) in flips {
            self.directory[j as usize].slot = slot;
        }
        for &(k, id, slot) in directory {
            match self.directory_pages.get_mut(k as usize) {
                Some(d) => *d = (id, slot),
                None => {
                    debug_assert_eq!(k as usize, self.directory_pages.len(), "dense");
                    self.directory_pages.push((id, slot));
                }
            }
        }
        self.directory_dirty.clear();
    }

    /// The directory list a checkpoint carries: every directory page's id and slot.
    pub fn directory_list(&self) -> &[(u32, PairSlot)] {
        &self.directory_pages
    }
}

/// The ids allocation may hand out: free pairs of carved metadata extents, lowest first.
#[derive(Debug)]
pub struct PairAllocator {
    geometry: MetaGeometry,
    /// Free ids allocation may take now.
    allocatable: BTreeSet<u32>,
    /// Freed ids and the interval they were freed in: they wait for a commit (R5-D3).
    pending: BTreeMap<u32, u64>,
    /// Extents (copy 0) carved in a phase 1 whose checkpoint has not committed.
    carved: Vec<u32>,
    /// Extents (copy 0) whose pair is metadata in the extent table.
    metadata: BTreeSet<u32>,
    /// Pairs admitted steps have claimed and not yet taken (R13-E2): no other use, and no
    /// return, may take them. Shared with the [`Claim`]s, which give theirs back when dropped.
    claimed: Arc<AtomicUsize>,
    /// Pairs of the whole id space outside region 0 (`H x P`), which scales the floors.
    area_pairs: u64,
}

impl PairAllocator {
    /// An allocator over `geometry` with no metadata extent yet.
    pub fn new(geometry: MetaGeometry) -> PairAllocator {
        PairAllocator {
            geometry,
            allocatable: BTreeSet::new(),
            pending: BTreeMap::new(),
            carved: Vec::new(),
            metadata: BTreeSet::new(),
            claimed: Arc::new(AtomicUsize::new(0)),
            area_pairs: u64::from(geometry.h) * u64::from(geometry.pairs_per_extent),
        }
    }

    /// The floor `usage` stops at on this area: the full-size floor, scaled down on areas of
    /// fewer than 2,048 pairs (rounded up, so a part never vanishes while the area has room).
    pub fn floor(&self, usage: PairUse) -> usize {
        self.scaled(usage.full_floor())
    }

    fn scaled(&self, full: usize) -> usize {
        (full as u64 * self.area_pairs.min(RESERVE_FULL_AREA_PAIRS))
            .div_ceil(RESERVE_FULL_AREA_PAIRS) as usize
    }

    /// The reserve on this area: steps claim only above it.
    pub fn reserve(&self) -> usize {
        self.scaled(METADATA_RESERVE)
    }

    /// The stock carver's watermarks on this area, `(low, high)`: it carves when fewer than
    /// `low` pairs are allocatable, up to `high` = `max(ceil(3 x reserve / 2), min(2,176, area
    /// pairs / 16))` (design, "Space for metadata"), and `low` is half of that.
    pub fn watermarks(&self) -> (usize, usize) {
        let full = CARVE_HIGH_FULL.min(self.area_pairs / 16) as usize;
        let high = (3 * self.reserve()).div_ceil(2).max(full);
        (high / 2, high)
    }

    /// Pairs claimed and not yet taken.
    pub fn claimed(&self) -> usize {
        self.claimed.load(Ordering::Relaxed)
    }

    /// Allocatable pairs nobody has claimed: what a return may withdraw and admission (b)
    /// looks at.
    pub fn unclaimed(&self) -> usize {
        self.allocatable.len().saturating_sub(self.claimed())
    }

    /// Admission (b): claims `n` pairs for a step if they lie above the reserve and every
    /// earlier claim; `None` claims nothing. A step that needs no pair gets an empty claim
    /// whatever the reserve holds (R14-B2).
    pub fn claim(&mut self, n: usize) -> Option<Claim> {
        let fits = n == 0 || self.allocatable.len() >= self.reserve() + self.claimed() + n;
        fits.then(|| {
            self.claimed.fetch_add(n, Ordering::Relaxed);
            Claim {
                left: n,
                claimed: self.claimed.clone(),
            }
        })
    }

    /// The lowest allocatable id, drawn on `claim`: never fails while the claim holds a pair.
    pub fn allocate_step(&mut self, claim: &mut Claim) -> std::result::Result<u32, OverDraw> {
        debug_assert!(
            Arc::ptr_eq(&claim.claimed, &self.claimed),
            "another volume's claim"
        );
        if claim.left == 0 {
            return Err(OverDraw);
        }
        let id = self.allocatable.pop_first().ok_or(OverDraw)?;
        claim.left -= 1;
        self.claimed.fetch_sub(1, Ordering::Relaxed);
        Ok(id)
    }

    /// Ids allocation may take now (the reserve included).
    pub fn allocatable(&self) -> usize {
        self.allocatable.len()
    }

    /// Pairs of the carved extents no page uses, `(free, all)`: allocatable, or freed and
    /// waiting for a commit. Only whole extents above the high watermark go back to data
    /// (`returnable`), so after deletes most of this is room kept for later map pages
    /// (`zbd stat`).
    pub fn free_of_carved(&self) -> (u64, u64) {
        let per_extent = u64::from(self.geometry.pairs_per_extent);
        let all = self.metadata.len() as u64 * per_extent;
        // Extents carved in a phase 1 not yet committed are free and not allocatable yet.
        let free = (self.allocatable.len() + self.pending.len()) as u64
            + self.carved.len() as u64 * per_extent;
        debug_assert!(free <= all, "{free} free pairs of {all} carved");
        (free.min(all), all)
    }

    /// Extents (copy 0) whose pairs are metadata, carved in a phase 1 or before.
    pub fn metadata_extents(&self) -> impl Iterator<Item = u32> + '_ {
        self.metadata.iter().copied()
    }

    /// The lowest allocatable id for a use other than a step, only while more than its floor
    /// and every claim remain.
    pub fn allocate(&mut self, usage: PairUse) -> Option<u32> {
        if self.allocatable.len() <= self.floor(usage) + self.claimed() {
            return None;
        }
        self.allocatable.pop_first()
    }

    /// At open: `id`, of a carved extent, is in use (its pair state is a slot), so allocation
    /// must not hand it out.
    pub fn mark_in_use(&mut self, id: u32) {
        self.allocatable.remove(&id);
    }

    /// Frees `id` in `interval`: it waits until a checkpoint whose phase 1 came later commits.
    pub fn free(&mut self, id: u32, interval: u64) {
        // Region-0 ids are a device's fixed leaves, never handed out by this allocator.
        if matches!(self.geometry.home(id), Some(PairHome::Extent { .. })) {
            self.pending.insert(id, interval);
        }
    }

    /// Phase 1 carved `extent` (copy 0; its partner is `extent + H`): it is metadata from now on,
    /// and its ids, all free, become allocatable when this checkpoint commits. An extent at or
    /// past `H` holds no copy 0 of any pair: asking is a caller's error, never ignored.
    pub fn carve(&mut self, extent: u32) -> Result<()> {
        if extent >= self.geometry.h {
            return Err(Error::Invalid(format!(
                "extent {extent} cannot be carved: metadata pairs start below H = {}",
                self.geometry.h
            )));
        }
        // Carving it again would make its ids in use allocatable a second time (R14-A1).
        if !self.metadata.insert(extent) {
            return Err(Error::Invalid(format!(
                "extent {extent} cannot be carved: it already holds metadata pairs"
            )));
        }
        self.carved.push(extent);
        Ok(())
    }

    /// Metadata extents (copy 0) below `below` every id of which is allocatable, highest
    /// first: what a phase 1 may give back to data while `keep` allocatable ids and every
    /// claim remain after them. At most `max` of them, from the `look` highest extents below
    /// `below` that have an allocatable id (allocation takes the lowest ids first, so the top
    /// is where whole extents empty).
    pub fn returnable(&self, keep: usize, below: u32, max: usize, look: usize) -> Vec<u32> {
        let per = self.geometry.pairs_per_extent as usize;
        let floor = keep.max(self.claimed());
        let mut left = self.allocatable.len();
        let mut out = Vec::new();
        let mut top = match self.geometry.id_in_extent(below, 0) {
            Some(first) => self.allocatable.range(..first).next_back().copied(),
            None => self.allocatable.last().copied(),
        };
        for _ in 0..look {
            let Some(id) = top else { break };
            if out.len() >= max || left < floor + per {
                break;
            }
            let Some(PairHome::Extent { extent, .. }) = self.geometry.home(id) else {
                break;
            };
            let ids = self.ids_of(extent);
            // An id is allocatable, pending or in use: all allocatable means no page uses
            // the extent, none waits for a commit, and it is not a carve still uncommitted.
            if self.allocatable.range(ids.clone()).count() == per {
                out.push(extent);
                left -= per;
            }
            top = self.allocatable.range(..ids.start).next_back().copied();
        }
        out
    }

    /// Phase 1 chose `extent`'s pair for return (every id in it free): its ids leave allocation
    /// at once, so no page allocated before the commit lands in it (R5-A2), and its pending ids
    /// will not rejoin when their wait ends unless it is carved again (R6-A2).
    /// Refused, changing nothing, when the pairs left would not cover the claims (R14-D6).
    pub fn withdraw(&mut self, extent: u32) -> Result<()> {
        if !self.metadata.contains(&extent) {
            return Err(Error::Invalid(format!(
                "extent {extent} cannot be returned: it holds no metadata pairs"
            )));
        }
        let ids = self.ids_of(extent);
        let leaving = self.allocatable.range(ids.clone()).count();
        if self.allocatable.len() - leaving < self.claimed() {
            return Err(Error::Invalid(format!(
                "extent {extent} cannot be returned: steps have claimed its pairs"
            )));
        }
        self.metadata.remove(&extent);
        self.carved.retain(|&e| e != extent);
        self.allocatable.retain(|id| !ids.contains(id));
        Ok(())
    }

    /// A checkpoint whose phase 1 opened interval `interval` committed: its carved extents'
    /// ids become allocatable, and ids freed before `interval` rejoin allocation if their
    /// extent pair is still metadata (else they stay free and are never handed out).
    pub fn commit(&mut self, interval: u64) {
        for extent in std::mem::take(&mut self.carved) {
            self.allocatable.extend(self.ids_of(extent));
        }
        let ready: Vec<u32> = self
            .pending
            .iter()
            .filter(|(_, &f)| f < interval)
            .map(|(&id, _)| id)
            .collect();
        for id in ready {
            self.pending.remove(&id);
            if let Some(PairHome::Extent { extent, .. }) = self.geometry.home(id) {
                if self.metadata.contains(&extent) {
                    self.allocatable.insert(id);
                }
            }
        }
    }

    fn ids_of(&self, extent: u32) -> std::ops::Range<u32> {
        match self.geometry.id_in_extent(extent, 0) {
            Some(first) => first..first + self.geometry.pairs_per_extent,
            None => 0..0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// 1,100 extents of 32 KiB: H = 550, P = 4, 2,200 pairs, so the floors are whole.
    fn geometry() -> MetaGeometry {
        MetaGeometry::new(40, 32 * 1024, 1100).expect("geometry")
    }

    fn pool() -> PagePool<Page> {
        PagePool::new(16 * crate::meta::pool::FRAME_BYTES, 0).expect("pool")
    }

    fn no_id() -> Result<u32> {
        panic!("the page exists: no id is needed")
    }

    #[test]
    fn lookups_read_the_list_over_the_page_and_folds_change_no_answer() {
        let mut p = pool();
        let mut s = PairStates::new(2);
        assert_eq!(s.state(&p, 5), Lookup::Known(PairState::Free));
        s.record(5, PairState::SlotA, 1);
        s.record(6, PairState::SlotB, 1);
        s.record(7, PairState::Free, 3);
        assert_eq!(s.state(&p, 6), Lookup::Known(PairState::SlotB));
        // The free of interval 3 waits for a commit of interval 4 or later. Page 0 was never
        // written: the fold creates it, dirty, under a new id.
        assert_eq!(
            s.fold_page(&mut p, 0, 3, || Ok(100)).expect("fold"),
            Some(2)
        );
        assert!(p.is_dirty(100));
        assert_eq!(
            s.page_of(0),
            Some((100, PairSlot::B)),
            "its first write takes A"
        );
        assert_eq!(s.list_len(), 1);
        assert_eq!(s.state(&p, 5), Lookup::Known(PairState::SlotA));
        assert_eq!(s.state(&p, 6), Lookup::Known(PairState::SlotB));
        assert_eq!(s.fold_page(&mut p, 0, 4, no_id).expect("fold"), Some(1));
        assert_eq!(s.list_len(), 0);
        assert_eq!(s.state(&p, 7), Lookup::Known(PairState::Free));
        // Written and committed, then evicted: a lookup asks for the page, a fold waits for it.
        p.snapshot();
        p.commit();
        s.commit(&[(0, PairSlot::A)], &[(0, 200, PairSlot::A)]);
        assert_eq!(s.directory_list(), &[(200, PairSlot::A)]);
        let body = p.remove(100).expect("resident");
        assert_eq!(s.state(&p, 5), Lookup::Fault(0));
        s.record(8, PairState::SlotA, 5);
        assert_eq!(s.foldable_pages(5), vec![0]);
        assert_eq!(s.fold_page(&mut p, 0, 5, no_id).expect("fold"), None);
        p.install(100, PageKind::PairState, body, false, 0)
            .expect("read back");
        assert_eq!(s.state(&p, 5), Lookup::Known(PairState::SlotA));
        assert_eq!(s.fold_page(&mut p, 0, 5, no_id).expect("fold"), Some(1));
        assert_eq!(s.state(&p, 8), Lookup::Known(PairState::SlotA));
        // A new page under an id already in the pool is refused, and changes no entry.
        s.record(20_000, PairState::SlotA, 5);
        assert!(s.fold_page(&mut p, 1, 5, || Ok(100)).is_err());
        assert_eq!(s.page_of(1), None);
    }

    /// R15-C2: a disk read of a folded pair-state page (a hint issued before the fold) cannot
    /// replace it: the pool keeps the resident frame.
    #[test]
    fn a_read_of_a_folded_pair_state_page_does_not_replace_it() {
        let mut p = pool();
        let mut s = PairStates::new(1);
        s.record(5, PairState::SlotB, 1);
        assert_eq!(s.fold_page(&mut p, 0, 1, || Ok(9)).expect("fold"), Some(1));
        let stale = Page::new(PageKind::PairState, 0, 0, Box::new([0; PAGE_BODY_BYTES]));
        assert_eq!(
            p.install(9, PageKind::PairState, stale, false, 0)
                .expect("install"),
            Install::AlreadyResident
        );
        assert_eq!(s.state(&p, 5), Lookup::Known(PairState::SlotB));
    }

    #[test]
    fn the_checkpoint_list_round_trips_through_a_load() {
        let mut p = pool();
        let mut s = PairStates::new(1);
        s.record(9, PairState::Free, 2);
        s.record(3, PairState::SlotB, 2);
        let written = s.list_entries();
        assert_eq!(written.iter().map(|e| e.id).collect::<Vec<_>>(), vec![3, 9]);
        let mut r = PairStates::new(1);
        r.load_list(&written);
        for id in [3, 9, 10] {
            assert_eq!(r.state(&p, id), s.state(&p, id));
        }
        // Loaded frees are old: a fold may apply them at once.
        assert_eq!(r.fold_page(&mut p, 0, 0, || Ok(1)).expect("fold"), Some(2));
    }

    /// A checkpoint writes the directory pages its folds and flips changed, with the slots the
    /// flips take, and every page below them never written (the list is dense).
    #[test]
    fn the_directory_to_write_names_the_flipped_slots_and_is_dense() {
        let per = DIRECTORY_ENTRIES_PER_PAGE as u32;
        let mut p = pool();
        let mut s = PairStates::new(3 * per);
        let far = 2 * per + 7;
        s.record(far * PAIR_STATE_IDS_PER_PAGE as u32, PairState::SlotA, 1);
        s.fold_page(&mut p, far, 2, || Ok(50)).expect("fold");
        let pages = s.directory_to_write(&[(far, PairSlot::A)]);
        assert_eq!(
            pages.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        let e = pages[2].1[7];
        assert_eq!((e.page, e.slot), (Some(50), PairSlot::A));
        assert_eq!(usize::from(e.free), PAIR_STATE_IDS_PER_PAGE - 1);
        assert_eq!(
            s.page_of(far),
            Some((50, PairSlot::B)),
            "flips wait for the commit"
        );
    }

    #[test]
    fn allocation_takes_the_lowest_id_and_each_use_keeps_its_floor() {
        let g = geometry();
        let mut a = PairAllocator::new(g);
        assert_eq!(a.allocate(PairUse::Metadata), None);
        assert!(a.withdraw(0).is_err(), "not metadata until carved");
        for e in 0..g.h {
            a.carve(e).expect("below H");
        }
        assert!(a.carve(g.h).is_err(), "no pair starts at H");
        assert!(
            a.carve(0).is_err(),
            "carved twice, its ids would be handed out twice"
        );
        assert_eq!(
            a.allocate(PairUse::Metadata),
            None,
            "carved ids wait for the commit"
        );
        a.commit(1);
        assert_eq!(a.allocatable(), (g.h * g.pairs_per_extent) as usize);
        // A step allocates against its claim only, and a claim stays above the reserve.
        let above = a.allocatable() - METADATA_RESERVE;
        assert!(a.claim(above + 1).is_none());
        let mut c = a.claim(3).expect("above the reserve");
        assert_eq!(a.allocate_step(&mut c), Ok(40));
        drop(c);
        assert_eq!(a.claimed(), 0, "a dropped claim gives its pairs back");
        // Each use stops at its floor; the next one down goes on (R12-D5's nested floors).
        let mut c = a.claim(a.unclaimed() - METADATA_RESERVE).expect("fits");
        while c.left() > 0 {
            assert!(a.allocate_step(&mut c).is_ok(), "a claimed pair is there");
        }
        assert_eq!(a.allocate_step(&mut c), Err(OverDraw));
        assert_eq!((a.allocatable(), a.claimed()), (METADATA_RESERVE, 0));
        for (usage, floor) in [
            (PairUse::DeviceOperation, 64),
            (PairUse::ReleaseQueue, 31),
            (PairUse::Metadata, 0),
        ] {
            while a.allocate(usage).is_some() {}
            assert_eq!(a.allocatable(), floor, "{usage:?}");
        }
    }

    #[test]
    fn a_small_area_scales_its_floors_and_a_claim_still_succeeds() {
        // 64 extents of 32 KiB: H = 32, P = 4, 128 pairs (R13-E6's example: 8/4/2/0).
        let g = MetaGeometry::new(10, 32 * 1024, 64).expect("geometry");
        let mut a = PairAllocator::new(g);
        let floors = [
            PairUse::DeviceOperation,
            PairUse::ReleaseQueue,
            PairUse::Metadata,
        ]
        .map(|u| a.floor(u));
        assert_eq!((a.reserve(), floors), (8, [4, 2, 0]));
        for e in 0..3 {
            a.carve(e).expect("below H");
        }
        a.commit(1);
        let mut c = a
            .claim(1)
            .expect("12 carved pairs serve a step above the scaled reserve of 8");
        assert_eq!(a.allocate_step(&mut c), Ok(10));
        assert!(a.claim(4).is_none(), "11 left, the reserve is 8");
        // Claims hold against every other use and every return.
        let mut b = PairAllocator::new(g);
        for e in 0..4 {
            b.carve(e).expect("below H");
        }
        b.commit(1);
        let mut kept = b.claim(8).expect("16 carved, reserve 8");
        while b.allocate(PairUse::Metadata).is_some() {}
        assert_eq!((b.allocatable(), b.claimed()), (8, 8));
        assert_eq!(b.unclaimed(), 0);
        assert!(b.withdraw(3).is_err(), "its free pairs are claimed");
        assert!(
            b.claim(0).is_some(),
            "a step that needs no pair is admitted below the reserve"
        );
        // Split and keep move pairs between claims and back, never past what is held.
        assert!(kept.split(9).is_none());
        let part = kept.split(3).expect("8 held");
        kept.keep(2);
        assert_eq!((kept.left(), part.left(), b.claimed()), (2, 3, 5));
        drop(part);
        assert_eq!(b.claimed(), 2);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Allocate(u8),
        Claim(usize),
        DropClaim(usize),
        AllocateStep(usize),
        Free(usize),
        Carve(u32),
        Withdraw(u32),
        Return(usize),
        Commit,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u8..4).prop_map(Op::Allocate),
            2 => (0usize..40).prop_map(Op::Claim),
            1 => any::<usize>().prop_map(Op::DropClaim),
            3 => any::<usize>().prop_map(Op::AllocateStep),
            3 => (0usize..64).prop_map(Op::Free),
            1 => (0u32..40).prop_map(Op::Carve),
            1 => (0u32..40).prop_map(Op::Withdraw),
            1 => (0usize..64).prop_map(Op::Return),
            2 => Just(Op::Commit),
        ]
    }

    proptest! {
        /// Against a model: an id is never handed out twice without a free, never before a
        /// commit that came after its free, never from an extent pair that is not metadata, and
        /// always the lowest the model allows.
        #[test]
        fn the_allocator_never_hands_out_an_id_it_must_not(ops in prop::collection::vec(op(), 1..300)) {
            let g = MetaGeometry::new(40, 32 * 1024, 80).expect("geometry");
            let mut a = PairAllocator::new(g);
            let mut interval = 1u64;
            let mut held: Vec<u32> = Vec::new();
            let mut freed_at: BTreeMap<u32, u64> = BTreeMap::new();
            let mut metadata: BTreeSet<u32> = BTreeSet::new();
            let mut usable: BTreeSet<u32> = BTreeSet::new();
            let mut carved: BTreeSet<u32> = BTreeSet::new();
            let mut claims: Vec<Claim> = Vec::new();
            let reserve = a.reserve();
            for op in ops {
                let claimed: usize = claims.iter().map(Claim::left).sum();
                prop_assert_eq!(a.claimed(), claimed);
                // No use and no return ever leaves fewer pairs than are claimed (R13-B2).
                prop_assert!(usable.len() >= claimed);
                let got = match op {
                    Op::Claim(n) => {
                        let fits = n == 0 || usable.len() >= reserve + claimed + n;
                        let c = a.claim(n);
                        prop_assert_eq!(c.is_some(), fits);
                        claims.extend(c);
                        None
                    }
                    Op::DropClaim(i) if !claims.is_empty() => {
                        claims.swap_remove(i % claims.len());
                        None
                    }
                    Op::DropClaim(_) => None,
                    Op::AllocateStep(i) if !claims.is_empty() => {
                        let n = claims.len();
                        let c = &mut claims[i % n];
                        let had = c.left();
                        let got = a.allocate_step(c);
                        // Under a non-empty claim a step's allocation never fails (R14-D6).
                        prop_assert_eq!(got.is_ok(), had > 0);
                        if had > 0 {
                            prop_assert_eq!(got.ok(), usable.first().copied());
                        }
                        got.ok()
                    }
                    Op::AllocateStep(_) => None,
                    Op::Allocate(u) => {
                        let usage = [PairUse::DeviceOperation, PairUse::ReleaseQueue, PairUse::Metadata, PairUse::Replay][u as usize];
                        let got = a.allocate(usage);
                        let expect = (usable.len() > a.floor(usage) + claimed).then(|| usable.first().copied()).flatten();
                        prop_assert_eq!(got, expect, "claimed {}", claimed);
                        got
                    }
                    _ => None,
                };
                match op {
                    Op::Allocate(_) | Op::AllocateStep(_) => {
                        if let Some(id) = got {
                            usable.remove(&id);
                            let Some(PairHome::Extent { extent, .. }) = g.home(id) else {
                                return Err(TestCaseError::fail("region-0 id handed out"));
                            };
                            prop_assert!(metadata.contains(&extent));
                            prop_assert!(!held.contains(&id));
                            held.push(id);
                        }
                    }
                    Op::Claim(_) | Op::DropClaim(_) => {}
                    Op::Free(i) if !held.is_empty() => {
                        let id = held.swap_remove(i % held.len());
                        a.free(id, interval);
                        freed_at.insert(id, interval);
                    }
                    Op::Free(_) => {}
                    Op::Carve(e) => {
                        // The carver takes only pairs with no page in use.
                        let in_use = held.iter().any(|&id| {
                            matches!(g.home(id), Some(PairHome::Extent { extent, .. }) if extent == e)
                        });
                        if !in_use && !metadata.contains(&e) {
                            a.carve(e).expect("below H");
                            metadata.insert(e);
                            carved.insert(e);
                        }
                    }
                    Op::Withdraw(e) => {
                        // Only a pair with every id free is returned.
                        let in_use = held.iter().any(|&id| {
                            matches!(g.home(id), Some(PairHome::Extent { extent, .. }) if extent == e)
                        });
                        let in_e = |id: &u32| matches!(g.home(*id), Some(PairHome::Extent { extent, .. }) if extent == e);
                        let keeps_claims = usable.iter().filter(|id| !in_e(id)).count() >= claimed;
                        if !in_use && metadata.contains(&e) {
                            // Refused, and nothing changed, when the claims would not be kept.
                            prop_assert_eq!(a.withdraw(e).is_ok(), keeps_claims);
                        }
                        if !in_use && metadata.contains(&e) && keeps_claims {
                            metadata.remove(&e);
                            carved.remove(&e);
                            usable.retain(|&id| !matches!(g.home(id), Some(PairHome::Extent { extent, .. }) if extent == e));
                        }
                    }
                    Op::Return(keep) => {
                        // What a phase 1 gives back: whole extents of usable ids, the highest
                        // first, leaving `keep` and every claim; the top one when it qualifies.
                        let per = g.pairs_per_extent as usize;
                        let extent_of = |id: u32| match g.home(id) {
                            Some(PairHome::Extent { extent, .. }) => extent,
                            _ => u32::MAX,
                        };
                        let whole = |e: u32| {
                            let first = g.id_in_extent(e, 0).expect("below H");
                            (first..first + g.pairs_per_extent).all(|id| usable.contains(&id))
                        };
                        let floor = keep.max(claimed);
                        let back = a.returnable(keep, 30, 4, 8);
                        prop_assert!(back.iter().all(|&e| e < 30), "{:?}", back);
                        prop_assert!(back.windows(2).all(|w| w[0] > w[1]), "{:?}", back);
                        prop_assert!(back.is_empty() || usable.len() >= floor + per * back.len());
                        let below = g.id_in_extent(30, 0).expect("below H");
                        if let Some(top) = usable.range(..below).next_back().map(|&id| extent_of(id)) {
                            if whole(top) && usable.len() >= floor + per {
                                prop_assert_eq!(back.first().copied(), Some(top));
                            }
                        }
                        for &e in &back {
                            prop_assert!(metadata.contains(&e) && whole(e), "extent {} is not free", e);
                        }
                        for e in back {
                            a.withdraw(e).expect("a returnable extent");
                            metadata.remove(&e);
                            usable.retain(|&id| extent_of(id) != e);
                        }
                    }
                    Op::Commit => {
                        interval += 1;
                        for e in std::mem::take(&mut carved) {
                            let first = g.id_in_extent(e, 0).expect("carved extent");
                            usable.extend(first..first + g.pairs_per_extent);
                        }
                        let ready: Vec<u32> = freed_at.iter().filter(|(_, &f)| f < interval).map(|(&id, _)| id).collect();
                        for id in ready {
                            freed_at.remove(&id);
                            if let Some(PairHome::Extent { extent, .. }) = g.home(id) {
                                if metadata.contains(&extent) {
                                    usable.insert(id);
                                }
                            }
                        }
                        a.commit(interval);
                    }
                }
            }
        }
    }
}
