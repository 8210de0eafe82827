//! Crash consistency on the simulated disk: power is cut at every storage operation of a random
//! workload (writes, syncs, discards, inside flushes and checkpoints); the disk then keeps any
//! subset of the unsynced writes, in any order, torn at sector granularity. After reopening,
//! every block acknowledged before the last completed flush must read back exactly, and no block
//! may hold data it never held. Replay a failure with the printed seed and crash point.
//! The I/O layer runs in its reordered mode (io.rs): writes are held and completed in a seeded
//! random order at the next sync, so reads (host RMW, cleaner) must find recent writes in its
//! queue and a crash loses whatever had not been issued; one sweep runs with synchronous writes.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use zbd_core::format::{Checkpoint, Superblock};
use zbd_core::{Codec, IoOptions, SimStorage, Volume};

const SIZE: u64 = 256 * 1024;

/// Per-block history since the last completed flush.
struct Expect {
    /// Content at the last completed flush (or FUA write).
    durable: Vec<Vec<u8>>,
    /// Contents written since, any of which may survive.
    since: Vec<Vec<Vec<u8>>>,
    model: Vec<u8>,
}

impl Expect {
    fn new() -> Self {
        let n = SIZE as usize / BS;
        Expect {
            durable: vec![vec![0; BS]; n],
            since: vec![Vec::new(); n],
            model: vec![0; SIZE as usize],
        }
    }

    /// Records an operation that was started (it may or may not have completed).
    fn started(&mut self, op: &Op) {
        let (offset, len) = match op {
            Op::Write { offset, data, .. } => (*offset, data.len() as u64),
            Op::Zero { offset, len } | Op::Trim { offset, len } => (*offset, *len),
            Op::Flush => return,
        };
        apply_model(&mut self.model, op);
        let first = offset as usize / BS;
        let last = (offset + len - 1) as usize / BS;
        for b in first..=last {
            self.since[b].push(self.model[b * BS..(b + 1) * BS].to_vec());
        }
    }

    /// After `op` failed: each of its blocks holds what the volume reads (or stays as the
    /// model says where it reads EIO, which the oracle then allows).
    fn resync(&mut self, vol: &Volume, op: &Op) {
        let (offset, len) = match op {
            Op::Write { offset, data, .. } => (*offset, data.len() as u64),
            Op::Zero { offset, len } | Op::Trim { offset, len } => (*offset, *len),
            Op::Flush => return,
        };
        let mut buf = vec![0u8; BS];
        for b in offset as usize / BS..=(offset + len - 1) as usize / BS {
            if vol.read((b * BS) as u64, &mut buf).is_ok() {
                self.model[b * BS..(b + 1) * BS].copy_from_slice(&buf);
                self.since[b].push(buf.clone());
            }
        }
    }

    /// Everything before is now durable.
    fn flushed(&mut self) {
        for (b, s) in self.since.iter_mut().enumerate() {
            s.clear();
            self.durable[b] = self.model[b * BS..(b + 1) * BS].to_vec();
        }
    }
}

fn is_durability_point(op: &Op) -> bool {
    matches!(op, Op::Flush | Op::Write { fua: true, .. })
}

/// Runs `ops` until power fails; returns the expectation.
fn run_until_crash(vol: &Volume, ops: &[Op]) -> Expect {
    let mut exp = Expect::new();
    for op in ops {
        exp.started(op);
        if apply_volume(vol, op).is_err() {
            break;
        }
        if is_durability_point(op) {
            exp.flushed();
        }
    }
    exp
}

fn verify(vol: &Volume, exp: &Expect, ctx: &str) {
    let mut buf = vec![0u8; BS];
    for b in 0..exp.durable.len() {
        vol.read((b * BS) as u64, &mut buf)
            .unwrap_or_else(|e| panic!("{ctx}: block {b} unreadable after recovery: {e}"));
        let ok = buf == exp.durable[b] || exp.since[b].contains(&buf);
        assert!(
            ok,
            "{ctx}: block {b} holds data it never held (or lost flushed data)"
        );
    }
    let report = vol.check(&|_, _| {});
    assert!(report.is_clean(), "{ctx}: check after recovery: {report:?}");
}

/// Crash at every storage operation (from `first_op`, every `step`) of the workload of `seed`.
fn sweep(seed: u64, ops: usize, extent: u32, codec: Codec, step: u64) -> u64 {
    sweep_with(
        seed,
        ops,
        extent,
        codec,
        step,
        6,
        false,
        IoOptions::reordered(seed),
    )
}

/// `capacity_factor`: data area as a multiple of the logical size (small = the cleaner must run).
/// `io`: how writes reach the simulated disk (reordered: held by the I/O layer and completed in a
/// seeded random order, so reads and the cleaner must find them in its queue).
#[allow(clippy::too_many_arguments)]
fn sweep_with(
    seed: u64,
    ops: usize,
    extent: u32,
    codec: Codec,
    step: u64,
    capacity_factor: u64,
    expect_cleaning: bool,
    io: IoOptions,
) -> u64 {
    let open = open_opts_with(io);
    let opts = small_volume(SIZE, extent, codec, capacity_factor, 6);
    let work = if expect_cleaning {
        overwrite_workload(seed, SIZE / BS as u64, ops)
    } else {
        workload(seed, SIZE, ops)
    };
    // Dry run: how many storage operations the workload takes.
    let (disk, vol) = sim_volume_with(&opts, open.clone());
    let start = disk.ops();
    for op in &work {
        apply_volume(&vol, op)
            .unwrap_or_else(|e| panic!("seed {seed}: workload failed without a crash: {e}"));
    }
    let total = disk.ops();
    let runs = vol.stats().counters.cleaner_runs;
    assert!(
        !expect_cleaning || runs > 0,
        "seed {seed}: the workload never made the cleaner run"
    );
    if expect_cleaning {
        eprintln!("seed {seed}: {runs} cleaner passes in the workload");
    }
    drop(vol);
    let mut points = 0;
    // Sampled sweeps (step > 1) start at an offset chosen by the seed, so that seeds together
    // cover the operations any one of them skips.
    let mut c = start + seed % step;
    while c < total {
        let (disk, vol) = sim_volume_with(&opts, open.clone());
        disk.set_power_loss_at(c);
        let exp = run_until_crash(&vol, &work);
        vol.abandon(); // a crashed process writes nothing more
        let mut rng = SmallRng::seed_from_u64(seed ^ (c << 20));
        let image = disk.crash_image(&mut rng);
        let ctx = format!("seed {seed} crash at storage op {c} (extent {extent}, {codec})");
        let disk2 = Arc::new(SimStorage::from_image(image));
        let vol2 = Volume::open(Box::new(Arc::clone(&disk2)), open_opts())
            .unwrap_or_else(|e| panic!("{ctx}: reopen failed: {e}"));
        verify(&vol2, &exp, &ctx);
        // The recovered volume keeps working and survives a clean reopen.
        if c.is_multiple_of(7) {
            vol2.write(0, &vec![0xa5; BS], false)
                .unwrap_or_else(|e| panic!("{ctx}: write after recovery: {e}"));
            vol2.close()
                .unwrap_or_else(|e| panic!("{ctx}: close after recovery: {e}"));
            drop(vol2);
            let vol3 = Volume::open(Box::new(disk2), open_opts())
                .unwrap_or_else(|e| panic!("{ctx}: second reopen: {e}"));
            let mut b = vec![0u8; BS];
            vol3.read(0, &mut b).expect("read");
            assert_eq!(b, vec![0xa5; BS], "{ctx}: write after recovery lost");
        }
        points += 1;
        c += step;
    }
    points
}

#[test]
fn crash_at_every_storage_operation() {
    let mut points = 0;
    for (seed, extent, codec) in [
        (1u64, 8192u32, Codec::Lz4),
        (2, 16384, Codec::Zstd(1)),
        (3, 8192, Codec::None),
    ] {
        points += sweep(seed, 160, extent, codec, 1);
    }
    // `zbd create`'s extent size on a file, with a data area of at least eight such extents.
    let extent = zbd_core::layout::FILE_EXTENT_BYTES_DEFAULT;
    points += sweep_with(
        5,
        160,
        extent,
        Codec::Lz4,
        1,
        (8 * u64::from(extent)).div_ceil(SIZE).max(6),
        false,
        IoOptions::reordered(5),
    );
    // The same with every write done in order by the caller.
    points += sweep_with(
        4,
        80,
        8192,
        Codec::Lz4,
        1,
        6,
        false,
        IoOptions::synchronous(),
    );
    eprintln!("{points} crash points verified");
    assert!(points > 1000, "only {points} crash points");
}

#[test]
fn crash_points_inside_cleaning() {
    // Every crash point is the slowest test of the suite (two minutes on two cores): make test
    // crashes at every third storage operation, make test-heavy at each.
    let step = full_or_light(1, 3);
    let mut points = 0;
    for (seed, codec) in [(21u64, Codec::Lz4), (22, Codec::Zstd(1))] {
        points += sweep_with(
            seed,
            1000,
            16384,
            codec,
            step,
            1,
            true,
            IoOptions::reordered(seed),
        );
    }
    eprintln!("{points} crash points verified with the cleaner running");
    assert!(points > 500 / step, "only {points} crash points");
}

#[test]
#[ignore = "heavy: run by make test-heavy"]
fn crash_sweep_many_seeds() {
    let mut points = 0;
    for seed in 10..60u64 {
        let codec = [Codec::Lz4, Codec::Zlib(1), Codec::Lzo, Codec::None][seed as usize % 4];
        let extent = [8192u32, 16384, 32768][seed as usize % 3];
        points += sweep(seed, 250, extent, codec, 1);
        if codec != Codec::None {
            points += sweep_with(
                seed + 100,
                300,
                16384,
                codec,
                1,
                1,
                true,
                IoOptions::reordered(seed),
            );
        }
    }
    eprintln!("{points} crash points verified");
}

/// Single-block writes (some incompressible), trims, zero ranges and flushes on a volume whose
/// data area is far smaller than its logical size, so writes keep failing with NoSpace and
/// ranges take the checkpoint path of a full volume. A NoSpace write changes nothing; power is
/// cut at every storage operation as above.
fn full_volume_sweep(seed: u64, ops: usize) -> u64 {
    let opts = zbd_core::CreateOptions {
        extent_bytes: 8192,
        codec: Codec::Lz4,
        capacity_bytes: Some(SIZE / 2),
        queue_len: Some(6),
        ..zbd_core::CreateOptions::new(SIZE)
    };
    let blocks = SIZE / BS as u64;
    let mut rng = SmallRng::seed_from_u64(seed);
    let work: Vec<Op> = (0..ops)
        .map(|_| {
            let lba = rand::Rng::random_range(&mut rng, 0..blocks);
            let n = rand::Rng::random_range(&mut rng, 1..=6u64).min(blocks - lba);
            match rand::Rng::random_range(&mut rng, 0..100) {
                0..=69 => {
                    let kind = [Fill::Random, Fill::Text][rand::Rng::random_range(&mut rng, 0..2)];
                    Op::Write {
                        offset: lba * BS as u64,
                        data: fill(&mut rng, kind, BS),
                        fua: false,
                    }
                }
                70..=79 => Op::Trim {
                    offset: lba * BS as u64,
                    len: n * BS as u64,
                },
                80..=87 => Op::Zero {
                    offset: lba * BS as u64,
                    len: n * BS as u64,
                },
                _ => Op::Flush,
            }
        })
        .collect();
    let run = |vol: &Volume, disk: &SimStorage| -> (Expect, usize) {
        let mut exp = Expect::new();
        let mut no_space = 0;
        for op in &work {
            let saved = (exp.model.clone(), exp.since.clone());
            exp.started(op);
            match apply_volume(vol, op) {
                Ok(()) if is_durability_point(op) => exp.flushed(),
                Ok(()) => {}
                Err(zbd_core::Error::NoSpace) if !disk.powered_off() => {
                    assert!(
                        matches!(op, Op::Write { .. }),
                        "seed {seed}: NoSpace on {op:?}"
                    );
                    (exp.model, exp.since) = saved;
                    no_space += 1;
                }
                Err(_) => break,
            }
        }
        (exp, no_space)
    };
    let (disk, vol) = sim_volume(&opts);
    let start = disk.ops();
    let (_, no_space) = run(&vol, &disk);
    let total = disk.ops();
    assert!(no_space > 0, "seed {seed}: the volume never filled up");
    drop(vol);
    let mut points = 0;
    for c in start..total {
        let (disk, vol) = sim_volume(&opts);
        disk.set_power_loss_at(c);
        let (exp, _) = run(&vol, &disk);
        vol.abandon();
        let mut rng = SmallRng::seed_from_u64(seed ^ (c << 20));
        let image = disk.crash_image(&mut rng);
        let ctx = format!("seed {seed} full-volume crash at storage op {c}");
        let vol2 = Volume::open(Box::new(SimStorage::from_image(image)), open_opts())
            .unwrap_or_else(|e| panic!("{ctx}: reopen failed: {e}"));
        verify(&vol2, &exp, &ctx);
        points += 1;
    }
    points
}

#[test]
fn crash_at_every_storage_operation_of_a_full_volume() {
    let points = full_volume_sweep(31, 300);
    eprintln!("{points} crash points verified on a full volume");
    assert!(points > 300, "only {points} crash points");
}

#[test]
#[ignore = "heavy: run by make test-heavy"]
fn crash_sweep_full_volume_many_seeds() {
    let points: u64 = (40..60u64).map(|seed| full_volume_sweep(seed, 500)).sum();
    eprintln!("{points} crash points verified on full volumes");
}

/// Crashes at many instants of an overwrite-heavy workload on a disk that never discards, with
/// a short allocation queue: extents are reused often and always still hold segments of their
/// previous life, which roll-forward must not replay. (Two guards cover this: the allocation
/// sequence in each segment header, and the write-sequence watermark, since a previous life's
/// records are all older than the checkpoint that released the extent; this test fails only
/// when both are broken.)
#[test]
fn crashes_while_reused_extents_hold_stale_segments() {
    stale_segment_crashes(&small_volume(SIZE, 8192, Codec::Lz4, 2, 4));
}

/// The same on a bit-10 volume: many checkpoints that flip the same pairs back and forth.
#[test]
fn crashes_after_many_checkpoints_on_bit10() {
    stale_segment_crashes(&with_metadata_pages(&small_volume(
        SIZE,
        8192,
        Codec::Lz4,
        2,
        4,
    )));
}

/// The workload and crash images of the two tests above on a volume of `opts`.
fn stale_segment_crashes(opts: &zbd_core::CreateOptions) {
    let seed = 71u64;
    let sb = zbd_core::layout::plan(opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let vol = Volume::create_with(Box::new(NoDiscard(Arc::clone(&disk))), opts, open_opts())
        .expect("create");
    let work = overwrite_workload(seed, SIZE / BS as u64 / 2, 2500);
    let mut exp = Expect::new();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut crashes = 0;
    for (i, op) in work.iter().enumerate() {
        exp.started(op);
        apply_volume(&vol, op).unwrap_or_else(|e| panic!("seed {seed} op {i}: {e}"));
        if is_durability_point(op) {
            exp.flushed();
        }
        if i % 25 == 24 {
            let image = disk.crash_image(&mut rng);
            let ctx = format!("seed {seed} crash after op {i}");
            let vol2 = Volume::open(Box::new(SimStorage::from_image(image)), open_opts())
                .unwrap_or_else(|e| panic!("{ctx}: reopen failed: {e}"));
            verify(&vol2, &exp, &ctx);
            vol2.abandon();
            crashes += 1;
        }
    }
    let s = vol.stats();
    assert!(
        s.counters.checkpoints > 50,
        "only {} checkpoints",
        s.counters.checkpoints
    );
    eprintln!(
        "{crashes} crash instants verified, {} checkpoints",
        s.counters.checkpoints
    );
}

/// Power cut at random storage operations while the background cleaner thread runs alongside
/// an overwrite-heavy workload on a tight data area (the operation order differs run to run, so
/// the crash points are sampled, not swept). The cut may hit the cleaner or the host first.
#[test]
fn crashes_with_the_background_cleaner_running() {
    background_cleaner_crash_samples(&small_volume(SIZE, 16384, Codec::Lz4, 1, 6), 200);
}

/// The same on a bit-10 volume (in `make test` too, not only `make test-bit10`): the background
/// cleaner's checkpoints (`checkpoint_unlocked`) let host writes change tree pages between a
/// checkpoint's phase 1 and its commit.
#[test]
fn crashes_with_the_background_cleaner_running_on_bit10() {
    let opts = with_metadata_pages(&small_volume(SIZE, 16384, Codec::Lz4, 1, 6));
    background_cleaner_crash_samples(&opts, 60);
}

/// `points` power cuts at sampled storage operations of the workload above on a volume of
/// `opts`, each image opened read-only (recovery in RAM only), then writable, against the model.
fn background_cleaner_crash_samples(opts: &zbd_core::CreateOptions, points: usize) {
    let seed = 81u64;
    let open = zbd_core::OpenOptions {
        background_cleaner: true,
        clean_watermarks: Some((25, 45)),
        ..open_opts()
    };
    let work = overwrite_workload(seed, SIZE / BS as u64, 800);
    let create = || {
        let sb = zbd_core::layout::plan(opts).expect("plan");
        let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
        let vol =
            Volume::create_with(Box::new(Arc::clone(&disk)), opts, open.clone()).expect("create");
        (disk, vol)
    };
    let (disk, vol) = create();
    let start = disk.ops();
    for op in &work {
        apply_volume(&vol, op).unwrap_or_else(|e| panic!("seed {seed}: dry run: {e}"));
    }
    let total = disk.ops();
    let runs = vol.stats().counters.cleaner_runs;
    drop(vol);
    let mut rng = SmallRng::seed_from_u64(seed);
    for k in 0..points {
        let c = rand::Rng::random_range(&mut rng, start..total);
        let (disk, vol) = create();
        disk.set_power_loss_at(c);
        let exp = run_until_crash(&vol, &work);
        vol.abandon();
        let image = disk.crash_image(&mut rng);
        let ctx =
            format!("seed {seed} sample {k}: crash at storage op {c} with the cleaner running");
        let ro = Volume::open(
            Box::new(SimStorage::from_image(image.clone())),
            zbd_core::OpenOptions {
                read_only: true,
                ..open_opts()
            },
        )
        .unwrap_or_else(|e| panic!("{ctx}: read-only reopen failed: {e}"));
        let mut buf = vec![0u8; BS];
        for b in 0..exp.durable.len() {
            ro.read((b * BS) as u64, &mut buf)
                .unwrap_or_else(|e| panic!("{ctx}: read-only: block {b}: {e}"));
            assert!(
                buf == exp.durable[b] || exp.since[b].contains(&buf),
                "{ctx}: read-only: block {b} holds data it never held"
            );
        }
        drop(ro);
        let vol2 = Volume::open(Box::new(SimStorage::from_image(image)), open_opts())
            .unwrap_or_else(|e| panic!("{ctx}: reopen failed: {e}"));
        verify(&vol2, &exp, &ctx);
    }
    eprintln!("{points} crash samples verified ({runs} cleaner passes in the dry run)");
    assert!(runs > 0, "seed {seed}: the cleaner never ran");
}

/// Where a fault-model run puts its fault.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// The first sync at or after this storage operation fails (writes since the last sync are
    /// dropped, some or all), then the process stops and the machine crashes.
    FailedSync(u64),
    /// Power is lost at this storage operation, then one bit of a current metadata copy (the
    /// newest checkpoint or a current map page) flips: two copies must lose nothing.
    MetadataFlip(u64),
    /// After the n-th completed flush one bit flips in a durable log segment (an extent of the
    /// newest checkpoint's allocation queue); the workload goes on to its end.
    LogFlip(usize),
}

/// A random nonzero byte in the extents the newest checkpoint queued (the roll-forward log), or
/// a byte of a current metadata copy.
fn pick_target(
    disk: &SimStorage,
    sb: &Superblock,
    rng: &mut SmallRng,
    metadata: bool,
) -> Option<u64> {
    let image = disk.current_image();
    let ck = (0..2u64)
        .flat_map(|slot| (0..sb.metadata_copies()).map(move |copy| (slot, copy)))
        .filter_map(|(slot, copy)| {
            let off = sb.checkpoint_slot_offset(slot, copy) as usize;
            Checkpoint::decode(&image[off..off + sb.checkpoint_slot_bytes as usize], sb).ok()
        })
        .max_by_key(|c| c.seq)?;
    if metadata && ck.extension.is_some() {
        return Some(bit10_metadata_target(&image, sb, rng, &ck));
    }
    if metadata {
        let copy = rng.random_range(0..sb.metadata_copies());
        let pages: Vec<u32> = (0..sb.map_pages)
            .filter(|&p| ck.page_slots[p as usize] != 0)
            .collect();
        if pages.is_empty() || rng.random_bool(0.3) {
            let used = 256 + 16 * ck.queue.len() as u64;
            return Some(sb.checkpoint_slot_offset(ck.seq, copy) + rng.random_range(0..used));
        }
        let p = pages[rng.random_range(0..pages.len())];
        let slot = ck.page_slots[p as usize] - 1;
        return Some(sb.map_page_offset(p, slot, copy) + rng.random_range(0..4096));
    }
    for _ in 0..64 {
        let q = ck.queue[rng.random_range(0..ck.queue.len())];
        let base = sb.extent_offset(q.extent);
        let ext = &image[base as usize..(base + u64::from(sb.extent_bytes)) as usize];
        let nonzero: Vec<usize> = (0..ext.len()).filter(|&i| ext[i] != 0).collect();
        if !nonzero.is_empty() {
            return Some(base + nonzero[rng.random_range(0..nonzero.len())] as u64);
        }
    }
    None
}

/// A byte of one copy of bit-10 metadata: the newest checkpoint's header, queue and
/// extension, or a written page of region 0 or of the carved metadata extents, either slot
/// (which slot is current is in the pair states; a flip in the other one must change nothing).
fn bit10_metadata_target(
    image: &[u8],
    sb: &Superblock,
    rng: &mut SmallRng,
    ck: &Checkpoint,
) -> u64 {
    let copy = rng.random_range(0..2u8);
    if rng.random_bool(0.3) {
        let at = sb.checkpoint_slot_offset(ck.seq, copy) as usize;
        let used = u32::from_le_bytes(image[at + 192..at + 196].try_into().expect("4 bytes"));
        return at as u64 + rng.random_range(0..u64::from(used));
    }
    let g = zbd_core::meta::MetaGeometry::at_enable(sb).expect("geometry");
    let region0 = (0..2 * sb.map_pages).map(|i| sb.map_page_offset(i / 2, (i % 2) as u8, copy));
    let carved = metadata_extents(image, sb, ck)
        .into_iter()
        .filter(|&e| e < g.h)
        .flat_map(|e| {
            let base = sb.extent_offset(if copy == 0 { e } else { e + g.h });
            (0..u64::from(sb.extent_bytes) / 4096).map(move |k| base + k * 4096)
        });
    let written: Vec<u64> = region0
        .chain(carved)
        .filter(|&at| {
            image[at as usize..at as usize + 4096]
                .iter()
                .any(|&b| b != 0)
        })
        .collect();
    written[rng.random_range(0..written.len())] + rng.random_range(0..4096)
}

/// Oracle of the fault model: every block reads its last flushed value, a value written after
/// that flush, or EIO (only where `eio_ok`); never an older value, never zeros it did not hold;
/// `check` lists exactly the blocks that read EIO. Returns how many read EIO.
fn verify_faulty(vol: &Volume, exp: &Expect, eio_ok: bool, ctx: &str) -> usize {
    let mut eio = Vec::new();
    let mut buf = vec![0u8; BS];
    for b in 0..exp.durable.len() {
        match vol.read((b * BS) as u64, &mut buf) {
            Ok(()) => assert!(
                buf == exp.durable[b] || exp.since[b].contains(&buf),
                "{ctx}: block {b} holds data it never held (or older than its last flush)"
            ),
            Err(e) => {
                assert!(eio_ok, "{ctx}: block {b} unreadable: {e}");
                assert_eq!(e.errno(), zbd_core::error::errno::EIO, "{ctx}: {e}");
                eio.push(b as u64);
            }
        }
    }
    let report = vol.check(&|_, _| {});
    assert_eq!(
        report.damaged_blocks, eio,
        "{ctx}: check must list every EIO block"
    );
    if !eio_ok {
        assert!(report.is_clean(), "{ctx}: {report:?}");
    }
    eio.len()
}

/// Runs the workload of `seed` once with `fault`; returns whether the fault took effect and
/// how many blocks read EIO.
fn fault_run(
    seed: u64,
    work: &[Op],
    opts: &zbd_core::CreateOptions,
    fault: Fault,
    io: &IoOptions,
) -> (bool, usize) {
    let ctx = format!("seed {seed} {fault:?} {io:?}");
    let (disk, vol) = sim_volume_with(opts, open_opts_with(io.clone()));
    let sb = vol.superblock().clone();
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed);
    let mut exp = Expect::new();
    let (image, eio_ok, hit) = match fault {
        Fault::FailedSync(at) => {
            disk.fail_sync_at(disk.ops() + at, seed);
            let exp_run = run_until_crash(&vol, work);
            exp = exp_run;
            let hit = disk.sync_failures() > 0;
            if hit {
                // Stopped, says so, still serves reads of what it was given.
                assert!(
                    vol.stats().failed.is_some(),
                    "{ctx}: not in the failed state"
                );
                assert!(vol.write(0, &vec![7u8; BS], false).is_err(), "{ctx}");
                verify_faulty(&vol, &exp, false, &format!("{ctx}, before reopen"));
            }
            vol.abandon();
            (disk.crash_image(&mut rng), false, hit)
        }
        Fault::MetadataFlip(at) => {
            disk.set_power_loss_at(disk.ops() + at);
            exp = run_until_crash(&vol, work);
            vol.abandon();
            let image = disk.crash_image(&mut rng);
            let sim = SimStorage::from_image(image);
            let hit = match pick_target(&sim, &sb, &mut rng, true) {
                Some(byte) => {
                    sim.flip_bit(byte, rng.random_range(0..8));
                    true
                }
                None => false,
            };
            (sim.current_image(), false, hit)
        }
        Fault::LogFlip(after) => {
            let mut flushes = 0;
            let mut hit = false;
            for op in work {
                exp.started(op);
                if let Err(e) = apply_volume(&vol, op) {
                    // Only a read-modify-write of the damaged block may fail (EIO); the other
                    // blocks of the request may or may not have been written: go on from what
                    // the volume holds.
                    assert!(
                        hit && matches!(e, zbd_core::Error::Corrupt { .. }),
                        "{ctx}: {e}"
                    );
                    exp.resync(&vol, op);
                    continue;
                }
                if is_durability_point(op) {
                    exp.flushed();
                    flushes += 1;
                    if flushes == after {
                        if let Some(byte) = pick_target(&disk, &sb, &mut rng, false) {
                            disk.flip_bit(byte, rng.random_range(0..8));
                            hit = true;
                        }
                    }
                }
            }
            // One more write and flush, so that a segment written after the flip carries the
            // durable watermark: without any, damage to the newest flushed segment cannot be
            // told from a torn write (the documented limit, design.md "Torn or damaged").
            let last = Op::Write {
                offset: 0,
                data: vec![0x3c; BS],
                fua: false,
            };
            exp.started(&last);
            apply_volume(&vol, &last).expect("last write");
            vol.flush().expect("final flush");
            exp.flushed();
            vol.abandon();
            (disk.crash_image(&mut rng), true, hit)
        }
    };
    let vol2 = Volume::open(Box::new(SimStorage::from_image(image)), open_opts())
        .unwrap_or_else(|e| panic!("{ctx}: reopen failed: {e}"));
    let eio = verify_faulty(&vol2, &exp, eio_ok, &ctx);
    (hit, eio)
}

/// The fault model of issue 14 over one workload: a failed sync at every `step`-th storage
/// operation, power loss plus a flipped metadata bit at as many points, and a flipped log bit
/// after each flush. Returns (runs with the fault in effect, blocks that read EIO). `io` is how
/// the volume issues writes: synchronously, or queued and completed in a seeded order (a queued
/// write dropped by the failed sync must fail the volume just the same).
fn fault_sweep(
    seed: u64,
    ops: usize,
    extent: u32,
    codec: Codec,
    step: u64,
    io: IoOptions,
) -> (u64, usize) {
    let opts = small_volume(SIZE, extent, codec, 6, 6);
    let work = workload(seed, SIZE, ops);
    let (disk, vol) = sim_volume_with(&opts, open_opts_with(io.clone()));
    let start = disk.ops();
    for op in &work {
        apply_volume(&vol, op).expect("dry run");
    }
    let total = disk.ops() - start;
    let flushes = work.iter().filter(|op| is_durability_point(op)).count();
    drop(vol);
    let (mut runs, mut eio) = (0u64, 0usize);
    let mut c = 0;
    while c < total {
        for fault in [Fault::FailedSync(c), Fault::MetadataFlip(c)] {
            let (hit, e) = fault_run(seed, &work, &opts, fault, &io);
            runs += u64::from(hit);
            eio += e;
        }
        c += step;
    }
    for n in 1..=flushes {
        let (hit, e) = fault_run(seed, &work, &opts, Fault::LogFlip(n), &io);
        runs += u64::from(hit);
        eio += e;
    }
    (runs, eio)
}

#[test]
fn fault_model_failed_syncs_and_bit_flips() {
    let mut runs = 0;
    let mut eio = 0;
    // One seed with the I/O queue in reordered mode, one with synchronous writes.
    for (seed, extent, codec, io) in [
        (91u64, 8192u32, Codec::Lz4, IoOptions::reordered(91)),
        (92, 16384, Codec::None, IoOptions::synchronous()),
    ] {
        let (r, e) = fault_sweep(seed, 120, extent, codec, 3, io);
        runs += r;
        eio += e;
    }
    eprintln!("{runs} fault runs verified ({eio} blocks read EIO, all listed by check)");
    assert!(runs > 100, "only {runs} runs with the fault in effect");
}

#[test]
#[ignore = "heavy: run by make test-heavy"]
fn fault_model_many_seeds() {
    let mut runs = 0;
    let mut eio = 0;
    for seed in 200..230u64 {
        let codec = [Codec::Lz4, Codec::Zstd(1), Codec::None][seed as usize % 3];
        let extent = [8192u32, 16384, 32768][seed as usize % 3];
        let io = if seed % 2 == 0 {
            IoOptions::reordered(seed)
        } else {
            IoOptions::synchronous()
        };
        let (r, e) = fault_sweep(seed, 250, extent, codec, 1, io);
        runs += r;
        eio += e;
    }
    eprintln!("{runs} fault runs verified ({eio} blocks read EIO, all listed by check)");
}

// ---- Bit-10 (metadata pages) attacks the sweeps above leave out (an adversarial review) ----

/// What an image left by a create cut short must be: a volume that opens empty and works, or
/// one refused as not (yet) a volume; either way a new create over it must work.
fn check_create_image(
    image: Vec<u8>,
    opts: &zbd_core::CreateOptions,
    old: Option<&[u8]>,
    ctx: &str,
) -> bool {
    let disk = Arc::new(SimStorage::from_image(image.clone()));
    let opened = match Volume::open(Box::new(Arc::clone(&disk)), open_opts()) {
        Ok(vol) => {
            // The new volume, empty, or the old one untouched: nothing in between.
            let mut all = vec![0u8; SIZE as usize];
            vol.read(0, &mut all)
                .unwrap_or_else(|e| panic!("{ctx}: read: {e}"));
            assert!(
                all.iter().all(|&x| x == 0) || old.is_some_and(|o| o == &all[..]),
                "{ctx}: the volume is neither empty nor the old one"
            );
            let report = vol.check(&|_, _| {});
            assert!(report.is_clean(), "{ctx}: {report:?}");
            vol.write(0, &vec![0x5a; BS], false)
                .unwrap_or_else(|e| panic!("{ctx}: write: {e}"));
            vol.close().unwrap_or_else(|e| panic!("{ctx}: close: {e}"));
            drop(vol);
            let vol = Volume::open(Box::new(Arc::clone(&disk)), open_opts())
                .unwrap_or_else(|e| panic!("{ctx}: reopen: {e}"));
            assert_eq!(read_block(&vol, 0).expect("read"), vec![0x5a; BS], "{ctx}");
            true
        }
        Err(e) => {
            assert!(
                matches!(
                    e,
                    zbd_core::Error::NotAVolume(_) | zbd_core::Error::CorruptMetadata(_)
                ),
                "{ctx}: open refused with {e:?}"
            );
            false
        }
    };
    // Creating again over what the cut left.
    let disk = SimStorage::from_image(image);
    let vol = Volume::create_with(Box::new(disk), opts, open_opts())
        .unwrap_or_else(|e| panic!("{ctx}: create again: {e}"));
    vol.close().expect("close");
    opened
}

/// Power cut at every storage operation of a bit-10 `create` (extent table and catalog pages,
/// their sync, the slots, the open's recovery checkpoint), over a blank disk and over a disk
/// that holds a bit-10 volume already.
#[test]
fn crash_at_every_storage_operation_of_a_bit10_create() {
    let opts = with_metadata_pages(&small_volume(SIZE, 8192, Codec::Lz4, 6, 6));
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let (old_disk, old) = {
        let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
        let vol =
            Volume::create_with(Box::new(Arc::clone(&disk)), &opts, open_opts()).expect("create");
        (disk, vol)
    };
    let mut rng = SmallRng::seed_from_u64(101);
    for lba in 0..SIZE / BS as u64 {
        old.write(lba * BS as u64, &fill(&mut rng, Fill::Text, BS), false)
            .expect("write");
    }
    old.close().expect("close");
    let old_image = old_disk.current_image();
    let mut old_data = vec![0u8; SIZE as usize];
    {
        let vol = Volume::open(
            Box::new(SimStorage::from_image(old_image.clone())),
            open_opts(),
        )
        .expect("old volume");
        vol.read(0, &mut old_data).expect("read");
        vol.abandon();
    }
    let (mut opened, mut points) = (0, 0);
    for (name, base, old) in [
        ("blank", vec![0u8; sb.total_bytes() as usize], None),
        ("over an old volume", old_image, Some(&old_data[..])),
    ] {
        let disk = SimStorage::from_image(base.clone());
        let vol = Volume::create_with(Box::new(disk), &opts, open_opts()).expect("create");
        drop(vol);
        // Operations of create + open; count them on a fresh copy.
        let disk = Arc::new(SimStorage::from_image(base.clone()));
        let vol =
            Volume::create_with(Box::new(Arc::clone(&disk)), &opts, open_opts()).expect("create");
        let total = disk.ops();
        vol.abandon();
        for c in 0..total {
            let disk = Arc::new(SimStorage::from_image(base.clone()));
            disk.set_power_loss_at(c);
            if let Ok(vol) = Volume::create_with(Box::new(Arc::clone(&disk)), &opts, open_opts()) {
                vol.abandon();
            }
            let mut rng = SmallRng::seed_from_u64(c);
            let image = disk.crash_image(&mut rng);
            let ctx = format!("create {name}, power cut at storage op {c} of {total}");
            opened += usize::from(check_create_image(image, &opts, old, &ctx));
            points += 1;
        }
    }
    eprintln!("{points} create crash points, {opened} opened");
}

/// A failed sync at every storage operation of a bit-10 `create`: create fails (or the open's
/// checkpoint does), the machine crashes; what is left opens empty or is refused.
#[test]
fn failed_sync_during_a_bit10_create() {
    let opts = with_metadata_pages(&small_volume(SIZE, 8192, Codec::Lz4, 6, 6));
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let vol = Volume::create_with(Box::new(Arc::clone(&disk)), &opts, open_opts()).expect("create");
    let total = disk.ops();
    vol.abandon();
    for c in 0..total {
        let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
        disk.fail_sync_at(c, c);
        if let Ok(vol) = Volume::create_with(Box::new(Arc::clone(&disk)), &opts, open_opts()) {
            vol.abandon();
        }
        let mut rng = SmallRng::seed_from_u64(c);
        let image = disk.crash_image(&mut rng);
        check_create_image(
            image,
            &opts,
            None,
            &format!("failed sync at op {c} of create"),
        );
    }
}

/// A bit-10 `create` over a disk holding a volume, cut by a power loss before its superblock
/// is durable: the old volume still opens (its superblock and checkpoint are intact), so it
/// must be intact as a whole. Writes to half its blocks, a close and a reopen must leave the
/// other half reading what it held.
#[test]
fn an_interrupted_bit10_create_leaves_the_old_volume_whole() {
    let opts = with_metadata_pages(&small_volume(SIZE, 8192, Codec::Lz4, 6, 6));
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let blocks = SIZE / BS as u64;
    let old_disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let old =
        Volume::create_with(Box::new(Arc::clone(&old_disk)), &opts, open_opts()).expect("create");
    let mut rng = SmallRng::seed_from_u64(101);
    let mut old_data = Vec::new();
    for lba in 0..blocks {
        let b = fill(&mut rng, Fill::Text, BS);
        old.write(lba * BS as u64, &b, false).expect("write");
        old_data.extend_from_slice(&b);
    }
    old.close().expect("close");
    let base = old_disk.current_image();
    let mut tried = 0;
    for c in 0..8u64 {
        for k in 0..8u64 {
            let disk = Arc::new(SimStorage::from_image(base.clone()));
            disk.set_power_loss_at(c);
            if let Ok(v) = Volume::create_with(Box::new(Arc::clone(&disk)), &opts, open_opts()) {
                v.abandon();
            }
            let image = disk.crash_image(&mut SmallRng::seed_from_u64(k));
            let disk = Arc::new(SimStorage::from_image(image));
            let Ok(vol) = Volume::open(Box::new(Arc::clone(&disk)), open_opts()) else {
                continue;
            };
            let mut all = vec![0u8; SIZE as usize];
            vol.read(0, &mut all).expect("read");
            if all != old_data {
                continue; // the new, empty volume
            }
            tried += 1;
            let ctx = format!("create over a volume cut at storage op {c} (image {k})");
            // The old volume opens with its newest checkpoint: its extent table must be its
            // own (else extents holding its live blocks count as free and are written over;
            // a debug build panics in `Extents::remove_block` on the first overwrite).
            let report = vol.check(&|_, _| {});
            assert!(
                report.is_clean(),
                "{ctx}: the old volume opens, but: {:?}",
                &report.metadata_problems[..report.metadata_problems.len().min(3)]
            );
            for lba in blocks / 2..blocks {
                vol.write(lba * BS as u64, &fill(&mut rng, Fill::Random, BS), false)
                    .unwrap_or_else(|e| panic!("{ctx}: write {lba}: {e}"));
            }
            vol.close().unwrap_or_else(|e| panic!("{ctx}: close: {e}"));
            drop(vol);
            let vol = Volume::open(Box::new(Arc::clone(&disk)), open_opts())
                .unwrap_or_else(|e| panic!("{ctx}: reopen: {e}"));
            for lba in 0..blocks / 2 {
                let got = read_block(&vol, lba)
                    .unwrap_or_else(|e| panic!("{ctx}: old block {lba} lost: {e}"));
                assert!(
                    got[..] == old_data[lba as usize * BS..][..BS],
                    "{ctx}: old block {lba} reads other data"
                );
            }
        }
    }
    assert!(tried > 0, "no cut left the old volume openable");
}

/// A checkpoint written outside the state lock (`Volume::checkpoint`) is held in its phase 2
/// (its slot write parks) after its phase 1 took ~1,800 dirty leaves; meanwhile the host
/// zeroes one block in each of ~1,800 other leaves and flushes, below the dirty pages a
/// tree lets pile up before a checkpoint must come (3,072; a writer past it would wait for
/// the parked checkpoint). Power is cut there. Recovery replays both sets into the tree from
/// the checkpoint before, and its own checkpoint carries a pair-state flip per dirty page:
/// the volume must still open, with every flushed write in place. The volume has a list of
/// 4,096, as every volume created before 6349d060 keeps: 3,600 flips are just below its window
/// of 1,920 + 1,920, and it did not open when the window was bounded by dirty pages alone
/// (4,150 entries).
#[test]
fn recovery_after_a_crash_beside_a_background_checkpoint_opens() {
    let leaves = |a: u64, b: u64| (a..b).map(|l| l * 255);
    let base = zbd_core::CreateOptions {
        extent_bytes: 65536,
        codec: Codec::Lz4,
        capacity_bytes: Some(64 << 20),
        queue_len: Some(64),
        list_capacity: Some(4096),
        ..zbd_core::CreateOptions::new(5 << 30)
    };
    let opts = with_metadata_pages(&base);
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let (park, parked, release) = Parking::new(Arc::clone(&disk));
    let open = zbd_core::OpenOptions {
        map_cache_bytes: 64 << 20,
        ..open_opts_sync()
    };
    let vol = Arc::new(
        Volume::create_with(Box::new(Arc::clone(&park)), &opts, open.clone()).expect("create"),
    );
    let (n1, n2) = (1800u64, 1800u64);
    let mut rng = SmallRng::seed_from_u64(7);
    let mut text = Vec::new();
    for lba in leaves(0, n1 + n2 + 10) {
        let b = fill(&mut rng, Fill::Text, BS);
        vol.write(lba * BS as u64, &b, false).expect("write");
        text.push((lba, b));
    }
    vol.checkpoint().expect("checkpoint");
    // D1: below the window's bound (a checkpoint may still be asked for).
    for lba in leaves(0, n1) {
        vol.write_zeroes(lba * BS as u64, BS as u64).expect("zero");
    }
    vol.flush().expect("flush");
    let lo = sb
        .checkpoint_slot_offset(0, 0)
        .min(sb.checkpoint_slot_offset(1, 0));
    park.arm(Trap::Write(
        lo..lo + 2 * u64::from(sb.checkpoint_slot_bytes),
    ));
    let v = Arc::clone(&vol);
    let ck = std::thread::spawn(move || v.checkpoint());
    parked.recv().expect("the checkpoint's slot write parks");
    // D2, while that checkpoint is in flight: below the bound at which one is written in the
    // lock (that would wait for the parked one).
    for lba in leaves(n1, n1 + n2) {
        vol.write_zeroes(lba * BS as u64, BS as u64).expect("zero");
    }
    vol.flush().expect("flush");
    let image = disk.crash_image(&mut SmallRng::seed_from_u64(1));
    release.send(()).expect("release");
    let _ = ck.join();
    if let Ok(v) = Arc::try_unwrap(vol) {
        v.abandon();
    }
    let check = |vol: &Volume, how: &str| {
        for (lba, b) in &text {
            let got = read_block(vol, *lba).unwrap_or_else(|e| panic!("{how}: block {lba}: {e}"));
            let want_zero = *lba < (n1 + n2) * 255;
            assert!(
                if want_zero {
                    got.iter().all(|&x| x == 0)
                } else {
                    got == *b
                },
                "{how}: block {lba}"
            );
        }
    };
    // A read-only open replays into RAM and writes no checkpoint: it works.
    let ro = Volume::open(
        Box::new(SimStorage::from_image(image.clone())),
        zbd_core::OpenOptions {
            read_only: true,
            ..open.clone()
        },
    )
    .unwrap_or_else(|e| panic!("read-only reopen after the crash: {e}"));
    check(&ro, "read-only");
    drop(ro);
    let vol = Volume::open(Box::new(SimStorage::from_image(image)), open)
        .unwrap_or_else(|e| panic!("reopen after the crash: {e}"));
    check(&vol, "writable");
    for (lba, b) in &text {
        let got = read_block(&vol, *lba).unwrap_or_else(|e| panic!("block {lba}: {e}"));
        let want_zero = *lba < (n1 + n2) * 255;
        assert!(
            if want_zero {
                got.iter().all(|&x| x == 0)
            } else {
                got == *b
            },
            "block {lba}"
        );
    }
}

/// A checkpoint held in its phase 2 (slot write parked) after its phase 1 wrote leaf 0 into
/// the other slot of its pair; meanwhile the host trims leaf 0's whole range (the leaf leaves
/// the tree, its fixed id waits) and writes into it again (the leaf comes back under the same
/// id), and trims the rest of the volume (the root collapses and comes back under a new id).
/// Crash images taken while parked, after the commit, and after one more checkpoint must all
/// read what was flushed.
#[test]
fn region0_leaf_dropped_and_rebuilt_while_a_checkpoint_is_in_flight() {
    const S4: u64 = 4 << 20;
    let opts = with_metadata_pages(&small_volume(S4, 16384, Codec::Lz4, 6, 16));
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let blocks = S4 / BS as u64;
    for variant in 0..3 {
        let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
        let (park, parked, release) = Parking::new(Arc::clone(&disk));
        let vol = Arc::new(
            Volume::create_with(Box::new(Arc::clone(&park)), &opts, open_opts_sync())
                .expect("create"),
        );
        let mut rng = SmallRng::seed_from_u64(variant);
        let mut model = vec![0u8; S4 as usize];
        let put = |vol: &Volume, model: &mut Vec<u8>, lba: u64, rng: &mut SmallRng| {
            let b = fill(rng, Fill::Text, BS);
            vol.write(lba * BS as u64, &b, false).expect("write");
            model[lba as usize * BS..][..BS].copy_from_slice(&b);
        };
        for lba in 0..blocks {
            put(&vol, &mut model, lba, &mut rng);
        }
        vol.checkpoint().expect("checkpoint");
        put(&vol, &mut model, 3, &mut rng);
        put(&vol, &mut model, 40, &mut rng);
        let lo = sb
            .checkpoint_slot_offset(0, 0)
            .min(sb.checkpoint_slot_offset(1, 0));
        park.arm(Trap::Write(
            lo..lo + 2 * u64::from(sb.checkpoint_slot_bytes),
        ));
        let v = Arc::clone(&vol);
        let ck = std::thread::spawn(move || v.checkpoint());
        parked.recv().expect("parked");
        // Leaf 0 (blocks 0..255) dropped and rebuilt, then everything else trimmed.
        vol.trim(0, 255 * BS as u64).expect("trim leaf 0");
        model[..255 * BS].fill(0);
        put(&vol, &mut model, 7, &mut rng);
        vol.trim(255 * BS as u64, S4 - 255 * BS as u64)
            .expect("trim the rest");
        model[255 * BS..].fill(0);
        put(&vol, &mut model, 600, &mut rng);
        vol.flush().expect("flush");
        let mut images = Vec::new();
        if variant == 0 {
            images.push(("parked", disk.crash_image(&mut rng)));
        }
        release.send(()).expect("release");
        ck.join().expect("thread").expect("checkpoint");
        if variant == 1 {
            images.push(("after the commit", disk.crash_image(&mut rng)));
        }
        put(&vol, &mut model, 8, &mut rng);
        vol.checkpoint().expect("checkpoint");
        images.push(("after one more checkpoint", disk.crash_image(&mut rng)));
        for (when, image) in images {
            let ctx = format!("variant {variant}, crash {when}");
            let v2 = Volume::open(Box::new(SimStorage::from_image(image)), open_opts())
                .unwrap_or_else(|e| panic!("{ctx}: reopen: {e}"));
            // Writes after the flush may or may not survive: compare up to block 8's.
            let mut got = vec![0u8; S4 as usize];
            v2.read(0, &mut got).expect("read");
            for lba in 0..blocks as usize {
                if lba == 8 && when != "after one more checkpoint" {
                    continue;
                }
                assert!(
                    got[lba * BS..][..BS] == model[lba * BS..][..BS],
                    "{ctx}: block {lba}"
                );
            }
            let report = v2.check(&|_, _| {});
            assert!(report.is_clean(), "{ctx}: {report:?}");
        }
    }
}

/// `compact` of a bit-10 volume whose live blocks lie one per leaf over ~4,600 leaves, packed
/// in a few extents (highly compressible blocks, each written twice so every extent has dead
/// space): one pass moves them all and dirties every leaf under the lock, with no checkpoint
/// between (the queue never runs dry). The compaction and the checkpoints after it must work,
/// and the volume must read back after a close and after a crash.
#[test]
fn compact_of_a_bit10_volume_with_live_blocks_in_many_leaves() {
    let base = zbd_core::CreateOptions {
        extent_bytes: 65536,
        codec: Codec::Lz4,
        capacity_bytes: Some(16 << 20),
        queue_len: Some(16),
        ..zbd_core::CreateOptions::new(5 << 30)
    };
    let opts = with_metadata_pages(&base);
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let open = zbd_core::OpenOptions {
        map_cache_bytes: 64 << 20,
        ..open_opts_sync()
    };
    let vol =
        Volume::create_with(Box::new(Arc::clone(&disk)), &opts, open.clone()).expect("create");
    let block = |leaf: u64, round: u8| vec![(leaf % 200) as u8 + 1 + round; BS];
    let n = 4600u64;
    for round in 0..2u8 {
        for leaf in 0..n {
            vol.write(leaf * 255 * BS as u64, &block(leaf, round), false)
                .unwrap_or_else(|e| panic!("round {round} leaf {leaf}: {e}"));
        }
    }
    vol.checkpoint().expect("checkpoint");
    let compact = vol.compact(&|_, _| {}).map(|_| ());
    let checkpoint = vol.checkpoint();
    // The host's next flush makes the compaction's segments durable.
    let flush = vol.flush();
    let image = disk.crash_image(&mut SmallRng::seed_from_u64(3));
    let close = vol.close();
    drop(vol);
    let mut reopen = Vec::new();
    for (how, d) in [
        ("after the close", Arc::clone(&disk)),
        ("after a crash", Arc::new(SimStorage::from_image(image))),
    ] {
        let r = Volume::open(Box::new(d), open.clone()).map(|vol| {
            for leaf in (0..n).step_by(7) {
                let got = read_block(&vol, leaf * 255).expect("read");
                assert!(got == block(leaf, 1), "{how}: leaf {leaf}");
            }
        });
        reopen.push((how, r));
    }
    let ok = compact.is_ok()
        && checkpoint.is_ok()
        && flush.is_ok()
        && close.is_ok()
        && reopen.iter().all(|(_, r)| r.is_ok());
    assert!(
        ok,
        "compact: {compact:?}; checkpoint after it: {checkpoint:?}; flush: {flush:?}; \
         close: {close:?}; \
         writable reopen: {reopen:?}"
    );
}
