//! Extents and their accounting: the life cycle and live bytes of every extent
//! ([`ExtentInfo`], kept exact by every map change) with the pending-free set and the counts
//! per state derived from them ([`Extents`], `accounting`), the persisted extent table
//! (`table`) and the free list (`free_list`).

mod accounting;
mod free_list;
mod runs;
mod table;

pub use accounting::Extents;
pub use free_list::{in_runs, FreeList};
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

/// Per-extent accounting (kept exact: every map change adjusts it): live bytes, live blocks,
/// life cycle state and age. Packed into 9 bytes (it was 13): a 16 TiB volume at the default
/// 512 KiB extents has 31.5 M of them, resident (issue 27's RAM bound at 16 TiB).
///
/// Why the narrow fields hold every value: live bytes are at most the extent's size
/// (`EXTENT_BYTES_MAX`, 1 MiB, < 2^21); every live block has its own record of at least
/// `RECORD_BYTES` inside the extent (a unit's blocks one each, a shared item one for all its
/// references), and a metadata extent counts pairs of 8 KiB, so live blocks stay below
/// `EXTENT_BYTES_MAX / RECORD_BYTES` < 2^16. A value outside these bounds is a bug in the
/// accounting, which frees extents by it: [`ExtentInfo::new`] refuses it with a panic rather
/// than store a wrapped count.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ExtentInfo {
    /// Live bytes (bits 0..21), live blocks (21..37), state (37..40), little-endian.
    word: [u8; 5],
    /// Write sequence when it was last written, its low 32 bits (cleaner age, taken modulo
    /// 2^32: an extent older than 4 G writes only looks younger to the cleaner's heuristic;
    /// 0 after recovery).
    stamp: [u8; 4],
}

const LIVE_BYTES_BITS: u32 = 21;
const LIVE_BLOCKS_BITS: u32 = 16;
const _: () = assert!((crate::format::EXTENT_BYTES_MAX as u64) < 1 << LIVE_BYTES_BITS);
const _: () = assert!(
    crate::format::EXTENT_BYTES_MAX as usize / crate::format::RECORD_BYTES < 1 << LIVE_BLOCKS_BITS
);
const _: () = assert!(std::mem::size_of::<ExtentInfo>() == 9);

impl ExtentState {
    const ALL: [ExtentState; 5] = [
        ExtentState::Free,
        ExtentState::Open,
        ExtentState::Closed,
        ExtentState::PendingFree,
        ExtentState::Metadata,
    ];

    /// Position in [`ExtentState::ALL`] (the packed code and the index of per-state counts).
    pub(crate) fn index(self) -> usize {
        match self {
            ExtentState::Free => 0,
            ExtentState::Open => 1,
            ExtentState::Closed => 2,
            ExtentState::PendingFree => 3,
            ExtentState::Metadata => 4,
        }
    }
}

impl ExtentInfo {
    /// A free extent: no live block, never written.
    pub const FREE: ExtentInfo = ExtentInfo {
        word: [0; 5],
        stamp: [0; 4],
    };

    /// Whether an extent can hold `live_bytes` in `live_blocks` (see the type's doc).
    pub fn holds(live_bytes: u32, live_blocks: u32) -> bool {
        live_bytes < 1 << LIVE_BYTES_BITS && live_blocks < 1 << LIVE_BLOCKS_BITS
    }

    /// An entry; panics if `live_bytes` or `live_blocks` exceed what an extent can hold (see
    /// the type's doc: such a count is a bug, never a volume's state).
    pub fn new(state: ExtentState, live_bytes: u32, live_blocks: u32, stamp: u32) -> ExtentInfo {
        assert!(
            ExtentInfo::holds(live_bytes, live_blocks),
            "extent accounting out of range: {live_bytes} live bytes, {live_blocks} live blocks"
        );
        let w = u64::from(live_bytes)
            | u64::from(live_blocks) << LIVE_BYTES_BITS
            | (state.index() as u64) << (LIVE_BYTES_BITS + LIVE_BLOCKS_BITS);
        let mut word = [0; 5];
        word.copy_from_slice(&w.to_le_bytes()[..5]);
        ExtentInfo {
            word,
            stamp: stamp.to_le_bytes(),
        }
    }

    fn word(&self) -> u64 {
        let mut b = [0; 8];
        b[..5].copy_from_slice(&self.word);
        u64::from_le_bytes(b)
    }

    /// Sum of stored lengths of live blocks (a block of a compression unit counts its share of
    /// the unit, `units::share`; a metadata extent 0).
    pub fn live_bytes(&self) -> u32 {
        (self.word() & ((1 << LIVE_BYTES_BITS) - 1)) as u32
    }

    /// Live blocks (a metadata extent: its pairs in use).
    pub fn live_blocks(&self) -> u32 {
        ((self.word() >> LIVE_BYTES_BITS) & ((1 << LIVE_BLOCKS_BITS) - 1)) as u32
    }

    /// Life cycle state.
    pub fn state(&self) -> ExtentState {
        ExtentState::ALL[(self.word() >> (LIVE_BYTES_BITS + LIVE_BLOCKS_BITS)) as usize]
    }

    /// Write sequence when it was last written (low 32 bits).
    pub fn stamp(&self) -> u32 {
        u32::from_le_bytes(self.stamp)
    }

    /// This entry with `state`.
    pub(crate) fn with_state(self, state: ExtentState) -> ExtentInfo {
        ExtentInfo::new(state, self.live_bytes(), self.live_blocks(), self.stamp())
    }

    /// This entry with its live counts.
    pub(crate) fn with_live(self, live_bytes: u32, live_blocks: u32) -> ExtentInfo {
        ExtentInfo::new(self.state(), live_bytes, live_blocks, self.stamp())
    }

    /// This entry with `stamp`.
    pub(crate) fn with_stamp(self, stamp: u32) -> ExtentInfo {
        ExtentInfo {
            stamp: stamp.to_le_bytes(),
            ..self
        }
    }
}

impl std::fmt::Debug for ExtentInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtentInfo")
            .field("state", &self.state())
            .field("live_bytes", &self.live_bytes())
            .field("live_blocks", &self.live_blocks())
            .field("stamp", &self.stamp())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{EXTENT_BYTES_MAX, RECORD_BYTES};
    use proptest::prelude::*;

    proptest! {
        /// Every value an extent can hold reads back as written, and each `with_` changes only
        /// its own fields.
        #[test]
        fn packed_fields_read_back(
            s in 0usize..5, t in 0usize..5,
            bytes in 0..=EXTENT_BYTES_MAX, blocks in 0..=(EXTENT_BYTES_MAX / RECORD_BYTES as u32),
            bytes2 in 0..=EXTENT_BYTES_MAX, blocks2 in 0..=(EXTENT_BYTES_MAX / RECORD_BYTES as u32),
            stamp in any::<u32>(), stamp2 in any::<u32>(),
        ) {
            let (s, t) = (ExtentState::ALL[s], ExtentState::ALL[t]);
            let x = ExtentInfo::new(s, bytes, blocks, stamp);
            let view = |x: ExtentInfo| (x.state(), x.live_bytes(), x.live_blocks(), x.stamp());
            prop_assert_eq!(view(x), (s, bytes, blocks, stamp));
            prop_assert_eq!(view(x.with_state(t)), (t, bytes, blocks, stamp));
            prop_assert_eq!(view(x.with_live(bytes2, blocks2)), (s, bytes2, blocks2, stamp));
            prop_assert_eq!(view(x.with_stamp(stamp2)), (s, bytes, blocks, stamp2));
        }
    }

    #[test]
    fn a_count_no_extent_can_hold_is_refused() {
        assert!(ExtentInfo::holds(
            EXTENT_BYTES_MAX,
            EXTENT_BYTES_MAX / RECORD_BYTES as u32
        ));
        assert!(!ExtentInfo::holds(1 << 21, 1));
        assert!(!ExtentInfo::holds(0, 1 << 16));
        let wrapped =
            std::panic::catch_unwind(|| ExtentInfo::new(ExtentState::Closed, 0, u32::MAX, 0));
        assert!(
            wrapped.is_err(),
            "a wrapped live-block count must not be stored"
        );
    }
}
