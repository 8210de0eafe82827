//! Host request edges: out-of-range, zero-length and overflowing requests are errors or no-ops,
//! never panics, and unaligned zero/trim ranges at the device end touch exactly the bytes asked
//! for.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use zbd_core::{Codec, Error};

/// Out-of-range, zero-length and overflowing requests are errors (or no-ops), never panics;
/// unaligned zero/trim ranges at the device end touch exactly the bytes asked for.
#[test]
fn request_edges_and_unaligned_ranges_at_the_end() {
    let size = 64 * 1024u64;
    let opts = small_volume(size, 8192, Codec::Lz4, 4, 16);
    let (_disk, vol) = sim_volume(&opts);
    let mut model = vec![0u8; size as usize];
    let mut rng = SmallRng::seed_from_u64(5);
    let data = fill(&mut rng, Fill::Random, size as usize);
    vol.write(0, &data, false).expect("fill");
    model.copy_from_slice(&data);
    let mut one = [0u8; 1];
    for (offset, len) in [
        (size, 1u64),
        (size - 1, 2),
        (u64::MAX, 1),
        (u64::MAX - 10, 100),
        (1, u64::MAX),
        (size + 1, 0),
    ] {
        let oor = |r: zbd_core::Result<()>, what: &str| {
            assert!(
                matches!(r, Err(Error::OutOfRange { .. })),
                "{what} at {offset}+{len}: {r:?}"
            )
        };
        oor(vol.write_zeroes(offset, len), "write_zeroes");
        oor(vol.trim(offset, len), "trim");
        assert!(
            vol.allocation(offset, len).is_err(),
            "allocation {offset}+{len}"
        );
        if len <= 2 {
            let mut b = vec![0u8; len as usize];
            oor(vol.read(offset, &mut b), "read");
            oor(vol.write(offset, &b, false), "write");
        }
    }
    // Zero-length requests at the very end are no-ops.
    vol.read(size, &mut []).expect("empty read");
    vol.write(size, &[], true).expect("empty write");
    vol.trim(size, 0).expect("empty trim");
    vol.write_zeroes(size, 0).expect("empty zeroes");
    vol.read(size - 1, &mut one).expect("last byte");
    assert_eq!(one[0], model[size as usize - 1]);
    // Unaligned ranges ending at the device end.
    for (offset, len, trim) in [
        (size - 1, 1, true),
        (size - 4097, 4097, false),
        (size - 5000, 4000, true),
        (size - 3 * 4096 - 17, 3 * 4096 + 17, true),
        (size - 10000, 9999, false),
    ] {
        if trim {
            vol.trim(offset, len).expect("trim");
        } else {
            vol.write_zeroes(offset, len).expect("zeroes");
        }
        model[offset as usize..(offset + len) as usize].fill(0);
        let mut all = vec![0u8; size as usize];
        vol.read(0, &mut all).expect("read all");
        assert!(all == model, "after zeroing {offset}+{len}");
    }
    let runs = vol.allocation(0, size).expect("allocation");
    assert_eq!(runs.iter().map(|r| r.0).sum::<u64>(), size);
    assert!(vol.check(&|_, _| {}).is_clean());
}
