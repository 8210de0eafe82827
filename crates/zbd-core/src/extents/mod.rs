//! Extents and their accounting: the life cycle and live bytes of every extent
//! ([`ExtentInfo`], kept exact by every map change) with the pending-free set and the counts
//! per state derived from them ([`Extents`], `accounting`), the persisted extent table
//! (`table`) and the free list (`free_list`).

mod accounting;
mod free_list;
mod runs;
mod table;

pub use accounting::Extents;
pub use free_list::FreeList;
pub use table::{ExtentTable, WrittenTable};

/// Life cycle of an extent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtentState {
    /// Holds nothing the durable metadata needs; may be queued for allocation.
    Free,
    /// In the extent buffer, receiving blocks.
    Open,
    /// Written; may hold live blocks.
    Closed,
    /// Closed with no live block left; becomes free once a checkpoint no longer references it.
    PendingFree,
    /// Holds pairs of metadata pages (checkpoint flag bit 10; state 3 in the table):
    /// `live_blocks` counts its pairs in use and `live_bytes` is 0. Neither allocated to data
    /// nor cleaned: only the metadata store carves and returns such extents.
    Metadata,
}

/// Per-extent accounting (kept exact: every map change adjusts it). Packed: 13 bytes per
/// extent, not 16 (a 1 TiB volume has a million or more; issue 9). Fields are read and written
/// by value (safe Rust refuses references to unaligned fields).
#[derive(Clone, Copy, Debug)]
#[repr(C, packed)]
pub struct ExtentInfo {
    /// Sum of stored lengths of live blocks (a block of a compression unit counts its share of
    /// the unit, `units::share`).
    pub live_bytes: u32,
    /// Live blocks.
    pub live_blocks: u32,
    /// Life cycle state.
    pub state: ExtentState,
    /// Write sequence when it was last written, its low 32 bits (cleaner age, taken modulo
    /// 2^32: an extent older than 4 G writes only looks younger to the cleaner's heuristic; 4
    /// bytes, not 8, keep `ExtentInfo` at 13 bytes per extent; 0 after recovery).
    pub stamp: u32,
}

impl ExtentInfo {
    /// A free extent: no live block, never written.
    pub const FREE: ExtentInfo = ExtentInfo {
        live_bytes: 0,
        live_blocks: 0,
        state: ExtentState::Free,
        stamp: 0,
    };
}
