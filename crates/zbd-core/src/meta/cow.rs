//! Snapshots and clones on shared pages (docs/design.md, "Copy on write", "Counts and
//! accounting", build order step 4, first form): a snapshot is a read-only device row naming
//! its origin's root, a clone a writable one naming a snapshot's; the page count table (PCT)
//! holds how many parents name each page that more than one does, and a host change of a
//! shared page goes to a copy ([`MapTree::write`], [`MapTree::set_range`]).
//!
//! This is the catalog's side: the rows, the root counts and the parts a walk borrows
//! ([`CowParts`]); what a walk asks of them (`Sharing`) is `map/cow.rs`, beside the counters
//! it keeps.

use super::btree::{BTree, Pct, Sbt};
use super::catalog::Catalog;
use super::map_tree::MapTree;
use super::page::Page;
use super::pool::PagePool;
use super::store::MetaStore;
use crate::error::{Error, Result};
use crate::format::{ChildSlot, DeviceKind, DeviceRow, Extension, PctEntry, ROW_FLAG_DELETING};

/// What a copy-on-write walk of one device's tree needs of the catalog, borrowed at once
/// (`map/cow.rs` builds the `Sharing` of the walk from it).
pub struct CowParts<'a> {
    pub tree: &'a mut MapTree,
    pub pool: &'a mut PagePool<Page>,
    pub store: &'a mut MetaStore,
    pub pct: &'a mut BTree<Pct>,
    pub sbt: &'a mut BTree<Sbt>,
    pub header: &'a mut Extension,
}

impl Catalog {
    /// Device `device`'s tree with what copy on write asks of the catalog; `None` for no live
    /// device.
    pub fn cow(&mut self, device: u32) -> Option<CowParts<'_>> {
        let Catalog {
            store,
            pool,
            trees,
            sbt,
            pct,
            header,
            ..
        } = self;
        Some(CowParts {
            tree: trees.get_mut(&device)?,
            pool,
            store,
            pct,
            sbt,
            header,
        })
    }

    /// A new device sharing `source`'s tree: a read-only snapshot of a writable device (whose
    /// epoch goes up, so its next change of every page copies it first), or a writable clone
    /// of a snapshot. Its root gains one parent. Returns the new id and the zero blocks the
    /// volume counters gain: a zero root summary's (a root page's blocks are counted once,
    /// however many name it).
    pub fn add_shared_device(
        &mut self,
        source: u32,
        kind: DeviceKind,
        name: &str,
        created: (u64, u64),
    ) -> Result<(u32, u64)> {
        let src = self
            .devices
            .get(source)
            .cloned()
            .ok_or_else(|| Error::Invalid(format!("no device {source}")))?;
        if src.flags & ROW_FLAG_DELETING != 0 {
            // Part of its tree may be given up already: what a new device would share of it
            // is no point in time of anything.
            return Err(Error::Invalid(format!(
                "{:?} is being deleted (delete it again to finish)",
                src.name
            )));
        }
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
        }
        let zeros = if tree.root() == ChildSlot::AllZero {
            tree.blocks()
        } else {
            0
        };
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
        Ok((id, zeros))
    }

    /// Device `id`, emptied (its root a summary), names snapshot `snapshot`'s tree from now on
    /// (a rollback): the snapshot's root gains a parent, the device's epoch goes up. Returns
    /// the zero blocks the volume counters gain (a zero root summary's).
    pub fn share_tree(&mut self, snapshot: u32, id: u32) -> Result<u64> {
        let (Some(&snap), Some(&tree)) = (self.trees.get(&snapshot), self.trees.get(&id)) else {
            return Err(Error::Invalid(format!("no device {snapshot} or {id}")));
        };
        if tree.root() != ChildSlot::AllUnmapped
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
        let mut zeros = 0;
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
            ChildSlot::AllZero => zeros = snap.blocks(),
            ChildSlot::AllUnmapped => {}
        }
        self.devices.update(id, |r| r.epoch = epoch)?;
        self.trees.insert(
            id,
            MapTree::from_root(snap.root(), snap.depth(), snap.blocks())?
                .with_device(id)
                .with_epoch(epoch),
        );
        Ok(zeros)
    }

    /// Whether any snapshot or clone exists: leaves of the default device then take allocated
    /// ids, never region 0's fixed ones, which a page another device keeps may hold.
    pub fn any_shared_rows(&self) -> bool {
        self.devices
            .rows()
            .any(|r| matches!(r.kind, DeviceKind::Snapshot | DeviceKind::Clone))
    }
}
