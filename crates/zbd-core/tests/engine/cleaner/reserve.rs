//! The space reserve (`OpenOptions::space_reserve_bytes`) and writes that wait for room
//! (`Volume::write_or_wait`): a full over-committed volume must leave room for the filesystem
//! on top to replay its journal and be repaired, and a queued write must go through once the
//! host frees space. Guards against a full volume that no fsck can repair (issue 29).

use crate::common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zbd_core::{Error, OpenOptions, Volume};

/// 8 KiB extents: a 512 KiB data area is 64 extents.
const EXTENT: u64 = 8192;

/// A 4 MiB volume with a 512 KiB data area.
fn overcommitted() -> zbd_core::CreateOptions {
    zbd_core::CreateOptions {
        capacity_bytes: Some(512 * 1024),
        extent_bytes: EXTENT as u32,
        ..zbd_core::CreateOptions::new(4 << 20)
    }
}

fn with_reserve(extents: u64) -> OpenOptions {
    OpenOptions {
        space_reserve_bytes: extents * EXTENT,
        ..open_opts()
    }
}

/// Writes random blocks from `first` up until NoSpace; returns the blocks written.
fn fill(vol: &Volume, rng: &mut SmallRng, first: u64) -> Vec<(u64, Vec<u8>)> {
    let mut written = Vec::new();
    for lba in first..1024 {
        let data = crate::common::fill(rng, Fill::Random, BS);
        match vol.write(lba * BS as u64, &data, false) {
            Ok(()) => written.push((lba, data)),
            Err(Error::NoSpace) => return written,
            Err(e) => panic!("write {lba}: unexpected error {e}"),
        }
    }
    panic!("never ran out of space");
}

/// Host writes stop short of the reserve; the next open, finding the volume at its reserve,
/// lends it (writes fit again, as a journal replay needs), and earlier data is intact. Once the
/// host frees space well above the reserve it is held again.
#[test]
fn reserve_holds_back_host_writes_and_is_lent_by_the_next_open() {
    let mut rng = SmallRng::seed_from_u64(29);
    let (_, plain) = sim_volume(&overcommitted());
    let without = fill(&plain, &mut rng, 0).len();
    drop(plain);

    let (disk, vol) = sim_volume_with(&overcommitted(), with_reserve(8));
    let mut written = fill(&vol, &mut rng, 0);
    let with = written.len();
    // Each 8 KiB extent holds one raw block with its records (a segment per block at worst).
    assert!(
        with + 6 <= without,
        "the reserve of 8 extents held back only {} blocks ({with} vs {without})",
        without - with
    );
    let stats = vol.stats();
    assert_eq!(stats.reserve_bytes, 8 * EXTENT);
    assert!(!stats.reserve_lent, "lent before any reopen");
    vol.close().expect("close a full volume");
    drop(vol);

    let vol = Volume::open(Box::new(Arc::clone(&disk)), with_reserve(8)).expect("reopen");
    assert!(vol.stats().reserve_lent, "an open at the reserve lends it");
    let more = fill(&vol, &mut rng, with as u64);
    assert!(
        more.len() >= 4,
        "the lent reserve took only {} blocks",
        more.len()
    );
    written.extend(more);
    for (lba, data) in &written {
        assert_eq!(&read_block(&vol, *lba).expect("read"), data, "block {lba}");
    }
    // Freeing (nearly) everything brings free space far above the reserve: held again at the
    // next extent opened.
    vol.trim(0, 4 << 20).expect("trim");
    vol.flush().expect("flush");
    vol.checkpoint().expect("checkpoint");
    let data = crate::common::fill(&mut rng, Fill::Random, BS);
    vol.write(0, &data, false).expect("write after the trim");
    assert!(!vol.stats().reserve_lent, "the reserve is held again");
    vol.close().expect("close");
}

/// An open that does not find the volume at its reserve does not lend it.
#[test]
fn reserve_is_not_lent_when_the_volume_has_room() {
    let (disk, vol) = sim_volume_with(&overcommitted(), with_reserve(8));
    vol.write(0, &[7u8; BS], false).expect("write");
    vol.close().expect("close");
    drop(vol);
    let vol = Volume::open(Box::new(disk), with_reserve(8)).expect("reopen");
    assert!(!vol.stats().reserve_lent);
}

/// A write that waits for room goes through once the host trims (`--when-full queue`), and one
/// that no trim helps fails with NoSpace at its deadline.
#[test]
fn write_or_wait_goes_through_after_a_trim_and_gives_up_at_the_deadline() {
    let mut rng = SmallRng::seed_from_u64(30);
    let (_, vol) = sim_volume(&overcommitted());
    let written = fill(&vol, &mut rng, 0);
    let next = written.len() as u64;
    let started = Instant::now();
    let r = vol.write_or_wait(
        next * BS as u64,
        &crate::common::fill(&mut rng, Fill::Random, BS),
        false,
        Instant::now() + Duration::from_millis(300),
    );
    assert!(matches!(r, Err(Error::NoSpace)), "{r:?}");
    assert!(started.elapsed() >= Duration::from_millis(300));

    let vol = Arc::new(vol);
    let data = crate::common::fill(&mut rng, Fill::Random, BS);
    let waiting = {
        let vol = Arc::clone(&vol);
        let data = data.clone();
        std::thread::spawn(move || {
            vol.write_or_wait(
                next * BS as u64,
                &data,
                false,
                Instant::now() + Duration::from_secs(60),
            )
        })
    };
    vol.trim(0, next / 2 * BS as u64).expect("trim half");
    waiting
        .join()
        .expect("writer")
        .expect("the queued write went through after the trim");
    assert_eq!(read_block(&vol, next).expect("read"), data);
}
