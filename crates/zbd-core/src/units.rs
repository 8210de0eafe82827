//! Live accounting of multi-block compression units (docs/design.md, "Compression units").
//!
//! A unit is stored once and referenced by the map entries of its blocks. Each block is charged
//! its share of the unit's stored length, the shares of a unit's blocks summing to the length.
//! An extent's live bytes are then a function of the map entries alone: no table of units is
//! needed in RAM (it would grow with the data, and rebuilding it would need a scan of the whole
//! map at open, both of which the paged map avoids). A unit whose blocks are partly dead still
//! occupies its whole length, more than its live shares: that difference is what rewriting its
//! live blocks gives back, so the cleaner's cost-benefit rightly counts it as free.

use crate::format::MapEntry;

/// Stored bytes charged to the block of `e` (its whole length for a single block).
pub fn share(e: &MapEntry) -> u32 {
    let n = u32::from(e.unit_blocks.max(1));
    let i = u32::from(e.unit_index).min(n - 1);
    let len = u32::from(e.len);
    // Block i takes [len*i/n, len*(i+1)/n): the shares of 0..n sum to len exactly.
    len * (i + 1) / n - len * i / n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::BlockState;

    fn block(len: u16, index: u8, blocks: u8) -> MapEntry {
        MapEntry {
            state: BlockState::Data,
            extent: 3,
            offset: 512,
            len,
            unit_index: index,
            unit_blocks: blocks,
            ..MapEntry::UNMAPPED
        }
    }

    #[test]
    fn shares_of_a_unit_sum_to_its_length() {
        for blocks in [1u8, 2, 3, 4, 8, 16] {
            for len in [1u16, 511, 512, 4095, 6000, 65024] {
                let sum: u32 = (0..blocks).map(|i| share(&block(len, i, blocks))).sum();
                assert_eq!(sum, u32::from(len), "{blocks} blocks, {len} bytes");
            }
        }
        assert_eq!(share(&block(1000, 0, 1)), 1000);
        assert_eq!(share(&block(6000, 3, 4)), 1500);
    }
}
