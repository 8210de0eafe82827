//! Shared items (format bit 12; docs/design.md, "The shared-block table (SBT)", "Counts and
//! accounting", "Owner search"): an item two or more map slots name lives under one SBT entry,
//! its **owner**, which holds its location and exact reference count; each slot names it as a
//! shared entry (state 4: the SBT key and the block's index in the item). So the cleaner moves
//! a shared item by changing its one SBT entry, whatever the number of references.
//!
//! These are the catalog's operations on them, for one device's tree (devices share nothing
//! before step 3):
//! - [`Catalog::promote`]: a direct item becomes shared (an SBT entry born at its first
//!   block's LBA; its direct entries turn into shared ones);
//! - [`Catalog::add_ref`] and [`Catalog::drop_ref`]: one reference more or less, the entry
//!   removed in the same call that brings its count to 0 ("death at 0"), never below;
//! - [`Catalog::owner`]: which entry names an item found by its birth and location (a
//!   victim's record, a replayed move);
//! - [`Catalog::resolve`] and [`Catalog::move_shared`]: where a shared block is now, and a
//!   move of the whole item.
//!
//! The callers keep the extent accounting: a shared item charges its extent its whole stored
//! length once, as one live block ([`SbtValue::block`] of a one-block view), from the
//! promotion that makes it to the drop that kills it.

use super::catalog::Catalog;
use crate::error::{Error, Result};
use crate::format::{BlockState, MapEntry, SbtKey, SbtValue, SBT_FLAG_PINNED, SBT_KEY_FIELD_MAX};

/// What a promotion did: the new SBT entry, and each block that turned from a direct entry
/// (given) into a shared one, by LBA. With `error`, the promotion stopped part way (a leaf
/// that failed to load): what it lists was done and must be accounted, then the error
/// returned.
#[derive(Debug)]
pub struct Promoted {
    pub key: SbtKey,
    pub value: SbtValue,
    pub blocks: Vec<(u64, MapEntry)>,
    pub error: Option<Error>,
}

/// Who names the item a record describes (design.md, "Owner search").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// Its direct entries in the device's tree (the entry at the searched LBA is one of them).
    Direct(MapEntry),
    /// Its SBT entry.
    Shared(SbtKey, SbtValue),
    /// Nobody: the item is dead.
    Dead,
}

impl Catalog {
    /// Block `e` of a shared item as a direct entry names it (location, length, checksum of
    /// the whole item, and the block's index); any other entry as it is.
    pub fn resolve(&mut self, e: MapEntry) -> Result<MapEntry> {
        match e.sbt_key() {
            Some(key) => Ok(self.shared_value(key)?.block(e.unit_index)),
            None => Ok(e),
        }
    }

    /// Makes the direct item whose block at `lba` of `device` is `at` shared: an SBT entry
    /// keyed by the item's birth LBA (`lba - index`) and a new serial, counting the item's
    /// blocks still named in the tree, each of which becomes a shared entry. Nothing changes
    /// when the SBT refuses the entry (no page id: `NoSpace`).
    pub fn promote(&mut self, device: u32, lba: u64, at: MapEntry) -> Result<Promoted> {
        if at.state != BlockState::Data || u64::from(at.unit_index) > lba {
            return Err(Error::Invalid(format!(
                "block {lba} is no direct item to promote"
            )));
        }
        let birth = lba - u64::from(at.unit_index);
        // The item's blocks lie at birth + index (a unit is one run of LBAs); those still
        // naming it are its references.
        let mut named = Vec::with_capacity(usize::from(at.unit_blocks));
        let (tree, pool, store) = self.map(device);
        let end = (birth + u64::from(at.unit_blocks.max(1))).min(tree.blocks());
        for l in birth..end {
            let e = tree.get(pool, store, l)?;
            if e.state == BlockState::Data
                && (e.extent, e.offset) == (at.extent, at.offset)
                && u64::from(e.unit_index) == l - birth
            {
                named.push((l, e));
            }
        }
        let key = SbtKey {
            birth,
            serial: self.take_sbt_serial(),
        };
        if key.serial > SBT_KEY_FIELD_MAX {
            return Err(Error::NoSpace);
        }
        let mut value = SbtValue::of_item(&at, named.len() as u32);
        self.sbt
            .insert(&mut self.pool, &mut self.store, key, value)?;
        let (tree, pool, store) = self.map(device);
        let mut error = None;
        for (done, &(l, e)) in named.iter().enumerate() {
            if let Err(err) = tree.set(pool, store, l, MapEntry::shared(key, e.unit_index)) {
                // The count says how many slots name the key, whatever stopped us: those
                // blocks are shared, the rest stay direct, and the caller accounts for both.
                value.count = done as u32;
                self.set_count(key, value.count)?;
                if done == 0 {
                    return Err(err);
                }
                named.truncate(done);
                error = Some(err);
                break;
            }
        }
        Ok(Promoted {
            key,
            value,
            blocks: named,
            error,
        })
    }

    /// One reference more to `key`. A count that reaches `u32::MAX` pins the item: it is then
    /// never freed before `zbd compact` recounts it (a leak, never an early free).
    pub fn add_ref(&mut self, key: SbtKey) -> Result<SbtValue> {
        let mut v = self.shared_value(key)?;
        if v.flags & SBT_FLAG_PINNED == 0 {
            v.count += 1;
            if v.count == u32::MAX {
                v.flags |= SBT_FLAG_PINNED;
            }
        }
        self.sbt.replace(&mut self.pool, &mut self.store, key, v)?;
        Ok(v)
    }

    /// `n` references fewer to `key`; returns the item's entry when its count reached 0,
    /// removed in this call (the caller frees the item's charge). A pinned item keeps its count.
    pub fn drop_ref(&mut self, key: SbtKey, n: u32) -> Result<Option<SbtValue>> {
        let mut v = self.shared_value(key)?;
        if v.flags & SBT_FLAG_PINNED != 0 {
            return Ok(None);
        }
        if n > v.count {
            return Err(Error::CorruptMetadata(format!(
                "{n} references to {key:?} dropped, its count is {}",
                v.count
            )));
        }
        v.count -= n;
        if v.count > 0 {
            self.sbt.replace(&mut self.pool, &mut self.store, key, v)?;
            return Ok(None);
        }
        self.sbt.remove(&mut self.pool, &mut self.store, key)?;
        Ok(Some(v))
    }

    /// Points the shared item `key` at its copy at `extent`/`offset`, content unchanged: every
    /// reference follows. Returns its entry before the move.
    pub fn move_shared(&mut self, key: SbtKey, extent: u32, offset: u32) -> Result<SbtValue> {
        let old = self.shared_value(key)?;
        let mut at = old.block(0);
        (at.extent, at.offset) = (extent, offset);
        let new = SbtValue {
            flags: old.flags,
            ..SbtValue::of_item(&at, old.count)
        };
        self.sbt
            .replace(&mut self.pool, &mut self.store, key, new)?;
        Ok(old)
    }

    /// The owner of the item whose block `index` lies at `lba` of `device` (birth LBA
    /// `lba - index`) and whose stored bytes are at `extent`/`offset`: its direct entry there,
    /// its SBT entry, or nobody. Complete for one device: a direct item is named only at its
    /// own LBAs (it becomes direct only by a write there, and moves keep it there), and a
    /// shared one only under its birth LBA in the SBT.
    pub fn owner(
        &mut self,
        device: u32,
        lba: u64,
        index: u8,
        extent: u32,
        offset: u32,
    ) -> Result<Owner> {
        // A device deleted since the record was written names nothing any more.
        if let Some((tree, pool, store)) = self.map_of(device) {
            if lba < tree.blocks() {
                let e = tree.get(pool, store, lba)?;
                if e.state == BlockState::Data && (e.extent, e.offset) == (extent, offset) {
                    return Ok(Owner::Direct(e));
                }
            }
        }
        let Some(birth) = lba.checked_sub(u64::from(index)) else {
            return Ok(Owner::Dead);
        };
        let mut found = Owner::Dead;
        self.sbt.scan(
            &mut self.pool,
            &mut self.store,
            SbtKey { birth, serial: 0 },
            &mut |k, v| {
                if k.birth != birth {
                    return false;
                }
                if (v.extent, v.offset()) == (extent, offset) {
                    found = Owner::Shared(k, v);
                    return false;
                }
                true
            },
        )?;
        Ok(found)
    }

    /// Calls `f` with every shared item (key and entry), in key order, until it returns false.
    pub fn for_each_shared(&mut self, f: &mut impl FnMut(SbtKey, SbtValue) -> bool) -> Result<()> {
        let first = SbtKey {
            birth: 0,
            serial: 0,
        };
        self.sbt.scan(&mut self.pool, &mut self.store, first, f)
    }

    /// The SBT entry a shared map entry names; its absence is damage.
    fn shared_value(&mut self, key: SbtKey) -> Result<SbtValue> {
        self.sbt
            .get(&mut self.pool, &mut self.store, key)?
            .ok_or_else(|| {
                Error::CorruptMetadata(format!(
                    "a shared map entry names {key:?}, which the SBT lacks"
                ))
            })
    }

    fn set_count(&mut self, key: SbtKey, count: u32) -> Result<()> {
        self.sbt
            .update(&mut self.pool, &mut self.store, key, |v| {
                v.filter(|_| count > 0).map(|v| SbtValue { count, ..v })
            })
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{ChildSlot, ExtensionBody};
    use crate::meta::devices::{default_row, DEFAULT_DEVICE};
    use crate::meta::map_tree::{NoSharing, Replaced};
    use crate::meta::testing::{bounds, pool, TestVolume};
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    /// An item of the model: where it lies now and its shape.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct Item {
        extent: u32,
        offset: u32,
        blocks: u8,
        birth: u64,
    }

    #[derive(Clone, Debug, Default)]
    struct Model {
        /// LBA -> (item id, block index).
        map: BTreeMap<u64, (u32, u8)>,
        items: BTreeMap<u32, Item>,
        next: u32,
    }

    impl Model {
        fn live(&self) -> BTreeSet<u32> {
            self.map.values().map(|&(id, _)| id).collect()
        }
    }

    fn direct(id: u32, it: &Item, index: u8) -> MapEntry {
        MapEntry {
            state: BlockState::Data,
            codec: 1,
            len: 300 * u16::from(it.blocks),
            extent: it.extent,
            offset: it.offset,
            crc: id,
            unit_index: index,
            unit_blocks: it.blocks,
            dict: 0,
            seeded: true,
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// A host write of an item of `blocks` blocks at `lba`.
        Write(u64, u8),
        /// `lba` becomes a reference to what `src` holds (a verified dedup hit).
        Dedup(u64, u64),
        Trim(u64, u64),
        /// The cleaner moves the `n`-th shared item.
        Move(usize),
        Checkpoint {
            commit: bool,
        },
        Crash,
    }

    const BLOCKS: u64 = 3 * 255;

    fn op() -> impl Strategy<Value = Op> {
        let lba = 0..BLOCKS;
        prop_oneof![
            5 => (lba.clone(), prop_oneof![Just(1u8), Just(2), Just(4)])
                .prop_map(|(l, n)| Op::Write(l, n)),
            6 => (lba.clone(), lba.clone()).prop_map(|(l, s)| Op::Dedup(l, s)),
            2 => (lba, 1u64..300).prop_map(|(l, n)| Op::Trim(l, n)),
            2 => (0usize..8).prop_map(Op::Move),
            2 => any::<bool>().prop_map(|commit| Op::Checkpoint { commit }),
            1 => Just(Op::Crash),
        ]
    }

    /// Drops what a replaced entry referenced (a shared one's reference); the items that died.
    fn dropped(c: &mut Catalog, old: MapEntry, n: u64, dead: &mut Vec<SbtValue>) {
        if let Some(key) = old.sbt_key() {
            if let Some(v) = c.drop_ref(key, n as u32).expect("drop") {
                dead.push(v);
            }
        }
    }

    fn set(c: &mut Catalog, lba: u64, e: MapEntry, dead: &mut Vec<SbtValue>) {
        let (t, p, s) = c.map(DEFAULT_DEVICE);
        let old = t.set(p, s, lba, e).expect("set");
        dropped(c, old, 1, dead);
    }

    /// What the catalog holds equals the model: every slot names its item (through the SBT
    /// for shared ones), every SBT count is the number of slots naming its key, no key is
    /// named without an entry, and owner search finds every live item's owner and no dead one.
    fn same(c: &mut Catalog, m: &Model) -> std::result::Result<(), TestCaseError> {
        let mut slots: Vec<(u64, MapEntry)> = Vec::new();
        let (t, p, s) = c.map(DEFAULT_DEVICE);
        t.scan(p, s, 0, BLOCKS, &mut |l, n, e| {
            if e.state != BlockState::Unmapped {
                slots.extend((l..l + n).map(|b| (b, e)));
            }
        })
        .expect("scan");
        let mut named: BTreeMap<SbtKey, u32> = BTreeMap::new();
        prop_assert_eq!(slots.len(), m.map.len());
        for &(lba, e) in &slots {
            let &(id, index) = m.map.get(&lba).expect("model names it");
            if let Some(k) = e.sbt_key() {
                *named.entry(k).or_default() += 1;
            }
            let got = c.resolve(e).expect("resolve");
            prop_assert_eq!(got, direct(id, &m.items[&id], index), "block {}", lba);
        }
        let mut counted = BTreeMap::new();
        // Where each shared item lies (birth, extent, offset): items born at one LBA in turn
        // (a write there, another over it) share a birth but not a place.
        let mut shared_at = BTreeSet::new();
        c.for_each_shared(&mut |k, v| {
            counted.insert(k, v.count);
            shared_at.insert((k.birth, v.extent, v.offset()));
            true
        })
        .expect("sbt scan");
        prop_assert_eq!(&counted, &named);
        let live = m.live();
        for (&id, it) in &m.items {
            for i in 0..it.blocks {
                let owner = c
                    .owner(
                        DEFAULT_DEVICE,
                        it.birth + u64::from(i),
                        i,
                        it.extent,
                        it.offset,
                    )
                    .expect("owner");
                if !live.contains(&id) {
                    prop_assert_eq!(owner, Owner::Dead, "item {}", id);
                } else if owner == Owner::Dead {
                    // A live direct item is found from the LBAs still naming it; a shared one
                    // from any of its blocks.
                    let direct_here = m.map.get(&(it.birth + u64::from(i))) == Some(&(id, i));
                    prop_assert!(!direct_here, "item {} block {} lost its owner", id, i);
                    prop_assert!(
                        !shared_at.contains(&(it.birth, it.extent, it.offset)),
                        "shared item {} not found",
                        id
                    );
                }
            }
        }
        Ok(())
    }

    fn run(ops: Vec<Op>) -> std::result::Result<(), TestCaseError> {
        let v = TestVolume::new(8 << 20);
        let store = v.open(&Default::default(), 1);
        let mut c = Catalog::create(
            store,
            pool(64),
            &v.geometry,
            &bounds(),
            default_row(BLOCKS, 0),
        )
        .expect("create");
        let mut m = Model::default();
        let mut durable: Option<(ExtensionBody, Model, u64)> = None;
        for op in ops {
            let mut dead = Vec::new();
            let live_before = m.live();
            let mut shared_before = BTreeSet::new();
            c.for_each_shared(&mut |_, v| {
                shared_before.insert(v.crc);
                true
            })
            .expect("scan");
            match op {
                Op::Write(lba, n) => {
                    let id = m.next;
                    m.next += 1;
                    let n = n.min((BLOCKS - lba) as u8);
                    let it = Item {
                        extent: 10 + id,
                        offset: (id % 5) * 4096,
                        blocks: n,
                        birth: lba,
                    };
                    m.items.insert(id, it);
                    for i in 0..n {
                        set(&mut c, lba + u64::from(i), direct(id, &it, i), &mut dead);
                        m.map.insert(lba + u64::from(i), (id, i));
                    }
                }
                Op::Dedup(lba, src) => {
                    let Some(&(id, index)) = m.map.get(&src) else {
                        continue;
                    };
                    let (t, p, s) = c.map(DEFAULT_DEVICE);
                    let e = t.get(p, s, src).expect("get");
                    let key = match e.sbt_key() {
                        Some(k) => k,
                        None => c.promote(DEFAULT_DEVICE, src, e).expect("promote").key,
                    };
                    // The new reference first: the slot may hold the target already.
                    c.add_ref(key).expect("ref");
                    set(&mut c, lba, MapEntry::shared(key, index), &mut dead);
                    m.map.insert(lba, (id, index));
                }
                Op::Trim(lba, n) => {
                    let n = n.min(BLOCKS - lba);
                    let mut olds = Vec::new();
                    let (t, p, s) = c.map(DEFAULT_DEVICE);
                    t.set_range(
                        p,
                        s,
                        &mut NoSharing,
                        lba,
                        n,
                        ChildSlot::AllUnmapped,
                        &mut |r: Replaced| olds.push(r),
                    )
                    .expect("trim");
                    for r in olds {
                        dropped(&mut c, r.entry, r.count, &mut dead);
                    }
                    m.map.retain(|&b, _| b < lba || b >= lba + n);
                }
                Op::Move(n) => {
                    let mut keys = Vec::new();
                    c.for_each_shared(&mut |k, v| {
                        keys.push((k, v));
                        true
                    })
                    .expect("scan");
                    if keys.is_empty() {
                        continue;
                    }
                    let (key, v) = keys[n % keys.len()];
                    let id = v.crc;
                    let to = (5000 + m.next, 8192);
                    m.next += 1;
                    let before = c.move_shared(key, to.0, to.1).expect("move");
                    prop_assert_eq!(before, v);
                    let it = m.items.get_mut(&id).expect("item");
                    (it.extent, it.offset) = to;
                }
                Op::Checkpoint { commit } => {
                    let ext = c.checkpoint().expect("checkpoint");
                    if commit {
                        c.commit();
                        durable = Some((ext, m.clone(), c.store.interval()));
                    } else {
                        c.abort();
                    }
                }
                Op::Crash => {
                    let Some((ext, dm, interval)) = durable.clone() else {
                        continue;
                    };
                    c = v.open_catalog(&ext, interval, 64).expect("reopen");
                    m = dm;
                    same(&mut c, &m)?;
                    continue;
                }
            }
            // Death at 0, exactly: the items whose last reference went are the shared ones
            // that died in this op, each once.
            let gone: BTreeSet<u32> = live_before.difference(&m.live()).copied().collect();
            let died: Vec<u32> = dead.iter().map(|v| v.crc).collect();
            let died_set: BTreeSet<u32> = died.iter().copied().collect();
            prop_assert_eq!(died.len(), died_set.len(), "an item died twice");
            prop_assert!(died_set.is_subset(&gone), "{:?} died while named", died_set);
            let gone_shared: BTreeSet<u32> = gone.intersection(&shared_before).copied().collect();
            prop_assert_eq!(
                &died_set,
                &gone_shared,
                "shared items left unnamed but not freed"
            );
            if c.pool.stats().dirty * 2 >= 64 {
                let ext = c.checkpoint().expect("checkpoint");
                c.commit();
                durable = Some((ext, m.clone(), c.store.interval()));
            }
            same(&mut c, &m)?;
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn shared_items_keep_exact_counts_and_owners_through_crashes(
            ops in proptest::collection::vec(op(), 1..80)
        ) {
            run(ops)?;
        }
    }
}
