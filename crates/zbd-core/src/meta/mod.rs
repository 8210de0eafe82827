//! Metadata pages: what format v3's checkpoint flag bit 10 adds (docs/design.md, "Map trees,
//! pages and pairs", "Pair-state list", "Space for metadata"). Build step 1b lands here in
//! pieces; the byte layouts are in `format/pages.rs`.
//!
//! - `geometry.rs`: where a page id's pair of slots lies (region 0 or a metadata extent pair),
//!   the id space, and the sizes that follow from the volume's shape (pair-state list capacity
//!   and the bounds it is admitted by, the bit-10 checkpoint slot).
//! - `repairs.rs`: the written sets of the last 64 commits and the hint rule for frames read
//!   without the lock; the repair list of pages with one bad copy, its re-read set and phase 1's
//!   drop rule.
//!
//! Nothing in the engine uses this module yet.

pub mod geometry;
pub mod pairs;
pub mod repairs;
pub mod tree;

pub use geometry::{ListBounds, MetaGeometry, PairHome};
