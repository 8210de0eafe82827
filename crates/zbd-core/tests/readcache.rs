//! The read cache never hides the medium from `check`, and never serves bytes of an extent's
//! previous life after it was reused.

mod common;

use common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::Arc;
use zbd_core::{Codec, Volume};

#[test]
fn check_reads_the_device_not_the_cache() {
    let opts = small_volume(1 << 20, 32768, Codec::Lz4, 4, 16);
    let (disk, vol) = sim_volume(&opts);
    let mut rng = SmallRng::seed_from_u64(3);
    let data = fill(&mut rng, Fill::Text, 1 << 20);
    vol.write(0, &data, false).expect("write");
    vol.close().expect("close");
    let data_offset = vol.superblock().data_offset;
    drop(vol);
    let vol = Volume::open(Box::new(Arc::clone(&disk)), open_opts()).expect("open");
    let mut all = vec![0u8; 1 << 20];
    vol.read(0, &mut all).expect("read");
    // Bit rot after the blocks were read (and cached).
    disk.flip_bit(data_offset + 100, 3);
    let report = vol.check(&|_, _| {});
    assert_eq!(report.damaged_blocks.len(), 1, "{report:?}");
}

#[test]
fn reused_extents_are_not_served_from_the_cache() {
    let opts = small_volume(256 * 1024, 8192, Codec::Lz4, 2, 4);
    let (_disk, vol) = sim_volume(&opts);
    let mut rng = SmallRng::seed_from_u64(5);
    let mut buf = vec![0u8; 256 * 1024];
    // Each round overwrites everything, so old extents are freed and reused (the data area is
    // only twice the volume); reading in between fills the cache with the old lives' bytes.
    for round in 0..12 {
        let data = fill(&mut rng, Fill::Text, 256 * 1024);
        vol.write(0, &data, false).expect("write");
        vol.flush().expect("flush");
        vol.read(0, &mut buf).expect("read");
        assert!(buf == data, "round {round}: stale bytes read back");
    }
    assert!(vol.stats().counters.cleaner_runs > 0 || vol.stats().counters.checkpoints > 2);
}
