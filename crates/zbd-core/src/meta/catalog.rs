//! Everything a bit-10 checkpoint names, in one place: the pages on the medium and in RAM
//! (store and pool), the device table, the default device's map tree, the shared-block table
//! and the page count table. A checkpoint of the catalog is one [`MetaStore`] checkpoint that
//! writes every dirty page of every kind, and the [`ExtensionBody`] it returns is what the
//! engine's checkpoint slot carries after v2's header; an open starts from that body alone.
//!
//! Each device row has its own tree, whose pages carry the device as their creator; no page
//! is shared yet (step 4), so removing a device frees its whole tree.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::btree::{BTree, Pct, Sbt};
use super::devices::{DeviceHeader, DeviceTable, DEFAULT_DEVICE};
use super::map_tree::MapTree;
use super::page::Page;
use super::pool::PagePool;
use super::store::{FrameWrite, MetaCheckpoint, MetaStore};
use super::{ListBounds, MetaGeometry};
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::format::{
    ChildSlot, DeviceKind, DeviceRow, Extension, ExtensionBody, Superblock, PAGE_ID_NONE,
};

/// The metadata of one bit-10 volume.
pub struct Catalog {
    pub store: MetaStore,
    pub pool: PagePool<Page>,
    pub devices: DeviceTable,
    /// Each device's map, by device id.
    pub trees: BTreeMap<u32, MapTree>,
    pub sbt: BTree<Sbt>,
    pub pct: BTree<Pct>,
    /// The header fields no checkpoint changes (`H`, `pairs0`, the list's capacity, the
    /// enabling checkpoint) and the counters the catalog keeps (next SBT serial).
    pub(super) header: Extension,
}

impl Catalog {
    /// The catalog of a volume just made: its default device (`default`, whose id, kind,
    /// root and depth are set here) of `blocks` blocks, all unmapped, and empty tables.
    pub fn create(
        mut store: MetaStore,
        pool: PagePool<Page>,
        geometry: &MetaGeometry,
        bounds: &ListBounds,
        mut default: DeviceRow,
    ) -> Result<Catalog> {
        store.set_bounds(bounds);
        let tree = MapTree::new(default.blocks);
        default.root = tree.root();
        default.depth = tree.depth();
        Ok(Catalog {
            store,
            pool,
            devices: DeviceTable::create(default)?,
            trees: BTreeMap::from([(DEFAULT_DEVICE, tree)]),
            sbt: BTree::new(),
            pct: BTree::new(),
            header: Extension {
                h: geometry.h,
                pairs0: geometry.pairs0,
                list_capacity: bounds.capacity,
                next_sbt_serial: 1,
                ..Extension::default()
            },
        })
    }

    /// The catalog a durable checkpoint's extension names, its pages read from `storage`
    /// through a new store over `metadata_extents` into `pool`.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        storage: Arc<dyn Storage>,
        sb: &Superblock,
        geometry: MetaGeometry,
        metadata_extents: impl IntoIterator<Item = u32>,
        ext: &ExtensionBody,
        interval: u64,
        mut pool: PagePool<Page>,
        bounds: &ListBounds,
    ) -> Result<Catalog> {
        let h = &ext.header;
        if (h.h, h.pairs0, h.list_capacity) != (geometry.h, geometry.pairs0, bounds.capacity) {
            return Err(Error::CorruptMetadata(format!(
                "checkpoint extension names H = {}, pairs0 = {} and a list of {}, the volume's \
                 geometry {}, {} and {}",
                h.h, h.pairs0, h.list_capacity, geometry.h, geometry.pairs0, bounds.capacity
            )));
        }
        let meta = MetaCheckpoint {
            list: ext.pair_list.clone(),
            directory: ext.directory.clone(),
        };
        let mut store = MetaStore::open(storage, sb, geometry, metadata_extents, &meta, interval)?;
        store.set_bounds(bounds);
        let devices = DeviceTable::open(
            &mut pool,
            &mut store,
            &DeviceHeader {
                list: h.device_list,
                rows: h.device_rows,
                crc: h.device_rows_crc,
                next_device: h.next_device,
            },
        )?;
        let trees = devices
            .rows()
            .map(|r| {
                Ok((
                    r.id,
                    MapTree::from_root(r.root, r.depth, r.blocks)?
                        .with_device(r.id)
                        .with_epoch(r.epoch),
                ))
            })
            .collect::<Result<_>>()?;
        let root = |id: u32| (id != PAGE_ID_NONE).then_some(id);
        let shared_rows = devices
            .rows()
            .any(|r| matches!(r.kind, DeviceKind::Snapshot | DeviceKind::Clone));
        store.set_region0_fixed(!shared_rows);
        Ok(Catalog {
            store,
            pool,
            devices,
            trees,
            sbt: BTree::from_root(root(h.sbt_root), h.sbt_height, h.sbt_entries)?,
            pct: BTree::from_root(root(h.pct_root), h.pct_height, h.pct_entries)?,
            header: *h,
        })
    }

    /// Entries the pair-state list of a checkpoint may hold (`C`).
    pub fn list_capacity(&self) -> u32 {
        self.header.list_capacity
    }

    /// The next SBT serial, taken (serials only grow).
    pub fn take_sbt_serial(&mut self) -> u64 {
        self.header.next_sbt_serial += 1;
        self.header.next_sbt_serial - 1
    }

    /// Device `device`'s map with what its calls need (the pool and the store); the default
    /// device's always exists.
    pub fn map(&mut self, device: u32) -> (&mut MapTree, &mut PagePool<Page>, &mut MetaStore) {
        let tree = self.trees.get_mut(&device).expect("a live device's map");
        (tree, &mut self.pool, &mut self.store)
    }

    /// Device `device`'s map with what its calls need; `None` for no live device.
    pub fn map_of(
        &mut self,
        device: u32,
    ) -> Option<(&mut MapTree, &mut PagePool<Page>, &mut MetaStore)> {
        let tree = self.trees.get_mut(&device)?;
        Some((tree, &mut self.pool, &mut self.store))
    }

    /// Adds a device of `row.blocks` blocks, all unmapped, under a new id (returned); its
    /// row's root and depth are set here.
    pub fn add_device(&mut self, mut row: DeviceRow) -> Result<u32> {
        let tree = MapTree::new(row.blocks);
        row.root = tree.root();
        row.depth = tree.depth();
        let id = self.devices.add(row)?;
        self.trees.insert(id, tree.with_device(id));
        Ok(id)
    }

    /// Removes device `id`, whose tree must hold no page any more (given up with
    /// `MapTree::release`, or emptied by a trim of its whole range).
    pub fn remove_device(&mut self, id: u32) -> Result<DeviceRow> {
        let tree = *self
            .trees
            .get(&id)
            .filter(|_| id != DEFAULT_DEVICE)
            .ok_or_else(|| Error::Invalid(format!("no device {id} to remove")))?;
        if let ChildSlot::Page(root) = tree.root() {
            return Err(Error::Invalid(format!(
                "device {id} still names page {root}: give its tree up first"
            )));
        }
        self.trees.remove(&id);
        let row = self.devices.remove(id)?;
        self.store.set_region0_fixed(!self.any_shared_rows());
        Ok(row)
    }

    /// Phases 1 and 2 of a checkpoint: [`Catalog::prepare`], its writes issued and synced.
    /// Returns the extension the checkpoint slot carries; on an error nothing is in flight.
    pub fn checkpoint(&mut self) -> Result<ExtensionBody> {
        let (body, writes) = self.prepare()?;
        self.store.write_prepared(&mut self.pool, &writes)?;
        Ok(body)
    }

    /// Phase 1 of a checkpoint: each row takes its tree's root and depth, the device table
    /// writes its changed pages into the pool, and one store phase 1 seals every dirty page.
    /// Returns the extension the checkpoint slot carries and the frame writes, which must be
    /// durable before the slot is written; on an error nothing is in flight.
    pub fn prepare(&mut self) -> Result<(ExtensionBody, Vec<FrameWrite>)> {
        for (&id, t) in &self.trees {
            let (root, depth) = (t.root(), t.depth());
            self.devices.update(id, |r| {
                r.root = root;
                r.depth = depth;
            })?;
        }
        let d = self.devices.write(&mut self.pool, &mut self.store)?;
        let (meta, writes) = self.store.prepare(&mut self.pool)?;
        let none = PAGE_ID_NONE;
        let header = Extension {
            device_list: d.list,
            device_rows: d.rows,
            device_rows_crc: d.crc,
            next_device: d.next_device,
            sbt_root: self.sbt.root().unwrap_or(none),
            sbt_height: self.sbt.height(),
            sbt_entries: self.sbt.len(),
            pct_root: self.pct.root().unwrap_or(none),
            pct_height: self.pct.height(),
            pct_entries: self.pct.len(),
            release_list: none,
            hooks_list: none,
            ..self.header
        };
        let mut body = ExtensionBody {
            header,
            directory: meta.directory,
            summary_lists: Vec::new(),
            pair_list: meta.list,
        };
        // The body as the slot will hold it: counts and total from its lists.
        match body.counted() {
            Ok(header) => {
                body.header = header;
                Ok((body, writes))
            }
            Err(e) => {
                self.store.abort(&mut self.pool);
                Err(e)
            }
        }
    }

    /// The checkpoint in flight is durable.
    pub fn commit(&mut self) {
        self.store.commit(&mut self.pool);
    }

    /// The checkpoint in flight failed: its pages are dirty again.
    pub fn abort(&mut self) {
        self.store.abort(&mut self.pool);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{BlockState, DeviceKind, MapEntry, SbtKey, SbtValue};
    use crate::meta::devices::default_row;
    use crate::meta::map_tree::NoSharing;
    use crate::meta::testing::{bounds, pool, TestVolume};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn data(n: u32) -> MapEntry {
        MapEntry {
            state: BlockState::Data,
            len: 300,
            extent: n,
            crc: n,
            ..MapEntry::UNMAPPED
        }
    }

    fn sbt_value(n: u32) -> SbtValue {
        SbtValue {
            extent: n,
            location: 0,
            stored_len: 700,
            codec: 1,
            flags: 0,
            crc: !n,
            count: 3,
        }
    }

    fn open(v: &TestVolume, ext: &ExtensionBody, interval: u64) -> Result<Catalog> {
        v.open_catalog(ext, interval, 32)
    }

    /// Every kind a catalog holds, changed, checkpointed, then changed again and cut: the open
    /// from the committed extension (through its bytes) reads the committed state of each.
    #[test]
    fn every_kind_reopens_from_the_committed_extension() {
        let v = TestVolume::new(64 << 20);
        let blocks = v.sb.logical_blocks;
        let store = v.open(&Default::default(), 1);
        let mut c = Catalog::create(
            store,
            pool(256),
            &v.geometry,
            &bounds(),
            default_row(blocks, 0),
        )
        .expect("create");
        let mut other = default_row(blocks, 0);
        (other.name, other.kind) = ("snap".into(), DeviceKind::Snapshot);
        let snap = c.add_device(other).expect("add");
        for lba in (0..blocks).step_by(997) {
            c.trees
                .get_mut(&DEFAULT_DEVICE)
                .expect("default")
                .set(&mut c.pool, &mut c.store, lba, data(lba as u32))
                .expect("set");
        }
        for n in 0..500u32 {
            let key = SbtKey {
                birth: u64::from(n) * 7,
                serial: c.take_sbt_serial(),
            };
            c.sbt
                .insert(&mut c.pool, &mut c.store, key, sbt_value(n))
                .expect("sbt");
            c.pct
                .insert(&mut c.pool, &mut c.store, (u64::from(n), n), 2)
                .expect("pct");
        }
        let ext = c.checkpoint().expect("checkpoint");
        c.commit();
        let bytes = ext.encode().expect("encode");
        // Changes after the commit, cut by a power failure.
        c.trees
            .get_mut(&DEFAULT_DEVICE)
            .expect("default")
            .set(&mut c.pool, &mut c.store, 0, data(99))
            .expect("set");
        c.remove_device(snap).expect("remove");
        c.pct
            .remove(&mut c.pool, &mut c.store, (3, 3))
            .expect("pct");
        let _cut = c.checkpoint().expect("checkpoint");

        let ext = ExtensionBody::decode(&bytes).expect("decode");
        let mut r = open(&v, &ext, 2).expect("open");
        assert_eq!(r.devices.len(), 2);
        assert_eq!(r.devices.get(snap).map(|d| d.name.as_str()), Some("snap"));
        for lba in (0..blocks).step_by(997) {
            assert_eq!(
                r.trees[&DEFAULT_DEVICE]
                    .get(&mut r.pool, &mut r.store, lba)
                    .expect("get"),
                data(lba as u32)
            );
        }
        assert_eq!((r.sbt.len(), r.pct.len()), (500, 500));
        let key = SbtKey {
            birth: 49 * 7,
            serial: 50,
        };
        assert_eq!(
            r.sbt.get(&mut r.pool, &mut r.store, key).expect("get"),
            Some(sbt_value(49))
        );
        assert_eq!(
            r.pct.get(&mut r.pool, &mut r.store, (3, 3)).expect("get"),
            Some(2)
        );
        assert_eq!(
            r.take_sbt_serial(),
            501,
            "serials go on past every one taken"
        );
    }

    #[test]
    fn an_extension_of_another_geometry_is_refused() {
        let v = TestVolume::new(64 << 20);
        let store = v.open(&Default::default(), 1);
        let mut c = Catalog::create(store, pool(64), &v.geometry, &bounds(), default_row(100, 0))
            .expect("create");
        let mut ext = c.checkpoint().expect("checkpoint");
        c.commit();
        ext.header.h += 1;
        let err = open(&v, &ext, 2).err().expect("refused");
        assert!(err.to_string().contains("geometry"), "{err}");
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// A write to the `n`-th live device (in id order, wrapping).
        Set(usize, u64, u32),
        Trim(usize, u64, u64),
        Add,
        /// Removes the `n`-th live device other than the default one.
        Remove(usize),
        Checkpoint {
            commit: bool,
        },
        Crash,
    }

    fn op(blocks: u64) -> impl Strategy<Value = Op> {
        let lba = prop_oneof![0..600u64, (blocks - 600)..blocks];
        prop_oneof![
            8 => (0usize..4, lba.clone(), 1u32..1000).prop_map(|(d, l, v)| Op::Set(d, l, v)),
            2 => (0usize..4, lba, 1u64..600).prop_map(|(d, l, n)| Op::Trim(d, l, n)),
            1 => Just(Op::Add),
            1 => (0usize..3).prop_map(Op::Remove),
            2 => any::<bool>().prop_map(|commit| Op::Checkpoint { commit }),
            1 => Just(Op::Crash),
        ]
    }

    type Model = BTreeMap<u32, BTreeMap<u64, MapEntry>>;

    fn same(c: &mut Catalog, model: &Model) -> std::result::Result<(), TestCaseError> {
        prop_assert_eq!(
            c.trees.keys().copied().collect::<Vec<_>>(),
            model.keys().copied().collect::<Vec<_>>()
        );
        for (&d, m) in model {
            let (t, p, s) = c.map(d);
            let mut got = BTreeMap::new();
            t.scan(p, s, 0, t.blocks(), &mut |l, n, e| {
                if e.state == BlockState::Data {
                    got.extend((l..l + n).map(|b| (b, e)));
                }
            })
            .expect("scan");
            prop_assert_eq!(&got, m, "device {}", d);
        }
        Ok(())
    }

    /// Several devices whose leaves share positions (region 0's included), added, removed,
    /// written and trimmed between committed, failed and cut checkpoints, with a small pool:
    /// every device reads back its own entries live and after every crash, so no page id is
    /// shared between devices and a removed device's pages come back to nobody.
    fn run(ops: Vec<Op>) -> std::result::Result<(), TestCaseError> {
        let v = TestVolume::new(8 << 20);
        let blocks = (u64::from(v.geometry.pairs0) + 6) * 255;
        let store = v.open(&Default::default(), 1);
        let mut c = Catalog::create(
            store,
            pool(48),
            &v.geometry,
            &bounds(),
            default_row(blocks, 0),
        )
        .expect("create");
        let mut model: Model = BTreeMap::from([(DEFAULT_DEVICE, BTreeMap::new())]);
        let mut durable = (ExtensionBody::default(), model.clone(), 0u64);
        let mut committed = false;
        for op in ops {
            let live: Vec<u32> = model.keys().copied().collect();
            match op {
                Op::Set(d, l, n) => {
                    let d = live[d % live.len()];
                    let (t, p, s) = c.map(d);
                    t.set(p, s, l, data(n)).expect("set");
                    model.get_mut(&d).expect("live").insert(l, data(n));
                }
                Op::Trim(d, l, n) => {
                    let d = live[d % live.len()];
                    let n = n.min(blocks - l);
                    let (t, p, s) = c.map(d);
                    t.set_range(
                        p,
                        s,
                        &mut NoSharing,
                        l,
                        n,
                        ChildSlot::AllUnmapped,
                        &mut |_| {},
                    )
                    .expect("trim");
                    model
                        .get_mut(&d)
                        .expect("live")
                        .retain(|&b, _| b < l || b >= l + n);
                }
                Op::Add if live.len() < 4 => {
                    let mut row = default_row(blocks, 0);
                    row.name =
                        format!("d{}", c.devices.rows().map(|r| r.id).max().unwrap_or(0) + 1);
                    row.kind = DeviceKind::Other;
                    let id = c.add_device(row).expect("add");
                    model.insert(id, BTreeMap::new());
                }
                Op::Add => {}
                Op::Remove(n) if live.len() > 1 => {
                    let d = live[1 + n % (live.len() - 1)];
                    // A device's tree is emptied before its row goes.
                    let (t, p, s) = c.map(d);
                    let blocks = t.blocks();
                    t.set_range(
                        p,
                        s,
                        &mut NoSharing,
                        0,
                        blocks,
                        ChildSlot::AllUnmapped,
                        &mut |_| {},
                    )
                    .expect("emptied");
                    c.remove_device(d).expect("remove");
                    model.remove(&d);
                }
                Op::Remove(_) => {}
                Op::Checkpoint { commit } => {
                    let ext = c.checkpoint().expect("checkpoint");
                    if commit {
                        c.commit();
                        durable = (ext, model.clone(), c.store.interval());
                        committed = true;
                    } else {
                        c.abort();
                    }
                }
                Op::Crash if committed => {
                    let (ext, m, interval) = durable.clone();
                    c = open(&v, &ext, interval).expect("reopen");
                    model = m;
                }
                Op::Crash => {}
            }
            // A small pool fills with dirty frames: a committed checkpoint when half are.
            if c.pool.stats().dirty * 2 >= 48 {
                let ext = c.checkpoint().expect("checkpoint");
                c.commit();
                durable = (ext, model.clone(), c.store.interval());
                committed = true;
            }
            same(&mut c, &model)?;
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        #[test]
        fn devices_keep_their_own_pages_through_crashes(
            ops in proptest::collection::vec(op((u64::from(TestVolume::new(8 << 20).geometry.pairs0) + 6) * 255), 1..60)
        ) {
            run(ops)?;
        }
    }
}
