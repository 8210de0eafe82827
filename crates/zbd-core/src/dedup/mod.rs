//! Deduplication's fingerprint and its bounded index (docs/design.md, "Deduplication").
//!
//! A fingerprint is xxh3-128 of one 4 KiB block. It is fast (tens of GB/s) and it is never trusted:
//! whatever the index proposes is a *hint*, and a block becomes a reference only after the
//! candidate's stored bytes compare equal. A weak or colliding fingerprint can therefore cost a
//! wasted read or a missed duplicate, never wrong data.
//!
//! The index ([`Index`]) holds parts of fingerprints in a fixed RAM budget and forgets, oldest
//! first, when it is full: it never grows and never fails. `zbd estimate` drives it over a tree or
//! an image to measure what a budget finds before anyone turns deduplication on.

mod index;

pub use index::{Candidate, Index, IndexStats, Location, HOOK_LEVEL_MAX, INDEX_BYTES_MIN};

/// xxh3-128 of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub u128);

impl Fingerprint {
    /// The fingerprint of `block` (any length; the engine passes 4 KiB blocks).
    pub fn of(block: &[u8]) -> Fingerprint {
        Fingerprint(xxhash_rust::xxh3::xxh3_128(block))
    }

    /// The 64 bits the recent table keeps.
    pub fn high(self) -> u64 {
        (self.0 >> 64) as u64
    }

    /// The 64 bits that address buckets and sets.
    pub fn low(self) -> u64 {
        self.0 as u64
    }

    /// The 32 bits a manifest keeps for each block of an extent (what a v3 record carries).
    pub fn manifest_part(self) -> u32 {
        (self.0 >> 96) as u32
    }

    /// The 16 bits a hook keeps. Its top bits also choose the hooks: at sampling level `k` a
    /// block is a hook when its tag's top `k` bits are zero (one block in 2^k, by content, so
    /// two copies of a run pick the same blocks wherever the run lies).
    pub fn hook_tag(self) -> u16 {
        (self.high() >> 48) as u16
    }

    /// Whether this block is a hook at sampling level `level` (0: every block).
    pub fn is_hook_at(self, level: u32) -> bool {
        level == 0 || self.hook_tag() >> (16 - level) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_differ_for_different_blocks_and_agree_for_equal_ones() {
        let a = vec![7u8; 4096];
        let mut b = a.clone();
        b[4095] = 8;
        assert_eq!(Fingerprint::of(&a), Fingerprint::of(&a.clone()));
        assert_ne!(Fingerprint::of(&a), Fingerprint::of(&b));
    }

    #[test]
    fn about_one_block_in_two_to_the_level_is_a_hook() {
        for level in [0, 1, 5, 8] {
            let hooks = (0u32..64_000)
                .filter(|i| Fingerprint::of(&i.to_le_bytes()).is_hook_at(level))
                .count();
            let expected = 64_000 >> level;
            assert!(
                hooks >= expected * 8 / 10 && hooks <= expected * 12 / 10,
                "level {level}: {hooks} hooks of 64000, expected about {expected}"
            );
        }
    }
}
