//! Multi-block compression units in the engine: what they store, how a partial overwrite splits
//! them, how the cleaner gives back the dead share of mostly dead units, which volumes carry the
//! units flag, and that damage to a unit turns exactly its blocks into read errors. (The model,
//! crash and corruption tests run with units as well: `common::small_volume`.)

use crate::common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::Arc;
use zbd_core::format::{
    Checkpoint, Superblock, CKPT_FLAG_COMPRESSION_UNITS, CKPT_FLAG_SAVINGS_COUNTERS,
    SUPERBLOCK_BYTES,
};
use zbd_core::{Codec, CreateOptions, Error, SimStorage, Storage, Volume};

const SIZE: u64 = 4 << 20;

fn volume(unit: u32) -> (Arc<SimStorage>, Volume) {
    let opts = CreateOptions {
        unit_bytes: Some(unit),
        ..small_volume(SIZE, 32768, Codec::Zstd(1), 2, 16)
    };
    sim_volume(&opts)
}

fn text(seed: u64, len: usize) -> Vec<u8> {
    fill(&mut SmallRng::seed_from_u64(seed), Fill::Text, len)
}

fn reopen(disk: &Arc<SimStorage>, vol: Volume) -> Volume {
    vol.close().expect("close");
    drop(vol);
    Volume::open(Box::new(Arc::clone(disk)), open_opts()).expect("reopen")
}

/// Flags of the newest valid checkpoint on `disk`.
fn checkpoint_flags(disk: &SimStorage) -> u32 {
    let image = disk.current_image();
    let sb = Superblock::decode(&image[..SUPERBLOCK_BYTES]).expect("superblock");
    (0..2u64)
        .filter_map(|slot| {
            let at = sb.checkpoint_slot_offset(slot, 0) as usize;
            Checkpoint::decode(&image[at..at + sb.checkpoint_slot_bytes as usize], &sb).ok()
        })
        .max_by_key(|c| c.seq)
        .expect("a checkpoint")
        .flags
}

#[test]
fn units_store_less_than_single_blocks_and_stat_shows_them() {
    let data = text(1, 1 << 20);
    let mut live = Vec::new();
    for unit in [4096u32, 16384] {
        let (disk, vol) = volume(unit);
        vol.write(0, &data, false).expect("write");
        let vol = reopen(&disk, vol);
        let mut back = vec![0u8; data.len()];
        vol.read(0, &mut back).expect("read");
        assert!(back == data, "unit {unit}: data differs");
        let s = vol.stats();
        assert_eq!(s.unit_bytes, unit);
        // 256 blocks in 16K units, but the map page boundary at LBA 255 cuts the last unit to
        // 3 blocks and leaves block 255 on its own (`plan_units`).
        let in_units = if unit == 4096 { 0 } else { 255 };
        if unit == 4096 {
            assert_eq!(s.unit_blocks, 0);
        } else {
            assert_eq!(s.unit_blocks, in_units);
            assert!(s.unit_ratio > 1.0, "{s:?}");
        }
        // By unit size (`zbd stat`): 16K units are the 12-16K class, kept across the reopen.
        assert!(s.savings_known);
        let by_size: Vec<(u32, u64)> = s
            .units_by_size
            .iter()
            .map(|u| (u.max_unit_bytes, u.blocks))
            .collect();
        assert_eq!(by_size, [(8192, 0), (16384, in_units), (65536, 0)]);
        if unit != 4096 {
            assert_eq!(s.units_by_size[1].ratio, s.unit_ratio);
        }
        assert!(vol.check(&|_, _| {}).is_clean());
        live.push(s.physical_bytes_live);
    }
    assert!(
        live[1] < live[0],
        "16K units store {} bytes, single blocks {}",
        live[1],
        live[0]
    );
}

#[test]
fn incompressible_units_stay_raw_single_blocks() {
    let (_disk, vol) = volume(16384);
    let data = fill(&mut SmallRng::seed_from_u64(2), Fill::Random, 256 << 10);
    vol.write(0, &data, false).expect("write");
    let s = vol.stats();
    assert_eq!((s.unit_blocks, s.raw_blocks), (0, 64));
    assert_eq!(
        s.physical_bytes_live,
        data.len() as u64,
        "never more than none"
    );
    // Only volumes that use units carry the flag (the random data made none).
    vol.checkpoint().expect("checkpoint");
    assert_eq!(checkpoint_flags(&_disk) & CKPT_FLAG_COMPRESSION_UNITS, 0);
}

#[test]
fn partial_overwrite_splits_a_unit_and_accounting_stays_exact() {
    let (disk, vol) = volume(16384);
    let mut model = text(3, 64 << 10);
    vol.write(0, &model, false).expect("write");
    assert_ne!(checkpoint_flags(&disk) & CKPT_FLAG_COMPRESSION_UNITS, 0);
    let before = vol.stats();
    // One block of the second unit, and half a block of the third: new blocks on their own.
    let one = text(4, 4096);
    vol.write(5 * 4096, &one, false).expect("overwrite");
    model[5 * 4096..6 * 4096].copy_from_slice(&one);
    vol.write(9 * 4096 + 100, &one[..2000], false)
        .expect("partial");
    model[9 * 4096 + 100..9 * 4096 + 2100].copy_from_slice(&one[..2000]);
    let s = vol.stats();
    assert_eq!(s.unit_blocks, 14);
    assert_eq!(s.units_by_size[1].blocks, 14, "{:?}", s.units_by_size);
    // The split units are still stored whole: the new blocks took more room.
    assert!(s.physical_bytes_allocated >= before.physical_bytes_allocated);
    let verify = |vol: &Volume| {
        let mut back = vec![0u8; model.len()];
        vol.read(0, &mut back).expect("read");
        assert!(back == model, "content differs");
        let report = vol.check(&|_, _| {});
        assert!(report.is_clean(), "{report:?}");
    };
    verify(&vol);
    verify(&reopen(&disk, vol));
}

#[test]
fn cleaner_gives_back_the_dead_share_of_mostly_dead_units() {
    let (disk, vol) = volume(16384);
    let mut model = text(5, 1 << 20);
    vol.write(0, &model, false).expect("write");
    // Overwrite three of every four blocks, one block per request: each unit keeps one live
    // block but is still stored whole.
    for lba in (0..256u64).filter(|l| l % 4 != 0) {
        let b = text(1000 + lba, 4096);
        vol.write(lba * 4096, &b, false).expect("overwrite");
        model[lba as usize * 4096..(lba as usize + 1) * 4096].copy_from_slice(&b);
    }
    let before = vol.stats();
    assert_eq!(before.unit_blocks, 64);
    let r = vol.compact(&|_, _| {}).expect("compact");
    let after = vol.stats();
    assert!(r.victims > 0, "{r:?}");
    // The live blocks of the old units were recompressed on their own (all but those in an
    // extent not worth cleaning).
    assert!(after.unit_blocks <= 4, "{after:?}");
    assert!(
        after.physical_bytes_allocated < before.physical_bytes_allocated,
        "allocated {} -> {}",
        before.physical_bytes_allocated,
        after.physical_bytes_allocated
    );
    let vol = reopen(&disk, vol);
    let mut back = vec![0u8; model.len()];
    vol.read(0, &mut back).expect("read");
    assert!(back == model, "content differs after cleaning");
    assert!(vol.check(&|_, _| {}).is_clean());
}

#[test]
fn damage_to_a_unit_fails_exactly_its_blocks() {
    let (disk, vol) = volume(16384);
    let data = text(6, 32 << 10);
    vol.write(0, &data, false).expect("write");
    let sb = vol.superblock().clone();
    vol.close().expect("close");
    drop(vol);
    // The first unit's bytes follow the first segment header of the first extent.
    disk.flip_bit(sb.data_offset + 64 + 20, 1);
    let vol = Volume::open(Box::new(Arc::clone(&disk)), open_opts()).expect("open");
    let mut b = vec![0u8; 4096];
    for lba in 0..8u64 {
        let r = vol.read(lba * 4096, &mut b);
        if lba < 4 {
            assert!(
                matches!(r, Err(Error::Corrupt { lba: l }) if l == lba),
                "block {lba}: {r:?}"
            );
        } else {
            r.expect("the other unit reads");
            assert_eq!(b, data[lba as usize * 4096..(lba as usize + 1) * 4096]);
        }
    }
    assert_eq!(vol.check(&|_, _| {}).damaged_blocks, vec![0, 1, 2, 3]);
}

/// A checkpoint written by a build that did not keep the unit-size and dictionary counters
/// (flag clear, zeros in their slots): a read-only open says they are unknown, a writable open
/// counts them once (the same figures as kept incrementally) and its checkpoints carry them.
#[test]
fn savings_counters_missing_from_an_older_checkpoint_are_counted_once() {
    let (disk, vol) = volume(16384);
    vol.write(0, &text(5, 256 << 10), false).expect("write");
    vol.write(4096, &text(6, 4096), false).expect("split");
    let kept = vol.stats();
    assert!(kept.savings_known && kept.units_by_size[1].blocks == 63);
    vol.close().expect("close");
    drop(vol);
    // Rewrite the newest checkpoint as the older build wrote it.
    let image = disk.current_image();
    let sb = Superblock::decode(&image[..SUPERBLOCK_BYTES]).expect("superblock");
    let mut ck = (0..2u64)
        .filter_map(|slot| {
            let at = sb.checkpoint_slot_offset(slot, 0) as usize;
            Checkpoint::decode(&image[at..at + sb.checkpoint_slot_bytes as usize], &sb).ok()
        })
        .max_by_key(|c| c.seq)
        .expect("a checkpoint");
    assert_ne!(ck.flags & CKPT_FLAG_SAVINGS_COUNTERS, 0);
    ck.flags &= !CKPT_FLAG_SAVINGS_COUNTERS;
    ck.volume_counters[8..].fill(0);
    for copy in 0..sb.metadata_copies() {
        disk.write_at(
            sb.checkpoint_slot_offset(ck.seq, copy),
            &ck.encode(&sb).expect("encode"),
        )
        .expect("write checkpoint");
    }
    let ro = Volume::open_read_only(Box::new(SimStorage::from_image(disk.current_image())))
        .expect("open read-only");
    assert!(!ro.stats().savings_known);
    drop(ro);
    let figures = |s: &zbd_core::Stats| {
        let units: Vec<(u64, f64)> = s
            .units_by_size
            .iter()
            .map(|u| (u.blocks, u.ratio))
            .collect();
        (s.savings_known, s.nodict_blocks, s.nodict_ratio, units)
    };
    let vol = Volume::open(Box::new(Arc::clone(&disk)), open_opts()).expect("open");
    assert_eq!(figures(&vol.stats()), figures(&kept), "counted at open");
    assert!(vol.check(&|_, _| {}).is_clean());
    vol.close().expect("close");
    drop(vol);
    assert_ne!(checkpoint_flags(&disk) & CKPT_FLAG_SAVINGS_COUNTERS, 0);
    let ro = Volume::open_read_only(Box::new(SimStorage::from_image(disk.current_image())))
        .expect("reopen read-only");
    assert_eq!(
        figures(&ro.stats()),
        figures(&kept),
        "carried by the checkpoint"
    );
}
