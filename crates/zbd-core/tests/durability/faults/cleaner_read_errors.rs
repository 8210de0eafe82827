//! A victim the cleaner cannot read (issue 26, case 4): the cleaner leaves it alone and cleans
//! others, so writes go on while other extents can be reclaimed, instead of every later pass
//! failing on it and the volume ending in NoSpace. Its blocks read as errors; the others read
//! back exactly.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use zbd_core::{Codec, CreateOptions, SimStorage, Volume};

#[test]
fn an_unreadable_victim_is_left_alone_and_writes_go_on() {
    const SIZE: u64 = 1 << 20;
    let blocks = SIZE / BS as u64;
    // Data area twice the logical size: overwrites need the cleaner all the time.
    let opts = CreateOptions {
        unit_bytes: Some(BS as u32),
        ..small_volume(SIZE, 32768, Codec::None, 2, 16)
    };
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    // The first extent opened holds block 0 (written first, never overwritten).
    let vol =
        Volume::create_with(Box::new(Arc::clone(&disk)), &opts, open_opts_sync()).expect("create");
    vol.close().expect("close");
    drop(vol);
    let (_, ck) = newest_checkpoint(&disk.current_image());
    let first = ck.queue[0].extent;
    let at = sb.extent_offset(first);
    let bad = Arc::new(BadSpot {
        disk: Arc::clone(&disk),
        range: at..at + u64::from(sb.extent_bytes),
        armed: AtomicBool::new(false),
        failed: AtomicU64::new(0),
    });
    let vol = Volume::open(Box::new(Arc::clone(&bad)), open_opts_sync()).expect("open");
    let mut rng = SmallRng::seed_from_u64(5);
    let mut model = vec![0u8; SIZE as usize];
    let put = |vol: &Volume, model: &mut [u8], lba: u64, rng: &mut SmallRng| {
        let data = fill(rng, Fill::Random, BS);
        vol.write(lba * BS as u64, &data, false)
            .unwrap_or_else(|e| panic!("write block {lba}: {e}"));
        model[lba as usize * BS..(lba as usize + 1) * BS].copy_from_slice(&data);
    };
    for lba in 0..blocks {
        put(&vol, &mut model, lba, &mut rng);
    }
    vol.flush().expect("flush");
    bad.armed.store(true, Ordering::SeqCst);
    // Overwrite everything but block 0, many times over: the first extent becomes the best
    // victim (all dead but one block) and cannot be read.
    for _ in 0..6 * blocks {
        let lba = rng.random_range(1..blocks);
        put(&vol, &mut model, lba, &mut rng);
    }
    vol.flush().expect("flush");
    assert!(
        bad.failed.load(Ordering::SeqCst) > 0,
        "the cleaner never read the bad extent"
    );
    assert!(read_block(&vol, 0).is_err(), "block 0 lies on the bad spot");
    for lba in 1..blocks {
        assert_eq!(
            read_block(&vol, lba).expect("read"),
            &model[lba as usize * BS..(lba as usize + 1) * BS],
            "block {lba}"
        );
    }
}
