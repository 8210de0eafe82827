//! Dictionary retirement under load (`State::retire_dicts` / `free_retired`, per-dictionary live
//! counts, migration by the cleaner and `compact`): races with overwrites, trims, cleaning and
//! retrains, crashes around retirement and room reuse, and id reuse. Guards against a block
//! decoded with a dictionary other than its own.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use zbd_core::{Codec, CreateOptions, OpenOptions, SimStorage, Volume};

/// Dictionary volumes: 8 MiB, whose region holds two dictionaries (every retrain after the
/// second needs a retired one's room, so ids and bytes are reused), single 4 KiB blocks.
const DICT_SIZE: u64 = 8 << 20;
/// Blocks the dictionary tests write (1 MiB).
const DICT_BLOCKS: usize = 256;

fn dict_create() -> CreateOptions {
    dict_create_with(Codec::Lz4)
}

fn dict_create_with(codec: Codec) -> CreateOptions {
    CreateOptions {
        unit_bytes: Some(4096),
        ..small_volume(DICT_SIZE, 16384, codec, 2, 8)
    }
}

fn dict_open() -> OpenOptions {
    OpenOptions {
        dictionary: Some(true),
        ..open_opts()
    }
}

/// Block `b` at version `v`: a log-like record block (a dictionary pays on it) after a header
/// naming both.
fn log_block(b: usize, v: u64) -> Vec<u8> {
    let mut d = log_records(v.wrapping_mul(1009) ^ b as u64, BS);
    d[..8].copy_from_slice(&(b as u64).to_le_bytes());
    d[8..16].copy_from_slice(&v.to_le_bytes());
    d
}

fn samples(seed: u64) -> Vec<Vec<u8>> {
    log_records(seed, 256 << 10)
        .chunks(BS)
        .map(<[u8]>::to_vec)
        .collect()
}

/// Hypothesis 2b: a block whose map entry names another dictionary than the one its bytes
/// were compressed with (what a wrong live count followed by id reuse, or any misattribution,
/// would produce) must read as an error, never as data. An lz4 block decoded with another
/// dictionary of the same size decodes to the right length, so a checksum of the stored bytes
/// alone does not notice; the v3 item checksum is seeded with the dictionary's identity. Shown
/// here by rewriting map entries (both copies, page checksums valid) to name the other
/// dictionary of the volume.
#[test]
fn a_block_misattributed_to_another_dictionary_is_an_error_never_data() {
    // zstd frames name their dictionary (a mismatch fails to decode); lz4 blocks do not.
    for codec in [Codec::Zstd(1), Codec::Lz4] {
        misattributed(codec);
    }
}

fn misattributed(codec: Codec) {
    use zbd_core::format::{decode_map_page, encode_map_page, MapEntry, MAP_PAGE_BYTES};
    let (disk, vol) = sim_volume_v2_map(&dict_create_with(codec), dict_open());
    let write = |from: usize, to: usize, v: u64| {
        for b in from..to {
            vol.write((b * BS) as u64, &log_block(b, v), false)
                .expect("write");
        }
    };
    write(0, DICT_BLOCKS, 1);
    vol.retrain_dictionary(samples(100)).expect("retrain");
    write(0, DICT_BLOCKS, 2);
    // Whatever dictionary the first write trained is retired, and its room freed.
    vol.checkpoint().expect("checkpoint");
    vol.checkpoint().expect("checkpoint");
    assert_eq!(
        vol.retrain_dictionary(samples(101)).expect("retrain"),
        zbd_core::Retrained::Installed
    );
    write(DICT_BLOCKS / 2, DICT_BLOCKS, 3);
    vol.close().expect("close");
    drop(vol);
    let mut image = disk.current_image();
    let (sb, ck) = newest_checkpoint(&image);
    let slot = ck.page_slots[0];
    assert_ne!(slot, 0, "page 0 is written");
    let at = |copy| sb.map_page_offset(0, slot - 1, copy) as usize;
    let page = image[at(0)..at(0) + MAP_PAGE_BYTES].to_vec();
    let gen = u64::from_le_bytes(page[8..16].try_into().expect("8 bytes"));
    let per_page = zbd_core::format::MAP_ENTRIES_PER_PAGE.min(sb.logical_blocks as usize);
    let mut full = vec![MapEntry::UNMAPPED; per_page];
    decode_map_page(&page, 0, ck.seq, &mut full).expect("page");
    // Block 0 was written with one dictionary, block DICT_BLOCKS / 2 (same page) another.
    let (a, b) = (full[0].dict, full[DICT_BLOCKS / 2].dict);
    assert!(
        a != 0 && b != 0 && a != b,
        "two dictionaries in use: {a} {b}"
    );
    for e in full.iter_mut().take(DICT_BLOCKS / 2) {
        assert_eq!(e.dict, a);
        e.dict = b;
    }
    let patched = encode_map_page(0, gen, &full);
    for copy in 0..sb.metadata_copies() {
        image[at(copy)..at(copy) + MAP_PAGE_BYTES].copy_from_slice(&patched);
    }
    let vol =
        Volume::open_read_only(Box::new(Arc::new(SimStorage::from_image(image)))).expect("open");
    let mut wrong = Vec::new();
    for blk in 0..DICT_BLOCKS / 2 {
        if let Ok(got) = read_block(&vol, blk as u64) {
            if got != log_block(blk, 2) {
                wrong.push(blk);
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{codec}: {} of {} blocks decoded with the wrong dictionary read as data: {:?}",
        wrong.len(),
        DICT_BLOCKS / 2,
        &wrong[..wrong.len().min(8)]
    );
}

/// Every block reads exactly `expect`, `check` is clean (its recount of the map agrees with
/// the per-dictionary live counts), and after two checkpoints no listed dictionary other than
/// the active one has a zero count (retirement is not stuck) nor is one with live blocks gone.
fn verify_dict_volume(vol: &Volume, expect: &[Vec<u8>], ctx: &str) {
    for (b, want) in expect.iter().enumerate() {
        let got = read_block(vol, b as u64).unwrap_or_else(|e| panic!("{ctx}: block {b}: {e}"));
        assert!(got == *want, "{ctx}: block {b} is not its last write");
    }
    let report = vol.check(&|_, _| {});
    assert!(report.is_clean(), "{ctx}: check: {report:?}");
    vol.checkpoint().expect("checkpoint");
    vol.checkpoint().expect("checkpoint");
    let stats = vol.stats();
    for d in &stats.dictionaries {
        assert!(d.loaded, "{ctx}: dictionary {} listed but not loaded", d.id);
        assert!(
            d.active || d.live_blocks != Some(0),
            "{ctx}: dictionary {} has no live block but was not retired: {:?}",
            d.id,
            stats.dictionaries
        );
    }
}

/// Hypothesis 2a: retirement racing overwrites, trims, the cleaner's migration, compaction
/// and retrains (which reuse retired ids and room). A count too low would retire a dictionary
/// blocks still name: they would read as errors once it is unloaded, or as another
/// dictionary's data once its id is reused. Two writers own half the blocks each; a reader
/// checks every block reads a version between its last completed and last started write.
#[test]
fn retirement_beside_overwrites_trims_cleaning_and_retrains_keeps_every_block() {
    retirement_race(&dict_create(), (80, 90));
}

/// 2a on a thin volume whose data area (512 KiB) the compressed blocks nearly fill: writers
/// clean ahead (and make_space runs) while dictionaries are retired and retrained, so the
/// passes that migrate blocks to the current dictionary are the writers' own.
///
/// Issue 26 (fixed): in about 1 run in 100-400 the checking reader got "corrupt data" for a
/// block, for good: a writer's block compressed with an older dictionary was placed after a
/// checkpoint, written while it opened an extent, had retired that dictionary (no mapped
/// block named it any more), and the next checkpoint unloaded it. `State::placing_dict`;
/// the deterministic case is engine/tests.rs,
/// `a_checkpoint_while_a_block_is_placed_keeps_the_dictionary_it_names`.
#[test]
fn retirement_beside_writers_cleaning_ahead_keeps_every_block() {
    let create = CreateOptions {
        capacity_bytes: Some(512 << 10),
        ..dict_create()
    };
    retirement_race(&create, (20, 40));
}

fn retirement_race(create: &CreateOptions, watermarks: (u8, u8)) {
    let open = OpenOptions {
        background_cleaner: true,
        clean_watermarks: Some(watermarks),
        ..dict_open()
    };
    let (disk, vol) = sim_volume_with(create, open);
    let vol = Arc::new(vol);
    for b in 0..DICT_BLOCKS {
        vol.write((b * BS) as u64, &log_block(b, 1), false)
            .expect("fill");
    }
    let started: Arc<Vec<AtomicU64>> =
        Arc::new((0..DICT_BLOCKS).map(|_| AtomicU64::new(1)).collect());
    let completed: Arc<Vec<AtomicU64>> =
        Arc::new((0..DICT_BLOCKS).map(|_| AtomicU64::new(1)).collect());
    let trims: Arc<Mutex<HashSet<(usize, u64)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    const WRITERS: usize = 2;
    let barrier = Arc::new(Barrier::new(WRITERS + 2));
    let per = DICT_BLOCKS / WRITERS;
    let writers: Vec<_> = (0..WRITERS)
        .map(|t| {
            let (vol, started, completed, trims, barrier) = (
                Arc::clone(&vol),
                Arc::clone(&started),
                Arc::clone(&completed),
                Arc::clone(&trims),
                Arc::clone(&barrier),
            );
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(200 + t as u64);
                let range = t * per..(t + 1) * per;
                let mut last: Vec<Option<Vec<u8>>> =
                    range.clone().map(|b| Some(log_block(b, 1))).collect();
                let mut ver = vec![1u64; per];
                barrier.wait();
                for _ in 0..700 {
                    let b = rng.random_range(range.clone());
                    let n = rng.random_range(1..=8usize).min(range.end - b);
                    let trim = rng.random_range(0..100) >= 85;
                    let mut data = Vec::with_capacity(n * BS);
                    for k in b..b + n {
                        let i = k - range.start;
                        ver[i] += 1;
                        if trim {
                            trims.lock().expect("lock").insert((k, ver[i]));
                            last[i] = None;
                        } else {
                            let d = log_block(k, ver[i]);
                            data.extend_from_slice(&d);
                            last[i] = Some(d);
                        }
                        started[k].store(ver[i], Ordering::SeqCst);
                    }
                    if trim {
                        vol.trim((b * BS) as u64, (n * BS) as u64).expect("trim");
                    } else {
                        vol.write((b * BS) as u64, &data, false).expect("write");
                    }
                    for k in b..b + n {
                        completed[k].store(ver[k - range.start], Ordering::SeqCst);
                    }
                }
                (range, last)
            })
        })
        .collect();
    let retrainer = {
        let (vol, stop, barrier) = (Arc::clone(&vol), Arc::clone(&stop), Arc::clone(&barrier));
        std::thread::spawn(move || {
            barrier.wait();
            let mut installed = 0;
            let mut seed = 300;
            while !stop.load(Ordering::SeqCst) || installed < 4 {
                seed += 1;
                installed += usize::from(
                    vol.retrain_dictionary(samples(seed)).expect("retrain")
                        == zbd_core::Retrained::Installed,
                );
                vol.checkpoint().expect("checkpoint");
                vol.compact(&|_, _| {}).expect("compact");
                vol.clean().expect("clean");
                vol.checkpoint().expect("checkpoint");
                if seed > 340 {
                    break;
                }
            }
            installed
        })
    };
    let reader = spawn_checking_reader(
        Arc::clone(&vol),
        [Arc::clone(&started), Arc::clone(&completed)],
        Arc::clone(&trims),
        Arc::clone(&stop),
        (DICT_BLOCKS, 6),
        |b, v, buf| buf == log_block(b, v),
    );
    barrier.wait();
    let mut expect: Vec<Vec<u8>> = vec![vec![0u8; BS]; DICT_BLOCKS];
    for w in writers {
        let (range, last) = w.join().expect("writer");
        for (k, d) in range.zip(last) {
            expect[k] = d.unwrap_or_else(|| vec![0u8; BS]);
        }
    }
    stop.store(true, Ordering::SeqCst);
    reader.join().expect("reader");
    let installed = retrainer.join().expect("retrainer");
    // Two fit in the region: installs after the second reused a retired one's id and room.
    assert!(installed >= 4, "only {installed} retrains installed");
    verify_dict_volume(&vol, &expect, "live");
    vol.close().expect("close");
    drop(vol);
    let vol = Volume::open(Box::new(Arc::clone(&disk)), dict_open()).expect("reopen");
    verify_dict_volume(&vol, &expect, "reopened");
}

/// A closed dictionary volume whose blocks all name one dictionary (A) while a newer one (B)
/// serves new blocks; the region is full (two), so the next install needs A's room.
fn two_dictionary_image() -> Vec<u8> {
    let (disk, vol) = sim_volume_with(&dict_create(), dict_open());
    let write = |v: u64| {
        for b in 0..DICT_BLOCKS {
            vol.write((b * BS) as u64, &log_block(b, v), false)
                .expect("write");
        }
    };
    write(1);
    vol.retrain_dictionary(samples(100)).expect("retrain");
    write(2);
    vol.checkpoint().expect("checkpoint");
    vol.checkpoint().expect("checkpoint");
    assert_eq!(
        vol.retrain_dictionary(samples(101)).expect("retrain"),
        zbd_core::Retrained::Installed
    );
    let stats = vol.stats();
    let mut live: Vec<_> = stats
        .dictionaries
        .iter()
        .map(|d| (d.active, d.live_blocks))
        .collect();
    live.sort();
    assert_eq!(
        live,
        vec![(false, Some(DICT_BLOCKS as u64)), (true, Some(0))],
        "A names every block, B none"
    );
    vol.close().expect("close");
    drop(vol);
    disk.current_image()
}

/// The steps swept by hypothesis 2c-2e: blocks move off A (host overwrites, then `compact`'s
/// migration), checkpoints retire and free A, a retrain reuses its room, new blocks
/// name the new dictionary. Stops at the first error (the power loss).
fn retire_phase(vol: &Volume, exp: &mut Expect) -> Result<(), String> {
    let write = |exp: &mut Expect, from: usize, to: usize, v: u64| {
        for b in from..to {
            let d = log_block(b, v);
            exp.wrote(b, &d);
            vol.write((b * BS) as u64, &d, false)
                .map_err(|e| format!("write: {e}"))?;
        }
        Ok::<(), String>(())
    };
    let flush = |exp: &mut Expect| {
        vol.flush().map_err(|e| format!("flush: {e}"))?;
        exp.flushed();
        Ok::<(), String>(())
    };
    write(exp, 0, DICT_BLOCKS / 2, 3)?;
    flush(exp)?;
    write(exp, DICT_BLOCKS / 2, DICT_BLOCKS * 3 / 4, 4)?;
    flush(exp)?;
    vol.compact(&|_, _| {})
        .map_err(|e| format!("compact: {e}"))?;
    flush(exp)?;
    for _ in 0..2 {
        vol.checkpoint().map_err(|e| format!("checkpoint: {e}"))?;
        exp.flushed();
    }
    vol.retrain_dictionary(samples(102))
        .map_err(|e| format!("retrain: {e}"))?;
    write(exp, 0, DICT_BLOCKS / 8, 5)?;
    flush(exp)?;
    write(exp, DICT_BLOCKS / 8, DICT_BLOCKS / 4, 6)?;
    Ok(())
}

/// Hypotheses 2c, 2d, 2e: a crash at any storage operation while blocks move off a
/// dictionary, it is retired, freed and its room reused. Recovery rolls forward segments whose
/// records name dictionaries; the per-dictionary counts it starts from (the checkpoint's
/// directory) plus the replay must equal a recount of the map (`check`, right after the
/// open), every block must read its flushed value or a later one (never an error, never
/// another dictionary's decoding), and the recovered volume must go on retiring and reusing.
#[test]
fn a_crash_around_retirement_and_room_reuse_recovers_exact_counts() {
    let image = two_dictionary_image();
    let base_data: Vec<Vec<u8>> = (0..DICT_BLOCKS).map(|b| log_block(b, 2)).collect();
    let fresh = || {
        let mut exp = Expect::new(DICT_BLOCKS);
        exp.durable = base_data.clone();
        exp
    };
    // Probe: the phase retires A and reuses its id.
    let disk = Arc::new(SimStorage::from_image(image.clone()));
    let vol = Volume::open(Box::new(Arc::clone(&disk)), dict_open()).expect("open");
    let a = vol
        .stats()
        .dictionaries
        .iter()
        .find(|d| !d.active)
        .expect("A")
        .id;
    let base = disk.ops();
    let mut exp = fresh();
    retire_phase(&vol, &mut exp).expect("probe");
    let total = disk.ops() - base;
    let ids: Vec<(u16, bool)> = vol
        .stats()
        .dictionaries
        .iter()
        .map(|d| (d.id, d.active))
        .collect();
    // (Ids come back as late as possible, `dicts::place`: A's room is reused, its id is not.)
    assert!(
        ids.len() == 2 && ids.iter().all(|&(id, _)| id != a),
        "A ({a}) retired and its room reused by a new dictionary: {ids:?}"
    );
    exp.verify(&vol, "probe");
    drop(vol);
    let step = (total / 150).max(1);
    for (n, at) in (0..total).step_by(step as usize).enumerate() {
        let disk = Arc::new(SimStorage::from_image(image.clone()));
        let vol = Volume::open(Box::new(Arc::clone(&disk)), dict_open()).expect("open");
        disk.set_power_loss_at(disk.ops() + at);
        let mut exp = fresh();
        let _ = retire_phase(&vol, &mut exp);
        let crashed = disk.crash_image(&mut SmallRng::seed_from_u64(n as u64));
        vol.abandon();
        let disk = Arc::new(SimStorage::from_image(crashed));
        let vol = Volume::open(Box::new(Arc::clone(&disk)), dict_open())
            .unwrap_or_else(|e| panic!("crash at {at}: open: {e}"));
        let ctx = format!("crash at {at}");
        // `verify` runs `check` first thing after the open: counts against the map.
        exp.verify(&vol, &ctx);
        let now: Vec<Vec<u8>> = (0..DICT_BLOCKS)
            .map(|b| read_block(&vol, b as u64).expect("read"))
            .collect();
        verify_dict_volume(&vol, &now, &ctx);
        // The recovered volume retires and reuses room too.
        let mut now = now;
        for (b, d) in now.iter_mut().enumerate().skip(DICT_BLOCKS / 2) {
            *d = log_block(b, 7);
            vol.write((b * BS) as u64, d, false)
                .expect("write after recovery");
        }
        vol.compact(&|_, _| {}).expect("compact");
        verify_dict_volume(&vol, &now, &ctx);
        vol.retrain_dictionary(samples(103)).expect("retrain");
        for (b, d) in now.iter_mut().enumerate().take(DICT_BLOCKS / 4) {
            *d = log_block(b, 8);
            vol.write((b * BS) as u64, d, false)
                .expect("write after retrain");
        }
        vol.close().expect("close");
        drop(vol);
        let vol = Volume::open(Box::new(disk), dict_open()).expect("reopen");
        verify_dict_volume(&vol, &now, &format!("{ctx}, reopened"));
    }
}

/// Hypothesis 2b (id reuse): ids wrap around within 1..=127 once retired ones are free. A block
/// written long ago names dictionary X and is never rewritten; more than 127 dictionaries are
/// installed and retired after it (each one's blocks trimmed), so every other id is handed out
/// again. X must never be: the block would decode with another dictionary's content (wrong
/// data for lz4, see above). Also across a reopen in the middle.
#[test]
fn ids_wrap_around_but_never_onto_a_dictionary_a_live_block_names() {
    // 128 MiB logical (thin: an 8 MiB data area): a 128 KiB region holds four dictionaries,
    // so X, the one in use and a new one fit together.
    let create = CreateOptions {
        unit_bytes: Some(4096),
        capacity_bytes: Some(8 << 20),
        ..small_volume(128 << 20, 16384, Codec::Lz4, 1, 8)
    };
    let open = || OpenOptions {
        background_cleaner: false,
        ..dict_open()
    };
    let (disk, vol) = sim_volume_with(&create, open());
    let mut vol = vol;
    vol.retrain_dictionary(samples(1)).expect("retrain");
    let keep = log_block(0, 1);
    vol.write(0, &keep, false).expect("write");
    let x = vol
        .stats()
        .dictionaries
        .iter()
        .find(|d| d.active)
        .expect("X")
        .id;
    let mut seen: HashSet<u16> = HashSet::new();
    let mut reused = 0;
    for round in 0..140u64 {
        // The blocks of the dictionary in use die, so it can be retired and its room reused.
        for b in 1..9 {
            vol.write((b * BS) as u64, &log_block(b, round + 2), false)
                .expect("write");
        }
        vol.trim(BS as u64, 8 * BS as u64).expect("trim");
        vol.checkpoint().expect("checkpoint");
        vol.checkpoint().expect("checkpoint");
        assert_eq!(
            vol.retrain_dictionary(samples(10 + round % 7))
                .expect("retrain"),
            zbd_core::Retrained::Installed,
            "round {round}: nothing installed: {:?}",
            vol.stats().dictionaries
        );
        let id = vol
            .stats()
            .dictionaries
            .iter()
            .find(|d| d.active)
            .expect("active")
            .id;
        assert_ne!(
            id, x,
            "round {round}: X's id handed out while block 0 names it"
        );
        reused += usize::from(!seen.insert(id));
        if round == 70 {
            vol.close().expect("close");
            drop(vol);
            vol = Volume::open(Box::new(Arc::clone(&disk)), open()).expect("reopen");
        }
        assert!(
            read_block(&vol, 0).expect("block 0") == keep,
            "round {round}: block 0"
        );
    }
    assert!(reused > 0, "no id came back: the test exercised nothing");
    let report = vol.check(&|_, _| {});
    assert!(report.is_clean(), "check: {report:?}");
}
