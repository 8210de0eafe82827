//! Shared items through the volume map (format bit 12; `meta/shared.rs` has the operations
//! on the catalog): the same calls with the volume counters kept exact. A shared entry counts
//! as one block in use; its item's stored bytes count once, from the promotion that makes it
//! to the drop that kills it ([`MapCounters::add_item`]).
//!
//! v2's map has no shared items: resolving is the identity there, and every change is refused.

use super::tree::TreeMap;
use super::VolumeMap;
use crate::error::{Error, Result};
use crate::format::{MapEntry, SbtKey, SbtValue};
use crate::meta::devices::DEFAULT_DEVICE;
use crate::meta::shared::{Owner, Promoted};

impl TreeMap {
    fn promote(&mut self, lba: u64, at: MapEntry) -> Result<Promoted> {
        let (catalog, counters) = self.parts();
        let p = catalog.promote(DEFAULT_DEVICE, lba, at)?;
        for &(_, old) in &p.blocks {
            counters.replace(&old, &MapEntry::shared(p.key, old.unit_index), 1);
        }
        counters.add_item(&p.value);
        Ok(p)
    }

    fn drop_ref(&mut self, key: SbtKey) -> Result<Option<SbtValue>> {
        let (catalog, counters) = self.parts();
        let dead = catalog.drop_ref(key, 1)?;
        if let Some(v) = &dead {
            counters.sub_item(v);
        }
        Ok(dead)
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
            VolumeMap::Tree(t) => t.parts().0.add_ref(key),
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
            VolumeMap::Tree(t) => t
                .parts()
                .0
                .owner(DEFAULT_DEVICE, lba, index, extent, offset),
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

    /// Calls `f` with every shared item (its key and entry), in key order, until it returns
    /// false; none on v2's map.
    pub fn for_each_shared(&mut self, f: &mut impl FnMut(SbtKey, SbtValue) -> bool) -> Result<()> {
        match self {
            VolumeMap::Tree(t) => {
                let c = t.parts().0;
                c.sbt.scan(
                    &mut c.pool,
                    &mut c.store,
                    SbtKey {
                        birth: 0,
                        serial: 0,
                    },
                    f,
                )
            }
            VolumeMap::Pages(_) => Ok(()),
        }
    }
}
