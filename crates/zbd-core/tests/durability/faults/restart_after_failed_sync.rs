//! A restart in the same boot after a failed sync (issue 26, case 1). Linux keeps the pages a
//! failed fsync dropped readable (marked clean, never written), and the simulated disk does the
//! same: its reads see every write, its crash image only what a sync made durable. A reopen
//! must not build durable state on such pages: after a power cut, every block reads its last
//! flushed value or a later one, never an error or older data.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::Arc;
use zbd_core::{Codec, SimStorage, Volume};

const SIZE: u64 = 1 << 20;

fn block(seed: u64) -> Vec<u8> {
    fill(&mut SmallRng::seed_from_u64(seed), Fill::Random, BS)
}

/// Block 3 = A, flushed and checkpointed; block 3 = B, and the first sync at or after the
/// `at`-th storage operation from there fails (dropping some of what it covered, chosen by
/// `seed`): the flush's, or one of a checkpoint's three. The volume fences and is dropped;
/// returns its disk, whose reads still see what the failed sync dropped.
fn fenced_after_b(at: u64, seed: u64) -> Arc<SimStorage> {
    let opts = small_volume(SIZE, 32768, Codec::Lz4, 4, 16);
    let (disk, vol) = sim_volume_with(&opts, open_opts_sync());
    vol.write(3 * BS as u64, &block(1), false).expect("write A");
    vol.flush().expect("flush A");
    vol.checkpoint().expect("checkpoint A");
    vol.write(3 * BS as u64, &block(2), false).expect("write B");
    disk.fail_sync_at(disk.ops() + at, seed);
    // Flushes and checkpoints (bounded) until the sync fails.
    for _ in 0..8 {
        if disk.sync_failures() > 0 {
            break;
        }
        let _ = vol.flush();
        let _ = vol.checkpoint();
    }
    assert_eq!(disk.sync_failures(), 1, "no sync failed");
    vol.abandon();
    disk
}

/// [`fenced_after_b`], then the volume is reopened on the same disk; block 5 = C is written and
/// flushed, more checkpoints reuse freed extents; the power is cut. Returns what blocks 3 and 5
/// read then.
fn run(at: u64, seed: u64) -> (zbd_core::Result<Vec<u8>>, zbd_core::Result<Vec<u8>>) {
    let disk = fenced_after_b(at, seed);
    let c = block(3);
    // Same boot: the disk's reads still see the dropped writes.
    let vol = Volume::open(Box::new(Arc::clone(&disk)), open_opts_sync()).expect("reopen");
    vol.write(5 * BS as u64, &c, false).expect("write C");
    vol.flush().expect("flush C");
    // Churn: overwrite other blocks so freed extents are reused, with checkpoints between.
    for round in 0..6u64 {
        for lba in 8..24u64 {
            vol.write(lba * BS as u64, &block(100 + round * 64 + lba), false)
                .expect("churn");
        }
        vol.flush().expect("flush churn");
        vol.checkpoint().expect("checkpoint churn");
    }
    vol.abandon();
    let image = disk.crash_image(&mut SmallRng::seed_from_u64(seed));
    let after = Volume::open(
        Box::new(Arc::new(SimStorage::from_image(image))),
        open_opts_sync(),
    )
    .expect("open after the power cut");
    (read_block(&after, 3), read_block(&after, 5))
}

#[test]
fn flushed_blocks_survive_a_same_boot_reopen_after_a_failed_sync_and_a_power_cut() {
    let (a, b, c) = (block(1), block(2), block(3));
    let mut runs = 0;
    // Every storage operation of the next flush and checkpoint, each with several choices of
    // what the failed sync drops.
    for at in 0..16 {
        for seed in 0..6 {
            let (three, five) = run(at, seed);
            let three = three.unwrap_or_else(|e| {
                panic!("op {at}, seed {seed}: block 3 (flushed as A) reads {e}")
            });
            assert!(
                three == a || three == b,
                "op {at}, seed {seed}: block 3 is neither its flushed value nor a later one"
            );
            assert_eq!(
                five.unwrap_or_else(|e| panic!("op {at}, seed {seed}: block 5 reads {e}")),
                c,
                "op {at}, seed {seed}: block 5 lost its flushed value"
            );
            runs += 1;
        }
    }
    assert_eq!(runs, 96);
}

/// The same, with the power cut during the reopen itself (at every storage operation of it):
/// the reopen must not overwrite the older durable checkpoint while the one it started from
/// is only in the page cache.
#[test]
fn a_power_cut_during_the_reopen_after_a_failed_sync_keeps_flushed_blocks() {
    let (a, b) = (block(1), block(2));
    let mut cuts = 0;
    for at in 0..16 {
        for seed in 0..4 {
            for cut in 0..40 {
                let disk = fenced_after_b(at, seed);
                disk.set_power_loss_at(disk.ops() + cut);
                let reopened = Volume::open(Box::new(Arc::clone(&disk)), open_opts_sync());
                if let Ok(vol) = reopened {
                    vol.abandon();
                }
                if !disk.powered_off() {
                    break; // the reopen finished before this cut
                }
                cuts += 1;
                let image = disk.crash_image(&mut SmallRng::seed_from_u64(seed + cut));
                let after = Volume::open(
                    Box::new(Arc::new(SimStorage::from_image(image))),
                    open_opts_sync(),
                )
                .unwrap_or_else(|e| panic!("op {at}, seed {seed}, cut {cut}: open: {e}"));
                let three = read_block(&after, 3).unwrap_or_else(|e| {
                    panic!("op {at}, seed {seed}, cut {cut}: block 3 (flushed as A) reads {e}")
                });
                assert!(
                    three == a || three == b,
                    "op {at}, seed {seed}, cut {cut}: block 3 is neither A nor a later value"
                );
            }
        }
    }
    assert!(cuts > 64, "too few power cuts inside the reopen: {cuts}");
}
