//! A background cleaning pass that commits while a checkpoint is between its snapshot and its
//! commit (phase 2, parked at a chosen storage call). Its victims are referenced by the
//! snapshot, its outputs come from the allocation queue and hold records above the snapshot's
//! watermark; a crash there, or after the checkpoint and the next one (which releases the
//! victims, reused by later writes), must keep every flushed block.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::ops::Range;
use std::sync::Arc;
use zbd_core::{Codec, OpenOptions, SimStorage, Volume};

const SIZE: u64 = 4 << 20;
const BLOCKS: usize = SIZE as usize / BS;

fn scenario(trap: Trap, lose_after: Option<u64>, seed: u64) {
    let ctx = format!("trap {trap:?}, lose after {lose_after:?}, seed {seed}");
    let opts = small_volume(SIZE, 32 * 1024, Codec::Lz4, 1, 64);
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let (park, prx, rtx) = Parking::new(Arc::clone(&disk));
    let vol = Arc::new(
        Volume::create_with(
            Box::new(Arc::clone(&park)),
            &opts,
            OpenOptions {
                // Always "below the low watermark": `clean` runs a pass whenever there is dead
                // space.
                clean_watermarks: Some((89, 90)),
                ..open_opts_sync()
            },
        )
        .expect("create"),
    );
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut exp = Expect::new(BLOCKS);
    write_some(&vol, &mut exp, &mut rng, 700);
    // Overwrites: dead space in many extents for the cleaner.
    write_some(&vol, &mut exp, &mut rng, 500);
    vol.flush().expect("flush");
    exp.flushed();
    write_some(&vol, &mut exp, &mut rng, 40);
    let (ckpt, cleaner) = checkpoint_parked_beside_a_pass(&vol, &park, &prx, trap.clone(), &ctx);
    // Host overwrites after the pass (some of the moved blocks), durable by a flush when the
    // parked call is not a sync (a flush would wait for it).
    write_some(&vol, &mut exp, &mut rng, 40);
    let parks_sync = matches!(trap, Trap::Sync(_));
    if !parks_sync {
        vol.flush().expect("flush during the checkpoint");
        exp.flushed();
    }
    match lose_after {
        None => {
            let image = disk.crash_image(&mut rng);
            rtx.send(()).expect("release");
            ckpt.join().expect("ckpt thread").expect("checkpoint");
            cleaner.join().expect("cleaner thread").expect("clean");
            let vol2 =
                Volume::open(Box::new(SimStorage::from_image(image)), open_opts()).expect("reopen");
            exp.verify(&vol2, &ctx);
        }
        Some(k) => {
            disk.set_power_loss_at(disk.ops() + k);
            rtx.send(()).expect("release");
            let c1 = ckpt.join().expect("ckpt thread");
            let c2 = cleaner.join().expect("cleaner thread");
            // Writes reuse the extents the checkpoints released, then a flush.
            let mut ok = c1.is_ok() && c2.is_ok();
            for _ in 0..200 {
                if !ok {
                    break;
                }
                let b = rng.random_range(0..BLOCKS);
                let data = mixed_block(&mut rng);
                exp.wrote(b, &data);
                ok = vol.write((b * BS) as u64, &data, false).is_ok();
            }
            if ok && vol.flush().is_ok() {
                exp.flushed();
            }
            let image = disk.crash_image(&mut rng);
            let vol2 =
                Volume::open(Box::new(SimStorage::from_image(image)), open_opts()).expect("reopen");
            exp.verify(&vol2, &ctx);
        }
    }
    match Arc::try_unwrap(vol) {
        Ok(v) => v.abandon(),
        Err(_) => panic!("{ctx}: volume still shared"),
    }
}

fn ranges() -> (Range<u64>, Range<u64>) {
    let opts = small_volume(SIZE, 32 * 1024, Codec::Lz4, 1, 64);
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    (
        sb.checkpoint_offset..sb.map_offset,
        sb.map_offset..sb.checkpoint_offset1,
    )
}

#[test]
fn a_cleaning_pass_during_a_checkpoint_loses_nothing_in_a_crash_there() {
    let (slots, pages) = ranges();
    for seed in 0..3 {
        scenario(Trap::Sync(1), None, seed);
        scenario(Trap::Write(pages.clone()), None, seed);
        scenario(Trap::Write(slots.clone()), None, seed);
        scenario(Trap::Sync(2), None, seed);
    }
}

#[test]
fn a_cleaning_pass_during_a_checkpoint_loses_nothing_in_a_later_crash() {
    let (_, pages) = ranges();
    for seed in 0..3 {
        for k in [0, 3, 7, 15, 40, 120, 400] {
            scenario(Trap::Write(pages.clone()), Some(k), seed);
        }
    }
}

/// Extents whose last live block is overwritten during phase 2 are still referenced by the
/// snapshot being made durable: the checkpoint must not release (or discard) them at its
/// commit. The overwrites are not flushed, so after a crash right after the commit the
/// snapshot's (flushed) values must read back from those extents.
fn freed_during_phase_2(k: u64, seed: u64) {
    let ctx = format!("power lost {k} ops after the release, seed {seed}");
    let opts = small_volume(SIZE, 32 * 1024, Codec::Lz4, 4, 64);
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let (park, prx, rtx) = Parking::new(Arc::clone(&disk));
    let vol = Arc::new(
        Volume::create_with(Box::new(Arc::clone(&park)), &opts, open_opts_sync()).expect("create"),
    );
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut exp = Expect::new(BLOCKS);
    write_some(&vol, &mut exp, &mut rng, 200);
    // A run written alone: the extents in its middle hold nothing else.
    let run = 200..400usize;
    for b in run.clone() {
        let data = mixed_block(&mut rng);
        exp.wrote(b, &data);
        vol.write((b * BS) as u64, &data, false).expect("write");
    }
    write_some(&vol, &mut exp, &mut rng, 50);
    vol.flush().expect("flush");
    exp.flushed();
    park.arm(Trap::Sync(1));
    let v = Arc::clone(&vol);
    let ckpt = std::thread::spawn(move || v.checkpoint());
    prx.recv().expect("checkpoint parked");
    // Phase 2: the whole run is overwritten (not flushed): its extents turn pending free.
    for b in run {
        let data = mixed_block(&mut rng);
        exp.wrote(b, &data);
        vol.write((b * BS) as u64, &data, false).expect("write");
    }
    disk.set_power_loss_at(disk.ops() + k);
    rtx.send(()).expect("release");
    let _ = ckpt.join().expect("checkpoint thread");
    let image = disk.crash_image(&mut rng);
    let vol2 = Volume::open(Box::new(SimStorage::from_image(image)), open_opts()).expect("reopen");
    exp.verify(&vol2, &ctx);
    match Arc::try_unwrap(vol) {
        Ok(v) => v.abandon(),
        Err(_) => panic!("{ctx}: volume still shared"),
    }
}

#[test]
fn extents_freed_during_a_checkpoint_are_not_released_by_it() {
    for seed in 0..3 {
        for k in [2, 4, 6, 8, 12, 20, 40, 100] {
            freed_during_phase_2(k, seed);
        }
    }
}
