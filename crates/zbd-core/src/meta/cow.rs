//! Snapshots and clones on shared pages (docs/design.md, "Copy on write", "Counts and
//! accounting", build order step 4, first form): a snapshot is a read-only device row naming
//! its origin's root, a clone a writable one naming a snapshot's; the page count table (PCT)
//! holds how many parents name each page that more than one does, and a host change of a
//! shared page goes to a copy ([`MapTree::write`], [`MapTree::set_range`]).
//!
//! [`CatalogSharing`] is what the tree walks ask of the catalog: counts in the PCT, new shared
//! items in the SBT (a leaf's direct items before a copy shares them) and one more reference
//! for each shared slot a copy adds. It keeps the volume counters exact as it goes (a copy's
//! blocks count: the counters count each live page once) and lists the items it promoted,
//! whose extent charges the caller moves.

use super::btree::{BTree, Pct, Sbt};
use super::catalog::Catalog;
use super::map_tree::{MapTree, Sharing, TreeIo};
use super::page::Page;
use super::pool::PagePool;
use crate::error::{Error, Result};
use crate::format::{
    ChildSlot, DeviceKind, DeviceRow, Extension, MapEntry, PctEntry, SbtKey, SbtValue,
    SBT_FLAG_PINNED, SBT_KEY_FIELD_MAX,
};
use crate::map::{MapCounters, SharedTotals};
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

impl Catalog {
    /// Device `device`'s tree, the pool, the store and the sharing its walks ask of (with the
    /// volume counters and the promotions list the walk adds to).
    pub fn cow<'a>(
        &'a mut self,
        device: u32,
        counters: &'a RefCell<MapCounters>,
        totals: &'a mut Option<SharedTotals>,
        promoted: &'a mut Vec<CowPromotion>,
    ) -> Option<(
        &'a mut MapTree,
        &'a mut PagePool<Page>,
        &'a mut super::store::MetaStore,
        CatalogSharing<'a>,
    )> {
        let Catalog {
            store,
            pool,
            trees,
            sbt,
            pct,
            header,
            ..
        } = self;
        let tree = trees.get_mut(&device)?;
        Some((
            tree,
            pool,
            store,
            CatalogSharing {
                pct,
                sbt,
                header,
                counters,
                totals,
                promoted,
            },
        ))
    }

    /// A new device sharing `source`'s tree: a read-only snapshot of a writable device (whose
    /// epoch goes up, so its next change of every page copies it first), or a writable clone
    /// of a snapshot. Its root gains one parent. Returns the new id. The counters gain the
    /// blocks of a root summary (a root page's are counted once, however many name it).
    pub fn add_shared_device(
        &mut self,
        source: u32,
        kind: DeviceKind,
        name: &str,
        created: (u64, u64),
        counters: &mut MapCounters,
    ) -> Result<u32> {
        let src = self
            .devices
            .get(source)
            .cloned()
            .ok_or_else(|| Error::Invalid(format!("no device {source}")))?;
        match (kind, src.kind) {
            (DeviceKind::Snapshot, DeviceKind::Default | DeviceKind::Other | DeviceKind::Clone) => {
            }
            (DeviceKind::Clone, DeviceKind::Snapshot) => {}
            (DeviceKind::Snapshot, _) => {
                return Err(Error::Invalid(format!(
                    "{:?} is a snapshot: snapshots are taken of writable devices",
                    src.name
                )))
            }
            _ => {
                return Err(Error::Invalid(format!(
                    "{:?} is not a snapshot: clones are made of snapshots",
                    src.name
                )))
            }
        }
        let tree = self.trees[&source];
        let row = DeviceRow {
            id: 0,
            parent: source,
            kind,
            depth: tree.depth(),
            flags: u16::from(kind == DeviceKind::Snapshot),
            root: tree.root(),
            name: name.to_owned(),
            blocks: tree.blocks(),
            created_seq: created.0,
            created_at: created.1,
            bytes_used: 0,
            blocks_used: 0,
            epoch: 0,
            pages_max: 0,
        };
        let id = self.devices.add(row)?;
        if let ChildSlot::Page(root) = tree.root() {
            let key = (PctEntry::key(tree.depth() - 1, 0), root);
            let n = self
                .pct
                .get(&mut self.pool, &mut self.store, key)?
                .unwrap_or(1);
            if let Err(e) = self.pct.insert(&mut self.pool, &mut self.store, key, n + 1) {
                self.devices.remove(id)?;
                return Err(e);
            }
        } else if tree.root() == ChildSlot::AllZero {
            counters.add(&MapEntry::ZERO, tree.blocks());
        }
        let shared = MapTree::from_root(tree.root(), tree.depth(), tree.blocks())?.with_device(id);
        self.trees.insert(id, shared);
        if kind == DeviceKind::Snapshot {
            let epoch = src.epoch.checked_add(1).ok_or_else(|| {
                Error::Invalid(format!("{:?} has taken 2^32 snapshots", src.name))
            })?;
            self.devices.update(source, |r| r.epoch = epoch)?;
            let t = self.trees.get_mut(&source).expect("the source's tree");
            *t = t.with_epoch(epoch);
        }
        self.store.set_region0_fixed(!self.any_shared_rows());
        Ok(id)
    }

    /// Device `id`, emptied (its root a summary), names snapshot `snapshot`'s tree from now on
    /// (a rollback): the snapshot's root gains a parent, the device's epoch goes up.
    pub fn share_tree(&mut self, snapshot: u32, id: u32, counters: &mut MapCounters) -> Result<()> {
        let (Some(&snap), Some(&tree)) = (self.trees.get(&snapshot), self.trees.get(&id)) else {
            return Err(Error::Invalid(format!("no device {snapshot} or {id}")));
        };
        if matches!(tree.root(), ChildSlot::Page(_))
            || (snap.blocks(), snap.depth()) != (tree.blocks(), tree.depth())
        {
            return Err(Error::Invalid(format!(
                "device {id} must be empty and of its snapshot's size to take its tree"
            )));
        }
        let row = self
            .devices
            .get(id)
            .cloned()
            .ok_or_else(|| Error::Invalid(format!("no device {id}")))?;
        let epoch = row
            .epoch
            .checked_add(1)
            .ok_or_else(|| Error::Invalid(format!("{:?} is out of epochs", row.name)))?;
        match snap.root() {
            ChildSlot::Page(root) => {
                let key = (PctEntry::key(snap.depth() - 1, 0), root);
                let n = self
                    .pct
                    .get(&mut self.pool, &mut self.store, key)?
                    .unwrap_or(1);
                self.pct
                    .insert(&mut self.pool, &mut self.store, key, n + 1)?;
            }
            ChildSlot::AllZero => counters.add(&MapEntry::ZERO, snap.blocks()),
            ChildSlot::AllUnmapped => {}
        }
        if tree.root() == ChildSlot::AllZero {
            // Emptied by a trim, so unmapped; a zeroed root would be counted.
            counters.sub(&MapEntry::ZERO, tree.blocks());
        }
        self.devices.update(id, |r| r.epoch = epoch)?;
        self.trees.insert(
            id,
            MapTree::from_root(snap.root(), snap.depth(), snap.blocks())?
                .with_device(id)
                .with_epoch(epoch),
        );
        Ok(())
    }

    /// Whether any snapshot or clone exists: leaves of the default device then take allocated
    /// ids, never region 0's fixed ones, which a page another device keeps may hold.
    pub fn any_shared_rows(&self) -> bool {
        self.devices
            .rows()
            .any(|r| matches!(r.kind, DeviceKind::Snapshot | DeviceKind::Clone))
    }
}
