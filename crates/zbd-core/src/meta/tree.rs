//! The shape of a device's map tree (docs/design.md, "Map trees, pages and pairs"): leaves of
//! 255 entries, interior pages of 1,020 child slots, one root. Pure arithmetic: which page at
//! which level covers a block, and where in it.

use crate::format::{MAP_ENTRIES_PER_PAGE, MAP_INTERIOR_SLOTS};

/// Entries of a leaf.
const LEAF: u64 = MAP_ENTRIES_PER_PAGE as u64;
/// Child slots of an interior page.
const FANOUT: u64 = MAP_INTERIOR_SLOTS as u64;
/// Most levels a tree has (leaves included): 255 x 1,020^5 blocks is far past 2^64 bytes.
pub const DEPTH_MAX: u8 = 6;

/// Blocks one page at `level` covers (0 = a leaf: 255; 1: ~1 GiB; 2: ~1 TiB; 3: ~1 PiB).
pub fn blocks_under(level: u8) -> u64 {
    (0..level).fold(LEAF, |b, _| b.saturating_mul(FANOUT))
}

/// Levels (leaves included) of the smallest tree that covers `blocks`: a device's depth.
pub fn depth_for(blocks: u64) -> u8 {
    (1..=DEPTH_MAX)
        .find(|&d| blocks_under(d - 1) >= blocks)
        .unwrap_or(DEPTH_MAX)
}

/// Position at `level` of the page covering `lba` (a leaf's position is its v2 map page index).
pub fn position(lba: u64, level: u8) -> u64 {
    lba / blocks_under(level)
}

/// Index of `lba`'s entry in its leaf.
pub fn entry_index(lba: u64) -> usize {
    (lba % LEAF) as usize
}

/// Index, in the page at `level` (1 or more) covering `lba`, of the child slot on its path.
pub fn child_slot(lba: u64, level: u8) -> usize {
    debug_assert!(level >= 1, "leaves have entries, not child slots");
    (position(lba, level.saturating_sub(1)) % FANOUT) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_cover_what_the_design_says() {
        assert_eq!(blocks_under(0), 255);
        assert_eq!(
            blocks_under(1) * 4096,
            1_065_369_600,
            "a level-1 page covers ~1 GiB"
        );
        let tib = blocks_under(2) as f64 / (1u64 << 28) as f64;
        assert!((0.98..1.0).contains(&tib), "level 2 ~1 TiB: {tib}");
        assert_eq!(blocks_under(DEPTH_MAX), u64::MAX, "saturates, never wraps");
        assert_eq!(depth_for(0), 1);
        assert_eq!(depth_for(255), 1);
        assert_eq!(depth_for(256), 2);
        // A level-1 page covers 1,016 MiB, just short of 1 GiB.
        assert_eq!(
            depth_for((1000 << 20) / 4096),
            2,
            "1000 MiB: leaves and one root"
        );
        assert_eq!(depth_for((1 << 30) / 4096), 3, "1 GiB: one level more");
        assert_eq!(
            depth_for((16u64 << 40) / 4096),
            4,
            "16 TiB: leaves and 3 levels"
        );
        assert_eq!(depth_for(u64::MAX), DEPTH_MAX);
    }

    #[test]
    fn every_block_has_one_path_and_neighbours_share_it_up_to_their_split() {
        for lba in [0u64, 254, 255, 260_099, 260_100, 1 << 40] {
            let depth = depth_for(lba + 1);
            // Descending from the root by child slots lands on the leaf at `position(lba, 0)`.
            let mut pos = 0u64;
            for level in (1..depth).rev() {
                assert_eq!(position(lba, level), pos, "lba {lba} level {level}");
                pos = pos * 1020 + child_slot(lba, level) as u64;
            }
            assert_eq!(pos, position(lba, 0));
            assert_eq!(pos * 255 + entry_index(lba) as u64, lba);
        }
        // 254 and 255 are in different leaves under one level-1 page.
        assert_ne!(position(254, 0), position(255, 0));
        assert_eq!(position(254, 1), position(255, 1));
        assert_eq!((child_slot(254, 1), child_slot(255, 1)), (0, 1));
    }
}
