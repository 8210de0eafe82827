//! Running out of space and getting out of it: an over-committed or full volume accepts trims
//! and zero ranges and then writes again, and random overwrites of raw blocks never report
//! NoSpace while most of the data area is dead. Guards against dead ends the host cannot leave.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use zbd_core::{Error, Volume};

/// A 4 MiB volume with a data area of only `capacity` bytes (8 KiB extents).
fn overcommitted(capacity: u64) -> zbd_core::CreateOptions {
    zbd_core::CreateOptions {
        capacity_bytes: Some(capacity),
        extent_bytes: 8192,
        ..zbd_core::CreateOptions::new(4 << 20)
    }
}

/// Writes blocks from 0 up until the volume reports NoSpace; returns how many fit.
fn fill_until_no_space(
    vol: &Volume,
    rng: &mut SmallRng,
    block: &dyn Fn(&mut SmallRng) -> Vec<u8>,
) -> u64 {
    let mut written = 0u64;
    loop {
        match vol.write(written * BS as u64, &block(rng), false) {
            Ok(()) => written += 1,
            Err(Error::NoSpace) => return written,
            Err(e) => panic!("unexpected error {e}"),
        }
        assert!(written < 1024, "never ran out of space");
    }
}

/// An over-committed volume that ran out of space must still accept trims and zero ranges (they
/// free space and need none), after which writes fit again: NoSpace only while live data truly
/// does not fit, and never a dead end the host cannot get out of.
#[test]
fn full_volume_still_accepts_trim_and_then_writes() {
    let (disk, vol) = sim_volume(&overcommitted(256 * 1024));
    let mut rng = SmallRng::seed_from_u64(9);
    let written = fill_until_no_space(&vol, &mut rng, &|rng| fill(rng, Fill::Random, BS));
    vol.flush().expect("flush on a full volume");
    // Zeroing one block and trimming the rest must not need data space.
    vol.write_zeroes(0, BS as u64)
        .expect("write_zeroes on a full volume");
    vol.trim(BS as u64, (written - 1) * BS as u64)
        .expect("trim on a full volume");
    vol.trim(0, 4 << 20).expect("trim everything");
    for lba in 0..written / 2 {
        let d = fill(&mut rng, Fill::Random, BS);
        vol.write(lba * BS as u64, &d, false)
            .unwrap_or_else(|e| panic!("write {lba} after the trim: {e}"));
    }
    vol.close().expect("close");
    drop(vol);
    let vol = reopen(&disk);
    assert!(vol.check(&|_, _| {}).is_clean());
}

/// A full volume whose host then frees half of every extent (scattered trims, nothing whole)
/// must take new writes again: the live data is half the capacity. The cleaner needs at least
/// one free extent to compact into, so host writes must not have used up every last one.
#[test]
fn full_volume_with_scattered_trims_takes_writes_again() {
    let (disk, vol) = sim_volume(&overcommitted(512 * 1024));
    let mut rng = SmallRng::seed_from_u64(10);
    let written = fill_until_no_space(&vol, &mut rng, &|rng| part_random(rng));
    let mut model: Vec<Option<Vec<u8>>> = vec![None; 1024];
    for lba in (0..written).step_by(2) {
        vol.trim(lba * BS as u64, BS as u64).expect("trim");
    }
    // A third of the written amount again, into fresh blocks.
    for i in 0..written / 3 {
        let lba = written + i;
        let d = part_random(&mut rng);
        vol.write(lba * BS as u64, &d, false).unwrap_or_else(|e| {
            panic!(
                "write {i} of {} after freeing half of {written} blocks: {e}",
                written / 3
            )
        });
        model[lba as usize] = Some(d);
    }
    vol.close().expect("close");
    drop(vol);
    let vol = reopen(&disk);
    for (lba, d) in model.iter().enumerate() {
        if let Some(d) = d {
            assert_eq!(
                &read_block(&vol, lba as u64).expect("read"),
                d,
                "block {lba}"
            );
        }
    }
    assert!(vol.check(&|_, _| {}).is_clean());
}

/// Incompressible blocks (three per 16 KiB extent) overwritten at random, 37 % live: cleaning
/// must keep up however few extents are free. The cleaner's footprint estimate is looser than
/// exact packing (sector padding, whole blocks), so with two free extents a pass could ask for a
/// third output and was then dropped altogether: NoSpace with most of the data area dead.
#[test]
fn random_overwrites_of_raw_blocks_never_run_out_of_space() {
    let opts = zbd_core::CreateOptions {
        extent_bytes: 16384,
        capacity_bytes: Some(512 * 1024),
        queue_len: Some(16),
        ..zbd_core::CreateOptions::new(1 << 20)
    };
    let (disk, vol) = sim_volume(&opts);
    let blocks = 48u64;
    let mut model = vec![vec![0u8; BS]; blocks as usize];
    let mut rng = SmallRng::seed_from_u64(13);
    for i in 0..6000 {
        let lba = rng.random_range(0..blocks);
        let d = fill(&mut rng, Fill::Random, BS);
        vol.write(lba * BS as u64, &d, false).unwrap_or_else(|e| {
            let s = vol.stats();
            panic!(
                "write {i}: {e} ({} live bytes, {} dead, {} extents free)",
                s.physical_bytes_live, s.dead_bytes, s.extents_free
            )
        });
        model[lba as usize] = d;
    }
    vol.close().expect("close");
    drop(vol);
    let vol = reopen(&disk);
    for (lba, d) in model.iter().enumerate() {
        assert!(
            &read_block(&vol, lba as u64).expect("read") == d,
            "block {lba}"
        );
    }
}
