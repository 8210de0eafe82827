//! Metadata pages on the medium: where a page tree's reads, new ids and frees go, and how a
//! checkpoint writes the pool's dirty pages into their pairs (docs/design.md, "Map trees, pages
//! and pairs": pairs and slots; "Where a pair lies"; "Pair-state list"; R15-A1, R15-C2).
//!
//! A page is read from the slot its pair state names (copy 0, else copy 1, each checked against
//! the page's address); a checkpoint writes each page of its snapshot into the **other** slot of
//! its pair, in both copies, so nothing the durable checkpoint names is ever overwritten and a
//! power cut before the commit leaves every durable page intact. The flips become pair states
//! at the commit. Ids come from the [`PairAllocator`], except a region-0 leaf's fixed id, whose
//! free waits for the next phase 1 so that a leaf trimmed and created again in one interval
//! keeps the pair state that says which slot holds its durable copy (R15-A1).
//!
//! Pair states live in the list until a phase 1 finds it longer than [`MetaStore::fold_from`]
//! and folds it into pair-state pages (frames of the same pool, written by the same
//! checkpoint). A pair-state page's own slot is its directory entry's; a directory page's is
//! the checkpoint's directory list's, so nothing is circular.
//!
//! The checkpoint record itself (which carries the pair-state list and the directory list) is
//! the engine's: here a commit ends with [`MetaStore::commit`] and a reopen starts from what
//! it carried ([`MetaCheckpoint`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::devices::DEFAULT_DEVICE;
use super::geometry::{ListBounds, MetaGeometry, PairHome};
use super::map_tree::TreeIo;
use super::page::Page;
use super::pairs::{
    directory_address, other_slot, pair_state_address, Lookup, PairAllocator, PairStates, PairUse,
};
use super::pool::PagePool;
use super::repairs::REPAIR_LIST_MAX;
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::format::{
    decode_directory, encode_directory, open_page, pair_state_at, seal_page, DirectoryEntry,
    FrameStamp, PageAddress, PageKind, PairListEntry, PairSlot, PairState, Superblock,
    DIRECTORY_ENTRIES_PER_PAGE, MAP_PAGE_BYTES, PAGE_BODY_BYTES, PAIR_STATE_IDS_PER_PAGE,
};

/// The list a phase 1 folds from when the caller sets none: the capacity of a small volume's
/// list (ListBounds gives the volume's own).
pub const FOLD_FROM_DEFAULT: usize = 4096;

/// What a checkpoint carries for the metadata pages: the pair-state list and the directory
/// list, both as of its commit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetaCheckpoint {
    pub list: Vec<PairListEntry>,
    /// Directory page `k`'s id and slot, for every `k` in order.
    pub directory: Vec<(u32, PairSlot)>,
}

/// Reads, new ids and frees of one volume's metadata pages, and the checkpoint's writes.
pub struct MetaStore {
    storage: Arc<dyn Storage>,
    sb: Superblock,
    geometry: MetaGeometry,
    pub states: PairStates,
    pub alloc: PairAllocator,
    /// Who new ids are for (admission's claims replace this in step 1b.4).
    pub usage: PairUse,
    /// A phase 1 folds the pair-state list into pages once it holds more entries than this.
    pub fold_from: usize,
    /// Small lists keep their pair-state pages held in the pool ([`MetaStore::set_bounds`]).
    hold_pair_states: bool,
    /// Pair-state pages (by index) held so.
    held: BTreeSet<u32>,
    /// Phase 1 folds that failed (the list carried their entries instead), and the last
    /// error, for statistics.
    pub fold_failures: u64,
    pub last_fold_error: Option<String>,
    /// The open interval: frees are tagged with it. A checkpoint's phase 1 closes it and opens
    /// the next, so frees made while that checkpoint is in flight wait for a later commit.
    interval: u64,
    /// The interval the last committed checkpoint's phase 1 opened: frees tagged before it
    /// may be folded.
    committed: u64,
    /// Region-0 ids dropped in the open interval: allocated still, until a phase 1 (R15-A1).
    region0_freed: BTreeSet<u32>,
    /// Whether the default device's leaves at region-0 positions take their fixed ids: not
    /// while snapshots or clones exist, since a page they keep may hold the id
    /// (`Catalog::any_shared_rows`).
    region0_fixed: bool,
    /// Ids taken for directory pages no commit has named yet, by page: a failed checkpoint's
    /// are used again by the next one, never leaked.
    new_directory_ids: BTreeMap<u32, u32>,
    /// The checkpoint between its phase 1 and its commit or abort.
    flight: Option<Flight>,
    /// Whether the last checkpoint committed moved or freed a page (its predecessor named
    /// other slots): `discard_stale_slots` waits for one that did not.
    last_commit_moved: bool,
    /// Pages whose copy 0 failed while copy 1 was good, not yet dirtied for their rewrite
    /// (each phase 1 takes up to [`REPAIR_LIST_MAX`] of them).
    pub bad_copies: Vec<PageAddress>,
    /// Such pages found since open, for `zbd check` (the first [`BAD_SEEN_MAX`]).
    pub bad_seen: Vec<PageAddress>,
    /// Page reads, for tests and statistics.
    pub reads: u64,
    /// Map leaves found with no intact copy since open (standing in as leaves of damaged
    /// entries; the first [`BAD_SEEN_MAX`]), and those not yet counted by the map.
    pub lost: Vec<PageAddress>,
    pub lost_new: Vec<PageAddress>,
}

/// Pages with one bad copy a store remembers for reports.
const BAD_SEEN_MAX: usize = 1024;

/// One frame write of a checkpoint: storage offset, bytes (shared by a page's two copies).
pub type FrameWrite = (u64, Arc<[u8]>);

/// What a checkpoint in flight changes at its commit.
#[derive(Debug, Default)]
struct Flight {
    /// Pages written whose slot is a pair state, and the slots they took.
    flips: Vec<(u32, PairState)>,
    /// Pair-state pages written (by index) and the slots they took.
    page_flips: Vec<(u32, PairSlot)>,
    /// Directory pages written.
    directory: Vec<DirectoryWrite>,
    /// Region-0 ids whose free phase 1 took; one created again meanwhile leaves the set.
    frees: BTreeSet<u32>,
    /// Ids freed since phase 1: a flip of theirs is not recorded over the free.
    freed_since: BTreeSet<u32>,
}

/// A directory page a checkpoint writes: its index, id, the slot it takes and its entries.
#[derive(Debug)]
struct DirectoryWrite {
    k: u32,
    id: u32,
    slot: PairSlot,
    entries: Vec<DirectoryEntry>,
}

fn slot_of(state: PairState) -> Option<PairSlot> {
    match state {
        PairState::SlotA => Some(PairSlot::A),
        PairState::SlotB => Some(PairSlot::B),
        PairState::Free | PairState::Reserved => None,
    }
}

impl MetaStore {
    /// A store over `storage` for the volume `sb` describes, its pair states as `states` holds
    /// them (from the durable checkpoint's lists), writing interval `interval` on.
    pub fn new(
        storage: Arc<dyn Storage>,
        sb: &Superblock,
        geometry: MetaGeometry,
        states: PairStates,
        alloc: PairAllocator,
        interval: u64,
    ) -> MetaStore {
        MetaStore {
            storage,
            sb: sb.clone(),
            geometry,
            states,
            alloc,
            usage: PairUse::Metadata,
            fold_from: FOLD_FROM_DEFAULT,
            hold_pair_states: false,
            held: BTreeSet::new(),
            fold_failures: 0,
            last_fold_error: None,
            interval,
            committed: interval,
            last_commit_moved: true,
            region0_freed: BTreeSet::new(),
            region0_fixed: true,
            new_directory_ids: BTreeMap::new(),
            flight: None,
            bad_copies: Vec::new(),
            bad_seen: Vec::new(),
            reads: 0,
            lost: Vec::new(),
            lost_new: Vec::new(),
        }
    }

    /// Entries the next checkpoint's pair-state list could hold at most: the list now, one
    /// per dirty page (written, its slot flipped) and one per region-0 free.
    pub fn window(&self, pool: &PagePool<Page>) -> usize {
        pool.stats().dirty as usize + self.states.list_len() + self.region0_freed.len()
    }

    /// Where pairs lie (`H`, `P`, region 0).
    pub fn geometry(&self) -> &MetaGeometry {
        &self.geometry
    }

    /// The open interval: the one a checkpoint's phase 1 opened, which an open after that
    /// checkpoint writes on in.
    pub fn interval(&self) -> u64 {
        self.interval
    }

    /// The store an open makes from a durable checkpoint: its directory pages read, the list
    /// it carried loaded, and the ids of the metadata extents (copy 0) allocatable but for
    /// those in use: named by the list, by a pair-state page (where the list does not name
    /// them), or holding a pair-state or directory page. Reads every written pair-state page
    /// once (the allocator holds every free id of the carved extents; step 1b.5's carver keeps
    /// that set small).
    pub fn open(
        storage: Arc<dyn Storage>,
        sb: &Superblock,
        geometry: MetaGeometry,
        metadata_extents: impl IntoIterator<Item = u32>,
        durable: &MetaCheckpoint,
        interval: u64,
    ) -> Result<MetaStore> {
        let pages = geometry.pair_state_pages() as u32;
        let mut alloc = PairAllocator::new(geometry);
        for e in metadata_extents {
            alloc.carve(e)?;
        }
        alloc.commit(0);
        let mut store = MetaStore::new(
            storage,
            sb,
            geometry,
            PairStates::new(pages),
            alloc,
            interval,
        );
        let mut entries = Vec::new();
        for (k, &(id, slot)) in durable.directory.iter().enumerate() {
            let page = store.read_slot(&directory_address(id, k as u32), slot)?;
            entries.extend(decode_directory(&page.body[..])?);
        }
        store.states = PairStates::from_directory(pages, durable.directory.clone(), entries);
        // An entry past the id space has no pair-state page (a later fold would index the
        // directory past its end) and no pair: damage, refused here.
        if let Some(e) = durable.list.iter().find(|e| geometry.home(e.id).is_none()) {
            return Err(Error::CorruptMetadata(format!(
                "the pair-state list names page {} past the id space ({} ids)",
                e.id,
                geometry.ids_max()
            )));
        }
        store.states.load_list(&durable.list);
        let listed: BTreeMap<u32, PairState> =
            durable.list.iter().map(|e| (e.id, e.state)).collect();
        let own: Vec<u32> = store.states.own_ids().collect();
        for j in 0..pages {
            let Some((pid, slot)) = store.states.page_of(j) else {
                continue;
            };
            let page = store.read_slot(&pair_state_address(pid, j), slot)?;
            let first = j * PAIR_STATE_IDS_PER_PAGE as u32;
            for i in 0..PAIR_STATE_IDS_PER_PAGE {
                let id = first + i as u32;
                if !listed.contains_key(&id) && pair_state_at(&page.body, i) != PairState::Free {
                    store.alloc.mark_in_use(id);
                }
            }
        }
        for (&id, &state) in &listed {
            if state != PairState::Free {
                store.alloc.mark_in_use(id);
            }
        }
        for id in own {
            store.alloc.mark_in_use(id);
        }
        Ok(store)
    }

    /// `id`'s pair state, reading its pair-state page into the pool when it is not resident.
    fn state(&mut self, pool: &mut PagePool<Page>, id: u32) -> Result<PairState> {
        if let Lookup::Fault(j) = self.states.state(pool, id) {
            self.fault_pair_state(pool, j)?;
        }
        match self.states.state(pool, id) {
            Lookup::Known(s) => Ok(s),
            Lookup::Fault(j) => Err(Error::CorruptMetadata(format!(
                "pair-state page {j} did not stay resident (page {id})"
            ))),
        }
    }

    /// What the hint rule compares for `id` before and after a read without the lock: its
    /// pair state, and whether it was dropped as a region-0 leaf (which keeps its pair state
    /// until a phase 1, so the state alone would let a read from before the drop in).
    pub fn hint_token(&self, pool: &PagePool<Page>, id: u32) -> (Lookup, bool) {
        let dropped = self.region0_freed.contains(&id)
            || self.flight.as_ref().is_some_and(|f| f.frees.contains(&id));
        (self.states.state(pool, id), dropped)
    }

    fn offset(&self, id: u32, slot: PairSlot, copy: u8) -> Result<u64> {
        self.geometry
            .slot_offset(&self.sb, id, slot, copy)
            .ok_or_else(|| Error::CorruptMetadata(format!("page id {id} is past the id space")))
    }

    /// Page `at` from `slot`: copy 0, else copy 1 (reported for repair). A copy that cannot
    /// be read is tried like one that fails its check: the other copy may serve.
    fn read_slot(&mut self, at: &PageAddress, slot: PairSlot) -> Result<Page> {
        let mut buf = vec![0u8; MAP_PAGE_BYTES];
        let mut last = None;
        let mut io_error = None;
        for copy in 0..2u8 {
            self.reads += 1;
            let got = self
                .storage
                .read_at(self.offset(at.id, slot, copy)?, &mut buf)
                .and_then(|()| open_page(&buf, &self.sb.uuid, at))
                .and_then(|(stamp, body)| Page::decode(at, &stamp, body))
                .map(|page| Page {
                    slot: Some(slot),
                    ..page
                });
            match got {
                Ok(page) => {
                    if copy > 0 {
                        self.bad_copies.push(*at);
                        if self.bad_seen.len() < BAD_SEEN_MAX {
                            self.bad_seen.push(*at);
                        }
                    }
                    return Ok(page);
                }
                Err(Error::Io(e)) => io_error = Some(Error::Io(e)),
                Err(e) => last = Some(e),
            }
        }
        // Damage only when both copies were read and failed their checks: the caller may
        // treat damage as lost content, never a read that failed.
        Err(io_error.or(last).expect("two copies tried"))
    }

    /// Storage offsets of both copies of page `id`'s durable frame, for a scrub: `None` when
    /// the next checkpoint writes the page anyway (its frame is dirty or being written).
    pub fn durable_copies(
        &mut self,
        pool: &mut PagePool<Page>,
        id: u32,
    ) -> Result<Option<[u64; 2]>> {
        if pool.is_dirty(id) {
            return Ok(None);
        }
        let Some(slot) = slot_of(self.state(pool, id)?) else {
            return Ok(None);
        };
        Ok(Some([self.offset(id, slot, 0)?, self.offset(id, slot, 1)?]))
    }

    /// The pair-state and directory pages with the offsets of their durable copies. A
    /// pair-state page whose frame is dirty or being written is left out: the next
    /// checkpoint writes it anyway, and one a fold just made names a slot no commit wrote yet.
    /// A directory page keeps its durable slot until the commit that writes it again.
    pub fn own_pages_copies(&self, pool: &PagePool<Page>) -> Result<Vec<(PageAddress, [u64; 2])>> {
        let written = |at: PageAddress, slot| -> Result<(PageAddress, [u64; 2])> {
            Ok((
                at,
                [self.offset(at.id, slot, 0)?, self.offset(at.id, slot, 1)?],
            ))
        };
        let mut out = Vec::new();
        for (j, id, slot) in self.states.written_pages() {
            if !pool.is_dirty(id) {
                out.push(written(pair_state_address(id, j), slot)?);
            }
        }
        for (k, &(id, slot)) in self.states.directory_list().iter().enumerate() {
            out.push(written(directory_address(id, k as u32), slot)?);
        }
        Ok(out)
    }

    /// Calls `discard` with the byte ranges of page slots no page needs (`zbd compact`): both
    /// copies of the slot a page's pair does not hold it in, and both slots of a free pair,
    /// in region 0 and in the carved extents. A page that changed in both slots since create
    /// holds 16 KiB of the backing file where it needs 8. The store's own pages (pair
    /// states, directory) keep both slots; reserved pairs too. Only after a checkpoint that
    /// moved and freed no page, so that the one before it (an open's fallback) names the
    /// same slots; otherwise (a phase 1 that rewrote pages repaired from their second copy)
    /// nothing. Returns the bytes given to `discard`. Offline only: nothing may change
    /// meanwhile.
    pub fn discard_stale_slots(
        &mut self,
        pool: &mut PagePool<Page>,
        mut discard: impl FnMut(u64, u64) -> Result<()>,
    ) -> Result<u64> {
        assert!(self.flight.is_none(), "no checkpoint in flight");
        if self.last_commit_moved {
            return Ok(0);
        }
        let own: BTreeSet<u32> = self.states.own_ids().collect();
        let extents: Vec<u32> = self.alloc.metadata_extents().collect();
        let g = self.geometry;
        let ids =
            (0..g.pairs0).chain(extents.iter().flat_map(move |&e| {
                (0..g.pairs_per_extent).filter_map(move |p| g.id_in_extent(e, p))
            }));
        // Runs of neighbouring slots, one per copy, joined before they are discarded.
        let mut runs: [Option<(u64, u64)>; 2] = [None, None];
        let mut total = 0u64;
        let page = MAP_PAGE_BYTES as u64;
        for id in ids.filter(|id| !own.contains(id)) {
            let slots: &[PairSlot] = match self.state(pool, id)? {
                PairState::SlotA => &[PairSlot::B],
                PairState::SlotB => &[PairSlot::A],
                PairState::Free => &[PairSlot::A, PairSlot::B],
                PairState::Reserved => &[],
            };
            for &slot in slots {
                for copy in 0..2u8 {
                    let at = self.offset(id, slot, copy)?;
                    let run = &mut runs[usize::from(copy)];
                    match run {
                        Some((start, len)) if *start + *len == at => *len += page,
                        _ => {
                            if let Some((start, len)) = run.replace((at, page)) {
                                discard(start, len)?;
                                total += len;
                            }
                        }
                    }
                }
            }
        }
        for (start, len) in runs.into_iter().flatten() {
            discard(start, len)?;
            total += len;
        }
        Ok(total)
    }

    /// A scrub found a damaged copy of page `at` (the other intact, or the page resident):
    /// queued like a read that fell back to copy 1, so a phase 1 writes both copies again.
    pub fn scrub_found(&mut self, at: PageAddress) {
        if !self.bad_copies.contains(&at) {
            self.bad_copies.push(at);
        }
    }

    /// Phase 1 dirties up to [`REPAIR_LIST_MAX`] pages read from copy 1 because copy 0 failed,
    /// so this checkpoint writes both copies of each into the other slot (the rest wait for the
    /// next phase 1). A page freed or reused since is dropped: its bad copy is not current any
    /// more. A directory page (resident as decoded entries, not in the pool) is marked for the
    /// checkpoint's directory writes; a pair-state page no longer resident is read back first.
    fn dirty_repairs(&mut self, pool: &mut PagePool<Page>) {
        let n = self.bad_copies.len().min(REPAIR_LIST_MAX);
        let found: Vec<PageAddress> = self.bad_copies.drain(..n).collect();
        for at in found {
            match pool.peek(at.id).map(|p| p.address(at.id)) {
                // A stand-in for a lost leaf is not the page's content: a write under it
                // writes it, never a repair.
                Some(a) if a == at && !self.lost.contains(&at) => {
                    pool.change(at.id, at.kind);
                }
                Some(_) => {}
                None if at.kind == PageKind::PairStateDirectory => {
                    let k = at.position as u32;
                    if self
                        .states
                        .directory_page(k)
                        .is_some_and(|(id, _)| id == at.id)
                    {
                        self.states.rewrite_directory_page(k);
                    }
                }
                None if at.kind == PageKind::PairState => {
                    let j = at.position as u32;
                    let before = self.bad_copies.len();
                    let current = self.states.page_of(j).is_some_and(|(id, _)| id == at.id);
                    if current && self.fault_pair_state(pool, j).is_ok() {
                        pool.change(at.id, at.kind);
                    }
                    self.bad_copies.truncate(before);
                }
                None => {
                    // Read again (copy 0 still fails: that read's own report is dropped).
                    let before = self.bad_copies.len();
                    if let Ok(page) = self.read(pool, &at) {
                        let _ = pool.install(at.id, at.kind, page, true, 0);
                    }
                    self.bad_copies.truncate(before);
                }
            }
        }
    }

    /// Phase 1 folds the list into pair-state pages when it is long: each page with foldable
    /// entries is read if it is not resident, or created under a new id.
    fn fold(&mut self, pool: &mut PagePool<Page>) -> Result<()> {
        if self.states.list_len() <= self.fold_from {
            return Ok(());
        }
        for j in self.states.foldable_pages(self.committed) {
            // A new pair-state page needs its directory page (and every one below it: the
            // list is dense): their ids are taken first, so a checkpoint never runs out of ids
            // after a fold made a page it cannot name.
            if self.states.page_of(j).is_none() {
                let k = j / DIRECTORY_ENTRIES_PER_PAGE as u32;
                for k in self.states.directory_list().len() as u32..=k {
                    if !self.new_directory_ids.contains_key(&k) {
                        let id = self.alloc.allocate(self.usage).ok_or(Error::NoSpace)?;
                        self.new_directory_ids.insert(k, id);
                    }
                }
            }
            loop {
                let (alloc, usage) = (&mut self.alloc, self.usage);
                let folded = self.states.fold_page(pool, j, self.committed, || {
                    alloc.allocate(usage).ok_or(Error::NoSpace)
                })?;
                if folded.is_some() {
                    self.keep(pool, j);
                    break;
                }
                self.fault_pair_state(pool, j)?;
            }
        }
        Ok(())
    }

    /// Reads written pair-state page `j` into the pool.
    fn fault_pair_state(&mut self, pool: &mut PagePool<Page>, j: u32) -> Result<()> {
        let (pid, slot) = self.states.page_of(j).expect("a written pair-state page");
        let page = self.read_slot(&pair_state_address(pid, j), slot)?;
        pool.install(pid, PageKind::PairState, page, false, 0)?;
        self.keep(pool, j);
        Ok(())
    }

    /// On a small list, pair-state page `j` (resident) stays resident from now on: one hold,
    /// counted in the floor's `2R`.
    fn keep(&mut self, pool: &mut PagePool<Page>, j: u32) {
        if self.hold_pair_states && !self.held.contains(&j) {
            let (pid, _) = self.states.page_of(j).expect("a written pair-state page");
            if pool.hold(pid) {
                self.held.insert(j);
            }
        }
    }

    /// The list's bounds: a phase 1 folds from their `fold_from` entries, and on a small list
    /// folds the whole list and keeps its pair-state pages resident once read or made.
    /// Whether new leaves of the default device at region-0 positions take their fixed ids
    /// (see the field).
    pub fn set_region0_fixed(&mut self, on: bool) {
        self.region0_fixed = on;
    }

    pub fn set_bounds(&mut self, bounds: &ListBounds) {
        self.fold_from = bounds.fold_from().map_or(0, |f| f as usize);
        self.hold_pair_states = bounds.small();
    }

    /// Phases 1 and 2 of a checkpoint for the pool's pages: [`MetaStore::prepare`], then
    /// [`MetaStore::write_prepared`]. Returns what this checkpoint carries.
    pub fn checkpoint(&mut self, pool: &mut PagePool<Page>) -> Result<MetaCheckpoint> {
        let (meta, writes) = self.prepare(pool)?;
        self.write_prepared(pool, &writes)?;
        Ok(meta)
    }

    /// Writes what [`MetaStore::prepare`] returned, then syncs; on an error the checkpoint is
    /// aborted here, as if phase 1 had failed.
    pub fn write_prepared(
        &mut self,
        pool: &mut PagePool<Page>,
        writes: &[FrameWrite],
    ) -> Result<()> {
        let r = writes
            .iter()
            .try_for_each(|(at, frame)| self.storage.write_at(*at, frame))
            .and_then(|()| self.storage.sync());
        if r.is_err() {
            self.abort(pool);
        }
        r
    }

    /// Phase 1 of a checkpoint for the pool's pages: folds a long list, takes the region-0
    /// frees of the closing interval and the pool's snapshot, opens the next interval, and
    /// seals each page for the other slot of its pair, then the directory pages that changed.
    /// Returns what this checkpoint carries and the frame writes (both copies of each page,
    /// sharing one buffer) that the caller issues and syncs before anything names them.
    /// Nothing durable is overwritten; the flips and frees take effect at
    /// [`MetaStore::commit`]. On an error the checkpoint is aborted here: its pages dirty
    /// again, its region-0 frees back for the next one.
    pub fn prepare(
        &mut self,
        pool: &mut PagePool<Page>,
    ) -> Result<(MetaCheckpoint, Vec<FrameWrite>)> {
        assert!(self.flight.is_none(), "one checkpoint in flight at a time");
        self.dirty_repairs(pool);
        // A fold only shortens the list. One that fails (no id for a new pair-state page, a
        // page that cannot be read) leaves what it folded in dirty pages and the rest listed:
        // the same answers, and this checkpoint carries them, so a fold can never be what
        // stops checkpoints (the list's capacity is the caller's bound; admission keeps it).
        if let Err(e) = self.fold(pool) {
            self.fold_failures += 1;
            self.last_fold_error = Some(e.to_string());
        }
        let seq = self.interval;
        let mut flips = Vec::new();
        let mut page_flips = Vec::new();
        for id in pool.snapshot() {
            let page = pool.peek(id).expect("a snapshot's pages are resident");
            if page.kind == PageKind::PairState {
                let j = page.position as u32;
                let (_, slot) = self.states.page_of(j).expect("a written pair-state page");
                page_flips.push((j, other_slot(slot)));
                continue;
            }
            match self.next_slot(pool, id) {
                Ok(s) => flips.push((id, s)),
                Err(e) => {
                    // Nothing was taken but the snapshot: its pages are dirty again.
                    pool.abort();
                    return Err(e);
                }
            }
        }
        let mut directory = Vec::new();
        for (k, entries) in self.states.directory_to_write(&page_flips) {
            let (id, slot) = match self.states.directory_page(k) {
                Some((id, slot)) => (id, other_slot(slot)),
                None => {
                    let id = match self.new_directory_ids.get(&k) {
                        Some(&id) => id,
                        None => match self.alloc.allocate(self.usage) {
                            Some(id) => id,
                            None => {
                                pool.abort();
                                return Err(Error::NoSpace);
                            }
                        },
                    };
                    self.new_directory_ids.insert(k, id);
                    (id, PairSlot::A)
                }
            };
            directory.push(DirectoryWrite {
                k,
                id,
                slot,
                entries,
            });
        }
        let frees = std::mem::take(&mut self.region0_freed);
        let mut list: BTreeMap<u32, PairState> = self
            .states
            .list_entries()
            .into_iter()
            .map(|e| (e.id, e.state))
            .collect();
        list.extend(flips.iter().copied());
        list.extend(frees.iter().map(|&id| (id, PairState::Free)));
        let mut carried: Vec<(u32, PairSlot)> = self.states.directory_list().to_vec();
        for d in &directory {
            match carried.get_mut(d.k as usize) {
                Some(c) => *c = (d.id, d.slot),
                None => carried.push((d.id, d.slot)),
            }
        }
        self.flight = Some(Flight {
            flips,
            page_flips,
            directory,
            frees,
            freed_since: BTreeSet::new(),
        });
        self.interval += 1;
        let writes = match self.frames(pool, seq) {
            Ok(w) => w,
            Err(e) => {
                self.abort(pool);
                return Err(e);
            }
        };
        let meta = MetaCheckpoint {
            list: list
                .into_iter()
                .map(|(id, state)| PairListEntry { id, state })
                .collect(),
            directory: carried,
        };
        Ok((meta, writes))
    }

    /// The slot a checkpoint writes `id` into: the one its pair state does not name. The
    /// frame knows it without a lookup (the slot it was read from, moved at each commit), and
    /// a page created since holds no durable copy unless it is a region-0 leaf created again
    /// under its fixed id: only those look their pair state up (and may read a pair-state
    /// page), so a checkpoint of a pool full of dirty frames needs no frame for lookups.
    fn next_slot(&mut self, pool: &mut PagePool<Page>, id: u32) -> Result<PairState> {
        let known = pool.peek(id).expect("a snapshot's pages are resident").slot;
        if known.is_some() || id >= self.geometry.pairs0 {
            if cfg!(debug_assertions) {
                if let Lookup::Known(s) = self.states.state(pool, id) {
                    assert_eq!(
                        slot_of(s),
                        known,
                        "page {id}'s frame and pair state disagree"
                    );
                }
            }
            return Ok(match known {
                Some(PairSlot::A) => PairState::SlotB,
                Some(PairSlot::B) | None => PairState::SlotA,
            });
        }
        match self.state(pool, id)? {
            PairState::SlotA => Ok(PairState::SlotB),
            // A new page (free until its first commit) takes slot A.
            PairState::SlotB | PairState::Free => Ok(PairState::SlotA),
            PairState::Reserved => Err(Error::CorruptMetadata(format!(
                "page {id} is in a pair held out of allocation"
            ))),
        }
    }

    /// Both copies of a page sealed for `slot`: one buffer, two offsets.
    fn seal(
        &self,
        at: &PageAddress,
        slot: PairSlot,
        stamp: &FrameStamp,
        body: &[u8; PAGE_BODY_BYTES],
        out: &mut Vec<FrameWrite>,
    ) -> Result<()> {
        let frame = seal_page(&self.sb.uuid, at, stamp, body);
        for copy in 0..2 {
            out.push((self.offset(at.id, slot, copy)?, Arc::clone(&frame)));
        }
        Ok(())
    }

    /// The frames of the checkpoint in flight, sealed now (writers may change the pages as
    /// soon as the lock goes).
    fn frames(&self, pool: &PagePool<Page>, seq: u64) -> Result<Vec<FrameWrite>> {
        let f = self.flight.as_ref().expect("in flight");
        let pages = f
            .flips
            .iter()
            .map(|&(id, state)| (id, slot_of(state).expect("a slot")))
            .chain(
                f.page_flips
                    .iter()
                    .map(|&(j, slot)| (self.states.page_of(j).expect("written").0, slot)),
            );
        let mut out = Vec::new();
        for (id, slot) in pages {
            let page = pool.peek(id).expect("a snapshot's pages are resident");
            self.seal(
                &page.address(id),
                slot,
                &page.stamp(seq),
                &page.body,
                &mut out,
            )?;
        }
        for d in &f.directory {
            let body = encode_directory(&d.entries);
            let at = directory_address(d.id, d.k);
            self.seal(&at, d.slot, &FrameStamp::other(seq), &body, &mut out)?;
        }
        Ok(out)
    }

    /// The checkpoint in flight is durable: its flips and frees are the pair states now (a
    /// page freed since its phase 1 stays free), its pages clean, and the frees of the interval
    /// it closed may be reused and folded.
    pub fn commit(&mut self, pool: &mut PagePool<Page>) {
        let f = self.flight.take().expect("a checkpoint in flight");
        self.last_commit_moved = !f.flips.is_empty() || !f.frees.is_empty();
        let closing = self.interval - 1;
        for (id, state) in f.flips {
            if !f.freed_since.contains(&id) {
                self.states.record(id, state, closing);
                pool.annotate(id, |p| p.slot = slot_of(state));
            }
        }
        for id in f.frees {
            self.states.record(id, PairState::Free, closing);
        }
        let directory: Vec<(u32, u32, PairSlot)> =
            f.directory.iter().map(|d| (d.k, d.id, d.slot)).collect();
        self.states.commit(&f.page_flips, &directory);
        for d in &f.directory {
            self.new_directory_ids.remove(&d.k);
        }
        pool.commit();
        self.alloc.commit(self.interval);
        self.committed = self.interval;
    }

    /// The checkpoint in flight failed: its pages are dirty again, no pair state changed, and
    /// its region-0 frees (but for leaves created again meanwhile) wait for the next one.
    pub fn abort(&mut self, pool: &mut PagePool<Page>) {
        let f = self.flight.take().expect("a checkpoint in flight");
        self.region0_freed.extend(f.frees);
        pool.abort();
    }
}

/// Whether `buf` is an intact copy of page `at` of the volume `uuid` names: its seeded CRC,
/// its address and its body.
pub fn intact_copy(buf: &[u8], uuid: &[u8; 16], at: &PageAddress) -> bool {
    open_page(buf, uuid, at)
        .and_then(|(stamp, body)| Page::decode(at, &stamp, body))
        .is_ok()
}

impl TreeIo for MetaStore {
    fn read(&mut self, pool: &mut PagePool<Page>, at: &PageAddress) -> Result<Page> {
        let slot = slot_of(self.state(pool, at.id)?).ok_or_else(|| {
            Error::CorruptMetadata(format!("page {} is named but its pair is free", at.id))
        })?;
        self.read_slot(at, slot)
    }

    fn allocate(&mut self, page: &Page) -> Result<u32> {
        let region0 = self.region0_fixed
            && page.kind == PageKind::MapLeaf
            && page.creator == DEFAULT_DEVICE
            && page.position < u64::from(self.geometry.pairs0);
        if region0 {
            let id = page.position as u32;
            // Created again before the phase 1 (or the commit) that frees it: the id never
            // left its pair state, and the free is not recorded.
            self.region0_freed.remove(&id);
            if let Some(f) = self.flight.as_mut() {
                f.frees.remove(&id);
            }
            return Ok(id);
        }
        self.alloc.allocate(self.usage).ok_or(Error::NoSpace)
    }

    fn lost(&mut self, pool: &mut PagePool<Page>, at: &PageAddress) -> Option<PairSlot> {
        if self.lost.len() < BAD_SEEN_MAX && !self.lost.contains(at) {
            self.lost.push(*at);
            self.lost_new.push(*at);
        }
        // Known: the read that failed looked it up.
        self.state(pool, at.id).ok().and_then(slot_of)
    }

    fn free(&mut self, id: u32) {
        match self.geometry.home(id) {
            Some(PairHome::Region0 { .. }) => {
                self.region0_freed.insert(id);
            }
            _ => {
                self.states.record(id, PairState::Free, self.interval);
                self.alloc.free(id, self.interval);
                if let Some(f) = self.flight.as_mut() {
                    f.freed_since.insert(id);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{MemStorage, SimStorage};
    use crate::format::{BlockState, ChildSlot, MapEntry, PageKind};
    use crate::meta::map_tree::{MapTree, NoSharing};
    use crate::meta::pool::FRAME_BYTES;
    use crate::meta::repairs::{Recheck, WrittenSets};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// Extents carved for metadata in every test volume (copy 0; copy 1 is `e + H`).
    const CARVED: [u32; 4] = [0, 1, 2, 3];

    struct Volume {
        storage: Arc<dyn Storage>,
        sb: Superblock,
        geometry: MetaGeometry,
        /// The stores opened on it fold their lists past this.
        fold_from: usize,
        /// Its metadata extents (copy 0).
        carved: Vec<u32>,
    }

    fn volume_on(storage: impl FnOnce(u64) -> Arc<dyn Storage>) -> Volume {
        let sb = crate::layout::plan(&crate::layout::CreateOptions::new(8 << 20)).expect("plan");
        let geometry = MetaGeometry::at_enable(&sb).expect("geometry");
        Volume {
            storage: storage(sb.total_bytes()),
            sb,
            geometry,
            fold_from: FOLD_FROM_DEFAULT,
            carved: CARVED.to_vec(),
        }
    }

    fn volume() -> Volume {
        volume_on(|len| Arc::new(MemStorage::new(len)))
    }

    /// What a durable checkpoint carries for the store: its pair-state and directory lists and
    /// the tree root as of its phase 1.
    #[derive(Clone)]
    struct Durable {
        meta: MetaCheckpoint,
        root: ChildSlot,
        interval: u64,
    }

    const EMPTY: Durable = Durable {
        meta: MetaCheckpoint {
            list: Vec::new(),
            directory: Vec::new(),
        },
        root: ChildSlot::AllUnmapped,
        interval: 1,
    };

    /// A store as an open after that checkpoint makes it: pair states from its list, carved ids
    /// in use taken out of allocation.
    fn open(v: &Volume, d: &Durable) -> MetaStore {
        MetaStore::open(
            v.storage.clone(),
            &v.sb,
            v.geometry,
            v.carved.iter().copied(),
            &d.meta,
            d.interval,
        )
        .map(|mut s| {
            s.fold_from = v.fold_from;
            s
        })
        .expect("open")
    }

    fn pool() -> PagePool<Page> {
        PagePool::new(64 * FRAME_BYTES, 0).expect("pool")
    }

    fn data(n: u32) -> MapEntry {
        MapEntry {
            state: BlockState::Data,
            len: 77,
            extent: n,
            offset: 1024,
            crc: n.wrapping_mul(2_654_435_761),
            ..MapEntry::UNMAPPED
        }
    }

    fn trim(t: &mut MapTree, p: &mut PagePool<Page>, s: &mut MetaStore, first: u64, n: u64) {
        t.set_range(
            p,
            s,
            &mut NoSharing,
            first,
            n,
            ChildSlot::AllUnmapped,
            &mut |_| {},
        )
        .expect("trim");
    }

    /// A checkpoint's phase 1 as the engine takes it: the list it carries and the root.
    fn begin(t: &MapTree, p: &mut PagePool<Page>, s: &mut MetaStore, interval: u64) -> Durable {
        let root = t.root();
        let meta = s.checkpoint(p).expect("checkpoint");
        Durable {
            meta,
            root,
            interval,
        }
    }

    fn reopen(v: &Volume, d: &Durable, blocks: u64) -> (MetaStore, MapTree, PagePool<Page>) {
        let depth = MapTree::new(blocks).depth();
        let tree = MapTree::from_root(d.root, depth, blocks).expect("root");
        (open(v, d), tree, pool())
    }

    #[derive(Clone, Debug)]
    enum Op {
        Set(u64, u32),
        Trim(u64, u64),
        /// A checkpoint's phase 1 and 2; steps go on while it is in flight.
        Begin,
        /// The checkpoint in flight commits, or its sync fails (abort).
        End {
            commit: bool,
        },
        /// A power failure: the open starts from the last committed checkpoint, whatever the
        /// one in flight wrote.
        Crash,
    }

    fn op(blocks: u64) -> impl Strategy<Value = Op> {
        // Blocks in the first leaves (region 0) and the last ones (past it: carved ids).
        let lba = prop_oneof![0..600u64, (blocks - 600)..blocks];
        prop_oneof![
            6 => (lba.clone(), 1u32..1000).prop_map(|(l, v)| Op::Set(l, v)),
            2 => (lba, prop_oneof![1u64..300, 255u64..=510]).prop_map(|(l, n)| Op::Trim(l, n)),
            2 => Just(Op::Begin),
            2 => any::<bool>().prop_map(|commit| Op::End { commit }),
            1 => Just(Op::Crash),
        ]
    }

    /// The live tree against a flat map, with writes and trims between a checkpoint's phase 1
    /// and its commit; after every crash, the tree read from the medium against the flat map as
    /// of the last committed checkpoint's phase 1. A checkpoint cut after its writes must not
    /// have touched a durable page: it writes only the other slots, no id the durable one names
    /// is reused before a later commit, and a region-0 leaf trimmed and created again keeps the
    /// pair state naming its durable slot (R15-A1).
    fn run(ops: Vec<Op>, fold_from: usize) -> std::result::Result<(), TestCaseError> {
        let mut v = volume();
        v.fold_from = fold_from;
        let blocks = (u64::from(v.geometry.pairs0) + 8) * 255;
        let mut durable = EMPTY;
        let mut durable_model: BTreeMap<u64, MapEntry> = BTreeMap::new();
        let (mut store, mut tree, mut p) = reopen(&v, &durable, blocks);
        let mut model = durable_model.clone();
        // The checkpoint in flight: what it carries and the model at its phase 1.
        let mut flight: Option<(Durable, BTreeMap<u64, MapEntry>)> = None;
        for op in ops {
            match op {
                Op::Set(l, n) => {
                    tree.set(&mut p, &mut store, l, data(n)).expect("set");
                    model.insert(l, data(n));
                }
                Op::Trim(first, n) => {
                    let n = n.min(blocks - first);
                    trim(&mut tree, &mut p, &mut store, first, n);
                    let gone: Vec<u64> = model.range(first..first + n).map(|(&b, _)| b).collect();
                    for b in gone {
                        model.remove(&b);
                    }
                }
                Op::Begin if flight.is_none() => {
                    let d = begin(&tree, &mut p, &mut store, durable.interval + 1);
                    flight = Some((d, model.clone()));
                }
                Op::Begin => {}
                Op::End { commit } => {
                    if let Some((d, m)) = flight.take() {
                        if commit {
                            store.commit(&mut p);
                            durable = d;
                            durable_model = m;
                        } else {
                            store.abort(&mut p);
                        }
                    }
                }
                Op::Crash => {
                    flight = None;
                    (store, tree, p) = reopen(&v, &durable, blocks);
                    model = durable_model.clone();
                    for (&l, &e) in &model {
                        prop_assert_eq!(
                            tree.get(&mut p, &mut store, l).expect("read"),
                            e,
                            "lba {}",
                            l
                        );
                    }
                }
            }
        }
        for (&l, &e) in &model {
            prop_assert_eq!(
                tree.get(&mut p, &mut store, l).expect("read"),
                e,
                "lba {}",
                l
            );
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(192))]
        #[test]
        fn checkpoints_never_overwrite_what_the_durable_one_names(
            ops in proptest::collection::vec(op((u64::from(volume().geometry.pairs0) + 8) * 255), 1..80),
            fold_from in prop_oneof![Just(0usize), 1usize..6, Just(FOLD_FROM_DEFAULT)],
        ) {
            run(ops, fold_from)?;
        }
    }

    /// R15-A1's sequence by hand: a region-0 leaf flushed in slot A, trimmed whole and written
    /// again in the next interval, whose checkpoint is cut after its writes: the reopen reads
    /// the flushed content.
    #[test]
    fn a_region0_leaf_trimmed_and_created_again_keeps_its_durable_slot() {
        let v = volume();
        let blocks = u64::from(v.geometry.pairs0) * 255;
        let (mut store, mut tree, mut p) = reopen(&v, &EMPTY, blocks);
        tree.set(&mut p, &mut store, 10, data(1)).expect("set");
        let d = begin(&tree, &mut p, &mut store, 2);
        store.commit(&mut p);
        assert!(d.meta.list.contains(&PairListEntry {
            id: 0,
            state: PairState::SlotA
        }));
        trim(&mut tree, &mut p, &mut store, 0, 255);
        tree.set(&mut p, &mut store, 10, data(2))
            .expect("write again");
        let _cut = store.checkpoint(&mut p).expect("checkpoint");
        let (mut store, tree, mut p) = reopen(&v, &d, blocks);
        assert_eq!(tree.get(&mut p, &mut store, 10).expect("read"), data(1));
    }

    /// Review 15's adversarial pass (F1): a page freed while a checkpoint is in flight is not
    /// reused before a later commit, so the next checkpoint cannot overwrite what the one in
    /// flight names.
    #[test]
    fn a_free_during_the_flight_is_not_reused_before_a_later_commit() {
        let v = volume();
        let pairs0 = u64::from(v.geometry.pairs0);
        let blocks = (pairs0 + 8) * 255;
        let (mut store, mut tree, mut p) = reopen(&v, &EMPTY, blocks);
        let l1 = pairs0 * 255; // past region 0: allocated ids for the leaf and the root
        tree.set(&mut p, &mut store, l1, data(1)).expect("set");
        begin(&tree, &mut p, &mut store, 2);
        store.commit(&mut p);
        let d2 = begin(&tree, &mut p, &mut store, 3);
        trim(&mut tree, &mut p, &mut store, l1, 255);
        store.commit(&mut p);
        tree.set(&mut p, &mut store, l1 + 255, data(2))
            .expect("set");
        let _cut = store.checkpoint(&mut p).expect("checkpoint");
        let (mut store, tree, mut p) = reopen(&v, &d2, blocks);
        assert_eq!(tree.get(&mut p, &mut store, l1).expect("read"), data(1));
        assert_eq!(
            tree.get(&mut p, &mut store, l1 + 255).expect("read"),
            MapEntry::UNMAPPED
        );
    }

    /// F1's second effect: a commit does not record its flip over a free made during its
    /// flight.
    #[test]
    fn a_commit_does_not_undo_a_free_made_during_its_flight() {
        let v = volume();
        let pairs0 = u64::from(v.geometry.pairs0);
        let (mut store, mut tree, mut p) = reopen(&v, &EMPTY, (pairs0 + 8) * 255);
        let l1 = pairs0 * 255;
        tree.set(&mut p, &mut store, l1, data(1)).expect("set");
        let ChildSlot::Page(root) = tree.root() else {
            panic!("a root page")
        };
        store.checkpoint(&mut p).expect("checkpoint");
        trim(&mut tree, &mut p, &mut store, l1, 255);
        assert_eq!(tree.root(), ChildSlot::AllUnmapped);
        store.commit(&mut p);
        assert_eq!(store.states.state(&p, root), Lookup::Known(PairState::Free));
    }

    /// F2: an abort does not free a region-0 leaf created again during its flight.
    #[test]
    fn an_abort_does_not_free_a_region0_leaf_created_again_during_its_flight() {
        let v = volume();
        let (mut store, mut tree, mut p) = reopen(&v, &EMPTY, u64::from(v.geometry.pairs0) * 255);
        tree.set(&mut p, &mut store, 10, data(1)).expect("set");
        store.checkpoint(&mut p).expect("checkpoint");
        store.commit(&mut p);
        trim(&mut tree, &mut p, &mut store, 0, 255);
        store.checkpoint(&mut p).expect("phase 1 takes id 0's free");
        tree.set(&mut p, &mut store, 10, data(2))
            .expect("created again in the flight");
        store.abort(&mut p);
        store.checkpoint(&mut p).expect("checkpoint");
        store.commit(&mut p);
        assert_ne!(store.states.state(&p, 0), Lookup::Known(PairState::Free));
        let mut cold = pool();
        assert_eq!(tree.get(&mut cold, &mut store, 10).expect("read"), data(2));
    }

    /// F8: a checkpoint whose sync fails keeps its region-0 frees for the next one and leaves
    /// its pages dirty.
    #[test]
    fn a_failed_checkpoint_keeps_its_region0_frees() {
        let sim = Arc::new(SimStorage::new(volume().sb.total_bytes() as usize));
        let v = volume_on(|_| sim.clone());
        let (mut store, mut tree, mut p) = reopen(&v, &EMPTY, u64::from(v.geometry.pairs0) * 255);
        tree.set(&mut p, &mut store, 10, data(1)).expect("set");
        store.checkpoint(&mut p).expect("checkpoint");
        store.commit(&mut p);
        trim(&mut tree, &mut p, &mut store, 0, 255);
        tree.set(&mut p, &mut store, 300, data(3)).expect("set");
        sim.fail_sync_at(sim.ops(), 1);
        assert!(store.checkpoint(&mut p).is_err(), "the sync fails");
        assert!(p.is_dirty(1), "the failed checkpoint's page is dirty again");
        store.checkpoint(&mut p).expect("checkpoint");
        store.commit(&mut p);
        assert_eq!(store.states.state(&p, 0), Lookup::Known(PairState::Free));
        assert!(!p.is_dirty(1));
    }

    /// Sets up pair-state page 0 written (leaves 0 and 1 flushed, their flips folded), then
    /// dirties leaf 1 (read, so its frame knows its slot) and, when `recreate`, trims leaf 0
    /// whole and writes it again (a region-0 leaf created again under its fixed id, whose
    /// slot only its pair state says); then evicts page 0 and damages both its copies.
    /// Returns the store, tree, pool, and the good copies to put back.
    #[allow(clippy::type_complexity)]
    fn pair_state_page_lost(
        v: &Volume,
        recreate: bool,
    ) -> (MetaStore, MapTree, PagePool<Page>, Vec<(u64, Vec<u8>)>) {
        let blocks = u64::from(v.geometry.pairs0) * 255;
        let (mut store, mut tree, mut p) = reopen(v, &EMPTY, blocks);
        tree.set(&mut p, &mut store, 3, data(1)).expect("set");
        tree.set(&mut p, &mut store, 300, data(1)).expect("set");
        store.checkpoint(&mut p).expect("checkpoint");
        store.commit(&mut p);
        // The next phase 1 folds the flips into pair-state page 0.
        store.checkpoint(&mut p).expect("checkpoint");
        store.commit(&mut p);
        let (pid, slot) = store.states.page_of(0).expect("page 0 written");
        assert_eq!(store.states.list_len(), 0);
        tree.set(&mut p, &mut store, 301, data(3)).expect("set");
        if recreate {
            trim(&mut tree, &mut p, &mut store, 0, 255);
            tree.set(&mut p, &mut store, 4, data(2)).expect("set");
        }
        assert!(p.remove(pid).is_some(), "page 0 is clean: it may leave");
        let mut good = Vec::new();
        for copy in 0..2 {
            let off = v
                .geometry
                .slot_offset(&v.sb, pid, slot, copy)
                .expect("offset");
            let mut b = vec![0u8; MAP_PAGE_BYTES];
            v.storage.read_at(off, &mut b).expect("read");
            good.push((off, b.clone()));
            b[100] ^= 1;
            v.storage.write_at(off, &b).expect("write");
        }
        (store, tree, p, good)
    }

    /// A checkpoint of pages it read needs no pair-state page: each frame knows its slot. With
    /// pair-state page 0 unreadable, leaf 1's checkpoint commits and reopens.
    #[test]
    fn a_checkpoint_of_pages_it_read_needs_no_pair_state_page() {
        let mut v = volume();
        v.fold_from = 0;
        let (mut store, tree, mut p, good) = pair_state_page_lost(&v, false);
        let d = begin(&tree, &mut p, &mut store, 4);
        store.commit(&mut p);
        assert!(!p.is_dirty(1));
        for (off, b) in good {
            v.storage.write_at(off, &b).expect("write");
        }
        let blocks = u64::from(v.geometry.pairs0) * 255;
        let (mut store, tree, mut p) = reopen(&v, &d, blocks);
        assert_eq!(tree.get(&mut p, &mut store, 301).expect("read"), data(3));
        assert_eq!(tree.get(&mut p, &mut store, 3).expect("read"), data(1));
    }

    /// A region-0 leaf created again needs its pair state, from its pair-state page: when that
    /// page fails both copies the checkpoint fails with nothing taken (every page dirty
    /// again), and once the page reads again the next checkpoint commits.
    #[test]
    fn a_checkpoint_whose_pair_state_page_cannot_be_read_takes_nothing() {
        let mut v = volume();
        v.fold_from = 0;
        let (mut store, tree, mut p, good) = pair_state_page_lost(&v, true);
        assert!(store.checkpoint(&mut p).is_err());
        assert!(p.is_dirty(0) && p.is_dirty(1), "the leaves are dirty again");
        for (off, b) in good {
            v.storage.write_at(off, &b).expect("write");
        }
        let d = begin(&tree, &mut p, &mut store, 4);
        store.commit(&mut p);
        assert!(!p.is_dirty(0) && !p.is_dirty(1));
        let blocks = u64::from(v.geometry.pairs0) * 255;
        let (mut store, tree, mut p) = reopen(&v, &d, blocks);
        assert_eq!(tree.get(&mut p, &mut store, 301).expect("read"), data(3));
        assert_eq!(tree.get(&mut p, &mut store, 4).expect("read"), data(2));
        assert_eq!(
            tree.get(&mut p, &mut store, 3).expect("read"),
            MapEntry::UNMAPPED
        );
    }

    /// A small list folds whole at every phase 1 (a checkpoint carries only its own flips) and
    /// keeps its pair-state page held: a pool of 16 frames evicts clean leaves under writes
    /// and reads across the device, never the page.
    #[test]
    fn a_small_list_keeps_its_pair_state_pages_resident() {
        let v = volume();
        let blocks = (u64::from(v.geometry.pairs0) + 8) * 255;
        let (mut store, mut tree, _) = reopen(&v, &EMPTY, blocks);
        let bounds = ListBounds::new(4096, 17, 1);
        assert!(bounds.small());
        store.set_bounds(&bounds);
        let mut p = PagePool::new(16 * FRAME_BYTES, 0).expect("pool");
        let mut page = None;
        for round in 0..6u32 {
            for leaf in 0..(blocks / 255) {
                tree.set(
                    &mut p,
                    &mut store,
                    leaf * 255 + u64::from(round),
                    data(round + 1),
                )
                .expect("set");
                if p.stats().dirty >= 6 {
                    store.checkpoint(&mut p).expect("checkpoint");
                    store.commit(&mut p);
                }
            }
            let before = store.states.list_len();
            let carried = store.checkpoint(&mut p).expect("checkpoint").list;
            store.commit(&mut p);
            // Folded whole at phase 1: it carries only this checkpoint's own flips.
            assert!(
                before > 0 && carried.len() <= 16,
                "{before} {}",
                carried.len()
            );
            let (pid, _) = store.states.page_of(0).expect("page 0 written");
            assert!(page.is_none_or(|q| q == pid));
            page = Some(pid);
            assert!(
                p.contains(pid),
                "round {round}: the pair-state page left the pool"
            );
        }
        // Both copies of the page go bad on the medium; reads of every leaf, three times round
        // with nothing dirty, cycle more pages than frames through the pool, and need the
        // page's bits for every leaf they read: they succeed only because it never left.
        let pid = page.expect("written");
        let (_, slot) = store.states.page_of(0).expect("written");
        for copy in 0..2 {
            let off = v
                .geometry
                .slot_offset(&v.sb, pid, slot, copy)
                .expect("offset");
            v.storage
                .write_at(off, &[0u8; MAP_PAGE_BYTES])
                .expect("write");
        }
        let evicted = p.stats().evictions;
        for _ in 0..3 {
            for leaf in 0..(blocks / 255) {
                assert_eq!(
                    tree.get(&mut p, &mut store, leaf * 255).expect("read"),
                    data(1)
                );
            }
        }
        assert!(p.stats().evictions > evicted, "the reads evicted leaves");
    }

    /// A fold that cannot run (no id left for a new pair-state page) does not stop the
    /// checkpoint: the list carries the entries, the commit holds, an open reads them back,
    /// and a later fold, once ids are free again, moves them into the page.
    #[test]
    fn a_fold_without_an_id_leaves_the_list_longer_never_the_checkpoint_undone() {
        let mut v = volume();
        v.fold_from = 0;
        let blocks = (u64::from(v.geometry.pairs0) + 8) * 255;
        let (mut store, mut tree, mut p) = reopen(&v, &EMPTY, blocks);
        tree.set(&mut p, &mut store, 10, data(1)).expect("set");
        let l1 = u64::from(v.geometry.pairs0) * 255;
        tree.set(&mut p, &mut store, l1, data(2)).expect("set");
        // Every other id taken: the first fold needs one for pair-state page 0.
        let mut taken = Vec::new();
        while let Some(id) = store.alloc.allocate(PairUse::Metadata) {
            taken.push(id);
        }
        begin(&tree, &mut p, &mut store, 2);
        store.commit(&mut p);
        let d = begin(&tree, &mut p, &mut store, 3);
        store.commit(&mut p);
        assert_eq!(store.fold_failures, 1, "{:?}", store.last_fold_error);
        assert!(d.meta.directory.is_empty() && !d.meta.list.is_empty());
        let (mut s2, t2, mut p2) = reopen(&v, &d, blocks);
        assert_eq!(t2.get(&mut p2, &mut s2, 10).expect("read"), data(1));
        assert_eq!(t2.get(&mut p2, &mut s2, l1).expect("read"), data(2));
        // One id back (freed, then past a commit): the directory page takes it, the
        // pair-state page finds none, and the checkpoint still commits.
        let give_back = |store: &mut MetaStore, id: u32| {
            store.alloc.free(id, store.interval() - 1);
            store.alloc.commit(store.interval());
        };
        give_back(&mut store, taken[0]);
        let d = begin(&tree, &mut p, &mut store, 4);
        store.commit(&mut p);
        assert_eq!(store.fold_failures, 2);
        assert!(d.meta.directory.is_empty());
        // A second: the next phase 1 folds.
        give_back(&mut store, taken[1]);
        let d = begin(&tree, &mut p, &mut store, 5);
        store.commit(&mut p);
        assert_eq!(store.fold_failures, 2, "{:?}", store.last_fold_error);
        assert_eq!(d.meta.directory.len(), 1);
        let (mut s3, t3, mut p3) = reopen(&v, &d, blocks);
        assert_eq!(t3.get(&mut p3, &mut s3, l1).expect("read"), data(2));
    }

    /// Folds move the list into pair-state pages without changing an answer: a checkpoint
    /// after a fold carries an empty list and one directory page, and an open from it reads the
    /// states from the page (a leaf past region 0, whose id came from the allocator, stays out
    /// of allocation).
    #[test]
    fn a_folded_list_opens_from_its_pages() {
        let mut v = volume();
        v.fold_from = 0;
        let pairs0 = u64::from(v.geometry.pairs0);
        let blocks = (pairs0 + 8) * 255;
        let (mut store, mut tree, mut p) = reopen(&v, &EMPTY, blocks);
        tree.set(&mut p, &mut store, 10, data(1)).expect("set");
        tree.set(&mut p, &mut store, pairs0 * 255, data(2))
            .expect("set");
        let d1 = begin(&tree, &mut p, &mut store, 2);
        store.commit(&mut p);
        assert!(d1.meta.directory.is_empty(), "nothing to fold yet");
        assert!(!d1.meta.list.is_empty());
        let d2 = begin(&tree, &mut p, &mut store, 3);
        store.commit(&mut p);
        assert!(d2.meta.list.is_empty(), "{:?}", d2.meta.list);
        assert_eq!(d2.meta.directory.len(), 1);
        let (mut store, mut tree, mut p) = reopen(&v, &d2, blocks);
        assert_eq!(tree.get(&mut p, &mut store, 10).expect("read"), data(1));
        let (a, b) = (p.resident(), store.reads);
        assert_eq!(
            tree.get(&mut p, &mut store, pairs0 * 255).expect("read"),
            data(2)
        );
        assert!(p.resident() > a && store.reads > b);
        // New pages take ids nobody holds: the old ones read back after another commit.
        tree.set(&mut p, &mut store, (pairs0 + 4) * 255, data(3))
            .expect("set");
        let d3 = begin(&tree, &mut p, &mut store, 4);
        store.commit(&mut p);
        let (mut store, tree, mut p) = reopen(&v, &d3, blocks);
        for (l, n) in [(10, 1), (pairs0 * 255, 2), ((pairs0 + 4) * 255, 3)] {
            assert_eq!(tree.get(&mut p, &mut store, l).expect("read"), data(n));
        }
    }

    /// F5: a frame of a region-0 leaf read without the lock before a trim dropped it is not
    /// installed by the hint rule (the drop changes the hint token), and a leaf created again
    /// under the id replaces any stale clean frame.
    #[test]
    fn a_hint_read_before_a_region0_trim_is_not_installed() {
        let v = volume();
        let (mut store, mut tree, _) = reopen(&v, &EMPTY, u64::from(v.geometry.pairs0) * 255);
        let mut p = pool();
        tree.set(&mut p, &mut store, 10, data(1)).expect("set");
        store.checkpoint(&mut p).expect("checkpoint");
        let mut sets = WrittenSets::new(0);
        sets.publish(1, vec![0]).expect("publish");
        store.commit(&mut p);
        let mut p = pool();
        let noted = sets.latest();
        let token = store.hint_token(&p, 0);
        let at = PageAddress {
            id: 0,
            kind: PageKind::MapLeaf,
            level: 0,
            position: 0,
        };
        let frame = store.read(&mut p, &at).expect("read");
        trim(&mut tree, &mut p, &mut store, 0, 255);
        let recheck = Recheck {
            absent: !p.contains(0),
            same_pair_state: store.hint_token(&p, 0) == token,
        };
        assert!(
            sets.hint(0, noted, recheck).is_err(),
            "the drop changed the token"
        );
        // Even installed (a caller that skipped the rule), the stale frame gives way.
        p.install(0, PageKind::MapLeaf, frame, false, 0)
            .expect("install");
        tree.set(&mut p, &mut store, 10, data(2))
            .expect("a write after the trim");
        assert_eq!(
            tree.get(&mut p, &mut store, 11).expect("read"),
            MapEntry::UNMAPPED
        );
    }

    #[test]
    fn a_bad_first_copy_is_read_from_the_second_and_reported() {
        let v = volume();
        let (mut store, mut tree, mut p) = reopen(&v, &EMPTY, u64::from(v.geometry.pairs0) * 255);
        tree.set(&mut p, &mut store, 300, data(5)).expect("set");
        store.checkpoint(&mut p).expect("checkpoint");
        store.commit(&mut p);
        // Leaf 1 (id 1, region 0) was written to slot A: damage copy 0 there.
        let off = v
            .geometry
            .slot_offset(&v.sb, 1, PairSlot::A, 0)
            .expect("offset");
        let mut b = vec![0u8; MAP_PAGE_BYTES];
        v.storage.read_at(off, &mut b).expect("read");
        b[200] ^= 0x10;
        v.storage.write_at(off, &b).expect("write");
        let mut cold = pool();
        assert_eq!(tree.get(&mut cold, &mut store, 300).expect("read"), data(5));
        assert_eq!(store.bad_copies.len(), 1);
        assert_eq!(store.bad_copies[0].id, 1);
        // Both copies bad: an error, never unmapped.
        let off1 = v
            .geometry
            .slot_offset(&v.sb, 1, PairSlot::A, 1)
            .expect("offset");
        v.storage.write_at(off1, &b).expect("write");
        let mut cold = pool();
        // Both copies bad: a damaged entry (the leaf stands in as damaged entries), never
        // unmapped, never data; the leaf is noted as lost.
        let e = tree.get(&mut cold, &mut store, 300).expect("a stand-in");
        assert_eq!(e.state, BlockState::Corrupt);
        assert_eq!(store.lost.first().map(|a| a.id), Some(1));
    }

    /// The next checkpoint rewrites a page found with a bad copy 0: both copies of the other
    /// slot, so a later loss of the old copy 1 loses nothing, whether the page stayed
    /// resident or was evicted before that phase 1.
    #[test]
    fn a_bad_first_copy_is_rewritten_by_the_next_checkpoint() {
        for evicted in [false, true] {
            let v = volume();
            let blocks = u64::from(v.geometry.pairs0) * 255;
            let (mut store, mut tree, mut p) = reopen(&v, &EMPTY, blocks);
            tree.set(&mut p, &mut store, 300, data(5)).expect("set");
            store.checkpoint(&mut p).expect("checkpoint");
            store.commit(&mut p);
            let slot_a = |copy| {
                v.geometry
                    .slot_offset(&v.sb, 1, PairSlot::A, copy)
                    .expect("offset")
            };
            let mut b = vec![0u8; MAP_PAGE_BYTES];
            v.storage.read_at(slot_a(0), &mut b).expect("read");
            b[200] ^= 0x10;
            v.storage.write_at(slot_a(0), &b).expect("write");
            let mut p = pool();
            assert_eq!(tree.get(&mut p, &mut store, 300).expect("read"), data(5));
            assert_eq!(store.bad_seen.len(), 1);
            if evicted {
                p.remove(1);
            }
            store.checkpoint(&mut p).expect("checkpoint");
            store.commit(&mut p);
            // Slot A's copy 1 lost too: slot B, written whole, serves.
            v.storage.write_at(slot_a(1), &b).expect("write");
            let mut cold = pool();
            assert_eq!(
                tree.get(&mut cold, &mut store, 300).expect("rewritten"),
                data(5),
                "evicted: {evicted}"
            );
            assert!(store.bad_copies.is_empty());
        }
    }

    /// An open from a checkpoint whose pair-state list names an id past the id space (a
    /// damaged or crafted extension) must refuse it as damage; taken in, the next fold
    /// indexes the directory past its end and panics.
    #[test]
    fn an_open_refuses_a_list_entry_past_the_id_space() {
        let mut v = volume();
        v.fold_from = 0;
        let past = v.geometry.ids_max() as u32 + 5 * PAIR_STATE_IDS_PER_PAGE as u32;
        let d = Durable {
            meta: MetaCheckpoint {
                list: vec![PairListEntry {
                    id: past,
                    state: PairState::SlotA,
                }],
                directory: Vec::new(),
            },
            ..EMPTY
        };
        let opened = MetaStore::open(
            v.storage.clone(),
            &v.sb,
            v.geometry,
            v.carved.iter().copied(),
            &d.meta,
            d.interval,
        );
        let Ok(mut store) = opened else {
            return;
        };
        store.fold_from = 0;
        let mut p = pool();
        let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            store.checkpoint(&mut p).map(|_| ())
        }));
        assert!(
            matches!(got, Ok(Err(Error::CorruptMetadata(_)))),
            "a list entry past the id space is damage, found at open or at the fold: {:?}",
            got.map_err(|_| "panicked")
        );
    }

    /// A sparse medium for the guarded runs: the frames written, the frames the durable
    /// checkpoint names (a write over one is recorded, whatever it writes: the oracle the
    /// model check alone lacks, since a rewrite of the same content reads back right), and a
    /// write or sync made to fail on request.
    #[derive(Default)]
    struct Guard {
        len: u64,
        frames: std::sync::Mutex<std::collections::HashMap<u64, Vec<u8>>>,
        named: std::sync::Mutex<BTreeSet<u64>>,
        overwrites: std::sync::Mutex<Vec<u64>>,
        /// The write this many writes from now fails (0: the next one).
        fail_write_in: std::sync::Mutex<Option<u32>>,
        fail_sync: std::sync::atomic::AtomicBool,
    }

    const FRAME: u64 = MAP_PAGE_BYTES as u64;

    impl Storage for Guard {
        fn len_bytes(&self) -> Result<u64> {
            Ok(self.len)
        }

        fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
            let frames = self.frames.lock().expect("lock");
            let mut done = 0;
            while done < buf.len() {
                let at = offset + done as u64;
                let (base, within) = (at / FRAME * FRAME, (at % FRAME) as usize);
                let n = (FRAME as usize - within).min(buf.len() - done);
                match frames.get(&base) {
                    Some(f) => buf[done..done + n].copy_from_slice(&f[within..within + n]),
                    None => buf[done..done + n].fill(0),
                }
                done += n;
            }
            Ok(())
        }

        fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
            {
                let mut fail = self.fail_write_in.lock().expect("lock");
                match fail.as_mut() {
                    Some(0) => {
                        *fail = None;
                        return Err(Error::Io(std::io::Error::other("injected write failure")));
                    }
                    Some(n) => *n -= 1,
                    None => {}
                }
            }
            let named = self.named.lock().expect("lock");
            let mut frames = self.frames.lock().expect("lock");
            let mut done = 0;
            while done < data.len() {
                let at = offset + done as u64;
                let (base, within) = (at / FRAME * FRAME, (at % FRAME) as usize);
                let n = (FRAME as usize - within).min(data.len() - done);
                if named.contains(&base) {
                    self.overwrites.lock().expect("lock").push(base);
                }
                let f = frames
                    .entry(base)
                    .or_insert_with(|| vec![0; MAP_PAGE_BYTES]);
                f[within..within + n].copy_from_slice(&data[done..done + n]);
                done += n;
            }
            Ok(())
        }

        fn sync(&self) -> Result<()> {
            if self
                .fail_sync
                .swap(false, std::sync::atomic::Ordering::Relaxed)
            {
                return Err(Error::Io(std::io::Error::other("injected sync failure")));
            }
            Ok(())
        }

        fn discard(&self, _offset: u64, _len: u64) -> Result<()> {
            Ok(())
        }
    }

    /// The frames the durable checkpoint `d` names (both copies of the current slot of each of
    /// its directory pages, its pair-state pages and every map page its tree reaches, read
    /// from the medium by a store opened from it) and the map pages' ids.
    /// `other`: the root of a second device's tree the checkpoint names too.
    fn named_by(
        v: &Volume,
        d: &Durable,
        blocks: u64,
        other: Option<ChildSlot>,
    ) -> (BTreeSet<u64>, BTreeSet<u32>) {
        struct Walk<'a> {
            store: &'a mut MetaStore,
            seen: Vec<(u32, PairSlot)>,
        }
        impl TreeIo for Walk<'_> {
            fn read(&mut self, pool: &mut PagePool<Page>, at: &PageAddress) -> Result<Page> {
                let page = TreeIo::read(&mut *self.store, pool, at)?;
                let Lookup::Known(state) = self.store.states.state(pool, at.id) else {
                    panic!("page {}'s pair state is resident after its read", at.id)
                };
                self.seen
                    .push((at.id, slot_of(state).expect("a page read has a slot")));
                Ok(page)
            }
            fn allocate(&mut self, _: &Page) -> Result<u32> {
                unreachable!("a walk creates nothing")
            }
            fn free(&mut self, _: u32) {
                unreachable!("a walk frees nothing")
            }
        }
        let mut store = open(v, d);
        let mut pages: Vec<(u32, PairSlot)> = d.meta.directory.clone();
        for j in 0..v.geometry.pair_state_pages() as u32 {
            pages.extend(store.states.page_of(j));
        }
        let depth = MapTree::new(blocks).depth();
        let tree = MapTree::from_root(d.root, depth, blocks).expect("root");
        let mut pool = PagePool::new(1024 * FRAME_BYTES, 0).expect("pool");
        let mut walk = Walk {
            store: &mut store,
            seen: Vec::new(),
        };
        tree.scan(&mut pool, &mut walk, 0, blocks, &mut |_, _, _| {})
            .expect("the durable tree reads");
        if let Some(root) = other {
            let t = MapTree::from_root(root, depth, blocks)
                .expect("root")
                .with_device(OTHER_DEVICE);
            t.scan(&mut pool, &mut walk, 0, blocks, &mut |_, _, _| {})
                .expect("the durable other tree reads");
        }
        let ids = walk.seen.iter().map(|&(id, _)| id).collect();
        pages.extend(walk.seen);
        let frames = pages
            .iter()
            .flat_map(|&(id, slot)| {
                (0..2).map(move |c| {
                    v.geometry
                        .slot_offset(&v.sb, id, slot, c)
                        .expect("in the id space")
                })
            })
            .collect();
        (frames, ids)
    }

    /// The store as a tree's io, checking every id it hands out: never one in use in the live
    /// tree, one the durable checkpoint's tree names (but a region-0 leaf's fixed id), or a
    /// pair-state or directory page's.
    struct Checked<'a> {
        store: &'a mut MetaStore,
        live: &'a mut BTreeSet<u32>,
        durable: &'a BTreeSet<u32>,
        pairs0: u32,
    }

    impl TreeIo for Checked<'_> {
        fn read(&mut self, pool: &mut PagePool<Page>, at: &PageAddress) -> Result<Page> {
            TreeIo::read(&mut *self.store, pool, at)
        }
        fn allocate(&mut self, page: &Page) -> Result<u32> {
            let id = self.store.allocate(page)?;
            if id >= self.pairs0 {
                assert!(
                    !self.durable.contains(&id),
                    "id {id}, which the durable checkpoint names, handed out"
                );
                assert!(
                    !self.store.states.own_ids().any(|o| o == id),
                    "id {id} of a pair-state or directory page handed out"
                );
            }
            assert!(self.live.insert(id), "id {id}, in use, handed out again");
            Ok(id)
        }
        fn free(&mut self, id: u32) {
            self.live.remove(&id);
            self.store.free(id);
        }
    }

    /// A volume of 8 MiB logical over 1.2 GiB of 32 KiB extents on a sparse medium, its
    /// metadata extents carved across the first four pair-state page boundaries, so that its
    /// pages' pair states lie in up to five pair-state pages.
    fn wide_volume(guard: &mut Option<Arc<Guard>>) -> Volume {
        let sb = crate::layout::plan(&crate::layout::CreateOptions {
            extent_bytes: 32 << 10,
            capacity_bytes: Some(1200 << 20),
            ..crate::layout::CreateOptions::new(8 << 20)
        })
        .expect("plan");
        let geometry = MetaGeometry::at_enable(&sb).expect("geometry");
        let per = PAIR_STATE_IDS_PER_PAGE as u32;
        let mut carved = Vec::new();
        // One extent across each boundary, so that lowest-first allocation reaches the next
        // pair-state page every few ids, and room past the last.
        for j in 1..=4 {
            carved.push((j * per - geometry.pairs0) / geometry.pairs_per_extent);
        }
        let last = carved[3];
        carved.extend(last + 1..last + 5);
        assert!(carved.iter().all(|&e| e < geometry.h), "{geometry:?}");
        let g = Arc::new(Guard {
            len: sb.total_bytes(),
            ..Guard::default()
        });
        *guard = Some(g.clone());
        Volume {
            storage: g,
            sb,
            geometry,
            fold_from: FOLD_FROM_DEFAULT,
            carved,
        }
    }

    fn guarded_volume(wide: bool) -> (Volume, Arc<Guard>) {
        let mut guard = None;
        let v = if wide {
            wide_volume(&mut guard)
        } else {
            volume_on(|len| {
                let g = Arc::new(Guard {
                    len,
                    ..Guard::default()
                });
                guard = Some(g.clone());
                g
            })
        };
        (v, guard.expect("made"))
    }

    #[derive(Clone, Debug)]
    enum GuardedOp {
        Set(u64, u32),
        Trim(u64, u64),
        Begin,
        /// A checkpoint whose write this many writes in fails, or (at 8) whose sync fails.
        Fail(u8),
        End {
            commit: bool,
        },
        Crash,
        /// Every clean pair-state page leaves the pool.
        Evict,
        /// With nothing dirty and no checkpoint in flight, every block read through a cold pool.
        Cold,
        /// A second device's map, on the same store and pool: a write, a trim, made (all
        /// unmapped) and removed (every page freed, as `Catalog::remove_device` does).
        OtherSet(u64, u32),
        OtherTrim(u64, u64),
        OtherAdd,
        OtherRemove,
    }

    /// The second device of the guarded runs (its leaves take allocated ids, region 0's
    /// positions included).
    const OTHER_DEVICE: u32 = DEFAULT_DEVICE + 1;

    fn guarded_op(blocks: u64) -> impl Strategy<Value = GuardedOp> {
        let lba = prop_oneof![0..600u64, (blocks - 600)..blocks];
        prop_oneof![
            6 => (lba.clone(), 1u32..1000).prop_map(|(l, v)| GuardedOp::Set(l, v)),
            2 => (lba, prop_oneof![1u64..300, 255u64..=510]).prop_map(|(l, n)| GuardedOp::Trim(l, n)),
            2 => Just(GuardedOp::Begin),
            1 => (0u8..=8).prop_map(GuardedOp::Fail),
            2 => any::<bool>().prop_map(|commit| GuardedOp::End { commit }),
            1 => Just(GuardedOp::Crash),
            1 => Just(GuardedOp::Evict),
            1 => Just(GuardedOp::Cold),
        ]
    }

    /// [`guarded_op`] with a second device's ops.
    fn guarded_op_devices(blocks: u64) -> impl Strategy<Value = GuardedOp> {
        let lba = prop_oneof![0..600u64, (blocks - 600)..blocks];
        prop_oneof![
            8 => guarded_op(blocks),
            4 => (lba.clone(), 1u32..1000).prop_map(|(l, v)| GuardedOp::OtherSet(l, v)),
            1 => (lba, prop_oneof![1u64..300, 255u64..=510])
                .prop_map(|(l, n)| GuardedOp::OtherTrim(l, n)),
            1 => Just(GuardedOp::OtherAdd),
            1 => Just(GuardedOp::OtherRemove),
        ]
    }

    struct Guarded {
        v: Volume,
        guard: Arc<Guard>,
        blocks: u64,
        frames: u64,
        durable: Durable,
        durable_model: BTreeMap<u64, MapEntry>,
        durable_ids: BTreeSet<u32>,
        store: MetaStore,
        tree: MapTree,
        p: PagePool<Page>,
        model: BTreeMap<u64, MapEntry>,
        live: BTreeSet<u32>,
        flight: Option<(Durable, BTreeMap<u64, MapEntry>)>,
        /// A small list: every phase 1 folds it whole and its pair-state pages stay held.
        small: bool,
        /// The second device's tree and model, live, as of the flight's phase 1, and durable.
        other: Option<(MapTree, BTreeMap<u64, MapEntry>)>,
        other_flight: Option<(ChildSlot, BTreeMap<u64, MapEntry>)>,
        other_durable: Option<(ChildSlot, BTreeMap<u64, MapEntry>)>,
    }

    impl Guarded {
        fn open_store(v: &Volume, d: &Durable, small: bool) -> MetaStore {
            let mut s = open(v, d);
            if small {
                s.set_bounds(&ListBounds::new(4096, 17, 1));
            }
            s
        }

        fn new(wide: bool, fold_from: usize, frames: u64, small: bool) -> Guarded {
            let (mut v, guard) = guarded_volume(wide);
            v.fold_from = fold_from;
            let blocks = (u64::from(v.geometry.pairs0) + 8) * 255;
            let depth = MapTree::new(blocks).depth();
            Guarded {
                small,
                other: None,
                other_flight: None,
                other_durable: None,
                store: Guarded::open_store(&v, &EMPTY, small),
                tree: MapTree::from_root(EMPTY.root, depth, blocks).expect("root"),
                p: PagePool::new(frames * FRAME_BYTES, 0).expect("pool"),
                v,
                guard,
                blocks,
                frames,
                durable: EMPTY,
                durable_model: BTreeMap::new(),
                durable_ids: BTreeSet::new(),
                model: BTreeMap::new(),
                live: BTreeSet::new(),
                flight: None,
            }
        }

        fn io(&mut self) -> (&mut MapTree, &mut PagePool<Page>, Checked<'_>) {
            (
                &mut self.tree,
                &mut self.p,
                Checked {
                    store: &mut self.store,
                    live: &mut self.live,
                    durable: &self.durable_ids,
                    pairs0: self.v.geometry.pairs0,
                },
            )
        }

        fn io_other(&mut self) -> Option<(&mut MapTree, &mut PagePool<Page>, Checked<'_>)> {
            let (tree, _) = self.other.as_mut()?;
            Some((
                tree,
                &mut self.p,
                Checked {
                    store: &mut self.store,
                    live: &mut self.live,
                    durable: &self.durable_ids,
                    pairs0: self.v.geometry.pairs0,
                },
            ))
        }

        /// Checkpoints (and commits) first when pinned frames pass half the pool, as the
        /// engine does.
        fn room(&mut self) {
            if self.p.stats().pinned * 2 > self.frames {
                self.end(true);
                if self.begin() {
                    self.end(true);
                }
            }
        }

        fn begin(&mut self) -> bool {
            if self.flight.is_some() {
                return false;
            }
            let root = self.tree.root();
            match self.store.checkpoint(&mut self.p) {
                Ok(meta) => {
                    let own: Vec<u32> = self.store.states.own_ids().collect();
                    for id in own {
                        assert!(!self.live.contains(&id), "page {id} is a map page too");
                    }
                    let d = Durable {
                        meta,
                        root,
                        interval: self.store.interval(),
                    };
                    self.flight = Some((d, self.model.clone()));
                    self.other_flight = self.other.as_ref().map(|(t, m)| (t.root(), m.clone()));
                    true
                }
                Err(_) => {
                    assert_eq!(
                        self.p.stats().writing,
                        0,
                        "a failed checkpoint writes nothing"
                    );
                    false
                }
            }
        }

        fn end(&mut self, commit: bool) {
            let Some((d, m)) = self.flight.take() else {
                return;
            };
            if !commit {
                self.store.abort(&mut self.p);
                return;
            }
            self.store.commit(&mut self.p);
            self.durable = d;
            self.durable_model = m;
            self.other_durable = self.other_flight.take();
            let other = self.other_durable.as_ref().map(|(r, _)| *r);
            let (frames, ids) = named_by(&self.v, &self.durable, self.blocks, other);
            *self.guard.named.lock().expect("lock") = frames;
            self.durable_ids = ids;
        }

        fn check(&mut self, cold: bool) -> std::result::Result<(), TestCaseError> {
            let mut fresh = PagePool::new(self.frames * FRAME_BYTES, 0).expect("pool");
            let p = if cold { &mut fresh } else { &mut self.p };
            for (&l, &e) in &self.model {
                prop_assert_eq!(
                    self.tree.get(p, &mut self.store, l).expect("read"),
                    e,
                    "lba {}",
                    l
                );
            }
            if let Some((t, m)) = &self.other {
                for (&l, &e) in m {
                    prop_assert_eq!(
                        t.get(p, &mut self.store, l).expect("read"),
                        e,
                        "other lba {}",
                        l
                    );
                }
            }
            Ok(())
        }

        fn op(&mut self, op: GuardedOp) -> std::result::Result<(), TestCaseError> {
            match op {
                GuardedOp::Set(l, n) => {
                    let l = l % self.blocks;
                    self.room();
                    let (tree, p, mut io) = self.io();
                    tree.set(p, &mut io, l, data(n)).expect("set");
                    self.model.insert(l, data(n));
                }
                GuardedOp::Trim(first, n) => {
                    let first = first % self.blocks;
                    self.room();
                    let n = n.min(self.blocks - first);
                    let (tree, p, mut io) = self.io();
                    tree.set_range(
                        p,
                        &mut io,
                        &mut NoSharing,
                        first,
                        n,
                        ChildSlot::AllUnmapped,
                        &mut |_| {},
                    )
                    .expect("trim");
                    let gone: Vec<u64> = self
                        .model
                        .range(first..first + n)
                        .map(|(&b, _)| b)
                        .collect();
                    for b in gone {
                        self.model.remove(&b);
                    }
                }
                GuardedOp::Begin => {
                    self.begin();
                }
                GuardedOp::Fail(k) => {
                    if self.flight.is_none() {
                        if k == 8 {
                            self.guard
                                .fail_sync
                                .store(true, std::sync::atomic::Ordering::Relaxed);
                        } else {
                            *self.guard.fail_write_in.lock().expect("lock") = Some(u32::from(k));
                        }
                        self.begin();
                        *self.guard.fail_write_in.lock().expect("lock") = None;
                        self.guard
                            .fail_sync
                            .store(false, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                GuardedOp::End { commit } => self.end(commit),
                GuardedOp::Crash => {
                    self.flight = None;
                    self.other_flight = None;
                    self.other = self.other_durable.clone().map(|(root, m)| {
                        let depth = MapTree::new(self.blocks).depth();
                        let t = MapTree::from_root(root, depth, self.blocks)
                            .expect("root")
                            .with_device(OTHER_DEVICE);
                        (t, m)
                    });
                    self.store = Guarded::open_store(&self.v, &self.durable, self.small);
                    let depth = MapTree::new(self.blocks).depth();
                    self.tree =
                        MapTree::from_root(self.durable.root, depth, self.blocks).expect("root");
                    self.p = PagePool::new(self.frames * FRAME_BYTES, 0).expect("pool");
                    self.model = self.durable_model.clone();
                    self.live = self.durable_ids.clone();
                    self.check(false)?;
                }
                GuardedOp::Evict => {
                    for j in 0..self.v.geometry.pair_state_pages() as u32 {
                        if let Some((pid, _)) = self.store.states.page_of(j) {
                            if self.p.contains(pid) && !self.p.is_dirty(pid) {
                                self.p.remove(pid);
                            }
                        }
                    }
                }
                GuardedOp::Cold => {
                    if self.flight.is_none() && self.p.stats().dirty == 0 {
                        self.check(true)?;
                    }
                }
                GuardedOp::OtherSet(l, n) => {
                    let l = l % self.blocks;
                    self.room();
                    if let Some((tree, p, mut io)) = self.io_other() {
                        tree.set(p, &mut io, l, data(n)).expect("set");
                        self.other.as_mut().expect("made").1.insert(l, data(n));
                    }
                }
                GuardedOp::OtherTrim(first, n) => {
                    let first = first % self.blocks;
                    self.room();
                    let n = n.min(self.blocks - first);
                    if let Some((tree, p, mut io)) = self.io_other() {
                        tree.set_range(
                            p,
                            &mut io,
                            &mut NoSharing,
                            first,
                            n,
                            ChildSlot::AllUnmapped,
                            &mut |_| {},
                        )
                        .expect("trim");
                        let m = &mut self.other.as_mut().expect("made").1;
                        m.retain(|&b, _| b < first || b >= first + n);
                    }
                }
                GuardedOp::OtherAdd => {
                    if self.other.is_none() {
                        let t = MapTree::new(self.blocks).with_device(OTHER_DEVICE);
                        self.other = Some((t, BTreeMap::new()));
                    }
                }
                GuardedOp::OtherRemove => {
                    let blocks = self.blocks;
                    if let Some((tree, p, mut io)) = self.io_other() {
                        tree.set_range(
                            p,
                            &mut io,
                            &mut NoSharing,
                            0,
                            blocks,
                            ChildSlot::AllUnmapped,
                            &mut |_| {},
                        )
                        .expect("remove");
                        self.other = None;
                    }
                }
            }
            let hit = self.guard.overwrites.lock().expect("lock").clone();
            prop_assert!(
                hit.is_empty(),
                "frames the durable checkpoint names were written: {:?}",
                hit
            );
            Ok(())
        }
    }

    fn run_guarded(
        ops: Vec<GuardedOp>,
        wide: bool,
        fold_from: usize,
        frames: u64,
    ) -> std::result::Result<(), TestCaseError> {
        run_guarded_with(ops, wide, fold_from, frames, false)
    }

    fn run_guarded_with(
        ops: Vec<GuardedOp>,
        wide: bool,
        fold_from: usize,
        frames: u64,
        small: bool,
    ) -> std::result::Result<(), TestCaseError> {
        let mut g = Guarded::new(wide, fold_from, frames, small);
        for op in ops {
            g.op(op)?;
        }
        g.check(false)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// The stronger oracle: a medium that records any write over a frame the durable
        /// checkpoint names, an io that refuses to hand out an id in use or named, failed writes
        /// and syncs, pair-state pages evicted at any point, a small pool, and an id space over
        /// several pair-state pages.
        #[test]
        fn no_checkpoint_writes_a_frame_the_durable_one_names(
            ops in proptest::collection::vec(guarded_op((u64::from(volume().geometry.pairs0) + 8) * 255), 1..100),
            wide in any::<bool>(),
            fold_from in prop_oneof![Just(0usize), 1usize..6, Just(FOLD_FROM_DEFAULT)],
            frames in prop_oneof![Just(64u64), Just(9u64)],
        ) {
            run_guarded(ops, wide, fold_from, frames)?;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// The same oracle with a second device's tree on the store and pool (made, written,
        /// trimmed and removed whole, also while a checkpoint is in flight) and, when `small`,
        /// a small list whose pair-state pages the store holds.
        #[test]
        fn no_checkpoint_writes_a_named_frame_with_two_devices_and_held_pages(
            ops in proptest::collection::vec(guarded_op_devices((u64::from(volume().geometry.pairs0) + 8) * 255), 1..120),
            wide in Just(true),
            fold_from in prop_oneof![Just(0usize), 1usize..6, Just(FOLD_FROM_DEFAULT)],
            frames in prop_oneof![Just(64u64), Just(16u64)],
            small in any::<bool>(),
        ) {
            run_guarded_with(ops, wide, fold_from, frames, small)?;
        }
    }
}
