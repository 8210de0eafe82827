//! Damage found is remembered, and damaged metadata copies are repaired (issue 26, case 4): a
//! block whose stored bytes a scrub finds bad takes the persistent damaged state (it reads EIO
//! without touching the medium, `stats()` counts it after a reopen, `check` lists it, an
//! overwrite clears it); a writable open rewrites damaged copies from the intact ones.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::Arc;
use zbd_core::{Codec, Error, SimStorage, Volume};

#[test]
fn a_block_a_scrub_finds_bad_stays_damaged_until_overwritten() {
    let opts = small_volume(1 << 20, 32768, Codec::Lz4, 4, 16);
    let (disk, vol) = sim_volume_with(&opts, open_opts_sync());
    let bad = fill(&mut SmallRng::seed_from_u64(9), Fill::Random, BS);
    let good = fill(&mut SmallRng::seed_from_u64(10), Fill::Random, BS);
    vol.write(7 * BS as u64, &bad, false).expect("write 7");
    vol.write(8 * BS as u64, &good, false).expect("write 8");
    vol.flush().expect("flush");
    vol.checkpoint().expect("checkpoint");
    // Rot one bit of block 7's stored bytes (stored raw: findable in the image).
    let image = disk.current_image();
    let at = image
        .windows(BS)
        .position(|w| w == &bad[..])
        .expect("block 7's bytes in the image");
    disk.flip_bit((at + 100) as u64, 3);
    assert_eq!(vol.stats().damaged_blocks, 0, "nothing known damaged yet");

    let report = vol.scrub(None, &|_, _| {});
    assert_eq!(report.damaged_blocks, vec![7], "{report:?}");
    assert_eq!(report.marked_damaged, 1, "{report:?}");
    assert_eq!(
        vol.stats().damaged_blocks,
        1,
        "the scrub's find is now known damage"
    );
    // Reads answer EIO from the map; the neighbour is intact.
    let reads = disk.bytes_read();
    assert!(matches!(
        read_block(&vol, 7),
        Err(Error::Corrupt { lba: 7 })
    ));
    assert_eq!(
        disk.bytes_read(),
        reads,
        "a known damaged block is not read"
    );
    assert_eq!(read_block(&vol, 8).expect("block 8"), good);
    vol.close().expect("close");
    drop(vol);

    // Persisted: a reopen (after a power cut, even) still knows it.
    let image = disk.crash_image(&mut SmallRng::seed_from_u64(1));
    let disk = Arc::new(SimStorage::from_image(image));
    let vol = Volume::open(Box::new(Arc::clone(&disk)), open_opts_sync()).expect("reopen");
    assert_eq!(vol.stats().damaged_blocks, 1);
    assert!(matches!(
        read_block(&vol, 7),
        Err(Error::Corrupt { lba: 7 })
    ));
    let check = vol.check(&|_, _| {});
    assert_eq!(check.damaged_blocks, vec![7], "{check:?}");
    // An overwrite clears it.
    vol.write(7 * BS as u64, &good, false).expect("overwrite 7");
    assert_eq!(read_block(&vol, 7).expect("block 7"), good);
    assert_eq!(vol.stats().damaged_blocks, 0);
    assert!(vol.check(&|_, _| {}).is_clean());
}

/// A damaged copy of the newest checkpoint is gone after a writable open and a close (the open
/// writes both copies of the checkpoint it starts from again, and each checkpoint after it
/// writes both copies of its slot), so a check no longer notes it.
#[test]
fn a_damaged_checkpoint_copy_is_gone_after_a_writable_open_and_close() {
    let opts = small_volume(1 << 20, 32768, Codec::Lz4, 4, 16);
    let (disk, vol) = sim_volume_with(&opts, open_opts_sync());
    vol.write(
        0,
        &fill(&mut SmallRng::seed_from_u64(1), Fill::Text, BS),
        false,
    )
    .expect("write");
    vol.close().expect("close");
    drop(vol);
    let (sb, ck) = newest_checkpoint(&disk.current_image());
    disk.flip_bit(sb.checkpoint_slot_offset(ck.seq, 1) + 40, 2);
    let noted = |disk: &Arc<SimStorage>| {
        let image = disk.current_image();
        let vol = Volume::open_read_only(Box::new(Arc::new(SimStorage::from_image(image))))
            .expect("open read-only");
        vol.check(&|_, _| {}).repaired
    };
    assert!(
        noted(&disk).iter().any(|l| l.contains("copy 1 is damaged")),
        "the damage is not seen: {:?}",
        noted(&disk)
    );
    let vol = Volume::open(Box::new(Arc::clone(&disk)), open_opts_sync()).expect("open");
    vol.close().expect("close");
    drop(vol);
    assert_eq!(
        noted(&disk),
        Vec::<String>::new(),
        "still damaged after a writable open"
    );
}

/// A damaged superblock copy (written only at create time) is written again from the intact one
/// by the next writable open; before, `check` reported it for ever.
#[test]
fn a_writable_open_rewrites_a_damaged_superblock_copy() {
    let opts = small_volume(1 << 20, 32768, Codec::Lz4, 4, 16);
    let (disk, vol) = sim_volume_with(&opts, open_opts_sync());
    vol.close().expect("close");
    drop(vol);
    disk.flip_bit(zbd_core::format::SUPERBLOCK_BYTES as u64 + 20, 1);
    let problems = |disk: &Arc<SimStorage>| {
        let image = disk.current_image();
        let vol = Volume::open_read_only(Box::new(Arc::new(SimStorage::from_image(image))))
            .expect("open read-only");
        vol.check(&|_, _| {}).metadata_problems
    };
    assert_eq!(
        problems(&disk),
        vec!["superblock copy B is damaged".to_string()]
    );
    let vol = Volume::open(Box::new(Arc::clone(&disk)), open_opts_sync()).expect("open");
    vol.close().expect("close");
    drop(vol);
    assert_eq!(
        problems(&disk),
        Vec::<String>::new(),
        "still damaged after a writable open"
    );
}
