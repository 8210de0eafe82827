//! Space per device (design.md, "Devices", "Stat"): the stored bytes each device's tree
//! references, and the part only it references (what deleting it would free, as `used` of a
//! ZFS snapshot). Neither is kept as a counter: an origin's write changes its snapshots'
//! unique bytes, so both are computed by a walk when asked.

use super::TreeMap;
use crate::error::{Error, Result};
use crate::format::{MapEntry, PctEntry, SbtKey, SbtValue, SBT_FLAG_PINNED};
use crate::meta::btree::{BTree, Sbt};
use crate::meta::catalog::Catalog;
use crate::meta::page::Page;
use crate::meta::pool::PagePool;
use crate::meta::store::MetaStore;
use crate::units::share;
use std::collections::HashMap;

/// One device's space, in stored (compressed) bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceSpace {
    pub id: u32,
    /// Stored bytes of the blocks its tree names: each block's share of its compression
    /// unit, whoever else names it (`zfs list -o refer`, `rbd du`).
    pub referenced_bytes: u64,
    /// Stored bytes no other device names: direct items in pages only it reaches, and shared
    /// items all of whose references lie in those pages, each counted whole.
    pub unique_bytes: u64,
}

/// The SBT entry of `key`, read once per walk.
fn item(
    sbt: &mut BTree<Sbt>,
    items: &mut HashMap<SbtKey, SbtValue>,
    pool: &mut PagePool<Page>,
    io: &mut MetaStore,
    key: SbtKey,
) -> Result<SbtValue> {
    if let Some(v) = items.get(&key) {
        return Ok(*v);
    }
    let v = sbt.get(pool, io, key)?.ok_or_else(|| {
        Error::CorruptMetadata(format!(
            "a shared map entry names {key:?}, which the SBT lacks"
        ))
    })?;
    items.insert(key, v);
    Ok(v)
}

impl TreeMap {
    /// The space of every device, in id order. Sums each live page once, plus the SBT entries
    /// of the shared items met.
    pub fn space(&mut self) -> Result<Vec<DeviceSpace>> {
        let Catalog {
            trees,
            pool,
            store,
            sbt,
            pct,
            ..
        } = &mut self.catalog;
        let mut items = HashMap::new();
        let mut memo = HashMap::new();
        let mut out = Vec::with_capacity(trees.len());
        for (&id, tree) in trees.iter() {
            let referenced_bytes =
                tree.referenced(pool, store, &mut memo, &mut |pool, io, e: &MapEntry| {
                    Ok(u64::from(match e.sbt_key() {
                        None => share(e),
                        Some(key) => {
                            share(&item(sbt, &mut items, pool, io, key)?.block(e.unit_index))
                        }
                    }))
                })?;
            let mut unique_bytes = 0u64;
            let mut slots: HashMap<SbtKey, u32> = HashMap::new();
            tree.unique(
                pool,
                store,
                &mut |pool, io, level, pos, page| {
                    Ok(pct
                        .get(pool, io, (PctEntry::key(level, pos), page))?
                        .unwrap_or(1))
                },
                &mut |e| match e.sbt_key() {
                    None => unique_bytes += u64::from(share(e)),
                    Some(key) => *slots.entry(key).or_default() += 1,
                },
            )?;
            for (key, n) in slots {
                let v = item(sbt, &mut items, pool, store, key)?;
                if v.flags & SBT_FLAG_PINNED == 0 && n >= v.count {
                    unique_bytes += u64::from(v.stored_len);
                }
            }
            out.push(DeviceSpace {
                id,
                referenced_bytes,
                unique_bytes,
            });
        }
        Ok(out)
    }
}
