//! Volumes created with metadata pages (checkpoint flag bit 10): the map is the default
//! device's page tree, carved metadata extents hold its pages, and every checkpoint carries
//! the extension. What a write stores must read back across checkpoints, clean closes and
//! crashes exactly as on a v2 volume, and the metadata extents must never take data.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use zbd_core::format::{Checkpoint, CKPT_FLAG_METADATA_PAGES};
use zbd_core::{Codec, CreateOptions, SimStorage, Volume};

const SIZE: u64 = 4 << 20;

fn bit10(size: u64, extent: u32, queue: u32) -> CreateOptions {
    CreateOptions {
        metadata_pages: true,
        ..small_volume(size, extent, Codec::Lz4, 3, queue)
    }
}

/// Random writes, zeroes and trims with flushes against a byte model; returns the model.
fn churn(vol: &Volume, seed: u64, ops: usize) -> Vec<u8> {
    let mut model = vec![0u8; SIZE as usize];
    for op in workload(seed, SIZE, ops) {
        apply_volume(vol, &op).expect("op");
        apply_model(&mut model, &op);
    }
    model
}

fn assert_reads(vol: &Volume, model: &[u8], ctx: &str) {
    let mut got = vec![0u8; model.len()];
    vol.read(0, &mut got).expect("read");
    assert!(got == model, "{ctx}: the volume differs from the model");
}

/// The newest checkpoint on `disk` sets bit 10 and carries an extension.
fn assert_bit10(disk: &SimStorage) {
    let (_, ck): (_, Checkpoint) = newest_checkpoint(&disk.current_image());
    assert!(ck.flags & CKPT_FLAG_METADATA_PAGES != 0 && ck.extension.is_some());
}

#[test]
fn a_bit10_volume_reads_back_across_checkpoints_closes_and_crashes() {
    let opts = bit10(SIZE, 16384, 6);
    let (disk, vol) = sim_volume(&opts);
    let model = churn(&vol, 1, 400);
    assert_reads(&vol, &model, "live");
    vol.close().expect("close");
    assert_bit10(&disk);
    let vol = reopen(&disk);
    assert_reads(&vol, &model, "after a clean close");
    let report = vol.check(&|_, _| {});
    assert!(report.is_clean(), "{report:?}");
    // More work, flushed, then a crash: recovery replays into the tree.
    let mut model2 = model.clone();
    let mut rng = SmallRng::seed_from_u64(2);
    for _ in 0..200 {
        let lba = rng.random_range(0..SIZE / 4096);
        let data = fill(&mut rng, Fill::Text, 4096);
        vol.write(lba * 4096, &data, false).expect("write");
        model2[(lba * 4096) as usize..(lba * 4096 + 4096) as usize].copy_from_slice(&data);
    }
    vol.flush().expect("flush");
    vol.abandon();
    let vol = reopen(&disk);
    assert_reads(&vol, &model2, "after a crash");
    let report = vol.check(&|_, _| {});
    assert!(report.is_clean(), "{report:?}");
    vol.close().expect("close");
    assert_bit10(&disk);
}

/// Both copies of both slots of the leaf holding blocks 0..255 damaged: those blocks read
/// as errors naming the block, never as data, and blocks under other leaves still read.
#[test]
fn a_damaged_leaf_is_an_error_never_data() {
    let opts = bit10(SIZE, 32768, 16);
    let (disk, vol) = sim_volume(&opts);
    let mut rng = SmallRng::seed_from_u64(4);
    let data = fill(&mut rng, Fill::Text, SIZE as usize);
    vol.write(0, &data, false).expect("write");
    vol.close().expect("close");
    let sb = vol.superblock().clone();
    drop(vol);
    // Region 0's leaves lie where v2's map pages do.
    damage_map_page_everywhere(&disk, &sb, 0);
    let vol = reopen(&disk);
    let e = read_block(&vol, 3).expect_err("a damaged leaf");
    assert!(matches!(e, zbd_core::Error::Corrupt { lba: 3 }), "{e}");
    let lba = 300;
    let got = read_block(&vol, lba).expect("another leaf");
    assert!(got == data[lba as usize * 4096..(lba as usize + 1) * 4096]);
}

/// Flips a byte of copy `copy` of both slots of region-0 page `page`.
fn damage_copy(disk: &SimStorage, sb: &zbd_core::format::Superblock, page: u32, copy: u8) {
    for slot in 0..2 {
        disk.flip_bit(sb.map_page_offset(page, slot, copy) + 700, 3);
    }
}

/// A leaf whose copy 0 rots is read from copy 1, reported by `check`, and rewritten whole by
/// the next checkpoint: when copy 1 of the old slot rots later, nothing is lost.
#[test]
fn a_leaf_with_one_bad_copy_is_reported_and_rewritten() {
    let opts = bit10(SIZE, 32768, 16);
    let (disk, vol) = sim_volume(&opts);
    let mut rng = SmallRng::seed_from_u64(5);
    let data = fill(&mut rng, Fill::Text, SIZE as usize);
    vol.write(0, &data, false).expect("write");
    vol.close().expect("close");
    let sb = vol.superblock().clone();
    drop(vol);
    damage_copy(&disk, &sb, 0, 0);
    let vol = reopen(&disk);
    assert_reads(&vol, &data, "one bad copy");
    let report = vol.check(&|_, _| {});
    assert!(report.is_clean(), "{report:?}");
    assert!(
        report.repaired.iter().any(|l| l.contains("metadata page 0 (MapLeaf")),
        "{report:?}"
    );
    vol.close().expect("close");
    drop(vol);
    damage_copy(&disk, &sb, 0, 1);
    let vol = reopen(&disk);
    assert_reads(&vol, &data, "after the rewrite, the old copy 1 lost too");
}
