//! Metadata pages on the medium: where a page tree's reads, new ids and frees go, and how a
//! checkpoint writes the pool's dirty pages into their pairs (docs/design.md, "Map trees, pages
//! and pairs": pairs and slots; "Where a pair lies"; R15-A1).
//!
//! A page is read from the slot its pair state names (copy 0, else copy 1, each checked against
//! the page's address); a checkpoint writes each page of its snapshot into the **other** slot of
//! its pair, in both copies, so nothing the durable checkpoint names is ever overwritten and a
//! power cut before the commit leaves every durable page intact. The flips become pair states
//! at the commit. Ids come from the [`PairAllocator`], except a region-0 leaf's fixed id, whose
//! free waits for the next phase 1 so that a leaf trimmed and created again in one interval
//! keeps the pair state that says which slot holds its durable copy (R15-A1).
//!
//! The checkpoint record itself (which carries the pair-state list) is the engine's: here a
//! commit ends with [`MetaStore::commit`] and a reopen starts from the list it carried.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::geometry::{MetaGeometry, PairHome};
use super::map_tree::{MapPage, TreeIo};
use super::pairs::{Lookup, PairAllocator, PairStates, PairUse};
use super::pool::PagePool;
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::format::{
    open_page, seal_page, FrameStamp, PageAddress, PairListEntry, PairSlot, PairState, Superblock,
    MAP_PAGE_BYTES,
};

/// Reads, new ids and frees of one volume's metadata pages, and the checkpoint's writes.
pub struct MetaStore {
    storage: Arc<dyn Storage>,
    sb: Superblock,
    geometry: MetaGeometry,
    pub states: PairStates,
    pub alloc: PairAllocator,
    /// Who new ids are for (admission's claims replace this in step 1b.4).
    pub usage: PairUse,
    /// The open interval: frees are tagged with it. A checkpoint's phase 1 closes it and opens
    /// the next, so frees made while that checkpoint is in flight wait for a later commit.
    interval: u64,
    /// Region-0 ids dropped in the open interval: allocated still, until a phase 1 (R15-A1).
    region0_freed: BTreeSet<u32>,
    /// The checkpoint between its phase 1 and its commit or abort.
    flight: Option<Flight>,
    /// Pages whose copy 0 failed while copy 1 was good: the repair list's input.
    pub bad_copies: Vec<PageAddress>,
    /// Page reads, for tests and statistics.
    pub reads: u64,
}

/// What a checkpoint in flight changes at its commit.
#[derive(Debug, Default)]
struct Flight {
    /// Pages written and the slots they took.
    flips: Vec<(u32, PairState)>,
    /// Region-0 ids whose free phase 1 took; one created again meanwhile leaves the set.
    frees: BTreeSet<u32>,
    /// Ids freed since phase 1: a flip of theirs is not recorded over the free.
    freed_since: BTreeSet<u32>,
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
    /// them (from the durable checkpoint's list), writing interval `interval` on.
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
            interval,
            region0_freed: BTreeSet::new(),
            flight: None,
            bad_copies: Vec::new(),
            reads: 0,
        }
    }

    /// The open interval: the one a checkpoint's phase 1 opened, which an open after that
    /// checkpoint writes on in.
    pub fn interval(&self) -> u64 {
        self.interval
    }

    /// The store an open makes from a durable checkpoint: pair states from the list it
    /// carried (pair-state pages read as never written until the directory is built), and the
    /// ids of the metadata extents (copy 0) allocatable but for those the list names in use.
    pub fn open(
        storage: Arc<dyn Storage>,
        sb: &Superblock,
        geometry: MetaGeometry,
        metadata_extents: impl IntoIterator<Item = u32>,
        list: &[PairListEntry],
        interval: u64,
    ) -> Result<MetaStore> {
        let mut states = PairStates::new(0..geometry.pair_state_pages() as u32);
        states.load_list(list);
        let mut alloc = PairAllocator::new(geometry);
        for e in metadata_extents {
            alloc.carve(e)?;
        }
        alloc.commit(0);
        for e in list.iter().filter(|e| e.state != PairState::Free) {
            alloc.mark_in_use(e.id);
        }
        Ok(MetaStore::new(
            storage, sb, geometry, states, alloc, interval,
        ))
    }

    fn state(&self, id: u32) -> Result<PairState> {
        match self.states.state(id) {
            Lookup::Known(s) => Ok(s),
            Lookup::Fault(j) => Err(Error::CorruptMetadata(format!(
                "pair-state page {j} is not resident (page {id})"
            ))),
        }
    }

    /// What the hint rule compares for `id` before and after a read without the lock: its
    /// pair state, and whether it was dropped as a region-0 leaf (which keeps its pair state
    /// until a phase 1, so the state alone would let a read from before the drop in).
    pub fn hint_token(&self, id: u32) -> (Lookup, bool) {
        let dropped = self.region0_freed.contains(&id)
            || self.flight.as_ref().is_some_and(|f| f.frees.contains(&id));
        (self.states.state(id), dropped)
    }

    fn offset(&self, id: u32, slot: PairSlot, copy: u8) -> Result<u64> {
        self.geometry
            .slot_offset(&self.sb, id, slot, copy)
            .ok_or_else(|| Error::CorruptMetadata(format!("page id {id} is past the id space")))
    }

    /// Phases 1 and 2 of a checkpoint for the pool's pages: takes the region-0 frees of the
    /// closing interval and the pool's snapshot, opens the next interval, writes each page into
    /// the other slot of its pair, both copies, and syncs. Nothing durable is overwritten; the
    /// flips and frees take effect at [`MetaStore::commit`]. Returns the pair-state list this
    /// checkpoint carries. On an error the checkpoint is aborted here: its pages dirty again,
    /// its region-0 frees back for the next one.
    pub fn checkpoint(&mut self, pool: &mut PagePool<MapPage>) -> Result<Vec<PairListEntry>> {
        assert!(self.flight.is_none(), "one checkpoint in flight at a time");
        let seq = self.interval;
        let flips: Result<Vec<(u32, PairState)>> = pool
            .snapshot()
            .into_iter()
            .map(|id| Ok((id, self.next_slot(id)?)))
            .collect();
        let flips = match flips {
            Ok(flips) => flips,
            Err(e) => {
                // Nothing was taken but the snapshot: its pages are dirty again.
                pool.abort();
                return Err(e);
            }
        };
        let frees = std::mem::take(&mut self.region0_freed);
        let mut list: BTreeMap<u32, PairState> = self
            .states
            .list_entries()
            .into_iter()
            .map(|e| (e.id, e.state))
            .collect();
        list.extend(flips.iter().copied());
        list.extend(frees.iter().map(|&id| (id, PairState::Free)));
        self.flight = Some(Flight {
            flips,
            frees,
            freed_since: BTreeSet::new(),
        });
        self.interval += 1;
        if let Err(e) = self.write(pool, seq) {
            self.abort(pool);
            return Err(e);
        }
        Ok(list
            .into_iter()
            .map(|(id, state)| PairListEntry { id, state })
            .collect())
    }

    /// The slot a checkpoint writes `id` into: the one its pair state does not name.
    fn next_slot(&self, id: u32) -> Result<PairState> {
        match self.state(id)? {
            PairState::SlotA => Ok(PairState::SlotB),
            // A new page (free until its first commit) takes slot A.
            PairState::SlotB | PairState::Free => Ok(PairState::SlotA),
            PairState::Reserved => Err(Error::CorruptMetadata(format!(
                "page {id} is in a pair held out of allocation"
            ))),
        }
    }

    fn write(&mut self, pool: &PagePool<MapPage>, seq: u64) -> Result<()> {
        let flips = &self.flight.as_ref().expect("in flight").flips;
        for &(id, state) in flips {
            let page = pool.peek(id).expect("a snapshot's pages are resident");
            let slot = slot_of(state).expect("a slot");
            let frame = seal_page(
                &self.sb.uuid,
                &page.address(id),
                &FrameStamp::map(1, 0, seq),
                &page.body,
            );
            for copy in 0..2 {
                self.storage
                    .write_at(self.offset(id, slot, copy)?, &frame)?;
            }
        }
        self.storage.sync()
    }

    /// The checkpoint in flight is durable: its flips and frees are the pair states now (a
    /// page freed since its phase 1 stays free), its pages clean, and the frees of the interval
    /// it closed may be reused.
    pub fn commit(&mut self, pool: &mut PagePool<MapPage>) {
        let f = self.flight.take().expect("a checkpoint in flight");
        let closing = self.interval - 1;
        for (id, state) in f.flips {
            if !f.freed_since.contains(&id) {
                self.states.record(id, state, closing);
            }
        }
        for id in f.frees {
            self.states.record(id, PairState::Free, closing);
        }
        pool.commit();
        self.alloc.commit(self.interval);
    }

    /// The checkpoint in flight failed: its pages are dirty again, no pair state changed, and
    /// its region-0 frees (but for leaves created again meanwhile) wait for the next one.
    pub fn abort(&mut self, pool: &mut PagePool<MapPage>) {
        let f = self.flight.take().expect("a checkpoint in flight");
        self.region0_freed.extend(f.frees);
        pool.abort();
    }
}

impl TreeIo for MetaStore {
    fn read(&mut self, at: &PageAddress) -> Result<MapPage> {
        let slot = slot_of(self.state(at.id)?).ok_or_else(|| {
            Error::CorruptMetadata(format!("page {} is named but its pair is free", at.id))
        })?;
        let mut buf = vec![0u8; MAP_PAGE_BYTES];
        let mut last = None;
        for copy in 0..2u8 {
            self.reads += 1;
            // A copy that cannot be read is tried like one that fails its check: the other
            // copy may serve.
            let got = self
                .storage
                .read_at(self.offset(at.id, slot, copy)?, &mut buf)
                .and_then(|()| open_page(&buf, &self.sb.uuid, at))
                .and_then(|(_, body)| MapPage::decode(at, body));
            match got {
                Ok(page) => {
                    if copy > 0 {
                        self.bad_copies.push(*at);
                    }
                    return Ok(page);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("two copies tried"))
    }

    fn allocate(&mut self, level: u8, position: u64) -> Result<u32> {
        if level == 0 && position < u64::from(self.geometry.pairs0) {
            let id = position as u32;
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
    use crate::meta::map_tree::MapTree;
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
    }

    fn volume_on(storage: impl FnOnce(u64) -> Arc<dyn Storage>) -> Volume {
        let sb = crate::layout::plan(&crate::layout::CreateOptions::new(8 << 20)).expect("plan");
        let geometry = MetaGeometry::at_enable(&sb).expect("geometry");
        Volume {
            storage: storage(sb.total_bytes()),
            sb,
            geometry,
        }
    }

    fn volume() -> Volume {
        volume_on(|len| Arc::new(MemStorage::new(len)))
    }

    /// What a durable checkpoint carries for the store: its pair-state list and the tree root
    /// as of its phase 1.
    #[derive(Clone)]
    struct Durable {
        list: Vec<PairListEntry>,
        root: ChildSlot,
        interval: u64,
    }

    const EMPTY: Durable = Durable {
        list: Vec::new(),
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
            CARVED,
            &d.list,
            d.interval,
        )
        .expect("open")
    }

    fn pool() -> PagePool<MapPage> {
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

    fn trim(t: &mut MapTree, p: &mut PagePool<MapPage>, s: &mut MetaStore, first: u64, n: u64) {
        t.set_range(p, s, first, n, ChildSlot::AllUnmapped, &mut |_| {})
            .expect("trim");
    }

    /// A checkpoint's phase 1 as the engine takes it: the list it carries and the root.
    fn begin(t: &MapTree, p: &mut PagePool<MapPage>, s: &mut MetaStore, interval: u64) -> Durable {
        let root = t.root();
        let list = s.checkpoint(p).expect("checkpoint");
        Durable {
            list,
            root,
            interval,
        }
    }

    fn reopen(v: &Volume, d: &Durable, blocks: u64) -> (MetaStore, MapTree, PagePool<MapPage>) {
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
    fn run(ops: Vec<Op>) -> std::result::Result<(), TestCaseError> {
        let v = volume();
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
            ops in proptest::collection::vec(op((u64::from(volume().geometry.pairs0) + 8) * 255), 1..80)
        ) {
            run(ops)?;
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
        assert!(d.list.contains(&PairListEntry {
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
        assert_eq!(store.states.state(root), Lookup::Known(PairState::Free));
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
        assert_ne!(store.states.state(0), Lookup::Known(PairState::Free));
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
        assert_eq!(store.states.state(0), Lookup::Known(PairState::Free));
        assert!(!p.is_dirty(1));
    }

    /// A checkpoint that cannot name a page's next slot (its pair-state page is not resident)
    /// fails with nothing taken: the page stays dirty and the region-0 frees wait.
    #[test]
    fn a_checkpoint_that_cannot_look_up_a_slot_takes_nothing() {
        let v = volume();
        let blocks = u64::from(v.geometry.pairs0) * 255;
        let mut store = open(&v, &EMPTY);
        let pages = v.geometry.pair_state_pages() as u32;
        // Pair-state page 0 (ids 0..16,320) exists on disk but is not resident.
        store.states = PairStates::new(1..pages);
        let mut tree = MapTree::new(blocks);
        let mut p = pool();
        tree.set(&mut p, &mut store, 300, data(1)).expect("set");
        // Leaf 0 created and trimmed whole: a region-0 free for the checkpoint to take.
        tree.set(&mut p, &mut store, 3, data(2)).expect("set");
        trim(&mut tree, &mut p, &mut store, 0, 255);
        assert!(store.checkpoint(&mut p).is_err());
        assert!(store.hint_token(0).1, "leaf 0's free still waits");
        assert!(p.is_dirty(1), "the leaf is dirty again");
        store
            .states
            .install(0, Box::new([0; crate::format::PAGE_BODY_BYTES]));
        store.checkpoint(&mut p).expect("checkpoint");
        store.commit(&mut p);
        assert!(!p.is_dirty(1));
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
        let token = store.hint_token(0);
        let at = PageAddress {
            id: 0,
            kind: PageKind::MapLeaf,
            level: 0,
            position: 0,
        };
        let frame = store.read(&at).expect("read");
        trim(&mut tree, &mut p, &mut store, 0, 255);
        let recheck = Recheck {
            absent: !p.contains(0),
            same_pair_state: store.hint_token(0) == token,
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
        assert!(tree.get(&mut cold, &mut store, 300).is_err());
    }
}
