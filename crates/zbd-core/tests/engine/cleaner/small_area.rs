//! Small data areas (6..32 extents): random overwrites of incompressible blocks never give
//! NoSpace while live data is within the guaranteed fraction (docs/design.md, cleaner section),
//! and writing past what fits gives NoSpace with earlier data intact.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use zbd_core::{Codec, CreateOptions, Error};

/// Incompressible 4 KiB blocks one output extent of the cleaner holds (one segment).
fn packed_blocks(extent_bytes: usize) -> u64 {
    test_segment_form().raw_blocks_fitting(extent_bytes as u32)
}

/// The guarantee of docs/design.md: (extents - 2) full output extents of live blocks.
fn guaranteed_blocks(extents: u64, extent_bytes: usize) -> u64 {
    (extents - 2) * packed_blocks(extent_bytes)
}

fn opts(extents: u64, extent_bytes: u32, logical_blocks: u64) -> CreateOptions {
    CreateOptions {
        extent_bytes,
        codec: Codec::Lz4,
        capacity_bytes: Some(extents * u64::from(extent_bytes)),
        ..CreateOptions::new(logical_blocks * BS as u64)
    }
}

fn random_block(rng: &mut SmallRng) -> Vec<u8> {
    let mut b = vec![0u8; BS];
    rng.fill(&mut b[..]);
    b
}

/// Fills the guaranteed number of blocks, then overwrites random ones until `factor` times the
/// data area was written: never NoSpace, every block reads back its last value, check clean.
fn overwrite_at_guarantee(extents: u64, extent_bytes: u32, factor: u64, seed: u64) {
    let blocks = guaranteed_blocks(extents, extent_bytes as usize);
    let (_disk, vol) = sim_volume(&opts(extents, extent_bytes, blocks));
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut model: Vec<Vec<u8>> = Vec::with_capacity(blocks as usize);
    let writes = blocks + factor * extents * u64::from(extent_bytes) / BS as u64;
    for i in 0..writes {
        let lba = if i < blocks {
            i
        } else {
            rng.random_range(0..blocks)
        };
        let b = random_block(&mut rng);
        if let Err(e) = vol.write(lba * BS as u64, &b, false) {
            panic!("{extents} x {extent_bytes}: write {i} of {writes} ({blocks} live) failed: {e}");
        }
        match model.get_mut(lba as usize) {
            Some(m) => *m = b,
            None => model.push(b),
        }
    }
    vol.flush().expect("flush");
    let mut back = vec![0u8; BS];
    for (l, b) in model.iter().enumerate() {
        vol.read(l as u64 * BS as u64, &mut back).expect("read");
        assert!(back == *b, "{extents} x {extent_bytes}: block {l} wrong");
    }
    let report = vol.check(&|_, _| {});
    assert!(report.is_clean(), "{extents} x {extent_bytes}: {report:?}");
}

#[test]
fn overwrites_at_the_guaranteed_fraction_never_run_out() {
    for extents in [6, 8, 16, 32] {
        overwrite_at_guarantee(extents, 32 << 10, 3, extents);
        overwrite_at_guarantee(extents, 1 << 20, 2, extents);
    }
}

/// Beyond what fits (after overwrites left dead space everywhere): NoSpace, not before the
/// guarantee, and every block written before reads back.
#[test]
fn writing_past_what_fits_gives_no_space_and_keeps_data() {
    for (extents, extent_bytes) in [(6u64, 32u32 << 10), (8, 1 << 20)] {
        let fits = guaranteed_blocks(extents, extent_bytes as usize);
        let slots = extents * packed_blocks(extent_bytes as usize);
        let (_disk, vol) = sim_volume(&opts(extents, extent_bytes, slots));
        let mut rng = SmallRng::seed_from_u64(extents);
        let mut model: Vec<Vec<u8>> = Vec::new();
        let overwrites = extents * u64::from(extent_bytes) / BS as u64;
        let mut i = 0u64;
        loop {
            // Half the guarantee first, then overwrites among it, then new blocks only.
            let lba = if (model.len() as u64) < fits / 2 || i >= overwrites {
                model.len() as u64
            } else {
                i += 1;
                rng.random_range(0..model.len() as u64)
            };
            let b = random_block(&mut rng);
            match vol.write(lba * BS as u64, &b, false) {
                Ok(()) if lba == model.len() as u64 => model.push(b),
                Ok(()) => model[lba as usize] = b,
                Err(Error::NoSpace) => break,
                Err(e) => panic!("unexpected {e}"),
            }
            assert!((model.len() as u64) < slots, "never ran out of space");
        }
        assert!(
            model.len() as u64 >= fits,
            "{extents} x {extent_bytes}: NoSpace at {} < {fits} live blocks",
            model.len()
        );
        let mut back = vec![0u8; BS];
        for (l, b) in model.iter().enumerate() {
            vol.read(l as u64 * BS as u64, &mut back).expect("read");
            assert!(back == *b, "block {l} lost after NoSpace");
        }
        assert!(vol.check(&|_, _| {}).is_clean());
    }
}
