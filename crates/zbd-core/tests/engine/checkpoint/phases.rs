//! The checkpoint writes and syncs outside the state lock (issues 9 and 13; docs/design.md,
//! "Concurrency and work scheduling"). A storage wrapper parks the checkpoint's thread at a
//! chosen write or sync until the test releases it: meanwhile reads, writes and flushes from
//! other threads must go on, and a crash at that point (or at any storage operation of the rest
//! of the checkpoint) must keep every flushed block, including those written during the
//! checkpoint (their sequence is above its watermark: recovery replays them from its queue).

use crate::common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::ops::Range;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use zbd_core::format::Superblock;
use zbd_core::{Codec, SimStorage, Volume};

const SIZE: u64 = 4 << 20;
const BLOCKS: usize = SIZE as usize / BS;

struct Rig {
    disk: Arc<SimStorage>,
    park: Arc<Parking>,
    parked: Receiver<()>,
    release: Sender<()>,
    vol: Arc<Volume>,
}

fn rig() -> Rig {
    // Synchronous I/O: the parked write or sync is the checkpoint thread's own call. A tiny map
    // cache: pages are evicted and faulted back while the checkpoint is in flight.
    let opts = small_volume(SIZE, 32 * 1024, Codec::Lz4, 4, 64);
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let (park, prx, rtx) = Parking::new(Arc::clone(&disk));
    let vol =
        Volume::create_with(Box::new(Arc::clone(&park)), &opts, open_opts_sync()).expect("create");
    Rig {
        disk,
        park,
        parked: prx,
        release: rtx,
        vol: Arc::new(vol),
    }
}

fn reopen(image: Vec<u8>) -> Volume {
    Volume::open(Box::new(SimStorage::from_image(image)), open_opts()).expect("reopen")
}

fn metadata_ranges(sb: &Superblock) -> (Range<u64>, Range<u64>) {
    // Copy 0: checkpoint slots, then map pages and extent-table pages.
    (
        sb.checkpoint_offset..sb.map_offset,
        sb.map_offset..sb.checkpoint_offset1,
    )
}

#[test]
fn reads_writes_and_faults_go_on_while_a_checkpoint_syncs() {
    let r = rig();
    let mut rng = SmallRng::seed_from_u64(9);
    let mut exp = Expect::new(BLOCKS);
    write_some(&r.vol, &mut exp, &mut rng, 800);
    r.vol.flush().expect("flush");
    exp.flushed();
    // Dirty map pages for the checkpoint to write.
    write_some(&r.vol, &mut exp, &mut rng, 40);
    for sync in 1..=2 {
        r.park.arm(Trap::Sync(sync));
        let vol = Arc::clone(&r.vol);
        let ckpt = std::thread::spawn(move || vol.checkpoint());
        r.parked.recv().expect("checkpoint parked");
        // The checkpoint's sync `sync` is parked: every block reads back (map pages are faulted
        // in and evicted: the cache holds four), and writes go on.
        let vol = Arc::clone(&r.vol);
        let durable = exp.durable.clone();
        let since = exp.since.clone();
        must_finish("a read", move || {
            let mut buf = vec![0u8; BS];
            for b in 0..BLOCKS {
                vol.read((b * BS) as u64, &mut buf).expect("read");
                assert!(
                    buf == durable[b] || since[b].last() == Some(&buf),
                    "block {b}"
                );
            }
        });
        let vol = Arc::clone(&r.vol);
        let mut wrng = SmallRng::seed_from_u64(100 + u64::from(sync));
        let mut e2 = Expect::new(BLOCKS);
        let writes = must_finish("a write", move || {
            write_some(&vol, &mut e2, &mut wrng, 20);
            e2.since
        });
        for (b, s) in writes.into_iter().enumerate() {
            for d in s {
                exp.wrote(b, &d);
            }
        }
        r.release.send(()).expect("release");
        ckpt.join().expect("checkpoint thread").expect("checkpoint");
    }
    r.vol.flush().expect("flush");
    exp.flushed();
    let image = r.disk.crash_image(&mut rng);
    let vol2 = reopen(image);
    exp.verify(&vol2, "after checkpoints with parked syncs");
}

/// One scenario: park the checkpoint at `trap`, write (and flush when the parked call is not a
/// sync, which would hold the sync of the flush) from this thread, then crash: right there, or
/// after `lose_after` more storage operations of the released checkpoint.
fn crash_during_checkpoint(trap: Trap, lose_after: Option<u64>, seed: u64) {
    let ctx = format!("trap {trap:?}, power lost after {lose_after:?} more ops, seed {seed}");
    let r = rig();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut exp = Expect::new(BLOCKS);
    write_some(&r.vol, &mut exp, &mut rng, 600);
    r.vol.flush().expect("flush");
    exp.flushed();
    // Overwrites: the checkpoint releases extents and writes map pages.
    write_some(&r.vol, &mut exp, &mut rng, 60);
    let parks_sync = matches!(trap, Trap::Sync(_));
    r.park.arm(trap);
    let vol = Arc::clone(&r.vol);
    let ckpt = std::thread::spawn(move || vol.checkpoint());
    r.parked.recv().expect("checkpoint parked");
    // During phase 2: writes above the checkpoint's watermark, overwrites of blocks it covers,
    // trims, and a flush that makes them durable before the checkpoint is.
    write_some(&r.vol, &mut exp, &mut rng, 80);
    let b = rng.random_range(0..BLOCKS - 4);
    r.vol
        .trim((b * BS) as u64, 4 * BS as u64)
        .expect("trim during the checkpoint");
    for i in b..b + 4 {
        exp.wrote(i, &[0u8; BS]);
    }
    if !parks_sync {
        r.vol.flush().expect("flush during the checkpoint");
        exp.flushed();
    }
    match lose_after {
        None => {
            // Crash with the checkpoint parked.
            let image = r.disk.crash_image(&mut rng);
            r.release.send(()).expect("release");
            ckpt.join().expect("checkpoint thread").expect("checkpoint");
            let vol2 = reopen(image);
            exp.verify(&vol2, &ctx);
        }
        Some(k) => {
            r.disk.set_power_loss_at(r.disk.ops() + k);
            r.release.send(()).expect("release");
            let done = ckpt.join().expect("checkpoint thread");
            // Writes and a flush after the checkpoint (or its failure).
            let more = (0..30).map(|_| (rng.random_range(0..BLOCKS), mixed_block(&mut rng)));
            let mut ok = true;
            for (b, data) in more.collect::<Vec<_>>() {
                exp.wrote(b, &data);
                if r.vol.write((b * BS) as u64, &data, false).is_err() {
                    ok = false;
                    break;
                }
            }
            if ok && done.is_ok() && r.vol.flush().is_ok() {
                exp.flushed();
            }
            let image = r.disk.crash_image(&mut rng);
            let vol2 = reopen(image);
            exp.verify(&vol2, &ctx);
        }
    }
    // The volume the test crashed is dropped without writing more (a crashed process).
    match Arc::try_unwrap(r.vol) {
        Ok(v) => v.abandon(),
        Err(_) => panic!("{ctx}: volume still shared"),
    }
}

#[test]
fn flushed_writes_during_a_checkpoint_survive_a_crash_in_it() {
    let r = rig();
    let (ckpt_slots, pages) = metadata_ranges(r.vol.superblock());
    drop(r);
    for seed in 0..4 {
        // Before the first sync (segments issued, pages written), writing pages, writing the
        // checkpoint (first sync done), before the last sync.
        crash_during_checkpoint(Trap::Sync(1), None, seed);
        crash_during_checkpoint(Trap::Write(pages.clone()), None, seed);
        crash_during_checkpoint(Trap::Write(ckpt_slots.clone()), None, seed);
        crash_during_checkpoint(Trap::Sync(2), None, seed);
    }
}

#[test]
fn a_crash_at_any_operation_after_the_parked_point_keeps_flushed_writes() {
    let r = rig();
    let (_, pages) = metadata_ranges(r.vol.superblock());
    drop(r);
    for k in 0..40 {
        crash_during_checkpoint(Trap::Write(pages.clone()), Some(k), 100 + k);
    }
}

/// The encoded map pages a checkpoint holds from its snapshot to its commit count in the map
/// cache budget (issue 9: they came on top of it, 8 MiB more at the 2048-page cap): while a
/// checkpoint of many dirty pages is parked, reads fault in every page of the map, and the cache
/// keeps that much room free.
#[test]
fn a_checkpoint_in_flight_counts_its_pages_in_the_map_cache_budget() {
    // Pinned pages (the snapshot's, still resident) and the snapshot's encoded copies fit in
    // the budget together: room is left for clean pages.
    const BUDGET: usize = 200;
    const DIRTY: u64 = 60;
    let size: u64 = 512 << 20;
    let per_page = zbd_core::format::MAP_ENTRIES_PER_PAGE as u64;
    let frame = per_page as usize * std::mem::size_of::<zbd_core::format::MapEntry>() + 64;
    let opts = zbd_core::CreateOptions {
        capacity_bytes: Some(16 << 20),
        ..small_volume(size, 64 * 1024, Codec::Lz4, 1, 64)
    };
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let (park, parked, release) = Parking::new(Arc::clone(&disk));
    let open = zbd_core::OpenOptions {
        map_cache_bytes: BUDGET * frame,
        ..open_opts_sync()
    };
    let vol =
        Arc::new(Volume::create_with(Box::new(Arc::clone(&park)), &opts, open).expect("create"));
    let pages = (size / BS as u64).div_ceil(per_page);
    assert!(
        pages > 2 * BUDGET as u64,
        "the map is larger than the cache"
    );
    let block = |lba: u64, v: u8| {
        let mut b = vec![v; BS];
        b[..8].copy_from_slice(&lba.to_le_bytes());
        b
    };
    // One block in every page, made durable (the pages are clean, read on demand), then again
    // in `DIRTY` pages (below the 64 pages that bring a checkpoint forward).
    for p in 0..pages {
        let lba = p * per_page;
        vol.write(lba * BS as u64, &block(lba, 1), false)
            .expect("write");
    }
    vol.checkpoint().expect("checkpoint");
    for p in 0..DIRTY {
        let lba = p * per_page;
        vol.write(lba * BS as u64, &block(lba, 2), false)
            .expect("write");
    }
    assert_eq!(vol.stats().map_cache.dirty_pages, DIRTY);
    park.arm(Trap::Sync(1));
    let v = Arc::clone(&vol);
    let ckpt = std::thread::spawn(move || v.checkpoint());
    parked.recv().expect("checkpoint parked");
    // Its pages are written, the sync after them is parked: fault in every page of the map.
    let v = Arc::clone(&vol);
    let most = must_finish("reads", move || {
        let mut buf = vec![0u8; BS];
        let mut most = 0;
        for p in 0..pages {
            let lba = p * per_page;
            v.read(lba * BS as u64, &mut buf).expect("read");
            let want = block(lba, if p < DIRTY { 2 } else { 1 });
            assert!(buf == want, "page {p}");
            most = most.max(v.stats().map_cache.resident_pages);
        }
        most
    });
    let held = (DIRTY as usize * zbd_core::format::MAP_PAGE_BYTES).div_ceil(frame) as u64;
    let stats = vol.stats().map_cache;
    assert!(
        stats.faults >= pages - BUDGET as u64,
        "pages were read: {stats:?}"
    );
    assert!(
        most + held <= BUDGET as u64,
        "{most} pages resident + {held} pages' worth of snapshot > budget {BUDGET}"
    );
    assert_eq!(stats.reserved_pages, held, "{stats:?}");
    release.send(()).expect("release");
    ckpt.join().expect("checkpoint thread").expect("checkpoint");
    let stats = vol.stats().map_cache;
    assert_eq!(
        (stats.reserved_pages, stats.dirty_pages),
        (0, 0),
        "{stats:?}"
    );
    assert!(stats.resident_pages <= BUDGET as u64, "{stats:?}");
}

/// A writer that cleans ahead of running out of space (`Volume::clean_ahead`: cleaning passes
/// and the checkpoints that free their victims, with the state lock released in between) while
/// another thread reads: no read returns data older than the last write of its block that
/// returned before the read started, nor newer than the last one started before it returned
/// (every block carries its version; a tiny map cache faults pages in all along). Not a parking
/// test: a pass commit that finds the allocation queue empty still checkpoints under the lock.
#[test]
fn reads_during_clean_ahead_return_the_latest_data() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    // Data area about the size of the logical space: overwrites soon need the cleaner.
    let opts = small_volume(SIZE, 32 * 1024, Codec::Lz4, 1, 64);
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let vol = Arc::new(
        Volume::create_with(Box::new(Arc::clone(&disk)), &opts, open_opts_sync()).expect("create"),
    );
    // Block b, version v: random (stored raw) after a header naming both.
    let block = |b: usize, v: u64, rng: &mut SmallRng| {
        let mut d = fill(rng, Fill::Random, BS);
        d[..8].copy_from_slice(&(b as u64).to_le_bytes());
        d[8..16].copy_from_slice(&v.to_le_bytes());
        d
    };
    let live = BLOCKS * 3 / 4;
    let mut rng = SmallRng::seed_from_u64(21);
    for b in 0..live {
        vol.write((b * BS) as u64, &block(b, 1, &mut rng), false)
            .expect("write");
    }
    // Per block: versions started and completed.
    let started: Arc<Vec<AtomicU64>> = Arc::new((0..live).map(|_| AtomicU64::new(1)).collect());
    let completed: Arc<Vec<AtomicU64>> = Arc::new((0..live).map(|_| AtomicU64::new(1)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let cleaned_before = vol.stats().counters.cleaner_runs;
    let (v, s, c, st) = (
        Arc::clone(&vol),
        Arc::clone(&started),
        Arc::clone(&completed),
        Arc::clone(&stop),
    );
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; BS];
        let mut rrng = SmallRng::seed_from_u64(5);
        let mut reads = 0u64;
        while !st.load(Ordering::SeqCst) || reads < 1000 {
            let b = rrng.random_range(0..live);
            let lo = c[b].load(Ordering::SeqCst);
            v.read((b * BS) as u64, &mut buf).expect("read");
            let hi = s[b].load(Ordering::SeqCst);
            let got = u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes"));
            assert_eq!(
                u64::from_le_bytes(buf[..8].try_into().expect("8")),
                b as u64
            );
            assert!(
                (lo..=hi).contains(&got),
                "block {b}: version {got}, expected {lo}..={hi}"
            );
            reads += 1;
        }
    });
    let mut latest = vec![1u64; live];
    for _ in 0..3000 {
        let b = rng.random_range(0..live);
        let ver = latest[b] + 1;
        started[b].store(ver, Ordering::SeqCst);
        vol.write((b * BS) as u64, &block(b, ver, &mut rng), false)
            .expect("write");
        completed[b].store(ver, Ordering::SeqCst);
        latest[b] = ver;
    }
    stop.store(true, Ordering::SeqCst);
    reader.join().expect("reader");
    assert!(
        vol.stats().counters.cleaner_runs > cleaned_before,
        "the writes needed the cleaner"
    );
    vol.flush().expect("flush");
    let image = disk.crash_image(&mut rng);
    let vol2 = reopen(image);
    let mut buf = vec![0u8; BS];
    for (b, &ver) in latest.iter().enumerate() {
        vol2.read((b * BS) as u64, &mut buf).expect("read");
        let got = u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes"));
        assert_eq!(got, ver, "block {b} after reopen");
    }
}

/// What a flush and a checkpoint cost in device syncs (issue 30: a FLUSH after a FUA write, or
/// an idle file system's periodic flush, paid a second device flush for nothing). A flush syncs
/// only when something was recorded since the last sync that succeeded, including a trim that
/// only extends a record; a checkpoint syncs twice. After a crash every flushed block, and the
/// trimmed range, read back as flushed.
#[test]
fn a_flush_syncs_only_what_is_new_and_a_checkpoint_syncs_twice() {
    let r = rig();
    let mut rng = SmallRng::seed_from_u64(30);
    let mut exp = Expect::new(BLOCKS);
    write_some(&r.vol, &mut exp, &mut rng, 100);
    let syncs = r.disk.syncs();
    r.vol.flush().expect("flush");
    exp.flushed();
    assert_eq!(r.disk.syncs(), syncs + 1, "a flush after writes syncs");
    r.vol.flush().expect("flush");
    assert_eq!(r.disk.syncs(), syncs + 1, "a flush with nothing new");
    let data = mixed_block(&mut rng);
    r.vol.write(3 * BS as u64, &data, true).expect("FUA write");
    exp.wrote(3, &data);
    exp.flushed();
    let syncs = r.disk.syncs();
    r.vol.flush().expect("flush after a FUA write");
    assert_eq!(r.disk.syncs(), syncs, "a flush right after a FUA write");
    // A trim, then one extending its record (no new sequence): both must reach the disk.
    r.vol.trim(10 * BS as u64, 2 * BS as u64).expect("trim");
    r.vol.trim(12 * BS as u64, 2 * BS as u64).expect("trim");
    for b in 10..14 {
        exp.wrote(b, &[0u8; BS]);
    }
    r.vol.flush().expect("flush after trims");
    exp.flushed();
    assert_eq!(r.disk.syncs(), syncs + 1, "a flush after trims syncs");
    write_some(&r.vol, &mut exp, &mut rng, 20);
    let syncs = r.disk.syncs();
    r.vol.checkpoint().expect("checkpoint");
    assert_eq!(r.disk.syncs(), syncs + 2, "a checkpoint syncs twice");
    exp.flushed();
    r.vol.flush().expect("flush after a checkpoint");
    assert_eq!(
        r.disk.syncs(),
        syncs + 2,
        "a checkpoint covers what it sealed"
    );
    let image = r.disk.crash_image(&mut rng);
    exp.verify(&reopen(image), "crash after the flushes");
}
