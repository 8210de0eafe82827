//! Checkpoints a write asks for, written by the volume's background thread (the write returns
//! at once). A simulated disk parks the checkpoint at its slot write (common/parking.rs) to hold
//! it between its phases while writes, flushes, failed syncs, crashes and close happen around
//! it; sampled crashes and failed syncs run a random workload beside the background thread.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::Duration;
use zbd_core::{Codec, CreateOptions, Error, IoOptions, OpenOptions, SimStorage, Volume};

pub(crate) const SIZE: u64 = 1 << 20;
const BLOCKS: usize = SIZE as usize / BS;
/// The background thread's name (handle.rs).
const BACKGROUND: &str = "zbd-cleaner";

/// Roomy (the cleaner never runs), incompressible blocks fill an extent every 7 writes, and a
/// queue of 32 asks for its refill with 4 extents left (`buffer::refill_at`): a few writes
/// still go on beside the checkpoint, later ones wait for it (`wait_for_queue_refill`).
pub(crate) fn create_opts() -> CreateOptions {
    small_volume(SIZE, 32768, Codec::Lz4, 4, 32)
}

/// The test options (synchronous I/O: a parked call parks the thread that made it) with or
/// without the background thread.
pub(crate) fn open_with(background: bool) -> OpenOptions {
    OpenOptions {
        background_cleaner: background,
        ..open_opts_sync()
    }
}

/// Incompressible block number `tag`.
fn block(tag: u64) -> Vec<u8> {
    fill(&mut SmallRng::seed_from_u64(tag), Fill::Random, BS)
}

struct Rig {
    disk: Arc<SimStorage>,
    park: Arc<Parking>,
    parked: std::sync::mpsc::Receiver<()>,
    release: std::sync::mpsc::Sender<()>,
    vol: Arc<Volume>,
}

/// A fresh volume on a parking disk, its trap armed at the first write into a checkpoint slot
/// (copy 0): a checkpoint parks there with its segments and map pages synced, before its root.
fn rig(background: bool) -> Rig {
    let opts = create_opts();
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let (park, parked, release) = Parking::new(Arc::clone(&disk));
    let vol = Volume::create_with(Box::new(Arc::clone(&park)), &opts, open_with(background))
        .expect("create");
    let slots = ckpt_slots(vol.superblock());
    park.arm(Trap::Write(slots));
    Rig {
        disk,
        park,
        parked,
        release,
        vol: Arc::new(vol),
    }
}

fn ckpt_slots(sb: &zbd_core::format::Superblock) -> Range<u64> {
    sb.checkpoint_offset..sb.map_offset
}

fn reopen(image: Vec<u8>, background: bool) -> Volume {
    Volume::open(
        Box::new(Arc::new(SimStorage::from_image(image))),
        open_with(background),
    )
    .expect("reopen")
}

/// Without the background thread: the write that asks for the refill of the allocation queue
/// writes the checkpoint itself. Returns how many single-block writes (block k at LBA k) it
/// takes until one asks, the thread that wrote the checkpoint, and checks that everything reads
/// back after a clean close.
fn writes_until_a_checkpoint_is_asked() -> (usize, Option<String>) {
    let r = rig(false);
    let started = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (vol, started, stop) = (Arc::clone(&r.vol), Arc::clone(&started), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("writer".into())
            .spawn(move || {
                for k in 0..BLOCKS {
                    if stop.load(Ordering::SeqCst) {
                        return k;
                    }
                    started.store(k + 1, Ordering::SeqCst);
                    vol.write((k * BS) as u64, &block(k as u64), false)
                        .expect("write");
                }
                BLOCKS
            })
            .expect("spawn")
    };
    r.parked
        .recv_timeout(STUCK)
        .expect("no checkpoint in a queue's worth of writes");
    let n = started.load(Ordering::SeqCst);
    let by = r.park.parked_by();
    stop.store(true, Ordering::SeqCst);
    r.release.send(()).expect("release");
    let written = writer.join().expect("writer");
    r.vol.close().expect("close");
    let vol = reopen(r.disk.current_image(), false);
    for k in 0..written {
        assert_eq!(read_block(&vol, k as u64).expect("read"), block(k as u64));
    }
    (n, by)
}

/// Writes the last `n` blocks and flushes, beside the parked checkpoint: both must succeed.
fn write_last_blocks_and_flush(r: &Rig, exp: &mut Expect, n: u64) {
    for i in 0..n {
        let b = BLOCKS - 1 - i as usize;
        let d = block(1000 + i);
        exp.wrote(b, &d);
        r.vol.write((b * BS) as u64, &d, false).expect("write");
    }
    r.vol
        .flush()
        .expect("a flush beside the checkpoint in flight");
    exp.flushed();
}

/// A volume with its background thread whose first `n` writes (see
/// [`writes_until_a_checkpoint_is_asked`]) asked for a checkpoint, and that checkpoint parked
/// at its root write by the background thread (the writes all returned).
fn background_checkpoint_parked(n: usize) -> (Rig, Expect) {
    let r = rig(true);
    let mut exp = Expect::new(BLOCKS);
    let vol = Arc::clone(&r.vol);
    let first: Vec<(usize, Vec<u8>)> = (0..n).map(|k| (k, block(k as u64))).collect();
    for (k, d) in &first {
        exp.wrote(*k, d);
    }
    // The last one asks. They must all return with the checkpoint not yet written (it parks at
    // its root write, which the writing thread would wait for).
    must_finish("the writes that ask for a checkpoint", move || {
        for (k, d) in first {
            vol.write((k * BS) as u64, &d, false).expect("write");
        }
    });
    r.parked
        .recv_timeout(STUCK)
        .expect("the background thread never wrote the checkpoint asked for");
    assert_eq!(
        r.park.parked_by().as_deref(),
        Some(BACKGROUND),
        "the checkpoint was not written by the background thread"
    );
    (r, exp)
}

/// How many writes ask for the first checkpoint (the same on every volume of `create_opts`).
fn asking_writes() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| writes_until_a_checkpoint_is_asked().0)
}

/// The old synchronous path (volumes opened without the background thread) and the new one:
/// the same writes ask for the checkpoint; without the thread the asking write writes it, with
/// it the thread does while the write has returned. Held between its phases (root not yet
/// written), writes and a flush go on; a crash there keeps every flushed block; the writes
/// after the flush that ask for more than the queue holds wait for the checkpoint (none may go
/// to an extent the durable checkpoint does not queue, or recovery would not find it).
#[test]
fn the_background_thread_writes_the_checkpoint_a_write_asks_for() {
    let (n, by) = writes_until_a_checkpoint_is_asked();
    assert_eq!(
        by.as_deref(),
        Some("writer"),
        "without the background thread the asking write writes the checkpoint"
    );
    assert!(n > 16, "the queue asked for its refill after {n} writes");

    let (r, mut exp) = background_checkpoint_parked(n);
    // Checkpoint in flight (segments and map pages synced, root not written): writes and a
    // flush go on, and a crash now keeps every flushed block.
    let mut rng = SmallRng::seed_from_u64(4);
    write_last_blocks_and_flush(&r, &mut exp, 5);
    let d = block(2000);
    exp.wrote(0, &d);
    r.vol.write(0, &d, false).expect("write");
    let vol2 = reopen(r.disk.crash_image(&mut rng), false);
    exp.verify(
        &vol2,
        "crash with the background checkpoint parked before its root",
    );
    drop(vol2);

    // A writer that needs more extents than the queue has left must wait for the checkpoint:
    // while it is parked, nothing may be written into an extent the durable checkpoint (the
    // one recovery starts from) does not queue.
    let sb = r.vol.superblock().clone();
    let (_, durable) = newest_checkpoint(&r.disk.current_image());
    let queued: Vec<u32> = durable.queue.iter().map(|q| q.extent).collect();
    let outside: Vec<Range<u64>> = (0..sb.extent_count)
        .filter(|e| !queued.contains(e))
        .map(|e| {
            let at = sb.extent_offset(e);
            at..at + u64::from(sb.extent_bytes)
        })
        .collect();
    let (seen_tx, seen_rx) = channel();
    r.park.watch_writes(outside, seen_tx);
    let more: Vec<(usize, Vec<u8>)> = (0..3 * 32 * 7)
        .map(|i| (rng.random_range(0..BLOCKS), block(3000 + i as u64)))
        .collect();
    for (b, d) in &more {
        exp.wrote(*b, d);
    }
    let (done_tx, done_rx) = channel();
    let vol = Arc::clone(&r.vol);
    let writer = std::thread::spawn(move || {
        for (b, d) in more {
            vol.write((b * BS) as u64, &d, false).expect("write");
        }
        vol.flush().expect("flush");
        let _ = done_tx.send(());
    });
    // Not a synchronisation: a correct engine makes the writer wait for the release, and this
    // only bounds how long the test looks for a writer that does not.
    match done_rx.recv_timeout(Duration::from_secs(2)) {
        Ok(()) => panic!("three queues' worth of writes finished with the refill parked"),
        Err(_) => assert!(
            seen_rx.try_recv().is_err(),
            "a write went to an extent outside the durable checkpoint's queue"
        ),
    }
    r.release.send(()).expect("release");
    writer.join().expect("writer");
    assert!(
        seen_rx.try_recv().is_ok(),
        "the watch never fired: the writer did not need fresh extents"
    );
    exp.flushed();
    let vol2 = reopen(r.disk.crash_image(&mut rng), true);
    exp.verify(&vol2, "crash after the refill");
    drop(vol2);
    r.vol.close().expect("close");
    let vol2 = reopen(r.disk.current_image(), true);
    exp.verify(&vol2, "after a clean close");
}

/// The last sync of a background checkpoint fails the Linux way (writes since the previous sync
/// may be dropped, the next sync would succeed). No caller sees that error: the fence must fail
/// every later flush, FUA write, write, trim and checkpoint, reads go on, and after a crash
/// every block flushed before the failure reads back.
#[test]
fn a_failed_sync_of_a_background_checkpoint_fails_every_later_flush_and_write() {
    let (r, mut exp) = background_checkpoint_parked(asking_writes());
    write_last_blocks_and_flush(&r, &mut exp, 4);
    // The checkpoint's next sync (its last, after the root) parks, then fails.
    r.park.arm(Trap::Sync(1));
    r.release.send(()).expect("release the root write");
    r.parked
        .recv_timeout(STUCK)
        .expect("the checkpoint's last sync");
    assert_eq!(r.park.parked_by().as_deref(), Some(BACKGROUND));
    r.disk.fail_sync_at(r.disk.ops(), 7);
    // Acknowledged before the failure, never flushed: may or may not survive.
    let d = block(5000);
    exp.wrote(1, &d);
    r.vol
        .write(BS as u64, &d, false)
        .expect("a write before the failure");
    r.release.send(()).expect("release the sync");
    // Syncs run one at a time: this flush's sync comes after the failed one.
    let e = r
        .vol
        .flush()
        .expect_err("a flush after a failed background sync");
    assert!(matches!(e, Error::Failed(_)), "{e}");
    assert_eq!(
        r.disk.sync_failures(),
        1,
        "the checkpoint's sync did not fail"
    );
    let d2 = block(6000);
    assert!(matches!(
        r.vol.write(2 * BS as u64, &d2, false),
        Err(Error::Failed(_))
    ));
    assert!(matches!(
        r.vol.write(2 * BS as u64, &d2, true),
        Err(Error::Failed(_))
    ));
    assert!(matches!(
        r.vol.trim(3 * BS as u64, BS as u64),
        Err(Error::Failed(_))
    ));
    assert!(matches!(r.vol.checkpoint(), Err(Error::Failed(_))));
    let failed = r.vol.stats().failed.expect("stats shows the failed state");
    assert!(failed.contains("sync"), "{failed}");
    // Reads go on, with the latest data.
    assert_eq!(read_block(&r.vol, 1).expect("read"), d);
    assert_eq!(read_block(&r.vol, 2).expect("read"), block(2));
    assert!(
        r.vol.close().is_err(),
        "a failed volume cannot close cleanly"
    );
    let image = r.disk.crash_image(&mut SmallRng::seed_from_u64(8));
    match Arc::try_unwrap(r.vol) {
        Ok(v) => v.abandon(),
        Err(_) => panic!("volume still shared"),
    }
    let vol2 = reopen(image, true);
    exp.verify(&vol2, "crash after a failed background sync");
    vol2.write(2 * BS as u64, &d2, true)
        .expect("writable again after reopening");
}

/// close() or drop while the background thread's checkpoint is in flight: both wait for it
/// and write the final checkpoint; nothing reaches the disk after close returned (not from the
/// background thread either), and the volume reopens with everything.
#[test]
fn close_or_drop_while_a_background_checkpoint_is_in_flight() {
    for close in [true, false] {
        let ctx = if close { "close" } else { "drop" };
        let (r, mut exp) = background_checkpoint_parked(asking_writes());
        let d = block(7000);
        exp.wrote(3, &d);
        r.vol.write(3 * BS as u64, &d, false).expect("write");
        exp.flushed();
        let Rig {
            disk, release, vol, ..
        } = r;
        let ender = std::thread::spawn(move || {
            if close {
                let res = vol.close();
                (res, Some(vol))
            } else {
                match Arc::try_unwrap(vol) {
                    Ok(v) => drop(v),
                    Err(_) => panic!("volume still shared"),
                }
                (Ok(()), None)
            }
        });
        release.send(()).expect("release");
        let (res, vol) = ender.join().expect(ctx);
        res.unwrap_or_else(|e| panic!("{ctx}: {e}"));
        if let Some(vol) = vol {
            let ops = disk.ops();
            match Arc::try_unwrap(vol) {
                Ok(v) => drop(v),
                Err(_) => panic!("volume still shared"),
            }
            assert_eq!(disk.ops(), ops, "storage used after close returned");
        }
        let vol2 = reopen(disk.current_image(), true);
        exp.verify(&vol2, ctx);
    }
}

/// close() right after the write that asks for a checkpoint, racing the background thread
/// taking the request: close writes the final checkpoint either way, and nothing reaches the
/// disk after it returned.
#[test]
fn close_racing_a_requested_background_checkpoint() {
    let n = asking_writes();
    for round in 0..10 {
        let (disk, vol) = sim_volume_with(&create_opts(), open_with(true));
        let mut exp = Expect::new(BLOCKS);
        for k in 0..n {
            let d = block(k as u64);
            exp.wrote(k, &d);
            vol.write((k * BS) as u64, &d, false).expect("write");
        }
        exp.flushed();
        vol.close()
            .unwrap_or_else(|e| panic!("round {round}: close: {e}"));
        let ops = disk.ops();
        drop(vol);
        assert_eq!(disk.ops(), ops, "round {round}: storage used after close");
        let vol2 = reopen(disk.current_image(), false);
        exp.verify(&vol2, &format!("round {round}"));
    }
}

/// Applies `op` to the byte model and records the new content of every block it touches.
fn started(model: &mut [u8], exp: &mut Expect, op: &Op) {
    let (offset, len) = match op {
        Op::Write { offset, data, .. } => (*offset, data.len() as u64),
        Op::Zero { offset, len } | Op::Trim { offset, len } => (*offset, *len),
        Op::Flush => return,
    };
    apply_model(model, op);
    for b in offset as usize / BS..=(offset + len - 1) as usize / BS {
        exp.wrote(b, &model[b * BS..(b + 1) * BS]);
    }
}

/// Power cuts and failed syncs at sampled storage operations of a random workload (writes of
/// every size, zeroes, trims, flushes, FUA) while the background thread writes the checkpoints
/// that writes ask for (a queue of 16 small extents: one every few dozen writes). Interleavings
/// differ run to run, so the points are sampled. Whichever thread's sync fails, no flush may
/// succeed after it, and every flush that did must have its blocks on the disk.
#[test]
fn crashes_and_failed_syncs_beside_background_checkpoints_lose_nothing_flushed() {
    const WSIZE: u64 = 256 * 1024;
    let seed = 77u64;
    let opts = small_volume(WSIZE, 8192, Codec::Lz4, 6, 16);
    let open = OpenOptions {
        background_cleaner: true,
        ..open_opts_with(IoOptions::reordered(seed))
    };
    let work = workload(seed, WSIZE, 400);
    let (disk, vol) = sim_volume_with(&opts, open.clone());
    let start = disk.ops();
    for op in &work {
        apply_volume(&vol, op).unwrap_or_else(|e| panic!("dry run: {e}"));
    }
    let total = disk.ops();
    let checkpoints = vol.stats().counters.checkpoints;
    drop(vol);
    assert!(checkpoints > 10, "only {checkpoints} checkpoints");
    let mut rng = SmallRng::seed_from_u64(seed);
    let (mut failed_syncs, mut crashes) = (0, 0);
    for k in 0..160u64 {
        let at = rng.random_range(start..total);
        let fail_sync = k % 2 == 1;
        let ctx = format!(
            "sample {k}: {} at storage op {at}",
            if fail_sync {
                "failed sync"
            } else {
                "power cut"
            }
        );
        let (disk, vol) = sim_volume_with(&opts, open.clone());
        if fail_sync {
            disk.fail_sync_at(at, k);
        } else {
            disk.set_power_loss_at(at);
        }
        let mut model = vec![0u8; WSIZE as usize];
        let mut exp = Expect::new(WSIZE as usize / BS);
        for op in &work {
            started(&mut model, &mut exp, op);
            if apply_volume(&vol, op).is_err() {
                break;
            }
            if matches!(op, Op::Flush | Op::Write { fua: true, .. }) {
                exp.flushed();
            }
        }
        if disk.sync_failures() > 0 {
            // Also when the background thread's sync failed after the workload's last flush.
            assert!(vol.flush().is_err(), "{ctx}: a flush after a failed sync");
            failed_syncs += 1;
        } else if disk.powered_off() {
            crashes += 1;
        }
        vol.abandon();
        let image = disk.crash_image(&mut rng);
        let vol2 = Volume::open(Box::new(SimStorage::from_image(image)), open_opts())
            .unwrap_or_else(|e| panic!("{ctx}: reopen: {e}"));
        exp.verify(&vol2, &ctx);
    }
    eprintln!("{crashes} crashes and {failed_syncs} failed syncs verified");
    assert!(
        crashes > 40 && failed_syncs > 40,
        "{crashes} crashes, {failed_syncs} failed syncs"
    );
}
