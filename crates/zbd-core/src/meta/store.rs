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

use std::collections::BTreeSet;
use std::sync::Arc;

use super::geometry::{MetaGeometry, PairHome};
use super::map_tree::{MapPage, TreeIo};
use super::pairs::{Lookup, PairAllocator, PairStates, PairUse};
use super::pool::PagePool;
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::format::{
    open_page, seal_page, FrameStamp, PageAddress, PairSlot, PairState, Superblock, MAP_PAGE_BYTES,
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
    /// The interval writes are in: the sequence of the checkpoint that will close it.
    interval: u64,
    /// Region-0 ids freed in this interval: allocated still, until the next phase 1 (R15-A1).
    region0_freed: BTreeSet<u32>,
    /// Pages whose copy 0 failed while copy 1 was good: the repair list's input.
    pub bad_copies: Vec<PageAddress>,
    /// Page reads, for tests and statistics.
    pub reads: u64,
}

/// What a checkpoint's phase 2 wrote: the pages and the slots they took, flipped at the commit.
#[derive(Debug, Default)]
pub struct Written {
    flips: Vec<(u32, PairState)>,
    frees: Vec<u32>,
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
            bad_copies: Vec::new(),
            reads: 0,
        }
    }

    fn state(&self, id: u32) -> Result<PairState> {
        match self.states.state(id) {
            Lookup::Known(s) => Ok(s),
            Lookup::Fault(j) => Err(Error::CorruptMetadata(format!(
                "pair-state page {j} is not resident (page {id})"
            ))),
        }
    }

    fn offset(&self, id: u32, slot: PairSlot, copy: u8) -> Result<u64> {
        self.geometry
            .slot_offset(&self.sb, id, slot, copy)
            .ok_or_else(|| Error::CorruptMetadata(format!("page id {id} is past the id space")))
    }

    /// Phase 1 and 2 of a checkpoint for the pool's pages: frees region-0 ids not created
    /// again this interval, takes the pool's snapshot and writes each page into the other slot
    /// of its pair, both copies, then syncs. Nothing durable is overwritten; the flips take
    /// effect at [`MetaStore::commit`].
    pub fn checkpoint(&mut self, pool: &mut PagePool<MapPage>) -> Result<Written> {
        let mut w = Written {
            frees: std::mem::take(&mut self.region0_freed)
                .into_iter()
                .collect(),
            ..Written::default()
        };
        let seq = self.interval;
        for id in pool.snapshot() {
            let page = pool.peek(id).expect("a snapshot's pages are resident");
            let next = match self.state(id)? {
                PairState::SlotA => PairState::SlotB,
                // A new page (free until its first commit) takes slot A.
                PairState::SlotB | PairState::Free => PairState::SlotA,
                PairState::Reserved => {
                    return Err(Error::CorruptMetadata(format!(
                        "page {id} is in a pair held out of allocation"
                    )))
                }
            };
            let slot = slot_of(next).expect("a slot");
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
            w.flips.push((id, next));
        }
        self.storage.sync()?;
        Ok(w)
    }

    /// The checkpoint that wrote `w` is durable: its flips and frees are the pair states now,
    /// its pages clean, and the next interval begins.
    pub fn commit(&mut self, pool: &mut PagePool<MapPage>, w: Written) {
        for (id, state) in w.flips {
            self.states.record(id, state, self.interval);
        }
        for id in w.frees {
            self.states.record(id, PairState::Free, self.interval);
        }
        pool.commit();
        self.interval += 1;
        self.alloc.commit(self.interval);
    }

    /// The checkpoint that wrote `w` failed: its pages are dirty again, the region-0 frees wait
    /// for the next one, and no pair state changed.
    pub fn abort(&mut self, pool: &mut PagePool<MapPage>, w: Written) {
        self.region0_freed.extend(w.frees);
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
            self.storage
                .read_at(self.offset(at.id, slot, copy)?, &mut buf)?;
            self.reads += 1;
            match open_page(&buf, &self.sb.uuid, at).and_then(|(_, body)| MapPage::decode(at, body))
            {
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
            // Created again in the interval it was freed in: the id never left its pair state.
            self.region0_freed.remove(&id);
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
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MemStorage;
    use crate::format::{BlockState, ChildSlot, MapEntry, PairListEntry};
    use crate::meta::map_tree::MapTree;
    use crate::meta::pool::FRAME_BYTES;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// Extents carved for metadata in every test volume (copy 0; copy 1 is `e + H`).
    const CARVED: [u32; 4] = [0, 1, 2, 3];

    struct Volume {
        storage: Arc<MemStorage>,
        sb: Superblock,
        geometry: MetaGeometry,
    }

    fn volume() -> Volume {
        let sb = crate::layout::plan(&crate::layout::CreateOptions::new(8 << 20)).expect("plan");
        let geometry = MetaGeometry::at_enable(&sb).expect("geometry");
        let storage = Arc::new(MemStorage::new(sb.total_bytes()));
        Volume {
            storage,
            sb,
            geometry,
        }
    }

    /// What a durable checkpoint carries for the store: its pair-state list and the tree root.
    #[derive(Clone)]
    struct Durable {
        list: Vec<PairListEntry>,
        root: ChildSlot,
        interval: u64,
    }

    /// A store as an open after that checkpoint makes it: pair states from its list, carved ids
    /// in use taken out of allocation.
    fn open(v: &Volume, d: &Durable) -> MetaStore {
        let pages = v.geometry.pair_state_pages() as u32;
        let mut states = PairStates::new(0..pages);
        states.load_list(&d.list);
        let mut alloc = PairAllocator::new(v.geometry);
        for &e in &CARVED {
            alloc.carve(e).expect("carve");
        }
        alloc.commit(0);
        for e in d.list.iter().filter(|e| e.state != PairState::Free) {
            alloc.mark_in_use(e.id);
        }
        MetaStore::new(
            v.storage.clone(),
            &v.sb,
            v.geometry,
            states,
            alloc,
            d.interval,
        )
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

    #[derive(Clone, Debug)]
    enum Op {
        Set(u64, u32),
        Trim(u64, u64),
        /// A checkpoint: committed, failed (sync error: aborted), or cut by a power failure
        /// after its pages were written (a crash, then an open from the durable checkpoint).
        Checkpoint(Outcome),
        /// A power failure between checkpoints.
        Crash,
    }

    #[derive(Clone, Copy, Debug)]
    enum Outcome {
        Commit,
        Abort,
        CutBeforeCommit,
    }

    fn op(blocks: u64) -> impl Strategy<Value = Op> {
        // Blocks in the first leaves and the last ones (past region 0, carved ids).
        let lba = prop_oneof![0..600u64, (blocks - 600)..blocks];
        prop_oneof![
            6 => (lba.clone(), 1u32..1000).prop_map(|(l, v)| Op::Set(l, v)),
            2 => (lba, prop_oneof![1u64..300, 255u64..=510]).prop_map(|(l, n)| Op::Trim(l, n)),
            1 => Just(Op::Checkpoint(Outcome::Commit)),
            1 => Just(Op::Checkpoint(Outcome::Abort)),
            1 => Just(Op::Checkpoint(Outcome::CutBeforeCommit)),
            1 => Just(Op::Crash),
        ]
    }

    /// The live tree against a flat map; after every crash, the tree read from the medium
    /// against the flat map as of the last committed checkpoint. A checkpoint cut after its
    /// writes must not have touched a durable page: it writes only the other slots, and a
    /// region-0 leaf trimmed and created again in one interval keeps the pair state naming its
    /// durable slot (R15-A1; freeing it at the trim would let the checkpoint overwrite it).
    fn run(ops: Vec<Op>) -> std::result::Result<(), TestCaseError> {
        let v = volume();
        // Leaves past region 0 too: the device reaches 8 leaves beyond it.
        let blocks = (u64::from(v.geometry.pairs0) + 8) * 255;
        let mut durable = Durable {
            list: Vec::new(),
            root: ChildSlot::AllUnmapped,
            interval: 1,
        };
        let mut durable_model: BTreeMap<u64, MapEntry> = BTreeMap::new();
        let mut store = open(&v, &durable);
        let mut tree = MapTree::from_root(durable.root, MapTree::new(blocks).depth());
        let mut p = pool();
        let mut model = durable_model.clone();
        for op in ops {
            let crash = match op {
                Op::Set(l, n) => {
                    tree.set(&mut p, &mut store, l, data(n)).expect("set");
                    model.insert(l, data(n));
                    false
                }
                Op::Trim(first, n) => {
                    let n = n.min(blocks - first);
                    tree.set_range(
                        &mut p,
                        &mut store,
                        first,
                        n,
                        ChildSlot::AllUnmapped,
                        &mut |_| {},
                    )
                    .expect("trim");
                    let gone: Vec<u64> = model.range(first..first + n).map(|(&b, _)| b).collect();
                    for b in gone {
                        model.remove(&b);
                    }
                    false
                }
                Op::Checkpoint(outcome) => {
                    let root = tree.root();
                    let w = store.checkpoint(&mut p).expect("checkpoint");
                    match outcome {
                        Outcome::Commit => {
                            store.commit(&mut p, w);
                            durable = Durable {
                                list: store.states.list_entries(),
                                root,
                                interval: durable.interval + 1,
                            };
                            durable_model = model.clone();
                            false
                        }
                        Outcome::Abort => {
                            store.abort(&mut p, w);
                            false
                        }
                        Outcome::CutBeforeCommit => true,
                    }
                }
                Op::Crash => true,
            };
            if crash {
                store = open(&v, &durable);
                tree = MapTree::from_root(durable.root, tree.depth());
                p = pool();
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
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn checkpoints_never_overwrite_what_the_durable_one_names(
            ops in proptest::collection::vec(op((u64::from(volume().geometry.pairs0) + 8) * 255), 1..60)
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
        let mut d = Durable {
            list: Vec::new(),
            root: ChildSlot::AllUnmapped,
            interval: 1,
        };
        let mut store = open(&v, &d);
        let mut tree = MapTree::new(u64::from(v.geometry.pairs0) * 255);
        let mut p = pool();
        tree.set(&mut p, &mut store, 10, data(1)).expect("set");
        let w = store.checkpoint(&mut p).expect("checkpoint");
        store.commit(&mut p, w);
        d = Durable {
            list: store.states.list_entries(),
            root: tree.root(),
            interval: 2,
        };
        assert!(d.list.contains(&PairListEntry {
            id: 0,
            state: PairState::SlotA
        }));
        tree.set_range(
            &mut p,
            &mut store,
            0,
            255,
            ChildSlot::AllUnmapped,
            &mut |_| {},
        )
        .expect("trim");
        tree.set(&mut p, &mut store, 10, data(2))
            .expect("write again");
        let _cut = store.checkpoint(&mut p).expect("checkpoint");
        let mut store = open(&v, &d);
        let tree = MapTree::from_root(d.root, tree.depth());
        let mut p = pool();
        assert_eq!(tree.get(&mut p, &mut store, 10).expect("read"), data(1));
    }

    #[test]
    fn a_bad_first_copy_is_read_from_the_second_and_reported() {
        let v = volume();
        let mut store = open(
            &v,
            &Durable {
                list: Vec::new(),
                root: ChildSlot::AllUnmapped,
                interval: 1,
            },
        );
        let mut tree = MapTree::new(u64::from(v.geometry.pairs0) * 255);
        let mut p = pool();
        tree.set(&mut p, &mut store, 300, data(5)).expect("set");
        let w = store.checkpoint(&mut p).expect("checkpoint");
        store.commit(&mut p, w);
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
