//! Many threads with many device writes in flight (I/O threads, a small write queue so writers
//! also wait for room, the read cache on, the background cleaner busy) against a per-granule
//! version model. The volume is cut into 100-byte granules (not sector aligned: most writes are
//! read-modify-writes, and neighbouring granules of one block belong to different threads, so
//! two unaligned writes to different bytes of one block race all the time); every granule has
//! one owning writer. Readers read random ranges and check each granule (each piece of it within
//! one 4 KiB block: requests are atomic per block) is exactly some version between the last
//! finished before the read and the last started after it. At the end a crash
//! image taken after a flush must hold exactly the last versions. Seeded (ZBD_STRESS_SEED).
//!
//! The second test (issue 9) keeps the cleaner busy on a small, mostly live data area while
//! writers and readers run: background passes read their victims without the state lock and
//! switch the map only for blocks that did not change meanwhile, so a block rewritten during a
//! pass must never read back as the copy the pass made of its older version.

use crate::common::*;
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use zbd_core::{IoOptions, OpenOptions, SimStorage, Volume};

const G: usize = 100;
const SIZE: u64 = 1 << 20;
const GRANULES: usize = SIZE as usize / G;
/// Granules below this are owned round-robin (racing neighbours in every block); above, in
/// stripes of `STRIPE` granules (large multi-block writes, compressed in parallel).
const INTERLEAVED: usize = GRANULES / 2;
const STRIPE: usize = 400;
const WRITERS: usize = 4;

fn owner(g: usize) -> usize {
    if g < INTERLEAVED {
        g % WRITERS
    } else {
        ((g - INTERLEAVED) / STRIPE) % WRITERS
    }
}

/// Content of granule `g` at version `v` (0: never written, zeros).
fn content(g: usize, v: u64) -> [u8; G] {
    let mut b = [0u8; G];
    if v == 0 {
        return b;
    }
    b[..8].copy_from_slice(&v.to_le_bytes());
    b[8..16].copy_from_slice(&(g as u64).to_le_bytes());
    for (i, x) in b[16..].iter_mut().enumerate() {
        // Compressible, but different for every granule and version.
        *x = (g as u64 * 31 + v * 7 + (i as u64 / 8)) as u8;
    }
    b
}

struct Model {
    started: Vec<AtomicU64>,
    done: Vec<AtomicU64>,
}

fn seed() -> u64 {
    std::env::var("ZBD_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0xc0c0)
}

/// How a run stresses the volume.
struct Case {
    /// Data area, in multiples of the logical size.
    capacity_x: f64,
    /// Cleaner watermarks (low, high) in % of free extents.
    watermarks: (u8, u8),
    /// A thread that runs cleaning rounds back to back while the writers run.
    cleaning_thread: bool,
    /// Operations per writer.
    ops: usize,
}

#[test]
fn concurrent_unaligned_writers_and_readers_match_the_model() {
    let runs = run(Case {
        capacity_x: 3.0,
        watermarks: (30, 50),
        cleaning_thread: false,
        ops: 1200,
    });
    eprintln!("{runs} cleaner passes");
}

#[test]
fn reads_during_cleaning_passes_never_see_stale_data() {
    let runs = run(Case {
        capacity_x: 1.6,
        watermarks: (80, 90),
        cleaning_thread: true,
        ops: 800,
    });
    // The point of the test: many passes ran while blocks were being rewritten and read.
    assert!(runs >= 20, "only {runs} cleaner passes ran");
}

/// Runs writers, readers (and maybe a cleaning thread) against the model; returns the number
/// of cleaner passes.
fn run(case: Case) -> u64 {
    let seed = seed();
    eprintln!("concurrency seed {seed} (ZBD_STRESS_SEED replays it)");
    let opts = zbd_core::CreateOptions {
        extent_bytes: 16384,
        capacity_bytes: Some((case.capacity_x * SIZE as f64) as u64),
        queue_len: Some(32),
        ..zbd_core::CreateOptions::new(SIZE)
    };
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let open = OpenOptions {
        io: IoOptions {
            threads: 4,
            // Small: writers (under the state lock) also wait for room in the queue.
            queue_bytes: 64 * 1024,
            reorder_seed: None,
        },
        read_cache_bytes: 256 * 1024,
        buffer_bytes: 128 * 1024,
        clean_watermarks: Some(case.watermarks),
        ..OpenOptions::default()
    };
    let vol =
        Arc::new(Volume::create_with(Box::new(Arc::clone(&disk)), &opts, open).expect("create"));
    let model = Arc::new(Model {
        started: (0..GRANULES).map(|_| 0.into()).collect(),
        done: (0..GRANULES).map(|_| 0.into()).collect(),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let failure: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let writers: Vec<_> = (0..WRITERS)
        .map(|t| {
            let (vol, model, failure) =
                (Arc::clone(&vol), Arc::clone(&model), Arc::clone(&failure));
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed ^ (t as u64 + 1) << 40);
                for i in 0..case.ops {
                    let (first, n) = if rng.random_bool(0.6) {
                        let k = rng.random_range(0..INTERLEAVED / WRITERS);
                        (k * WRITERS + t, 1)
                    } else {
                        let stripes = (GRANULES - INTERLEAVED) / STRIPE;
                        let s = t + WRITERS * rng.random_range(0..stripes.div_ceil(WRITERS));
                        if s >= stripes {
                            continue;
                        }
                        let a = rng.random_range(0..STRIPE);
                        let n = rng.random_range(1..=STRIPE - a);
                        (INTERLEAVED + s * STRIPE + a, n)
                    };
                    let mut data = Vec::with_capacity(n * G);
                    for g in first..first + n {
                        debug_assert_eq!(owner(g), t);
                        let v = model.done[g].load(Ordering::SeqCst) + 1;
                        model.started[g].store(v, Ordering::SeqCst);
                        data.extend_from_slice(&content(g, v));
                    }
                    let r = vol.write((first * G) as u64, &data, rng.random_bool(0.02));
                    let r = r.and_then(|()| {
                        if rng.random_bool(0.03) {
                            vol.flush()
                        } else {
                            Ok(())
                        }
                    });
                    if let Err(e) = r {
                        *failure.lock() = Some(format!("writer {t} op {i}: {e}"));
                        return;
                    }
                    for g in first..first + n {
                        model.done[g].fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..2u64)
        .map(|r| {
            let (vol, model, failure, stop) = (
                Arc::clone(&vol),
                Arc::clone(&model),
                Arc::clone(&failure),
                Arc::clone(&stop),
            );
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed ^ 0x4ead ^ r);
                let mut reads = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let first = rng.random_range(0..GRANULES);
                    let n = rng.random_range(1..=(GRANULES - first).min(300));
                    let lo: Vec<u64> = (first..first + n)
                        .map(|g| model.done[g].load(Ordering::SeqCst))
                        .collect();
                    let mut buf = vec![0u8; n * G];
                    if let Err(e) = vol.read((first * G) as u64, &mut buf) {
                        *failure.lock() = Some(format!("reader {r}: {e}"));
                        return reads;
                    }
                    for (k, got) in buf.chunks(G).enumerate() {
                        let g = first + k;
                        let hi = model.started[g].load(Ordering::SeqCst);
                        // A request is atomic per 4 KiB block, not across blocks: each piece of
                        // the granule within one block must be whole, of some version in range.
                        let start = g * G;
                        let mut at = start;
                        while at < start + G {
                            let end = ((at / BS + 1) * BS).min(start + G);
                            let (a, b) = (at - start, end - start);
                            let ok = (lo[k]..=hi).any(|v| got[a..b] == content(g, v)[a..b]);
                            if !ok {
                                *failure.lock() = Some(format!(
                                    "reader {r}: granule {g} (writer {}) bytes {a}..{b}: no \
                                     version between finished {} and started {hi} (stale or torn)",
                                    owner(g),
                                    lo[k]
                                ));
                                return reads;
                            }
                            at = end;
                        }
                    }
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    let cleaner = case.cleaning_thread.then(|| {
        let (vol, failure, stop) = (Arc::clone(&vol), Arc::clone(&failure), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                if let Err(e) = vol.clean() {
                    *failure.lock() = Some(format!("cleaner: {e}"));
                    return;
                }
            }
        })
    });
    for w in writers {
        w.join().expect("writer panicked");
    }
    stop.store(true, Ordering::SeqCst);
    if let Some(c) = cleaner {
        c.join().expect("cleaner thread panicked");
    }
    let reads: u64 = readers.into_iter().map(|h| h.join().expect("reader")).sum();
    if let Some(f) = failure.lock().take() {
        panic!("seed {seed}: {f}");
    }
    assert!(reads > 0, "no read was verified");
    vol.flush().expect("flush");
    let st = vol.stats();
    eprintln!(
        "seed {seed}: {reads} verified reads, {} cleaner passes",
        st.counters.cleaner_runs
    );
    let runs = st.counters.cleaner_runs;
    // A crash now keeps everything.
    let image = disk.crash_image(&mut SmallRng::seed_from_u64(seed));
    drop(vol);
    let crashed = Volume::open(Box::new(SimStorage::from_image(image)), open_opts())
        .expect("open after crash");
    let mut buf = vec![0u8; SIZE as usize];
    crashed.read(0, &mut buf).expect("read back");
    for (g, got) in buf.chunks(G).enumerate().take(GRANULES) {
        let v = model.done[g].load(Ordering::SeqCst);
        assert!(
            got == content(g, v),
            "seed {seed}: granule {g} lost version {v} after a crash following a flush"
        );
    }
    assert!(crashed.check(&|_, _| {}).is_clean());
    runs
}
