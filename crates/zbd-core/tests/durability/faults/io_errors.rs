//! I/O errors that are not power cuts: one EIO injected at every storage operation of a
//! workload in turn, and discards that always fail. A failed read fails its request only; a
//! failed write or sync stops the volume; nothing flushed is lost and no extent is handed out
//! twice.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use zbd_core::{Codec, Error, IoOptions, SimStorage, Volume};

/// Released extents must be consistently free even when discarding them fails: before, the
/// first failing discard aborted the release loop after the free list had taken every released
/// extent, leaving the rest "pending free" and so released (and queued) again at the next
/// checkpoint: one extent handed out twice.
#[test]
fn failing_discard_neither_fails_writes_nor_double_allocates() {
    let size = 256 * 1024u64;
    let opts = small_volume(size, 8192, Codec::Lz4, 2, 8);
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let vol = Volume::create_with(Box::new(NoDiscard(Arc::clone(&disk))), &opts, open_opts())
        .expect("create");
    let blocks = size / BS as u64;
    let mut model = vec![vec![0u8; BS]; blocks as usize];
    let mut rng = SmallRng::seed_from_u64(12);
    for i in 0..3000u64 {
        let lba = rng.random_range(0..blocks);
        let d = part_random(&mut rng);
        vol.write(lba * BS as u64, &d, false)
            .unwrap_or_else(|e| panic!("write {i}: {e}"));
        model[lba as usize] = d;
        if i % 97 == 0 {
            vol.checkpoint()
                .unwrap_or_else(|e| panic!("checkpoint {i}: {e}"));
        }
    }
    let check = |vol: &Volume, ctx: &str| {
        for (lba, d) in model.iter().enumerate() {
            let got = read_block(vol, lba as u64).unwrap_or_else(|e| panic!("{ctx}: {lba}: {e}"));
            assert!(&got == d, "{ctx}: block {lba} differs");
        }
        let report = vol.check(&|_, _| {});
        assert!(report.is_clean(), "{ctx}: {report:?}");
    };
    check(&vol, "live");
    vol.close().expect("close");
    drop(vol);
    check(&reopen(&disk), "reopened");
}

/// One I/O error injected at each storage operation of a workload in turn (redb's fuzzer does
/// this). A failed read fails that request only (each of its blocks then holds the old or the
/// new data) and the volume carries on. A failed write or sync stops the volume (the failed
/// state, docs/design.md): every later write and flush fails with EIO, reads are still served,
/// and after reopening every block holds its last flushed value or one written after it,
/// never a checksum error. Runs with synchronous writes (the request that issued the failing
/// write sees it) and with the I/O queue in reordered mode (a queued write's error fails the
/// next sync, or a later write that has to wait for it: io.rs), which must stop the volume too.
#[test]
fn an_io_error_at_any_operation_corrupts_nothing() {
    let size = 128 * 1024u64;
    let blocks = size / BS as u64;
    // Tight data area, the cleaner busy; then roomy, with unaligned writes, zeroes and trims.
    let tight = small_volume(size, 8192, Codec::Lz4, 1, 4);
    let overwrites = overwrite_workload(17, blocks, 300);
    let faults = io_fault_sweep(size, &tight, &overwrites, IoOptions::synchronous())
        + io_fault_sweep(size, &tight, &overwrites, IoOptions::reordered(17))
        + io_fault_sweep(
            size,
            &small_volume(size, 16384, Codec::Zstd(1), 4, 4),
            &workload(18, size, 150),
            IoOptions::synchronous(),
        );
    eprintln!("{faults} injected I/O errors survived");
}

/// Every block of `vol` reads back exactly as in `model`.
fn assert_holds(vol: &Volume, model: &[u8], ctx: &str) {
    for (b, want) in model.chunks(BS).enumerate() {
        let got = read_block(vol, b as u64).unwrap_or_else(|e| panic!("{ctx}: block {b}: {e}"));
        assert!(
            got == want,
            "{ctx}: block {b} differs from what the requests left"
        );
    }
}

/// Per-block contents at the last completed flush and written since (any may survive).
struct Flushed {
    durable: Vec<u8>,
    since: Vec<Vec<Vec<u8>>>,
}

impl Flushed {
    /// Every block of `vol` holds its last flushed value or one written since.
    fn check(&self, vol: &Volume, ctx: &str) {
        for b in 0..self.since.len() {
            let got = read_block(vol, b as u64).unwrap_or_else(|e| panic!("{ctx}: block {b}: {e}"));
            assert!(
                got == self.durable[b * BS..(b + 1) * BS] || self.since[b].contains(&got),
                "{ctx}: block {b} lost flushed data"
            );
        }
    }
}

/// Returns how many storage operations the workload made (one run per fault position).
fn io_fault_sweep(size: u64, opts: &zbd_core::CreateOptions, work: &[Op], io: IoOptions) -> i64 {
    let sb = zbd_core::layout::plan(opts).expect("plan");
    let blocks = size as usize / BS;
    let mut fault_at = 0i64;
    // Each operation in turn under make test-heavy; every third under make test (the whole
    // sweep is over a minute on two cores).
    let step = full_or_light(1, 3);
    let mut stopped_runs = 0;
    loop {
        let sim = Arc::new(SimStorage::new(sb.total_bytes() as usize));
        let storage = Arc::new(OneFault {
            disk: Arc::clone(&sim),
            countdown: i64::MAX.into(),
        });
        let vol = Volume::create_with(
            Box::new(Arc::clone(&storage)),
            opts,
            open_opts_with(io.clone()),
        )
        .expect("create");
        storage
            .countdown
            .store(fault_at, std::sync::atomic::Ordering::SeqCst);
        let mut model = vec![0u8; size as usize];
        let mut flushed = Flushed {
            durable: model.clone(),
            since: vec![Vec::new(); blocks],
        };
        let mut failed = 0;
        let ctx = format!("EIO at storage op {fault_at} ({io:?})");
        for (i, op) in work.iter().enumerate() {
            let before = model.clone();
            apply_model(&mut model, op);
            let (offset, len) = match op {
                Op::Write { offset, data, .. } => (*offset, data.len() as u64),
                Op::Trim { offset, len } | Op::Zero { offset, len } => (*offset, *len),
                Op::Flush => (0, 0),
            };
            let range_blocks = if len == 0 {
                0..=0usize
            } else {
                (offset / BS as u64) as usize..=((offset + len - 1) / BS as u64) as usize
            };
            if len > 0 {
                for b in range_blocks.clone() {
                    flushed.since[b].push(model[b * BS..(b + 1) * BS].to_vec());
                }
            }
            let r = apply_volume(&vol, op);
            if r.is_ok() {
                if matches!(op, Op::Flush | Op::Write { fua: true, .. }) {
                    flushed.durable.copy_from_slice(&model);
                    flushed.since.iter_mut().for_each(|s| s.clear());
                }
                continue;
            }
            failed += 1;
            // A failed request may have changed some of its blocks and not others (never part
            // of one block): read them back (the fault has fired, reads work) and go on from
            // what the volume holds.
            if len > 0 {
                for b in range_blocks {
                    let got = read_block(&vol, b as u64)
                        .unwrap_or_else(|e| panic!("{ctx}, op {i}: block {b}: {e}"));
                    let range = b * BS..(b + 1) * BS;
                    assert!(
                        got == before[range.clone()] || got == model[range.clone()],
                        "{ctx}, op {i} failed: block {b} is neither old nor new"
                    );
                    model[range].copy_from_slice(&got);
                }
            }
            if vol.stats().failed.is_some() {
                // Stopped: nothing is written any more, and it says so.
                let again = vol.write(0, &vec![1u8; BS], false);
                assert!(matches!(again, Err(Error::Failed(_))), "{ctx}: {again:?}");
                assert!(matches!(vol.flush(), Err(Error::Failed(_))), "{ctx}");
                assert_eq!(
                    again.err().map(|e| e.errno()),
                    Some(zbd_core::error::errno::EIO)
                );
                stopped_runs += 1;
                break;
            }
        }
        // Faults are injected into the workload only (a failed close is a crash, crash.rs).
        let fired = storage
            .countdown
            .swap(i64::MAX, std::sync::atomic::Ordering::SeqCst)
            < 0;
        let stopped = vol.stats().failed.is_some();
        if !stopped {
            // A crash right after a successful flush keeps everything, failed request or not.
            vol.flush().unwrap_or_else(|e| panic!("{ctx}: flush: {e}"));
            flushed.durable.copy_from_slice(&model);
            flushed.since.iter_mut().for_each(|s| s.clear());
        }
        let mut rng = SmallRng::seed_from_u64(fault_at as u64);
        let crashed = Volume::open(
            Box::new(SimStorage::from_image(sim.crash_image(&mut rng))),
            open_opts_sync(),
        )
        .unwrap_or_else(|e| panic!("{ctx}: open after crash: {e}"));
        flushed.check(&crashed, &format!("{ctx}, crash"));
        crashed.abandon();
        let closed = vol.close();
        assert_eq!(closed.is_err(), stopped, "{ctx}: close: {closed:?}");
        drop(vol);
        let vol = Volume::open(Box::new(sim), open_opts_sync())
            .unwrap_or_else(|e| panic!("{ctx}: reopen: {e}"));
        if stopped {
            flushed.check(&vol, &format!("{ctx}, reopen"));
        } else {
            assert_holds(&vol, &model, &ctx);
        }
        let report = vol.check(&|_, _| {});
        assert!(report.is_clean(), "{ctx}: {report:?}");
        if !fired {
            break;
        }
        assert!(failed <= 1, "{ctx}: {failed} requests failed after one EIO");
        fault_at += step;
    }
    assert!(
        fault_at > 100,
        "the workload made only {fault_at} storage operations"
    );
    assert!(stopped_runs > 0, "no fault ever stopped the volume");
    fault_at
}
