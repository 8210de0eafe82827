//! Second adversarial review of inline dedup (0d97bfa8..bff909dd): the within-request path
//! (`Piece::Copy`) across a dropped lock, verify candidates, a dedup pass beside inline
//! writers, full volumes, the background cleaner, crashes and failed syncs after them.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use zbd_core::{Codec, CreateOptions, Volume};

fn dedup_on(o: &CreateOptions) -> CreateOptions {
    CreateOptions {
        dedup: true,
        ..with_metadata_pages(o)
    }
}

fn block(vol: &Volume, lba: u64) -> Vec<u8> {
    let mut b = vec![0u8; BS];
    vol.read(lba * BS as u64, &mut b)
        .unwrap_or_else(|e| panic!("block {lba}: {e}"));
    b
}

/// 2 MiB logical on about as much data area, 32 KiB extents (as cleaner/space_short.rs):
/// writes of 64 raw blocks meet "space short" inside the request.
const TIGHT: u64 = 2 << 20;
const TIGHT_BLOCKS: u64 = TIGHT / BS as u64;
const RUN: u64 = 64;

fn tight() -> CreateOptions {
    dedup_on(&small_volume(TIGHT, 32 * 1024, Codec::Lz4, 1, 32))
}

/// Finding 1 (`Piece::Copy` after a "space short" round). Writer A writes 64 blocks at
/// `BASE..BASE+64` whose first and last are the same fresh block X (the last becomes a copy
/// of the first: `earlier`), the rest fresh random blocks, so the request meets space short
/// between them and lets the state lock go. Writer B meanwhile writes fresh blocks to `BASE`
/// only. Nobody but A writes `BASE+63`: it must read X. The copy's `stored_copy(BASE)` is
/// taken after the round, and names B's block if B wrote in between; `put_ref` then checks
/// the identity against what it was just given, and `BASE+63` becomes a reference to B's
/// bytes.
#[test]
fn review2_copy_within_request_across_space_short_names_another_writers_block() {
    const BASE: u64 = 0;
    let (_disk, vol) = sim_volume_with(&tight(), open_opts_with(zbd_core::IoOptions::default()));
    let vol = Arc::new(vol);
    let mut rng = SmallRng::seed_from_u64(21);
    let live = TIGHT_BLOCKS * 3 / 4;
    vol.write(
        0,
        &fill(&mut rng, Fill::Random, (live * BS as u64) as usize),
        false,
    )
    .expect("fill");
    let done = Arc::new(AtomicBool::new(false));
    let b_writes = Arc::new(AtomicU64::new(0));
    let b = {
        let (vol, done, b_writes) = (Arc::clone(&vol), Arc::clone(&done), Arc::clone(&b_writes));
        std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(22);
            while !done.load(Ordering::Relaxed) {
                let y = fill(&mut rng, Fill::Random, BS);
                vol.write(BASE * BS as u64, &y, false).expect("B write");
                b_writes.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let mut wrong = 0;
    let rounds = 300;
    for _ in 0..rounds {
        let x = fill(&mut rng, Fill::Random, BS);
        let mut data = x.clone();
        data.extend(fill(
            &mut rng,
            Fill::Random,
            ((RUN - 2) * BS as u64) as usize,
        ));
        data.extend_from_slice(&x);
        vol.write(BASE * BS as u64, &data, false).expect("A write");
        if block(&vol, BASE + RUN - 1) != x {
            wrong += 1;
        }
    }
    done.store(true, Ordering::Relaxed);
    b.join().expect("join B");
    let s = vol.stats();
    eprintln!(
        "space short rounds {}, B writes {}, wrong {wrong}/{rounds}",
        s.space_short_rounds,
        b_writes.load(Ordering::Relaxed)
    );
    assert!(s.space_short_rounds > 0, "never met space short");
    assert_eq!(
        wrong,
        0,
        "block {} (written X only by A) read another writer's bytes",
        BASE + RUN - 1
    );
}

/// What a concurrent run may leave in each block: its value at its writer's last completed
/// flush, or one written (or attempted) after it.
struct Owned {
    durable: Vec<Vec<u8>>,
    since: Vec<Vec<Vec<u8>>>,
    /// The value of the block's last request if it succeeded (`None`: it failed, and may
    /// have been applied in part).
    exact: Vec<Option<Vec<u8>>>,
    failed: u64,
    /// Every value each block was given, in order, with whether a flush completed after it.
    history: Vec<Vec<(Vec<u8>, bool)>>,
}

#[derive(Clone, Copy)]
struct Mix {
    unit: Option<u32>,
    background_cleaner: bool,
    dedup_pass: bool,
    /// Inline dedup on (else only the pass shares blocks).
    inline: bool,
    threads: u64,
    per: u64,
    rounds: usize,
    /// Live random data before the writers (blocks from `threads * per` on): a tight volume.
    prefill: u64,
}

/// Writers owning disjoint ranges write requests drawn from a few contents (copies within a
/// request, index hits, units), trims and flushes, beside the background cleaner and a dedup
/// pass loop as `m` says, on a tight volume (NoSpace is allowed and recorded as attempted);
/// a power cut (or a failed sync) at storage operation `cut` after the start, then a crash
/// image: every block must read its value at its writer's last completed flush or a later
/// one, and `check` must be clean.
fn mixed_run(m: Mix, seed: u64, cut: Option<(u64, bool)>) -> (u64, zbd_core::Stats) {
    let o = dedup_on(&CreateOptions {
        unit_bytes: m.unit,
        ..small_volume(TIGHT, 32 * 1024, Codec::Lz4, 1, 32)
    });
    let open = zbd_core::OpenOptions {
        background_cleaner: m.background_cleaner,
        dedup: Some(m.inline),
        ..open_opts_with(zbd_core::IoOptions::default())
    };
    let (disk, vol) = sim_volume_with(&o, open.clone());
    let mut rng = SmallRng::seed_from_u64(seed);
    let first_free = m.threads * m.per;
    vol.write(
        first_free * BS as u64,
        &fill(&mut rng, Fill::Random, (m.prefill * BS as u64) as usize),
        false,
    )
    .expect("prefill");
    vol.flush().expect("flush prefill");
    let vol = Arc::new(vol);
    let set: Arc<Vec<Vec<u8>>> = Arc::new(
        (0..8)
            .map(|_| {
                let mut b = fill(&mut rng, Fill::Random, BS / 2);
                b.resize(BS, 0);
                b
            })
            .collect(),
    );
    let ops0 = disk.ops();
    match cut {
        Some((c, true)) => disk.fail_sync_at(ops0 + c, seed ^ c),
        Some((c, false)) => disk.set_power_loss_at(ops0 + c),
        None => {}
    }
    let stop = Arc::new(AtomicBool::new(false));
    let pass = m.dedup_pass.then(|| {
        let (vol, stop) = (Arc::clone(&vol), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if vol.dedup(&|_, _| {}).is_err() {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
            }
        })
    });
    let writers: Vec<_> = (0..m.threads)
        .map(|t| {
            let (vol, set) = (Arc::clone(&vol), Arc::clone(&set));
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed * 1000 + t);
                let per = m.per as usize;
                let mut model = vec![vec![0u8; BS]; per];
                let mut own = Owned {
                    durable: model.clone(),
                    since: vec![Vec::new(); per],
                    exact: model.iter().cloned().map(Some).collect(),
                    failed: 0,
                    history: vec![Vec::new(); per],
                };
                for _ in 0..m.rounds {
                    let i = rng.random_range(0..per);
                    let n = rng.random_range(1..12usize).min(per - i);
                    let lba = t * m.per + i as u64;
                    let ok = if rng.random_bool(0.1) {
                        (i..i + n).for_each(|k| model[k] = vec![0u8; BS]);
                        vol.trim(lba * BS as u64, (n * BS) as u64).is_ok()
                    } else {
                        let mut data = Vec::new();
                        for k in 0..n {
                            let b = if rng.random_bool(0.2) {
                                fill(&mut rng, Fill::Random, BS)
                            } else {
                                set[rng.random_range(0..set.len())].clone()
                            };
                            data.extend_from_slice(&b);
                            model[i + k] = b;
                        }
                        vol.write(lba * BS as u64, &data, false).is_ok()
                    };
                    own.failed += u64::from(!ok);
                    for (k, v) in model.iter().enumerate().skip(i).take(n) {
                        own.since[k].push(v.clone());
                        own.exact[k] = ok.then(|| v.clone());
                        own.history[k].push((v.clone(), false));
                    }
                    if rng.random_bool(0.15) && vol.flush().is_ok() {
                        own.durable = model.clone();
                        own.since.iter_mut().for_each(Vec::clear);
                        for h in own.history.iter_mut() {
                            if let Some(l) = h.last_mut() {
                                l.1 = true;
                            }
                        }
                    }
                }
                own
            })
        })
        .collect();
    let owned: Vec<Owned> = writers
        .into_iter()
        .map(|h| h.join().expect("writer"))
        .collect();
    stop.store(true, Ordering::Relaxed);
    if let Some(p) = pass {
        p.join().expect("pass");
    }
    let stats = vol.stats();
    let ops = disk.ops() - ops0;
    let failed: u64 = owned.iter().map(|o| o.failed).sum();
    if cut.is_none() && failed > 0 {
        eprintln!("seed {seed}: {failed} requests failed (NoSpace)");
    }
    let vol = Arc::into_inner(vol).expect("one owner");
    if cut.is_none() {
        // Everything written reads back live, then after a flush and a crash.
        vol.flush().expect("final flush");
        for (t, own) in owned.iter().enumerate() {
            for i in 0..m.per as usize {
                let lba = t as u64 * m.per + i as u64;
                let got = block(&vol, lba);
                let ok = match &own.exact[i] {
                    Some(want) => &got == want,
                    None => got == own.durable[i] || own.since[i].contains(&got),
                };
                let at: Vec<usize> = own.history[i]
                    .iter()
                    .enumerate()
                    .filter(|(_, (v, _))| *v == got)
                    .map(|(k, _)| k)
                    .collect();
                assert!(
                    ok,
                    "seed {seed}: block {lba} live: history len {}, matches at {at:?}",
                    own.history[i].len()
                );
            }
        }
        assert_clean(&vol, &format!("seed {seed}: live"));
    }
    let mut rng = SmallRng::seed_from_u64(seed ^ 0xabc);
    let image = if matches!(cut, Some((_, true))) {
        // Reopen in the same boot (the failed sync's pages still readable), then a power
        // cut. The failed sync may come only now (the run ended before it): then the open
        // fails, and the crash is taken from there.
        vol.abandon();
        match Volume::open(Box::new(Arc::clone(&disk)), open.clone()) {
            Ok(again) => {
                let img = disk.crash_image(&mut rng);
                again.abandon();
                img
            }
            Err(_) => disk.crash_image(&mut rng),
        }
    } else {
        let img = disk.crash_image(&mut rng);
        vol.abandon();
        img
    };
    let disk = Arc::new(zbd_core::SimStorage::from_image(image));
    let vol = Volume::open(Box::new(Arc::clone(&disk)), open).expect("reopen");
    let ctx = format!("seed {seed} cut {cut:?}");
    for (t, own) in owned.iter().enumerate() {
        for i in 0..m.per as usize {
            let lba = t as u64 * m.per + i as u64;
            let got = read_block(&vol, lba).unwrap_or_else(|e| panic!("{ctx}: block {lba}: {e}"));
            let ok = if let (None, Some(want)) = (cut, &own.exact[i]) {
                &got == want
            } else {
                got == own.durable[i] || own.since[i].contains(&got)
            };
            if !ok {
                let h = &own.history[i];
                let at: Vec<(usize, bool)> = h
                    .iter()
                    .enumerate()
                    .filter(|(_, (v, _))| *v == got)
                    .map(|(k, (_, f))| (k, *f))
                    .collect();
                let in_set = set.iter().position(|v| *v == got);
                let zero = got.iter().all(|&b| b == 0);
                let g = &got;
                let others: Vec<u64> = owned
                    .iter()
                    .enumerate()
                    .flat_map(|(t2, o)| {
                        o.history.iter().enumerate().filter_map(move |(i2, h2)| {
                            h2.iter()
                                .any(|(v, _)| v == g)
                                .then_some(t2 as u64 * m.per + i2 as u64)
                        })
                    })
                    .collect();
                panic!(
                    "{ctx}: block {lba} reads neither its flushed value nor a later one: \
                     history len {}, matches at {at:?}, in set {in_set:?}, zero {zero}, \
                     durable in set {:?}, blocks that held it {others:?}",
                    h.len(),
                    set.iter().position(|v| *v == own.durable[i]),
                );
            }
        }
    }
    assert_clean(&vol, &ctx);
    (ops, stats)
}

fn mixed_sweep(m: Mix, seeds: std::ops::Range<u64>, cuts: u64) {
    for seed in seeds {
        let (ops, stats) = mixed_run(m, seed, None);
        if m.inline {
            assert!(
                stats.dedup_index.as_ref().expect("on").index.verified > 0,
                "no hit: {stats:?}"
            );
        }
        let mut rng = SmallRng::seed_from_u64(seed);
        for _ in 0..cuts {
            let c = rng.random_range(0..ops.max(1));
            mixed_run(m, seed, Some((c, false)));
            mixed_run(m, seed, Some((c, true)));
        }
    }
}

const BASE_MIX: Mix = Mix {
    unit: None,
    background_cleaner: false,
    dedup_pass: false,
    inline: true,
    threads: 3,
    per: 48,
    rounds: 150,
    prefill: TIGHT_BLOCKS * 3 / 4 - 3 * 48,
};

#[test]
fn review2_writers_beside_a_dedup_pass_then_crash() {
    mixed_sweep(
        Mix {
            dedup_pass: true,
            ..BASE_MIX
        },
        0..full_or_light(6, 3),
        4,
    );
}

#[test]
fn review2_writers_beside_the_background_cleaner_then_crash() {
    mixed_sweep(
        Mix {
            background_cleaner: true,
            ..BASE_MIX
        },
        0..full_or_light(6, 3),
        4,
    );
}

#[test]
fn review2_writers_with_units_cleaner_and_pass_then_crash() {
    mixed_sweep(
        Mix {
            unit: Some(16384),
            background_cleaner: true,
            dedup_pass: true,
            ..BASE_MIX
        },
        0..full_or_light(6, 3),
        4,
    );
}

/// The pass beside plain writers (inline dedup off): attributes what the pass tests find.
#[test]
fn review2_plain_writers_beside_a_dedup_pass_then_crash() {
    mixed_sweep(
        Mix {
            dedup_pass: true,
            inline: false,
            ..BASE_MIX
        },
        0..full_or_light(6, 3),
        4,
    );
}

#[test]
fn review2_writers_then_crash() {
    mixed_sweep(BASE_MIX, 0..full_or_light(6, 3), 4);
}

/// Finding 2, single-threaded: blocks turned into references to the same item, overwritten
/// and turned back, flushes now and then; a power cut at every storage operation. After
/// recovery `check` must be clean (a ref record replayed onto a block that already names
/// its item raises the count without a block to match).
#[test]
fn review2_ref_back_to_the_same_item_then_power_cut() {
    let o = dedup_on(&small_volume(1 << 20, 32 * 1024, Codec::Lz4, 3, 8));
    let (_d, vol) = sim_volume(&o);
    vol.close().expect("close");
    let image = _d.current_image();
    drop(vol);
    let mut rng = SmallRng::seed_from_u64(5);
    let a = {
        let mut b = fill(&mut rng, Fill::Random, BS / 2);
        b.resize(BS, 0);
        b
    };
    let zs: Vec<Vec<u8>> = (0..40).map(|_| fill(&mut rng, Fill::Random, BS)).collect();
    let run = |cut: Option<u64>, seed: u64| -> u64 {
        let disk = Arc::new(zbd_core::SimStorage::from_image(image.clone()));
        let vol = Volume::open(Box::new(Arc::clone(&disk)), open_opts()).expect("open");
        let ops0 = disk.ops();
        if let Some(c) = cut {
            disk.set_power_loss_at(ops0 + c);
        }
        let _ = vol.write(0, &a, false);
        let _ = vol.flush();
        for (r, z) in zs.iter().enumerate() {
            let lba = 1 + (r as u64 % 4);
            let _ = vol.write(lba * BS as u64, &a, false);
            let _ = vol.write(lba * BS as u64, z, false);
            let _ = vol.write(lba * BS as u64, &a, false);
            if r % 5 == 4 {
                let _ = vol.flush();
            }
        }
        let ops = disk.ops() - ops0;
        let mut rng = SmallRng::seed_from_u64(seed);
        let img = disk.crash_image(&mut rng);
        vol.abandon();
        let disk = Arc::new(zbd_core::SimStorage::from_image(img));
        let vol = Volume::open(Box::new(disk), open_opts()).expect("reopen");
        assert_clean(&vol, &format!("cut {cut:?} seed {seed}"));
        ops
    };
    let total = run(None, 0);
    for cut in 0..total {
        for seed in 0..3 {
            run(Some(cut), seed);
        }
    }
}
