//! Multi-threaded stress against a per-block version model, with the background cleaner busy on
//! a tight data area: writers own disjoint stripes of blocks and publish which versions they
//! started and finished; readers check that every block they read is exactly some version
//! between the last one finished before the read began and the last one started after it
//! (never stale, never missing, never foreign). The end state must match exactly, after a clean
//! close and after a crash image taken right after a flush. Seeded; the seed is printed.

use crate::common::*;
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use zbd_core::{Codec, OpenOptions, SimStorage, Volume};

const STRIPE: u64 = 8;

/// Version bookkeeping of one block (only its owning writer changes it).
#[derive(Default)]
struct Slot {
    /// Last version whose operation returned.
    done: u64,
    /// Last version whose operation started.
    started: u64,
    /// Versions that are all zeros (trim or zeroes); version 0 is the initial state.
    zero: BTreeSet<u64>,
}

/// Content of `lba` at data version `v`: a header naming both, then a seeded mix of random
/// bytes (varied compressed sizes) and zeros.
fn content(lba: u64, v: u64) -> Vec<u8> {
    let mut rng = SmallRng::seed_from_u64(lba.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ v);
    let mut b = vec![0u8; BS];
    b[..8].copy_from_slice(&lba.to_le_bytes());
    b[8..16].copy_from_slice(&v.to_le_bytes());
    let n = rng.random_range(300..3600);
    rng.fill(&mut b[16..16 + n]);
    b
}

fn check_block(
    slots: &[Mutex<Slot>],
    lba: u64,
    got: &[u8],
    lo: u64,
    hi: u64,
) -> Result<(), String> {
    let s = slots[lba as usize].lock();
    if got.iter().all(|&x| x == 0) {
        if s.zero.range(lo..=hi).next().is_some() {
            return Ok(());
        }
        return Err(format!(
            "block {lba} reads zeros; no zero version in {lo}..={hi}"
        ));
    }
    let hl = u64::from_le_bytes(got[..8].try_into().expect("8 bytes"));
    let v = u64::from_le_bytes(got[8..16].try_into().expect("8 bytes"));
    if hl != lba {
        return Err(format!("block {lba} holds block {hl}'s data (version {v})"));
    }
    if v < lo || v > hi || s.zero.contains(&v) {
        return Err(format!(
            "block {lba} reads version {v}, expected one of {lo}..={hi}"
        ));
    }
    if got != content(lba, v).as_slice() {
        return Err(format!("block {lba} version {v}: content differs"));
    }
    Ok(())
}

/// A volume on a simulated disk whose background cleaner starts early (25 % free) and works
/// up to 45 % free; returns the disk, the shared volume and its open options.
fn busy_cleaner_volume(
    opts: &zbd_core::CreateOptions,
) -> (Arc<SimStorage>, Arc<Volume>, OpenOptions) {
    let sb = zbd_core::layout::plan(opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let open = OpenOptions {
        background_cleaner: true,
        clean_watermarks: Some((25, 45)),
        ..open_opts()
    };
    let vol = Volume::create_with(Box::new(Arc::clone(&disk)), opts, open.clone()).expect("create");
    (disk, Arc::new(vol), open)
}

/// Waits for the writer threads, then tells the readers to stop.
fn join_writers(writers: Vec<std::thread::JoinHandle<()>>, stop: &AtomicBool) {
    for w in writers {
        w.join().expect("writer thread");
    }
    stop.store(true, Ordering::SeqCst);
}

/// Fails the test with the first problem a thread reported.
fn assert_no_failure(failure: &Mutex<Option<String>>, seed: u64) {
    if let Some(f) = failure.lock().take() {
        panic!("seed {seed}: {f}");
    }
}

struct Run {
    seed: u64,
    writers: usize,
    readers: usize,
    ops_per_writer: usize,
    /// Crash images to take and verify while the writers run (at most).
    crash_images: u64,
}

fn stress(run: &Run) {
    let seed = run.seed;
    eprintln!("stress seed {seed} (ZBD_STRESS_SEED replays it)");
    let size = 2u64 << 20;
    let blocks = size / BS as u64;
    let opts = small_volume(size, 16384, Codec::Lz4, 1, 32);
    let (disk, vol, open) = busy_cleaner_volume(&opts);
    let slots: Arc<Vec<Mutex<Slot>>> = Arc::new(
        (0..blocks)
            .map(|_| {
                Mutex::new(Slot {
                    zero: BTreeSet::from([0]),
                    ..Slot::default()
                })
            })
            .collect(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let failure: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let stripes = blocks / STRIPE;
    let mut handles = Vec::new();
    for w in 0..run.writers as u64 {
        let (vol, slots, failure) = (Arc::clone(&vol), Arc::clone(&slots), Arc::clone(&failure));
        let ops = run.ops_per_writer;
        let writers = run.writers as u64;
        handles.push(std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(seed ^ (w + 1) << 32);
            for i in 0..ops {
                let stripe = rng.random_range(0..stripes / writers) * writers + w;
                let first = stripe * STRIPE + rng.random_range(0..STRIPE);
                let n = rng
                    .random_range(1..=4)
                    .min(stripe * STRIPE + STRIPE - first);
                let kind = rng.random_range(0..100);
                let zero = kind >= 85;
                let mut versions = Vec::new();
                for lba in first..first + n {
                    let mut s = slots[lba as usize].lock();
                    s.started += 1;
                    let v = s.started;
                    if zero {
                        s.zero.insert(v);
                    }
                    versions.push(v);
                }
                let (off, len) = (first * BS as u64, n * BS as u64);
                let r = match kind {
                    85..=92 => vol.trim(off, len),
                    93..=99 => vol.write_zeroes(off, len),
                    _ => {
                        let mut data = Vec::with_capacity(len as usize);
                        for (k, v) in versions.iter().enumerate() {
                            data.extend(content(first + k as u64, *v));
                        }
                        vol.write(off, &data, rng.random_bool(0.02))
                    }
                };
                if let Err(e) = r {
                    *failure.lock() = Some(format!("writer {w} op {i}: {e}"));
                    return;
                }
                for (k, v) in versions.iter().enumerate() {
                    slots[first as usize + k].lock().done = *v;
                }
                if rng.random_bool(0.03) {
                    if let Err(e) = vol.flush() {
                        *failure.lock() = Some(format!("writer {w} flush: {e}"));
                        return;
                    }
                }
                if w == 0 && rng.random_bool(0.005) {
                    if let Err(e) = vol.checkpoint() {
                        *failure.lock() = Some(format!("checkpoint: {e}"));
                        return;
                    }
                }
            }
        }));
    }
    let mut reader_handles = Vec::new();
    for r in 0..run.readers as u64 {
        let (vol, slots, failure, stop) = (
            Arc::clone(&vol),
            Arc::clone(&slots),
            Arc::clone(&failure),
            Arc::clone(&stop),
        );
        reader_handles.push(std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(seed ^ 0xfeed ^ r);
            let mut reads = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let first = rng.random_range(0..blocks);
                let n = rng.random_range(1..=8).min(blocks - first);
                let lo: Vec<u64> = (first..first + n)
                    .map(|l| slots[l as usize].lock().done)
                    .collect();
                let mut buf = vec![0u8; (n as usize) * BS];
                if let Err(e) = vol.read(first * BS as u64, &mut buf) {
                    *failure.lock() = Some(format!("reader {r}: read {first}+{n}: {e}"));
                    return reads;
                }
                for k in 0..n {
                    let lba = first + k;
                    let hi = slots[lba as usize].lock().started;
                    let got = &buf[k as usize * BS..(k as usize + 1) * BS];
                    if let Err(msg) = check_block(&slots, lba, got, lo[k as usize], hi) {
                        *failure.lock() = Some(format!("reader {r}: {msg}"));
                        return reads;
                    }
                }
                reads += 1;
            }
            reads
        }));
    }
    // Crash images taken while writers and the cleaner run: every version finished before a
    // completed flush must be there (or a later one).
    let crashes = {
        let (vol, slots, failure, disk) = (
            Arc::clone(&vol),
            Arc::clone(&slots),
            Arc::clone(&failure),
            Arc::clone(&disk),
        );
        let open = OpenOptions {
            background_cleaner: false,
            ..open.clone()
        };
        let writers_done = Arc::clone(&stop);
        let crash_images = run.crash_images;
        std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(seed ^ 0xc4a5);
            let mut crashes = 0u64;
            while !writers_done.load(Ordering::SeqCst) && crashes < crash_images {
                let acked: Vec<u64> = slots.iter().map(|s| s.lock().done).collect();
                if let Err(e) = vol.flush() {
                    *failure.lock() = Some(format!("crasher flush: {e}"));
                    return crashes;
                }
                let image = disk.crash_image(&mut rng);
                let started: Vec<u64> = slots.iter().map(|s| s.lock().started).collect();
                let crashed = SimStorage::from_image(image);
                let vol2 = match Volume::open(Box::new(crashed), open.clone()) {
                    Ok(v) => v,
                    Err(e) => {
                        *failure.lock() = Some(format!("crash image {crashes}: open: {e}"));
                        return crashes;
                    }
                };
                let mut b = vec![0u8; BS];
                for lba in 0..blocks {
                    let r = vol2
                        .read(lba * BS as u64, &mut b)
                        .map_err(|e| e.to_string());
                    let r = r.and_then(|()| {
                        check_block(&slots, lba, &b, acked[lba as usize], started[lba as usize])
                    });
                    if let Err(msg) = r {
                        *failure.lock() = Some(format!("crash image {crashes}: {msg}"));
                        return crashes;
                    }
                }
                vol2.abandon();
                crashes += 1;
            }
            crashes
        })
    };
    join_writers(handles, &stop);
    let crashes = crashes.join().expect("crasher thread");
    let reads: u64 = reader_handles
        .into_iter()
        .map(|h| h.join().expect("reader thread"))
        .sum();
    assert_no_failure(&failure, seed);
    let stats = vol.stats();
    eprintln!(
        "seed {seed}: {reads} verified reads, {crashes} crash images, {} cleaner passes, \
         {} extents reclaimed",
        stats.counters.cleaner_runs, stats.counters.extents_reclaimed
    );
    assert!(
        stats.counters.cleaner_runs > 0,
        "seed {seed}: the cleaner never ran"
    );
    let expect_final = |vol: &Volume, ctx: &str| {
        let mut b = vec![0u8; BS];
        for lba in 0..blocks {
            let s = slots[lba as usize].lock();
            vol.read(lba * BS as u64, &mut b)
                .unwrap_or_else(|e| panic!("seed {seed} {ctx}: block {lba}: {e}"));
            let want = if s.zero.contains(&s.done) {
                vec![0u8; BS]
            } else {
                content(lba, s.done)
            };
            assert!(
                b == want,
                "seed {seed} {ctx}: block {lba} is not version {}",
                s.done
            );
        }
        let report = vol.check(&|_, _| {});
        assert!(report.is_clean(), "seed {seed} {ctx}: {report:?}");
    };
    expect_final(&vol, "live");
    // Crash right after a flush: everything must be there.
    vol.flush().expect("flush");
    let image = disk.current_image();
    let crashed = Arc::new(SimStorage::from_image(image));
    let vol2 =
        Volume::open(Box::new(Arc::clone(&crashed)), open.clone()).expect("reopen after crash");
    expect_final(&vol2, "after crash");
    vol2.close().expect("close");
    drop(vol2);
    let vol = Arc::try_unwrap(vol).ok().expect("sole owner");
    vol.close().expect("close");
    drop(vol);
    let vol3 = Volume::open(Box::new(disk), open).expect("reopen after close");
    expect_final(&vol3, "after close");
}

fn seed_from_env(default: u64) -> u64 {
    std::env::var("ZBD_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[test]
fn threads_with_background_cleaner_match_the_model() {
    stress(&Run {
        seed: seed_from_env(0x51),
        writers: 3,
        readers: 2,
        ops_per_writer: 8000,
        crash_images: 20,
    });
}

#[test]
#[ignore = "heavy: run by make test-heavy"]
fn threads_with_background_cleaner_many_seeds() {
    let base = seed_from_env(1000);
    for seed in base..base + 20 {
        stress(&Run {
            seed,
            writers: 4,
            readers: 3,
            ops_per_writer: 40000,
            crash_images: 200,
        });
    }
}

const SECTOR: usize = 512;
const SECTORS_PER_BLOCK: usize = BS / SECTOR;

/// Content of sector `j` of block `lba` at version `v` (0 = never written: zeros).
fn sector_content(lba: u64, j: usize, v: u64) -> Vec<u8> {
    if v == 0 {
        return vec![0; SECTOR];
    }
    let mut rng = SmallRng::seed_from_u64(lba << 20 ^ (j as u64) << 50 ^ v);
    let mut b = vec![0u8; SECTOR];
    rng.fill(&mut b[..]);
    b[..8].copy_from_slice(&lba.to_le_bytes());
    b[8..16].copy_from_slice(&v.to_le_bytes());
    b
}

/// Sector writes from several threads into the same blocks (each thread owns some sectors of
/// every block), so every write is a read-modify-write racing the others, while the background
/// cleaner relocates those blocks: no update may be lost, and readers never see a sector older
/// than its last finished write.
#[test]
fn racing_sector_writes_with_cleaner_lose_nothing() {
    let seed = seed_from_env(0x5ec);
    eprintln!("sector stress seed {seed} (ZBD_STRESS_SEED replays it)");
    let blocks = 48u64;
    let threads = 4usize;
    let opts = zbd_core::CreateOptions {
        extent_bytes: 16384,
        capacity_bytes: Some(512 * 1024),
        queue_len: Some(16),
        ..zbd_core::CreateOptions::new(1 << 20)
    };
    let (_disk, vol, _) = busy_cleaner_volume(&opts);
    // done[lba * 8 + j]: last finished version of that sector.
    let done: Arc<Vec<std::sync::atomic::AtomicU64>> = Arc::new(
        (0..blocks as usize * SECTORS_PER_BLOCK)
            .map(|_| 0.into())
            .collect(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let failure: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let writers: Vec<_> = (0..threads)
        .map(|t| {
            let (vol, done, failure) = (Arc::clone(&vol), Arc::clone(&done), Arc::clone(&failure));
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed ^ (t as u64 + 1) << 40);
                for i in 0..2500 {
                    let lba = rng.random_range(0..blocks);
                    let j = t + threads * rng.random_range(0..SECTORS_PER_BLOCK / threads);
                    let slot = &done[lba as usize * SECTORS_PER_BLOCK + j];
                    let v = slot.load(Ordering::SeqCst) + 1;
                    let at = lba * BS as u64 + (j * SECTOR) as u64;
                    if let Err(e) = vol.write(at, &sector_content(lba, j, v), false) {
                        let st = vol.stats();
                        *failure.lock() = Some(format!(
                            "thread {t} write {i}: {e} ({} extents free, {} live bytes, {} dead)",
                            st.extents_free, st.physical_bytes_live, st.dead_bytes
                        ));
                        return;
                    }
                    slot.store(v, Ordering::SeqCst);
                }
            })
        })
        .collect();
    let reader = {
        let (vol, done, failure, stop) = (
            Arc::clone(&vol),
            Arc::clone(&done),
            Arc::clone(&failure),
            Arc::clone(&stop),
        );
        std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(seed ^ 0x4ead);
            let mut b = vec![0u8; BS];
            let mut reads = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let lba = rng.random_range(0..blocks);
                let base = lba as usize * SECTORS_PER_BLOCK;
                let lo: Vec<u64> = (0..SECTORS_PER_BLOCK)
                    .map(|j| done[base + j].load(Ordering::SeqCst))
                    .collect();
                if let Err(e) = vol.read(lba * BS as u64, &mut b) {
                    *failure.lock() = Some(format!("read {lba}: {e}"));
                    return reads;
                }
                for (j, sector) in b.chunks(SECTOR).enumerate() {
                    let v = if sector.iter().all(|&x| x == 0) {
                        0
                    } else {
                        u64::from_le_bytes(sector[8..16].try_into().expect("8 bytes"))
                    };
                    if v < lo[j] || sector != sector_content(lba, j, v).as_slice() {
                        *failure.lock() = Some(format!(
                            "block {lba} sector {j}: read version {v}, finished {}",
                            lo[j]
                        ));
                        return reads;
                    }
                }
                reads += 1;
            }
            reads
        })
    };
    join_writers(writers, &stop);
    let reads = reader.join().expect("reader");
    assert_no_failure(&failure, seed);
    let runs = vol.stats().counters.cleaner_runs;
    eprintln!("seed {seed}: {reads} verified reads, {runs} cleaner passes");
    let mut b = vec![0u8; BS];
    for lba in 0..blocks {
        vol.read(lba * BS as u64, &mut b).expect("read");
        for (j, sector) in b.chunks(SECTOR).enumerate() {
            let v = done[lba as usize * SECTORS_PER_BLOCK + j].load(Ordering::SeqCst);
            assert!(
                sector == sector_content(lba, j, v).as_slice(),
                "seed {seed}: block {lba} sector {j} lost version {v}"
            );
        }
    }
    assert!(runs > 0, "seed {seed}: the cleaner never ran");
    assert!(vol.check(&|_, _| {}).is_clean());
}
