//! Review 13: attacks on `MapTree::pages_needed`, the stock carver, `check`'s metadata-extent
//! rule and trim/zero steps on bit-10 volumes.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::Arc;
use zbd_core::{Codec, CreateOptions, SimStorage, Volume};

/// A bit-10 volume of `logical` bytes on 16 MiB of data area with the default stock.
fn big_logical(logical: u64) -> CreateOptions {
    CreateOptions {
        extent_bytes: 32768,
        codec: Codec::Lz4,
        capacity_bytes: Some(16 << 20),
        queue_len: Some(8),
        metadata_pages: true,
        ..CreateOptions::new(logical)
    }
}

/// Opens `disk` after a crash twice (a failed open must not be cured by a retry either).
fn open_after_crash(disk: &Arc<SimStorage>) -> Volume {
    for attempt in 0..2 {
        match Volume::open(Box::new(Arc::clone(disk)), open_opts()) {
            Ok(v) => return v,
            Err(e) => eprintln!("open {attempt} after the crash: {e}"),
        }
    }
    panic!("a volume whose last request was flushed does not open after a crash")
}

/// F1. A write-zeroes of never-written space changes, live, a summary slot or a few interior
/// pages per step (`MapTree::set_range`): 16 GiB in 257 steps, no checkpoint needed. Replay
/// applies each Zero record block by block (`replay_one` in engine/open.rs: `set_entry(l,
/// ZERO)` for every block), creating and dirtying a leaf per 255 blocks: 16,448 leaves, all
/// pinned until the recovery checkpoint. The page pool runs out and the volume never opens
/// again ("Replay needs what the live run had" does not hold for zero and trim records).
#[test]
fn review13_f1_replay_of_a_flushed_16gib_zero_opens() {
    zero_16gib_flush_crash_reopen(&big_logical(16 << 30));
}

/// A block written and checkpointed, then a flushed 16 GiB write-zeroes over it and a crash:
/// the volume opens, the block reads zeros, `check` is clean.
fn zero_16gib_flush_crash_reopen(opts: &CreateOptions) {
    let (disk, vol) = sim_volume_v2_map(opts, open_opts());
    let mut rng = SmallRng::seed_from_u64(1);
    let data = fill(&mut rng, Fill::Text, 4096);
    vol.write(3 << 30, &data, false).expect("write");
    vol.checkpoint().expect("checkpoint");
    vol.write_zeroes(0, 16 << 30).expect("zero 16 GiB");
    vol.flush().expect("flush");
    vol.abandon();
    let vol = open_after_crash(&disk);
    assert!(read_block(&vol, (3 << 30) / 4096).expect("read") == vec![0u8; 4096]);
    let report = vol.check(&|_, _| {});
    assert!(report.is_clean(), "{report:?}");
}

/// F1, trim side: a trim of zeroed space turns whole all-zero subtrees into unmapped
/// summaries live; replay sets every block to unmapped under the all-zero summary and creates
/// a leaf per 255 blocks.
#[test]
fn review13_f1_replay_of_a_flushed_16gib_trim_over_zeroes_opens() {
    let (disk, vol) = sim_volume_v2_map(&big_logical(16 << 30), open_opts());
    vol.write_zeroes(0, 16 << 30).expect("zero all");
    vol.checkpoint().expect("checkpoint");
    vol.trim(0, 16 << 30).expect("trim 16 GiB");
    vol.flush().expect("flush");
    vol.abandon();
    let vol = open_after_crash(&disk);
    assert!(read_block(&vol, 12345).expect("read") == vec![0u8; 4096]);
    assert_eq!(vol.stats().zero_blocks, 0, "the trim did not survive whole");
    let report = vol.check(&|_, _| {});
    assert!(report.is_clean(), "{report:?}");
}

/// Attack 4: a trim of 16 steps (64 leaves each) over ~1,000 leaves that hold data, then a
/// write into its first step's range and a flush, with a power cut at every storage operation
/// and several crash images each. Blocks read their old data or zeros (any subset of an
/// unacknowledged request), the block written after the trim reads old, zero or new; once the
/// flush returned, the trim holds whole and the write survives. The volume opens and `check`
/// is clean.
#[test]
fn review13_a4_trim_steps_cut_at_every_operation() {
    let opts = big_logical(1 << 30);
    let (disk, vol) = sim_volume_v2_map(&opts, open_opts());
    let mut rng = SmallRng::seed_from_u64(4);
    let kinds: Vec<Vec<u8>> = (0..8).map(|_| fill(&mut rng, Fill::Text, 4096)).collect();
    let lbas: Vec<u64> = (0..1000).map(|i| i * 255 + (i % 200)).collect();
    let end = 250_000u64;
    for (i, l) in lbas.iter().enumerate() {
        vol.write(l * 4096, &kinds[i % 8], false).expect("write");
    }
    vol.close().expect("close");
    let base = disk.current_image();
    let fresh = fill(&mut rng, Fill::Text, 4096);
    let mut cut = 0;
    loop {
        let disk = Arc::new(SimStorage::from_image(base.clone()));
        let vol = Volume::open(Box::new(Arc::clone(&disk)), open_opts()).expect("open");
        disk.set_power_loss_at(disk.ops() + cut);
        let trimmed = vol.trim(0, end * 4096).is_ok();
        let wrote = trimmed && vol.write(lbas[1] * 4096, &fresh, false).is_ok();
        let flushed = wrote && vol.flush().is_ok() && !disk.powered_off();
        let done = !disk.powered_off();
        vol.abandon();
        for seed in 0..if done { 1 } else { 4 } {
            let image = if done {
                disk.current_image()
            } else {
                disk.crash_image(&mut SmallRng::seed_from_u64(cut * 16 + seed))
            };
            let disk = Arc::new(SimStorage::from_image(image));
            let vol = Volume::open(Box::new(Arc::clone(&disk)), open_opts())
                .unwrap_or_else(|e| panic!("cut {cut}/{seed}: open: {e}"));
            let mut trimmed_now = 0;
            for (i, l) in lbas.iter().enumerate() {
                let d = &kinds[i % 8];
                let got = read_block(&vol, *l)
                    .unwrap_or_else(|e| panic!("cut {cut}/{seed}: read {l}: {e}"));
                let zero = got == vec![0u8; 4096];
                trimmed_now += usize::from(zero);
                let ok = if *l >= end {
                    got == *d
                } else if i == 1 {
                    if flushed {
                        got == fresh
                    } else {
                        got == *d || zero || got == fresh
                    }
                } else if flushed {
                    zero
                } else {
                    got == *d || zero
                };
                assert!(
                    ok,
                    "cut {cut}/{seed} (flushed {flushed}): block {l} reads wrong data"
                );
            }
            eprintln!("cut {cut}/{seed}: {trimmed_now} trimmed, flushed {flushed}");
            let report = vol.check(&|_, _| {});
            assert!(report.is_clean(), "cut {cut}/{seed}: {report:?}");
            vol.close().expect("close");
        }
        if done {
            break;
        }
        cut += 1;
    }
}

/// Attack 4, concurrent: one thread trims and zeroes ranges of many steps over blocks with
/// data, another writes blocks past them, flushes and checkpoints, a third runs `check`
/// (the new metadata-extent rule against concurrent carves and checkpoints). Every `check`
/// must be clean; after the last flush and a crash every write past the ranges reads back
/// and the ranges read zeros.
#[test]
fn review13_a4_trim_steps_race_writes_flushes_and_check() {
    let opts = CreateOptions {
        metadata_stock_extents: Some(2),
        ..big_logical(1 << 30)
    };
    let (disk, vol) = sim_volume_v2_map(&opts, open_opts());
    let mut rng = SmallRng::seed_from_u64(5);
    let kinds: Vec<Vec<u8>> = (0..8).map(|_| fill(&mut rng, Fill::Text, 4096)).collect();
    let split = 120_000u64;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let last: Vec<std::sync::Mutex<Option<usize>>> =
        (0..400).map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|s| {
        s.spawn(|| {
            for round in 0..6u64 {
                for i in 0..400u64 {
                    let l = i * 255 + round;
                    vol.write(l * 4096, &kinds[(i + round) as usize % 8], false)
                        .expect("fill");
                }
                if round % 2 == 0 {
                    vol.trim(0, split * 4096).expect("trim");
                } else {
                    vol.write_zeroes(0, split * 4096).expect("zero");
                }
            }
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        s.spawn(|| {
            let mut n = 0usize;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let i = n % 400;
                let l = split + 10 + i as u64 * 255;
                let mut g = last[i].lock().expect("lock");
                vol.write(l * 4096, &kinds[n % 8], false)
                    .expect("write past");
                *g = Some(n % 8);
                drop(g);
                if n.is_multiple_of(37) {
                    vol.flush().expect("flush");
                }
                if n.is_multiple_of(101) {
                    vol.checkpoint().expect("checkpoint");
                }
                n += 1;
            }
        });
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let report = vol.check(&|_, _| {});
                assert!(report.is_clean(), "check while served: {report:?}");
            }
        });
    });
    vol.flush().expect("flush");
    vol.abandon();
    let vol = open_after_crash(&disk);
    for (i, k) in last.iter().enumerate() {
        if let Some(k) = *k.lock().expect("lock") {
            let l = split + 10 + i as u64 * 255;
            assert!(read_block(&vol, l).expect("read") == kinds[k], "block {l}");
        }
    }
    for i in 0..400u64 {
        for round in 0..6u64 {
            let l = i * 255 + round;
            if l < split {
                assert!(
                    read_block(&vol, l).expect("read") == vec![0u8; 4096],
                    "block {l}"
                );
            }
        }
    }
    let report = vol.check(&|_, _| {});
    assert!(report.is_clean(), "{report:?}");
}

/// F1 on a v2 volume (no page tree; its map pages are fixed and its dirty pages pinned until
/// the checkpoint too): a flushed 16 GiB write-zeroes replays and the volume opens.
#[test]
fn review13_f1_replay_of_a_flushed_16gib_zero_opens_on_v2() {
    zero_16gib_flush_crash_reopen(&CreateOptions {
        metadata_pages: false,
        ..big_logical(16 << 30)
    });
}
