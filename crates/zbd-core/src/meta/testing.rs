//! Test volumes for the page modules: a planned volume on a RAM storage with every metadata
//! extent pair carved, and stores opened on it from what a checkpoint carried.

use std::sync::Arc;

use super::catalog::Catalog;
use super::page::Page;
use super::pool::{PagePool, FRAME_BYTES};
use super::store::{MetaCheckpoint, MetaStore};
use super::{ListBounds, MetaGeometry};
use crate::backend::{MemStorage, Storage};
use crate::error::Result;
use crate::format::{ExtensionBody, Superblock};

pub struct TestVolume {
    pub storage: Arc<dyn Storage>,
    pub sb: Superblock,
    pub geometry: MetaGeometry,
}

impl TestVolume {
    /// A volume of `bytes` logical bytes laid out as `zbd create` would.
    pub fn new(bytes: u64) -> TestVolume {
        let sb = crate::layout::plan(&crate::layout::CreateOptions::new(bytes)).expect("plan");
        let geometry = MetaGeometry::at_enable(&sb).expect("geometry");
        TestVolume {
            storage: Arc::new(MemStorage::new(sb.total_bytes())),
            sb,
            geometry,
        }
    }

    /// The catalog an open after a checkpoint that carried `ext` makes, with a pool of
    /// `frames` frames and [`bounds`].
    pub fn open_catalog(&self, ext: &ExtensionBody, interval: u64, frames: u64) -> Result<Catalog> {
        Catalog::open(
            self.storage.clone(),
            &self.sb,
            self.geometry,
            0..self.geometry.h,
            ext,
            interval,
            pool(frames),
            &bounds(),
        )
    }

    /// The store an open after a checkpoint that carried `meta` makes, every pair carved.
    pub fn open(&self, meta: &MetaCheckpoint, interval: u64) -> MetaStore {
        MetaStore::open(
            self.storage.clone(),
            &self.sb,
            self.geometry,
            0..self.geometry.h,
            meta,
            interval,
        )
        .expect("open")
    }
}

/// A pool of `frames` frames and no floor.
pub fn pool(frames: u64) -> PagePool<Page> {
    PagePool::new(frames * FRAME_BYTES, 0).expect("pool")
}

/// A large list, so the folder runs only past a quarter of it.
pub fn bounds() -> ListBounds {
    ListBounds::new(65_536, 17, 1)
}
