//! What a copy-on-write walk asks of the catalog (`meta::map_tree::Sharing`, design.md "Copy
//! on write", "Counts and accounting"): counts in the PCT, new shared items in the SBT (a
//! leaf's direct items before a copy shares them) and one more reference for each shared slot
//! a copy adds. [`CatalogSharing`] keeps the volume counters exact as it goes (a copy's blocks
//! count: the counters count each live page once) and lists the items it promoted, whose
//! extent charges the caller moves.

use super::{MapCounters, SharedTotals};
use crate::error::{Error, Result};
use crate::format::Extension;
use crate::format::{MapEntry, PctEntry, SbtKey, SbtValue, SBT_FLAG_PINNED, SBT_KEY_FIELD_MAX};
use crate::meta::btree::{BTree, Pct, Sbt};
use crate::meta::cow::CowParts;
use crate::meta::map_tree::{MapTree, Sharing, TreeIo};
use crate::meta::page::Page;
use crate::meta::pool::PagePool;
use crate::meta::store::MetaStore;
use std::cell::RefCell;

/// What a copy on write promoted: the new shared item and the blocks that turned from direct
/// entries (given) into shared ones. The caller moves their extent charges.
#[derive(Debug)]
pub struct CowPromotion {
    pub key: SbtKey,
    pub value: SbtValue,
    pub blocks: Vec<(u64, MapEntry)>,
}

/// The catalog's part of copy on write for one tree walk.
pub struct CatalogSharing<'a> {
    pub pct: &'a mut BTree<Pct>,
    pub sbt: &'a mut BTree<Sbt>,
    pub header: &'a mut Extension,
    /// Shared with the walk's own report of what it replaced (both keep the counters).
    pub counters: &'a RefCell<MapCounters>,
    pub totals: &'a mut Option<SharedTotals>,
    pub promoted: &'a mut Vec<CowPromotion>,
}

impl<I: TreeIo> Sharing<I> for CatalogSharing<'_> {
    fn active(&self) -> bool {
        !self.pct.is_empty()
    }

    fn count(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        level: u8,
        pos: u64,
        id: u32,
    ) -> Result<u32> {
        let key = (PctEntry::key(level, pos), id);
        Ok(self.pct.get(pool, io, key)?.unwrap_or(1))
    }

    fn set_count(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        level: u8,
        pos: u64,
        id: u32,
        count: u32,
    ) -> Result<()> {
        let key = (PctEntry::key(level, pos), id);
        if count == 1 {
            self.pct.remove(pool, io, key)?;
        } else {
            self.pct.insert(pool, io, key, count)?;
        }
        Ok(())
    }

    fn share_item(
        &mut self,
        pool: &mut PagePool<Page>,
        io: &mut I,
        birth: u64,
        at: &MapEntry,
        blocks: &[(u64, MapEntry)],
        extra: u32,
    ) -> Result<SbtKey> {
        let serial = self.header.next_sbt_serial;
        if serial > SBT_KEY_FIELD_MAX || birth > SBT_KEY_FIELD_MAX {
            return Err(Error::NoSpace);
        }
        let key = SbtKey { birth, serial };
        let value = SbtValue::of_item(at, blocks.len() as u32 + extra);
        self.sbt.insert(pool, io, key, value)?;
        self.header.next_sbt_serial += 1;
        let mut c = self.counters.borrow_mut();
        for &(_, old) in blocks {
            c.replace(&old, &MapEntry::shared(key, old.unit_index), 1);
        }
        c.add_item(&value);
        if let Some(t) = self.totals {
            t.items += 1;
            t.references += u64::from(value.count);
            t.item_blocks += u64::from(value.unit_blocks());
        }
        self.promoted.push(CowPromotion {
            key,
            value,
            blocks: blocks.to_vec(),
        });
        Ok(key)
    }

    fn add_ref(&mut self, pool: &mut PagePool<Page>, io: &mut I, e: &MapEntry) -> Result<()> {
        let key = e.sbt_key().expect("a shared entry");
        let mut v = self.sbt.get(pool, io, key)?.ok_or_else(|| {
            Error::CorruptMetadata(format!(
                "a shared map entry names {key:?}, which the SBT lacks"
            ))
        })?;
        if v.flags & SBT_FLAG_PINNED == 0 {
            v.count += 1;
            if v.count == u32::MAX {
                v.flags |= SBT_FLAG_PINNED;
            }
        }
        self.sbt.replace(pool, io, key, v)?;
        if let Some(t) = self.totals {
            t.references += 1;
        }
        Ok(())
    }

    fn copied(&mut self, e: &MapEntry, blocks: u64) {
        self.counters.borrow_mut().add(e, blocks);
    }
}

impl<'a> CatalogSharing<'a> {
    /// A walk's tree, pool, store and sharing from the catalog's parts, with the volume
    /// counters and the promotions list the walk adds to.
    pub fn of(
        parts: CowParts<'a>,
        counters: &'a RefCell<MapCounters>,
        totals: &'a mut Option<SharedTotals>,
        promoted: &'a mut Vec<CowPromotion>,
    ) -> (
        &'a mut MapTree,
        &'a mut PagePool<Page>,
        &'a mut MetaStore,
        CatalogSharing<'a>,
    ) {
        let CowParts {
            tree,
            pool,
            store,
            pct,
            sbt,
            header,
        } = parts;
        let share = CatalogSharing {
            pct,
            sbt,
            header,
            counters,
            totals,
            promoted,
        };
        (tree, pool, store, share)
    }
}
