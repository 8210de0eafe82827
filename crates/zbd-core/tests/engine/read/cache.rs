//! The read cache never hides the medium from `check`, and never serves bytes of an extent's
//! previous life after it was reused.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::Arc;
use zbd_core::{Codec, Volume};

#[test]
fn check_reads_the_device_not_the_cache() {
    let (disk, _data, sb) = closed_text_volume(3);
    let data_offset = sb.data_offset;
    let vol = Volume::open(Box::new(Arc::clone(&disk)), open_opts()).expect("open");
    let mut all = vec![0u8; 1 << 20];
    vol.read(0, &mut all).expect("read");
    // Bit rot after the blocks were read (and cached).
    disk.flip_bit(data_offset + 100, 3);
    let report = vol.check(&|_, _| {});
    // The damaged compression unit (the text is stored in units): all of its blocks.
    assert_eq!(
        report.damaged_blocks.len() as u64,
        u64::from(sb.unit_blocks),
        "{report:?}"
    );
}

#[test]
fn reused_extents_are_not_served_from_the_cache() {
    // Incompressible blocks are stored raw, one per 8 KiB extent, at the same offset and length
    // in every life of an extent: a cache that kept an old life would serve its bytes (and the
    // read would fail its CRC) once the extent is reused.
    let size = 64 * 1024;
    let opts = small_volume(size, 8192, Codec::Lz4, 4, 4);
    let (_disk, vol) = sim_volume(&opts);
    let mut rng = SmallRng::seed_from_u64(5);
    let mut buf = vec![0u8; size as usize];
    let first = vol.stats().counters.checkpoints;
    for round in 0..12 {
        let data = fill(&mut rng, Fill::Random, size as usize);
        vol.write(0, &data, false).expect("write");
        vol.flush().expect("flush");
        vol.read(0, &mut buf)
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert!(buf == data, "round {round}: stale bytes read back");
    }
    // The data area holds two rounds: extents were reused many times.
    assert!(vol.stats().counters.checkpoints > first + 4);
}
