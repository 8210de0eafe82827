//! Live accounting of multi-block compression units (docs/design.md, "Compression units").
//!
//! A unit is stored once and referenced by the map entries of its blocks, so an extent's live
//! bytes count a unit's stored length once, while at least one of its blocks is live. A unit
//! whose blocks are mostly overwritten still takes its whole length until the cleaner rewrites
//! it; `waste` estimates what that rewrite gives back (the share of its length that belongs to
//! dead blocks), which the cleaner's victim choice counts as free space.

use crate::format::MapEntry;
use std::collections::HashMap;

/// How one block reference changes its extent's accounting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Delta {
    /// Stored bytes that became live (on add) or dead (on remove).
    pub bytes: u32,
    /// Change of the extent's unit waste (see the module doc).
    pub waste: i64,
}

/// Live blocks per stored unit, keyed by (extent, offset). Single blocks are not tracked.
#[derive(Clone, Debug, Default)]
pub struct UnitRefs {
    live: HashMap<(u32, u32), u8>,
}

/// Estimated bytes a rewrite of a unit with `live` of its blocks gives back.
pub fn waste(e: &MapEntry, live: u8) -> i64 {
    let n = i64::from(e.unit_blocks.max(1));
    i64::from(e.len) * (n - i64::from(live)) / n
}

impl UnitRefs {
    /// A data block referencing `e` became live.
    pub fn add(&mut self, e: &MapEntry) -> Delta {
        if e.unit_blocks <= 1 {
            return Delta {
                bytes: u32::from(e.len),
                waste: 0,
            };
        }
        let live = self.live.entry((e.extent, e.offset)).or_insert(0);
        let before = *live;
        *live += 1;
        Delta {
            bytes: if before == 0 { u32::from(e.len) } else { 0 },
            waste: waste(e, *live) - if before == 0 { 0 } else { waste(e, before) },
        }
    }

    /// A data block referencing `e` stopped being live.
    pub fn remove(&mut self, e: &MapEntry) -> Delta {
        if e.unit_blocks <= 1 {
            return Delta {
                bytes: u32::from(e.len),
                waste: 0,
            };
        }
        let key = (e.extent, e.offset);
        let Some(live) = self.live.get_mut(&key) else {
            return Delta::default();
        };
        let before = *live;
        *live -= 1;
        let after = *live;
        if after == 0 {
            self.live.remove(&key);
        }
        Delta {
            bytes: if after == 0 { u32::from(e.len) } else { 0 },
            waste: if after == 0 { 0 } else { waste(e, after) } - waste(e, before),
        }
    }

    /// Units with at least one live block.
    pub fn count(&self) -> usize {
        self.live.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::BlockState;

    fn block(extent: u32, offset: u32, len: u16, index: u8, blocks: u8) -> MapEntry {
        MapEntry {
            state: BlockState::Data,
            extent,
            offset,
            len,
            unit_index: index,
            unit_blocks: blocks,
            ..MapEntry::UNMAPPED
        }
    }

    #[test]
    fn a_unit_counts_once_and_its_dead_share_as_waste() {
        let mut r = UnitRefs::default();
        let (mut bytes, mut waste) = (0i64, 0i64);
        let mut apply = |d: Delta, sign: i64| {
            bytes += sign * i64::from(d.bytes);
            waste += d.waste;
            (bytes, waste)
        };
        let u: Vec<MapEntry> = (0..4).map(|i| block(3, 512, 6000, i, 4)).collect();
        for e in &u {
            apply(r.add(e), 1);
        }
        assert_eq!(apply(Delta::default(), 1), (6000, 0));
        // Three of four blocks overwritten: still stored whole, 3/4 of it is waste.
        for e in &u[..3] {
            apply(r.remove(e), -1);
        }
        assert_eq!(apply(Delta::default(), 1), (6000, 4500));
        assert_eq!(r.count(), 1);
        apply(r.remove(&u[3]), -1);
        assert_eq!(apply(Delta::default(), 1), (0, 0));
        assert_eq!(r.count(), 0);
        // Single blocks: their own length, never waste.
        let s = block(1, 0, 1000, 0, 1);
        assert_eq!(
            r.add(&s),
            Delta {
                bytes: 1000,
                waste: 0
            }
        );
        assert_eq!(
            r.remove(&s),
            Delta {
                bytes: 1000,
                waste: 0
            }
        );
    }
}
