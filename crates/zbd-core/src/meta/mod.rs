//! Metadata pages: what format v3's checkpoint flag bit 10 adds (docs/design.md, "Map trees,
//! pages and pairs", "Pair-state list", "Space for metadata"). Build step 1b lands here in
//! pieces; the byte layouts are in `format/pages.rs`.
//!
//! - `btree.rs`: a B+-tree of fixed-size entries over the pool, the one mechanism under the
//!   shared-block table (SBT) and the page count table (PCT).
//! - `catalog.rs`: everything a bit-10 checkpoint names (store, pool, devices, the default
//!   device's tree, SBT, PCT), checkpointed as one and opened from the extension it returns.
//! - `devices.rs`: the device table, rows resident by id, in device-table pages named by a
//!   list page.
//! - `geometry.rs`: where a page id's pair of slots lies (region 0 or a metadata extent pair),
//!   the id space, and the sizes that follow from the volume's shape (pair-state list capacity
//!   and the bounds it is admitted by, the bit-10 checkpoint slot).
//! - `map_tree.rs`: a device's map as a tree of leaves and interior pages over the pool, whose
//!   summary slots stand for whole unmapped or zero subtrees.
//! - `page.rs`: a page as the pool holds it, whatever its kind (kind, level, position, body).
//! - `pairs.rs`: pair states (which slot of a page id is current) and the ids allocation hands out.
//! - `pool.rs`: the one LRU pool of page frames every metadata page kind is cached in, and the
//!   floor of frames a volume can pin at once.
//! - `repairs.rs`: the written sets of the last 64 commits and the hint rule for frames read
//!   without the lock; the repair list of pages with one bad copy, its re-read set and phase 1's
//!   drop rule.
//! - `shared.rs`: shared items (bit 12): promotion into the SBT, references counted exactly
//!   and dropped to death at 0, owner search, moves of a whole shared item.
//! - `store.rs`: pages on the medium: reads from the current slot of a pair, new ids and
//!   frees (a region-0 leaf's free waits for phase 1), and a checkpoint writing the pool's
//!   snapshot into the other slots.
//! - `tree.rs`: a device's map tree: depth and positions.
//!
//! Nothing in the engine uses this module yet.

pub mod btree;
pub mod catalog;
pub mod cow;
pub mod devices;
pub mod geometry;
pub mod map_tree;
pub mod page;
pub mod pairs;
pub mod pool;
pub mod repairs;
pub mod shared;
pub mod store;
#[cfg(test)]
pub(crate) mod testing;
pub mod tree;

pub use geometry::{ListBounds, MetaGeometry, PairHome};
