//! The second review of snapshots (first form, 42409a68): scenarios that try to break counts,
//! counters and contents of snapshots and clones.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::Arc;
use zbd_core::{Codec, CreateOptions, Volume};

const SIZE: u64 = 4 << 20;
const BLOCKS: usize = (SIZE / BS as u64) as usize;
const LEAF: usize = 255;

fn opts(dedup: bool) -> CreateOptions {
    CreateOptions {
        dedup,
        ..with_metadata_pages(&small_volume(SIZE, 65536, Codec::Lz4, 2, 6))
    }
}

fn read_dev(vol: &Volume, id: u32) -> Vec<u8> {
    let mut got = vec![0u8; SIZE as usize];
    vol.read_in(id, 0, &mut got).expect("read");
    got
}

fn assert_dev(vol: &Volume, id: u32, model: &[u8], ctx: &str) {
    let got = read_dev(vol, id);
    for (i, (g, m)) in got.chunks(BS).zip(model.chunks(BS)).enumerate() {
        assert!(
            g == m,
            "{ctx}: device {id} block {i} differs from its model"
        );
    }
}

fn filled(seed: u64) -> (Arc<zbd_core::SimStorage>, Volume, Vec<u8>) {
    let (disk, vol) = sim_volume(&opts(false));
    let mut rng = SmallRng::seed_from_u64(seed);
    let now: Vec<u8> = (0..BLOCKS).flat_map(|_| part_random(&mut rng)).collect();
    vol.write(0, &now, false).expect("write");
    (disk, vol, now)
}

/// write_zeroes of a whole leaf the origin shares with a snapshot: the slot becomes the
/// zero summary without a report (the page stays for the snapshot), so the volume counters
/// miss the zero blocks the map now holds.
#[test]
fn review_zeroing_a_whole_shared_leaf_keeps_the_counters() {
    let (_disk, vol, mut now) = filled(1);
    vol.snapshot("default", "s").expect("snapshot");
    let at_s = now.clone();
    vol.write_zeroes(LEAF as u64 * BS as u64, (LEAF * BS) as u64)
        .expect("zero");
    now[LEAF * BS..2 * LEAF * BS].fill(0);
    assert_dev(&vol, 1, &now, "origin");
    assert_dev(&vol, id_of(&vol, "s"), &at_s, "snapshot");
    assert_clean(&vol, "after zeroing a whole shared leaf");
}

/// The same in a clone, whose leaf is its snapshot's (not made by it).
#[test]
fn review_clone_zeroing_a_whole_shared_leaf_keeps_the_counters() {
    let (_disk, vol, now) = filled(2);
    vol.snapshot("default", "s").expect("snapshot");
    let c = vol.clone_snapshot("s", "c").expect("clone");
    vol.write_zeroes_in(c, 0, (LEAF * BS) as u64).expect("zero");
    let mut in_c = now.clone();
    in_c[..LEAF * BS].fill(0);
    assert_dev(&vol, c, &in_c, "clone");
    assert_clean(&vol, "after a clone zeroed a whole shared leaf");
}

/// A snapshot takes no trims nor zeroing either.
#[test]
fn review_snapshot_refuses_trim_and_zero() {
    let (_disk, vol, now) = filled(3);
    let s = vol.snapshot("default", "s").expect("snapshot");
    assert!(vol.trim_in(s, 0, (LEAF * BS) as u64).is_err(), "trim");
    assert!(
        vol.write_zeroes_in(s, 0, (LEAF * BS) as u64).is_err(),
        "zero"
    );
    assert_dev(&vol, s, &now, "snapshot");
    assert_clean(&vol, "snapshot refused changes");
}

/// A random mix over several devices: writes (with repeats, for dedup), partial trims and
/// zeroing (never a whole leaf: see above), snapshots, clones, snapshots of clones, deletes
/// of origins and snapshots, rollbacks, the cleaner and the offline dedup pass; every live
/// device read against its model and `zbd check` after each operation; a reopen at the end.
fn mix(seed: u64, dedup: bool, ops: usize) {
    use rand::Rng;
    use std::collections::BTreeMap;
    let o = CreateOptions {
        dedup,
        ..with_metadata_pages(&small_volume(SIZE, 65536, Codec::Lz4, 6, 6))
    };
    let (disk, mut vol) = sim_volume(&o);
    let mut rng = SmallRng::seed_from_u64(seed);
    // name -> (model, writable, parent name)
    let mut devs: BTreeMap<String, (Vec<u8>, bool, String)> = BTreeMap::new();
    devs.insert(
        "default".into(),
        (vec![0u8; SIZE as usize], true, String::new()),
    );
    let mut pool: Vec<Vec<u8>> = (0..16).map(|_| part_random(&mut rng)).collect();
    let mut n = 0;
    for step in 0..ops {
        let names: Vec<String> = devs.keys().cloned().collect();
        let writable: Vec<String> = devs
            .iter()
            .filter(|d| d.1 .1)
            .map(|d| d.0.clone())
            .collect();
        let snaps: Vec<String> = devs
            .iter()
            .filter(|d| !d.1 .1)
            .map(|d| d.0.clone())
            .collect();
        let op = rng.random_range(0..100);
        let ctx = format!("seed {seed} step {step} op {op}");
        if op < 40 {
            let d = &writable[rng.random_range(0..writable.len())];
            let id = id_of(&vol, d);
            let at = rng.random_range(0..BLOCKS - 40);
            let len = rng.random_range(1..40);
            let mut buf = Vec::new();
            for _ in 0..len {
                if rng.random_bool(0.3) {
                    buf.extend_from_slice(&pool[rng.random_range(0..pool.len())]);
                } else {
                    let b = part_random(&mut rng);
                    if rng.random_bool(0.2) {
                        let k = rng.random_range(0..pool.len());
                        pool[k] = b.clone();
                    }
                    buf.extend_from_slice(&b);
                }
            }
            vol.write_in(id, (at * BS) as u64, &buf, false).expect(&ctx);
            devs.get_mut(d).expect("a live device").0[at * BS..(at + len) * BS]
                .copy_from_slice(&buf);
        } else if op < 48 {
            let d = &writable[rng.random_range(0..writable.len())];
            let id = id_of(&vol, d);
            // Partial ranges of at most two leaves, never a whole leaf.
            let at = rng.random_range(0..BLOCKS - 300);
            let len = rng.random_range(1..200);
            let zero = rng.random_bool(0.5);
            if zero && (at % LEAF == 0 || (LEAF - at % LEAF) + LEAF <= len) {
                continue;
            }
            if zero {
                vol.write_zeroes_in(id, (at * BS) as u64, (len * BS) as u64)
            } else {
                vol.trim_in(id, (at * BS) as u64, (len * BS) as u64)
            }
            .expect(&ctx);
            devs.get_mut(d).expect("a live device").0[at * BS..(at + len) * BS].fill(0);
        } else if op < 58 {
            let d = writable[rng.random_range(0..writable.len())].clone();
            n += 1;
            let name = format!("s{n}");
            vol.snapshot(&d, &name).expect(&ctx);
            let m = devs[&d].0.clone();
            devs.insert(name, (m, false, d));
        } else if op < 66 && !snaps.is_empty() {
            let s = snaps[rng.random_range(0..snaps.len())].clone();
            n += 1;
            let name = format!("c{n}");
            vol.clone_snapshot(&s, &name).expect(&ctx);
            let m = devs[&s].0.clone();
            devs.insert(name, (m, true, s));
        } else if op < 74 && names.len() > 1 {
            let d = names[rng.random_range(0..names.len())].clone();
            if d == "default" {
                continue;
            }
            vol.delete_device(&d).expect(&ctx);
            devs.remove(&d);
        } else if op < 82 {
            // Rollback of a writable device to one of its snapshots.
            let cands: Vec<(String, String)> = devs
                .iter()
                .filter(|x| !x.1 .1 && devs.contains_key(&x.1 .2))
                .map(|x| (x.1 .2.clone(), x.0.clone()))
                .collect();
            if cands.is_empty() {
                continue;
            }
            let (d, s) = cands[rng.random_range(0..cands.len())].clone();
            vol.rollback(&d, &s).expect(&ctx);
            let m = devs[&s].0.clone();
            devs.get_mut(&d).expect("a live device").0 = m;
        } else if op < 88 {
            vol.clean().expect(&ctx);
        } else if op < 92 && dedup {
            vol.dedup(&|_, _| {}).expect(&ctx);
        } else if op < 96 {
            vol.flush().expect(&ctx);
        } else {
            vol.close().expect(&ctx);
            vol = reopen(&disk);
        }
        for (name, (m, _, _)) in &devs {
            assert_dev(&vol, id_of(&vol, name), m, &ctx);
        }
        assert_clean(&vol, &ctx);
    }
    vol.close().expect("close");
    let vol = reopen(&disk);
    for (name, (m, _, _)) in &devs {
        assert_dev(&vol, id_of(&vol, name), m, "reopened at the end");
    }
    assert_clean(&vol, "reopened at the end");
}

#[test]
fn review_mix_plain() {
    for seed in 0..6 {
        mix(seed, false, 150);
    }
}

#[test]
fn review_mix_dedup() {
    for seed in 100..106 {
        mix(seed, true, 150);
    }
}

/// Power cuts across rollbacks, the delete of an origin whose snapshot and clone survive,
/// snapshots of clones, inline dedup onto items in shared leaves and the cleaner: the volume
/// opens, checks clean, and every snapshot that exists reads its point in time.
#[test]
fn review_power_cuts_across_rollback_and_origin_delete() {
    use rand::Rng;
    let o = CreateOptions {
        dedup: true,
        ..with_metadata_pages(&small_volume(SIZE, 65536, Codec::Lz4, 4, 6))
    };
    let (disk, vol) = sim_volume(&o);
    let mut rng = SmallRng::seed_from_u64(77);
    let base: Vec<u8> = (0..BLOCKS).flat_map(|_| part_random(&mut rng)).collect();
    vol.write(0, &base, false).expect("write");
    vol.create_device("o", SIZE).expect("device");
    vol.write_in(2, 0, &base, false).expect("write");
    vol.close().expect("close");
    let image = disk.current_image();
    let run = |cut: Option<u64>| -> u64 {
        let disk = Arc::new(zbd_core::SimStorage::from_image(image.clone()));
        let vol = reopen(&disk);
        let ops0 = disk.ops();
        if let Some(c) = cut {
            disk.set_power_loss_at(ops0 + c);
        }
        let mut rng = SmallRng::seed_from_u64(3);
        let mut kept: Vec<(String, Vec<u8>)> = Vec::new();
        let mut now = base.clone();
        let mut o_now = base.clone();
        let scribble = |vol: &Volume, dev: u32, m: &mut Vec<u8>, rng: &mut SmallRng| {
            for _ in 0..40 {
                let i = rng.random_range(0..BLOCKS);
                // Half the time another block's content: a dedup hit.
                let b = if rng.random_bool(0.5) {
                    let j = rng.random_range(0..BLOCKS);
                    m[j * BS..(j + 1) * BS].to_vec()
                } else {
                    part_random(rng)
                };
                if vol.write_in(dev, (i * BS) as u64, &b, false).is_ok() {
                    m[i * BS..(i + 1) * BS].copy_from_slice(&b);
                }
            }
        };
        if vol.snapshot("default", "s0").is_ok() {
            kept.push(("s0".into(), now.clone()));
        }
        scribble(&vol, 1, &mut now, &mut rng);
        if vol.snapshot("o", "os").is_ok() {
            kept.push(("os".into(), o_now.clone()));
        }
        scribble(&vol, 2, &mut o_now, &mut rng);
        let _ = vol.trim_in(2, (10 * BS) as u64, (600 * BS) as u64);
        o_now[10 * BS..610 * BS].fill(0);
        if let Ok(c) = vol.clone_snapshot("os", "oc") {
            let mut c_now = kept.last().expect("a snapshot").1.clone();
            scribble(&vol, c, &mut c_now, &mut rng);
            if vol.snapshot("oc", "ocs").is_ok() {
                kept.push(("ocs".into(), c_now.clone()));
            }
            scribble(&vol, c, &mut c_now, &mut rng);
        }
        let _ = vol.delete_device("o");
        let _ = vol.clean();
        if vol.rollback("default", "s0").is_ok() {
            now = base.clone();
        } else {
            assert!(cut.is_some(), "rollback");
        }
        scribble(&vol, 1, &mut now, &mut rng);
        let _ = vol.delete_device("s0");
        let _ = vol.flush();
        let ops = disk.ops() - ops0;
        if cut.is_none() {
            assert_eq!(kept.len(), 3, "every snapshot taken");
            let names: Vec<String> = vol.devices().into_iter().map(|d| d.name).collect();
            assert_eq!(names, ["default", "os", "oc", "ocs"], "{names:?}");
            assert_dev(&vol, 1, &now, "uncut default");
        }
        let mut crng = SmallRng::seed_from_u64(cut.unwrap_or(0));
        let crashed = disk.crash_image(&mut crng);
        vol.abandon();
        let vol = reopen(&Arc::new(zbd_core::SimStorage::from_image(crashed)));
        let ctx = format!("cut at {cut:?}");
        assert_clean(&vol, &ctx);
        finish_deletes(&vol, &ctx);
        let names: Vec<String> = vol.devices().into_iter().map(|d| d.name).collect();
        for (name, model) in &kept {
            if names.contains(name) {
                assert_dev(&vol, id_of(&vol, name), model, &ctx);
            }
        }
        ops
    };
    let total = run(None);
    let step = (total / 60).max(1);
    for cut in (0..total).step_by(step as usize) {
        run(Some(cut));
    }
}

/// Failed syncs (then a power cut at the end) across rollbacks, the delete of an origin whose snapshot and clone survive,
/// snapshots of clones, inline dedup onto items in shared leaves and the cleaner: the volume
/// opens, checks clean, and every snapshot that exists reads its point in time.
#[test]
fn review_failed_syncs_across_rollback_and_origin_delete() {
    use rand::Rng;
    let o = CreateOptions {
        dedup: true,
        ..with_metadata_pages(&small_volume(SIZE, 65536, Codec::Lz4, 4, 6))
    };
    let (disk, vol) = sim_volume(&o);
    let mut rng = SmallRng::seed_from_u64(77);
    let base: Vec<u8> = (0..BLOCKS).flat_map(|_| part_random(&mut rng)).collect();
    vol.write(0, &base, false).expect("write");
    vol.create_device("o", SIZE).expect("device");
    vol.write_in(2, 0, &base, false).expect("write");
    vol.close().expect("close");
    let image = disk.current_image();
    let run = |cut: Option<u64>| -> u64 {
        let disk = Arc::new(zbd_core::SimStorage::from_image(image.clone()));
        let vol = reopen(&disk);
        let ops0 = disk.ops();
        if let Some(c) = cut {
            disk.fail_sync_at(ops0 + c, c);
        }
        let mut rng = SmallRng::seed_from_u64(3);
        let mut kept: Vec<(String, Vec<u8>)> = Vec::new();
        let mut now = base.clone();
        let mut o_now = base.clone();
        let scribble = |vol: &Volume, dev: u32, m: &mut Vec<u8>, rng: &mut SmallRng| {
            for _ in 0..40 {
                let i = rng.random_range(0..BLOCKS);
                // Half the time another block's content: a dedup hit.
                let b = if rng.random_bool(0.5) {
                    let j = rng.random_range(0..BLOCKS);
                    m[j * BS..(j + 1) * BS].to_vec()
                } else {
                    part_random(rng)
                };
                if vol.write_in(dev, (i * BS) as u64, &b, false).is_ok() {
                    m[i * BS..(i + 1) * BS].copy_from_slice(&b);
                }
            }
        };
        if vol.snapshot("default", "s0").is_ok() {
            kept.push(("s0".into(), now.clone()));
        }
        scribble(&vol, 1, &mut now, &mut rng);
        if vol.snapshot("o", "os").is_ok() {
            kept.push(("os".into(), o_now.clone()));
        }
        scribble(&vol, 2, &mut o_now, &mut rng);
        let _ = vol.trim_in(2, (10 * BS) as u64, (600 * BS) as u64);
        o_now[10 * BS..610 * BS].fill(0);
        if let Ok(c) = vol.clone_snapshot("os", "oc") {
            let mut c_now = kept.last().expect("a snapshot").1.clone();
            scribble(&vol, c, &mut c_now, &mut rng);
            if vol.snapshot("oc", "ocs").is_ok() {
                kept.push(("ocs".into(), c_now.clone()));
            }
            scribble(&vol, c, &mut c_now, &mut rng);
        }
        let _ = vol.delete_device("o");
        let _ = vol.clean();
        if vol.rollback("default", "s0").is_ok() {
            now = base.clone();
        } else {
            assert!(cut.is_some(), "rollback");
        }
        scribble(&vol, 1, &mut now, &mut rng);
        let _ = vol.delete_device("s0");
        let _ = vol.flush();
        let ops = disk.ops() - ops0;
        if cut.is_none() {
            assert_eq!(kept.len(), 3, "every snapshot taken");
            let names: Vec<String> = vol.devices().into_iter().map(|d| d.name).collect();
            assert_eq!(names, ["default", "os", "oc", "ocs"], "{names:?}");
            assert_dev(&vol, 1, &now, "uncut default");
        }
        {
            let ctx = format!("live after a failed sync at {cut:?}");
            assert_clean(&vol, &ctx);
            // A delete the failed sync stopped takes no request until a reopen finishes it.
            let names: Vec<String> = vol
                .devices()
                .into_iter()
                .filter(|d| d.kind != "deleting")
                .map(|d| d.name)
                .collect();
            for (name, model) in &kept {
                if names.contains(name) {
                    assert_dev(&vol, id_of(&vol, name), model, &ctx);
                }
            }
        }
        let mut crng = SmallRng::seed_from_u64(cut.unwrap_or(0));
        let crashed = disk.crash_image(&mut crng);
        vol.abandon();
        let vol = reopen(&Arc::new(zbd_core::SimStorage::from_image(crashed)));
        let ctx = format!("cut at {cut:?}");
        assert_clean(&vol, &ctx);
        finish_deletes(&vol, &ctx);
        let names: Vec<String> = vol.devices().into_iter().map(|d| d.name).collect();
        for (name, model) in &kept {
            if names.contains(name) {
                assert_dev(&vol, id_of(&vol, name), model, &ctx);
            }
        }
        ops
    };
    let total = run(None);
    let step = (total / 60).max(1);
    for cut in (0..total).step_by(step as usize) {
        run(Some(cut));
    }
}
