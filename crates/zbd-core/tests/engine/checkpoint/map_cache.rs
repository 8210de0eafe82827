//! Checkpoints and the map cache: a checkpoint whose snapshot is larger than the whole cache
//! keeps reads fresh and flushed writes durable, and a failed shared metadata write below the
//! I/O queue fails the checkpoint instead of committing it.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use zbd_core::{Codec, SimStorage, Volume};

/// The value a block reads now: the last written since the flush, else the flushed one.
fn latest(exp: &Expect, b: usize) -> &[u8] {
    exp.since[b].last().unwrap_or(&exp.durable[b])
}

/// Hypothesis: while a checkpoint whose snapshot is larger than the whole map cache is in
/// flight (its reservation leaves room for one page), pages evicted to make that room and
/// faulted back from their old slot, whole-page trims of pages that are not resident (summary
/// only), and pages of the snapshot dirtied again, make a read return an older value, or the
/// commit install the wrong slot or summary, so that a crash there or after loses a flushed
/// write or brings back older data.
fn crash_with_a_snapshot_larger_than_the_cache(trap: Trap, lose_after: Option<u64>, seed: u64) {
    const SIZE: u64 = 16 << 20;
    const BLOCKS: usize = SIZE as usize / BS;
    let per_page = zbd_core::format::MAP_ENTRIES_PER_PAGE;
    let pages = BLOCKS.div_ceil(per_page);
    let ctx = format!("trap {trap:?}, power lost after {lose_after:?} more ops, seed {seed}");
    let opts = small_volume(SIZE, 32 * 1024, Codec::Lz4, 2, 64);
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let (park, parked, release) = Parking::new(Arc::clone(&disk));
    // Synchronous I/O: the parked call is the checkpoint thread's own. Four map pages of cache.
    let vol = Arc::new(
        Volume::create_with(Box::new(Arc::clone(&park)), &opts, open_opts_sync()).expect("create"),
    );
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut exp = Expect::new(BLOCKS);
    let write = |vol: &Volume, exp: &mut Expect, rng: &mut SmallRng, b: usize| {
        let data = mixed_block(rng);
        exp.wrote(b, &data);
        vol.write((b * BS) as u64, &data, false).expect("write");
    };
    // Blocks in every page, made durable (pages clean and read on demand from now on).
    for p in 0..pages {
        for _ in 0..3 {
            let b = (p * per_page + rng.random_range(0..per_page)).min(BLOCKS - 1);
            write(&vol, &mut exp, &mut rng, b);
        }
    }
    vol.flush().expect("flush");
    vol.checkpoint().expect("checkpoint");
    exp.flushed();
    // Every page dirty again: the snapshot holds all of them, far more than the cache's 4.
    for p in 0..pages {
        let b = (p * per_page + rng.random_range(0..per_page)).min(BLOCKS - 1);
        write(&vol, &mut exp, &mut rng, b);
    }
    let parks_sync = matches!(trap, Trap::Sync(_));
    park.arm(trap);
    let v = Arc::clone(&vol);
    let ckpt = std::thread::spawn(move || v.checkpoint());
    parked.recv().expect("checkpoint parked");
    let stats = vol.stats().map_cache;
    assert!(
        stats.reserved_pages >= stats.budget_pages,
        "{ctx}: the snapshot outgrows the cache: {stats:?}"
    );
    let check_all = |exp: &Expect, what: &str| {
        let mut buf = vec![0u8; BS];
        for b in 0..BLOCKS {
            vol.read((b * BS) as u64, &mut buf)
                .unwrap_or_else(|e| panic!("{ctx}: {what}: block {b}: {e}"));
            assert!(buf == latest(exp, b), "{ctx}: {what}: block {b} stale");
        }
    };
    // Phase 2: every page faulted in and out, twice around.
    check_all(&exp, "reads during the checkpoint");
    // Whole-page trims (summary only when the page is not resident), of a page of the snapshot
    // and of the last page (partial), then writes into some of those pages again.
    for p in [1, pages / 2, pages - 1] {
        let first = p * per_page;
        let n = per_page.min(BLOCKS - first);
        vol.trim((first * BS) as u64, (n * BS) as u64)
            .expect("trim during the checkpoint");
        for b in first..first + n {
            exp.wrote(b, &[0u8; BS]);
        }
    }
    write(&vol, &mut exp, &mut rng, pages / 2 * per_page + 5);
    for _ in 0..60 {
        let b = rng.random_range(0..BLOCKS);
        write(&vol, &mut exp, &mut rng, b);
    }
    if !parks_sync {
        vol.flush().expect("flush during the checkpoint");
        exp.flushed();
    }
    check_all(&exp, "reads after trims during the checkpoint");
    let image = match lose_after {
        None => {
            let image = disk.crash_image(&mut rng);
            release.send(()).expect("release");
            ckpt.join().expect("checkpoint thread").expect("checkpoint");
            check_all(&exp, "reads after the commit");
            image
        }
        Some(k) => {
            disk.set_power_loss_at(disk.ops() + k);
            release.send(()).expect("release");
            let done = ckpt.join().expect("checkpoint thread");
            if done.is_ok() {
                check_all(&exp, "reads after the commit");
            }
            let mut ok = done.is_ok();
            for _ in 0..30 {
                let b = rng.random_range(0..BLOCKS);
                let data = mixed_block(&mut rng);
                exp.wrote(b, &data);
                if vol.write((b * BS) as u64, &data, false).is_err() {
                    ok = false;
                    break;
                }
            }
            if ok && vol.flush().is_ok() {
                exp.flushed();
            }
            disk.crash_image(&mut rng)
        }
    };
    let vol2 = Volume::open(Box::new(SimStorage::from_image(image)), open_opts()).expect("reopen");
    exp.verify(&vol2, &ctx);
    match Arc::try_unwrap(vol) {
        Ok(v) => v.abandon(),
        Err(_) => panic!("{ctx}: volume still shared"),
    }
}

fn metadata_ranges(sb: &zbd_core::format::Superblock) -> (Range<u64>, Range<u64>) {
    // Copy 0: checkpoint slots, then map pages and extent-table pages.
    (
        sb.checkpoint_offset..sb.map_offset,
        sb.map_offset..sb.checkpoint_offset1,
    )
}

#[test]
fn a_snapshot_larger_than_the_map_cache_keeps_reads_fresh_and_flushed_writes() {
    let sb = zbd_core::layout::plan(&small_volume(16 << 20, 32 * 1024, Codec::Lz4, 2, 64))
        .expect("plan");
    let (ckpt_slots, pages) = metadata_ranges(&sb);
    for seed in 0..2 {
        crash_with_a_snapshot_larger_than_the_cache(Trap::Sync(1), None, seed);
        crash_with_a_snapshot_larger_than_the_cache(Trap::Write(pages.clone()), None, seed);
        crash_with_a_snapshot_larger_than_the_cache(Trap::Write(ckpt_slots.clone()), None, seed);
        crash_with_a_snapshot_larger_than_the_cache(Trap::Sync(2), None, seed);
    }
    for k in [0, 1, 2, 3, 5, 8, 13, 21, 34] {
        crash_with_a_snapshot_larger_than_the_cache(Trap::Write(pages.clone()), Some(k), 50 + k);
    }
}

/// Hypothesis: a map page or checkpoint write the I/O queue holds as the caller's shared buffer
/// (`write_shared`) fails below the queue and the checkpoint still commits (its sync does not
/// see the error, or another sync took it), or the volume keeps writing; a crash then loses
/// flushed data. Expected: the checkpoint fails, the volume stops writing, and the disk
/// reopens with every flushed block.
#[test]
fn a_failed_shared_metadata_write_fails_the_checkpoint_and_loses_nothing() {
    const SIZE: u64 = 4 << 20;
    const BLOCKS: usize = SIZE as usize / BS;
    for (mode, io) in IO_MODES {
        for target in ["pages", "checkpoint"] {
            let ctx = format!("{mode}, failed write of the {target}");
            let opts = small_volume(SIZE, 32 * 1024, Codec::Lz4, 4, 64);
            let sb = zbd_core::layout::plan(&opts).expect("plan");
            let (ckpt_slots, pages) = metadata_ranges(&sb);
            let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
            let store = Arc::new(FailWriteIn {
                disk: Arc::clone(&disk),
                range: Mutex::new(None),
            });
            let vol =
                Volume::create_with(Box::new(Arc::clone(&store)), &opts, open_opts_with(io()))
                    .expect("create");
            let mut rng = SmallRng::seed_from_u64(5);
            let mut exp = Expect::new(BLOCKS);
            write_some(&vol, &mut exp, &mut rng, 300);
            vol.flush().expect("flush");
            exp.flushed();
            write_some(&vol, &mut exp, &mut rng, 100);
            *store.range.lock().expect("lock") = Some(if target == "pages" {
                pages.clone()
            } else {
                ckpt_slots.clone()
            });
            let c = vol.checkpoint();
            assert!(
                store.range.lock().expect("lock").is_none(),
                "{ctx}: the fault never fired"
            );
            assert!(
                c.is_err(),
                "{ctx}: the checkpoint succeeded over a failed write"
            );
            assert!(vol.stats().failed.is_some(), "{ctx}: the volume goes on");
            assert!(vol.flush().is_err(), "{ctx}: a flush after it");
            assert!(
                vol.write(0, &[7u8; BS], false).is_err(),
                "{ctx}: a write after it"
            );
            drop(vol);
            let image = disk.crash_image(&mut rng);
            let vol2 =
                Volume::open(Box::new(SimStorage::from_image(image)), open_opts()).expect("reopen");
            exp.verify(&vol2, &ctx);
        }
    }
}
