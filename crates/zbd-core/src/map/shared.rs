//! Shared items through the volume map (format bit 12; `meta/shared.rs` has the operations
//! on the catalog): the same calls with the volume counters kept exact. A shared entry counts
//! as one block in use; its item's stored bytes count once, from the promotion that makes it
//! to the drop that kills it ([`MapCounters::add_item`]).
//!
//! v2's map has no shared items: resolving is the identity there, and every change is refused.

use super::tree::TreeMap;
use super::VolumeMap;
use crate::error::{Error, Result};
use crate::format::{key_device, key_lba, MapEntry, SbtKey, SbtValue};
use crate::meta::shared::{Owner, Promoted};

/// How much is shared: what `zbd stat` reports as the deduplication ratio.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SharedTotals {
    /// Shared items (SBT entries).
    pub items: u64,
    /// Slots naming them (the sum of their counts).
    pub references: u64,
    /// Blocks stored in them (their unit sizes summed).
    pub item_blocks: u64,
}

impl TreeMap {
    fn promote(&mut self, lba: u64, at: MapEntry) -> Result<Promoted> {
        let (catalog, counters, totals) = self.parts();
        let p = catalog.promote(key_device(lba), key_lba(lba), at)?;
        for &(_, old) in &p.blocks {
            counters.replace(&old, &MapEntry::shared(p.key, old.unit_index), 1);
        }
        counters.add_item(&p.value);
        if let Some(t) = totals {
            t.items += 1;
            t.references += u64::from(p.value.count);
            t.item_blocks += u64::from(p.value.unit_blocks());
        }
        Ok(p)
    }

    fn add_ref(&mut self, key: SbtKey) -> Result<SbtValue> {
        let (catalog, _, totals) = self.parts();
        let v = catalog.add_ref(key)?;
        if let Some(t) = totals {
            t.references += 1;
        }
        Ok(v)
    }

    fn drop_ref(&mut self, key: SbtKey) -> Result<Option<SbtValue>> {
        let (catalog, counters, totals) = self.parts();
        let dead = catalog.drop_ref(key, 1)?;
        if let Some(t) = totals {
            t.references = t.references.saturating_sub(1);
        }
        if let Some(v) = &dead {
            counters.sub_item(v);
            if let Some(t) = totals {
                t.items = t.items.saturating_sub(1);
                t.item_blocks = t.item_blocks.saturating_sub(u64::from(v.unit_blocks()));
            }
        }
        Ok(dead)
    }

    fn shared_totals(&mut self) -> Result<SharedTotals> {
        let (c, _, totals) = self.parts();
        if let Some(t) = totals {
            return Ok(*t);
        }
        let mut t = SharedTotals::default();
        c.for_each_shared(&mut |_, v| {
            t.items += 1;
            t.references += u64::from(v.count);
            t.item_blocks += u64::from(v.unit_blocks());
            true
        })?;
        *totals = Some(t);
        Ok(t)
    }
}

fn no_shared_items() -> Error {
    Error::Invalid("this volume's map has no shared items (format v2's map pages)".into())
}

impl VolumeMap {
    /// Block `e` as a direct entry names it: a shared entry resolved through the SBT (the
    /// item's location, length and checksum, and the block's index); any other as it is.
    pub fn resolve(&mut self, e: MapEntry) -> Result<MapEntry> {
        match self {
            VolumeMap::Tree(t) if e.sbt_key().is_some() => t.parts().0.resolve(e),
            _ => Ok(e),
        }
    }

    /// Makes the direct item whose block at `lba` is `at` shared (`Catalog::promote`), with
    /// the counters: what the caller must move in the extent accounting is in the result.
    pub fn promote(&mut self, lba: u64, at: MapEntry) -> Result<Promoted> {
        match self {
            VolumeMap::Tree(t) => t.promote(lba, at),
            VolumeMap::Pages(_) => Err(no_shared_items()),
        }
    }

    /// One reference more to `key` (the caller then sets a slot to it).
    pub fn add_ref(&mut self, key: SbtKey) -> Result<SbtValue> {
        match self {
            VolumeMap::Tree(t) => t.add_ref(key),
            VolumeMap::Pages(_) => Err(no_shared_items()),
        }
    }

    /// One reference fewer to `key` (a slot that named it changed); the item's entry when it
    /// died, its charge for the caller to free.
    pub fn drop_ref(&mut self, key: SbtKey) -> Result<Option<SbtValue>> {
        match self {
            VolumeMap::Tree(t) => t.drop_ref(key),
            VolumeMap::Pages(_) => Err(no_shared_items()),
        }
    }

    /// Points shared item `key` at its copy at `extent`/`offset`; its entry before the move.
    pub fn move_shared(&mut self, key: SbtKey, extent: u32, offset: u32) -> Result<SbtValue> {
        match self {
            VolumeMap::Tree(t) => t.parts().0.move_shared(key, extent, offset),
            VolumeMap::Pages(_) => Err(no_shared_items()),
        }
    }

    /// The owner of the item whose block `index` lies at `lba` and whose bytes are at
    /// `extent`/`offset` (`Catalog::owner`). On v2's map only a direct entry can be.
    pub fn owner(&mut self, lba: u64, index: u8, extent: u32, offset: u32) -> Result<Owner> {
        match self {
            VolumeMap::Tree(t) => {
                t.parts()
                    .0
                    .owner(key_device(lba), key_lba(lba), index, extent, offset)
            }
            VolumeMap::Pages(m) if lba >= m.blocks() => Ok(Owner::Dead),
            VolumeMap::Pages(m) => {
                let e = m.get(lba)?;
                Ok(
                    if e.state == crate::format::BlockState::Data
                        && (e.extent, e.offset) == (extent, offset)
                    {
                        Owner::Direct(e)
                    } else {
                        Owner::Dead
                    },
                )
            }
        }
    }

    /// How much is shared (none on v2's map). The first call walks the SBT.
    pub fn shared_totals(&mut self) -> Result<SharedTotals> {
        match self {
            VolumeMap::Tree(t) => t.shared_totals(),
            VolumeMap::Pages(_) => Ok(SharedTotals::default()),
        }
    }

    /// Calls `f` with every shared item (its key and entry), in key order, until it returns
    /// false; none on v2's map.
    pub fn for_each_shared(&mut self, f: &mut impl FnMut(SbtKey, SbtValue) -> bool) -> Result<()> {
        match self {
            VolumeMap::Tree(t) => t.parts().0.for_each_shared(f),
            VolumeMap::Pages(_) => Ok(()),
        }
    }

    /// `zbd check`'s recount of references: every SBT count equals the slots naming its key,
    /// and every shared slot names an SBT entry (one line per problem, at most 16 of each
    /// kind). A whole walk of the map and the SBT; none on v2's map.
    pub fn check_references(&mut self) -> Result<Vec<String>> {
        const SHOWN: usize = 16;
        let VolumeMap::Tree(t) = self else {
            return Ok(Vec::new());
        };
        let mut named: std::collections::BTreeMap<SbtKey, u64> = Default::default();
        // Each live leaf's slots once, whatever the devices that share it.
        t.visit(&mut |_, n, e| {
            if let Some(k) = e.sbt_key() {
                *named.entry(k).or_default() += n;
            }
        })?;
        let c = t.parts().0;
        let mut problems = Vec::new();
        let mut wrong = 0;
        c.for_each_shared(&mut |k, v| {
            let slots = named.remove(&k).unwrap_or(0);
            let pinned = v.flags & crate::format::SBT_FLAG_PINNED != 0;
            if u64::from(v.count) != slots && !(pinned && slots <= u64::from(v.count)) {
                wrong += 1;
                if wrong <= SHOWN {
                    problems.push(format!(
                        "shared item {k:?}: count {} but {slots} blocks name it",
                        v.count
                    ));
                }
            }
            true
        })?;
        for (k, slots) in named.iter().take(SHOWN) {
            problems.push(format!(
                "{slots} blocks name shared item {k:?}, which the shared-block table lacks"
            ));
        }
        problems.extend(t.check_page_counts()?);
        Ok(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::BlockState;
    use crate::map::MapCounters;
    use crate::meta::catalog::Catalog;
    use crate::meta::devices::default_row;
    use crate::meta::testing::{bounds, pool, TestVolume};

    fn data(extent: u32) -> MapEntry {
        MapEntry {
            state: BlockState::Data,
            len: 900,
            extent,
            crc: extent,
            ..MapEntry::UNMAPPED
        }
    }

    /// The recount finds a count one too high, one too low, and a slot whose key the SBT
    /// lacks; it is silent on the counts the operations keep.
    #[test]
    fn check_references_names_every_wrong_count() {
        let v = TestVolume::new(8 << 20);
        let store = v.open(&Default::default(), 1);
        let c = Catalog::create(
            store,
            pool(64),
            &v.geometry,
            &bounds(),
            default_row(1000, 0),
        )
        .expect("create");
        let mut m = VolumeMap::Tree(Box::new(TreeMap::new(c, MapCounters::default())));
        let mut keys = Vec::new();
        for (lba, extent) in [(10, 3), (20, 4), (30, 5)] {
            m.set(lba, data(extent)).expect("set");
            let p = m.promote(lba, data(extent)).expect("promote");
            for r in 1..=3 {
                m.add_ref(p.key).expect("ref");
                m.set(lba + 100 * r, MapEntry::shared(p.key, 0))
                    .expect("set");
            }
            keys.push(p.key);
        }
        assert_eq!(m.check_references().expect("check"), Vec::<String>::new());
        let VolumeMap::Tree(t) = &mut m else {
            unreachable!()
        };
        let c = t.parts().0;
        let bump = |c: &mut Catalog, key: SbtKey, by: i64| {
            c.sbt
                .update(&mut c.pool, &mut c.store, key, |v| {
                    v.map(|v| SbtValue {
                        count: (i64::from(v.count) + by) as u32,
                        ..v
                    })
                })
                .expect("update");
        };
        bump(c, keys[0], 1);
        bump(c, keys[1], -1);
        c.sbt
            .remove(&mut c.pool, &mut c.store, keys[2])
            .expect("remove");
        let problems = m.check_references().expect("check");
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].contains("count 5 but 4 blocks"), "{problems:?}");
        assert!(problems[1].contains("count 3 but 4 blocks"), "{problems:?}");
        assert!(problems[2].contains("lacks"), "{problems:?}");
    }
}
