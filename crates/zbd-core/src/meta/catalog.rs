//! Everything a bit-10 checkpoint names, in one place: the pages on the medium and in RAM
//! (store and pool), the device table, the default device's map tree, the shared-block table
//! and the page count table. A checkpoint of the catalog is one [`MetaStore`] checkpoint that
//! writes every dirty page of every kind, and the [`ExtensionBody`] it returns is what the
//! engine's checkpoint slot carries after v2's header; an open starts from that body alone.
//!
//! One device for now: step 3 gives each row its own tree (and its pages their creator).

use std::sync::Arc;

use super::btree::{BTree, Pct, Sbt};
use super::devices::{DeviceHeader, DeviceTable, DEFAULT_DEVICE};
use super::map_tree::MapTree;
use super::page::Page;
use super::pool::PagePool;
use super::store::{MetaCheckpoint, MetaStore};
use super::MetaGeometry;
use crate::backend::Storage;
use crate::error::{Error, Result};
use crate::format::{DeviceRow, Extension, ExtensionBody, Superblock, PAGE_ID_NONE};

/// The metadata of one bit-10 volume.
pub struct Catalog {
    pub store: MetaStore,
    pub pool: PagePool<Page>,
    pub devices: DeviceTable,
    /// The default device's map.
    pub tree: MapTree,
    pub sbt: BTree<Sbt>,
    pub pct: BTree<Pct>,
    /// The header fields no checkpoint changes (`H`, `pairs0`, the list's capacity, the
    /// enabling checkpoint) and the counters the catalog keeps (next SBT serial).
    header: Extension,
}

impl Catalog {
    /// The catalog of a volume just made: its default device (`default`, whose id, kind,
    /// root and depth are set here) of `blocks` blocks, all unmapped, and empty tables.
    pub fn create(
        store: MetaStore,
        pool: PagePool<Page>,
        geometry: &MetaGeometry,
        list_capacity: u32,
        mut default: DeviceRow,
    ) -> Result<Catalog> {
        let tree = MapTree::new(default.blocks);
        default.root = tree.root();
        default.depth = tree.depth();
        Ok(Catalog {
            store,
            pool,
            devices: DeviceTable::create(default)?,
            tree,
            sbt: BTree::new(),
            pct: BTree::new(),
            header: Extension {
                h: geometry.h,
                pairs0: geometry.pairs0,
                list_capacity,
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
    ) -> Result<Catalog> {
        let h = &ext.header;
        if (h.h, h.pairs0) != (geometry.h, geometry.pairs0) {
            return Err(Error::CorruptMetadata(format!(
                "checkpoint extension names H = {} and pairs0 = {}, the volume's geometry {} \
                 and {}",
                h.h, h.pairs0, geometry.h, geometry.pairs0
            )));
        }
        let meta = MetaCheckpoint {
            list: ext.pair_list.clone(),
            directory: ext.directory.clone(),
        };
        let mut store = MetaStore::open(storage, sb, geometry, metadata_extents, &meta, interval)?;
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
        let row = devices
            .get(DEFAULT_DEVICE)
            .expect("open checks the default row");
        let tree = MapTree::from_root(row.root, row.depth, row.blocks)?;
        let root = |id: u32| (id != PAGE_ID_NONE).then_some(id);
        Ok(Catalog {
            store,
            pool,
            devices,
            tree,
            sbt: BTree::from_root(root(h.sbt_root), h.sbt_height, h.sbt_entries)?,
            pct: BTree::from_root(root(h.pct_root), h.pct_height, h.pct_entries)?,
            header: *h,
        })
    }

    /// The next SBT serial, taken (serials only grow).
    pub fn take_sbt_serial(&mut self) -> u64 {
        self.header.next_sbt_serial += 1;
        self.header.next_sbt_serial - 1
    }

    /// Phases 1 and 2 of a checkpoint: the default row takes its tree's root and depth, the
    /// device table writes its changed pages, and one store checkpoint writes every dirty page
    /// and syncs. Returns the extension the checkpoint slot carries; on an error nothing is
    /// in flight.
    pub fn checkpoint(&mut self) -> Result<ExtensionBody> {
        let (root, depth) = (self.tree.root(), self.tree.depth());
        self.devices.update(DEFAULT_DEVICE, |r| {
            r.root = root;
            r.depth = depth;
        })?;
        let d = self.devices.write(&mut self.pool, &mut self.store)?;
        let meta = self.store.checkpoint(&mut self.pool)?;
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
        let body = ExtensionBody {
            header,
            directory: meta.directory,
            summary_lists: Vec::new(),
            pair_list: meta.list,
        };
        // The body as the slot will hold it (counts and total set by the encoding).
        let written = body.encode().and_then(|b| ExtensionBody::decode(&b));
        if written.is_err() {
            self.store.abort(&mut self.pool);
        }
        written
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
    use crate::meta::testing::{pool, TestVolume};

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
        Catalog::open(
            v.storage.clone(),
            &v.sb,
            v.geometry,
            0..v.geometry.h,
            ext,
            interval,
            pool(32),
        )
    }

    /// Every kind a catalog holds, changed, checkpointed, then changed again and cut: the open
    /// from the committed extension (through its bytes) reads the committed state of each.
    #[test]
    fn every_kind_reopens_from_the_committed_extension() {
        let v = TestVolume::new(64 << 20);
        let blocks = v.sb.logical_blocks;
        let store = v.open(&Default::default(), 1);
        let mut c = Catalog::create(store, pool(256), &v.geometry, 4096, default_row(blocks, 0))
            .expect("create");
        let mut other = default_row(blocks, 0);
        (other.name, other.kind) = ("snap".into(), DeviceKind::Snapshot);
        let snap = c.devices.add(other).expect("add");
        for lba in (0..blocks).step_by(997) {
            c.tree
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
        c.tree
            .set(&mut c.pool, &mut c.store, 0, data(99))
            .expect("set");
        c.devices.remove(snap).expect("remove");
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
                r.tree.get(&mut r.pool, &mut r.store, lba).expect("get"),
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
        let mut c = Catalog::create(store, pool(64), &v.geometry, 4096, default_row(100, 0))
            .expect("create");
        let mut ext = c.checkpoint().expect("checkpoint");
        c.commit();
        ext.header.h += 1;
        let err = open(&v, &ext, 2).err().expect("refused");
        assert!(err.to_string().contains("geometry"), "{err}");
    }
}
