//! Streaming reads: 128 KiB reads bypass the read cache, shorter ones fill it.

use crate::checkpoint::background::{create_opts, open_with, SIZE};
use crate::common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::Arc;
use zbd_core::{SimStorage, Volume};

/// Reads of 32 blocks (128 KiB) or more use the read cache without filling it; shorter reads
/// fill it.
#[test]
fn reads_of_128_kib_do_not_fill_the_read_cache_and_shorter_ones_do() {
    let (disk, vol) = sim_volume_with(&create_opts(), open_with(false));
    let data = fill(&mut SmallRng::seed_from_u64(8), Fill::Text, SIZE as usize);
    vol.write(0, &data, false).expect("write");
    vol.close().expect("close");
    drop(vol);
    let disk = Arc::new(SimStorage::from_image(disk.current_image()));
    let vol = Volume::open(Box::new(Arc::clone(&disk)), open_with(false)).expect("open");
    let read = |block: usize, blocks: usize| {
        let before = disk.bytes_read();
        let mut buf = vec![0u8; blocks * BS];
        vol.read((block * BS) as u64, &mut buf).expect("read");
        assert!(buf == data[block * BS..(block + blocks) * BS]);
        disk.bytes_read() - before
    };
    assert!(read(0, 31) > 0);
    assert_eq!(read(0, 31), 0, "a 124 KiB read did not fill the cache");
    let streamed = read(64, 32);
    assert!(streamed > 0);
    assert_eq!(read(64, 32), streamed, "a 128 KiB read filled the cache");
    // A streaming read still takes what is cached: of blocks 0..34 only the unit past block
    // 31 (8 KiB units: the 31-block read cached the unit of blocks 30 and 31) comes from disk.
    let partly = read(0, 34);
    assert!(
        partly > 0 && partly < streamed,
        "{partly} bytes read (a whole read: {streamed})"
    );
}
