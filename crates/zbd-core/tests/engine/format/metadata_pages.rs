//! Volumes created with metadata pages (checkpoint flag bit 10): the map is the default
//! device's page tree, carved metadata extents hold its pages, and every checkpoint carries
//! the extension. What a write stores must read back across checkpoints, clean closes and
//! crashes exactly as on a v2 volume, and the metadata extents must never take data.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use zbd_core::format::{Checkpoint, CKPT_FLAG_METADATA_PAGES};
use zbd_core::{Codec, CreateOptions, SimStorage, Storage, Volume};

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

/// A closed bit-10 volume filled with text whose leaf 0 (blocks 0..255) has no intact copy
/// left: the disk, the data written and the generator to go on with.
fn closed_with_leaf0_lost() -> (std::sync::Arc<SimStorage>, Vec<u8>, SmallRng) {
    let (disk, vol) = sim_volume(&bit10(SIZE, 32768, 16));
    let mut rng = SmallRng::seed_from_u64(4);
    let data = fill(&mut rng, Fill::Text, SIZE as usize);
    vol.write(0, &data, false).expect("write");
    vol.close().expect("close");
    let sb = vol.superblock().clone();
    drop(vol);
    // Region 0's leaves lie where v2's map pages do.
    damage_map_page_everywhere(&disk, &sb, 0);
    (disk, data, rng)
}

/// Both copies of both slots of the leaf holding blocks 0..255 damaged: those blocks read
/// as errors naming the block, never as data, and blocks under other leaves still read.
#[test]
fn a_damaged_leaf_is_an_error_never_data() {
    let (disk, data, _) = closed_with_leaf0_lost();
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
        report
            .repaired
            .iter()
            .any(|l| l.contains("metadata page 0 (MapLeaf")),
        "{report:?}"
    );
    vol.close().expect("close");
    drop(vol);
    damage_copy(&disk, &sb, 0, 1);
    let vol = reopen(&disk);
    assert_reads(&vol, &data, "after the rewrite, the old copy 1 lost too");
}

/// A leaf whose copy 1 rots is never met by a read (copy 0 serves them all). `check`'s scrub
/// of the page tree finds it, reports it, and the next checkpoint writes the leaf whole into
/// its other slot: when copy 0 of the old slot rots later, nothing is lost. Without the scrub
/// that second rot loses the leaf (`a_damaged_leaf_is_an_error_never_data`).
#[test]
fn check_scrubs_a_bad_copy_no_read_meets_and_it_is_rewritten() {
    let opts = bit10(SIZE, 32768, 16);
    let (disk, vol) = sim_volume(&opts);
    let mut rng = SmallRng::seed_from_u64(6);
    let data = fill(&mut rng, Fill::Text, SIZE as usize);
    vol.write(0, &data, false).expect("write");
    vol.close().expect("close");
    let sb = vol.superblock().clone();
    drop(vol);
    damage_copy(&disk, &sb, 2, 1);
    let vol = reopen(&disk);
    assert_reads(&vol, &data, "copy 1 bad, copy 0 serving");
    let report = vol.check(&|_, _| {});
    assert!(report.is_clean(), "{report:?}");
    let line =
        "metadata page 2 (MapLeaf, level 0, position 2): copy 1 is damaged, copy 0 is intact";
    assert!(report.repaired.iter().any(|l| l == line), "{report:?}");
    vol.close().expect("close");
    drop(vol);
    damage_copy(&disk, &sb, 2, 0);
    let vol = reopen(&disk);
    assert_reads(&vol, &data, "after the rewrite, the old copy 0 lost too");
    let report = vol.check(&|_, _| {});
    assert!(report.is_clean(), "{report:?}");
}

/// A pair-state directory page (kept in RAM as entries, never in the page pool) with a bad
/// copy: the scrub reports it and the next checkpoint writes it into its other slot, which an
/// idle checkpoint does not do otherwise.
#[test]
fn check_scrubs_the_pair_state_directory_and_rewrites_it() {
    let opts = bit10(SIZE, 16384, 6);
    let (disk, vol) = sim_volume(&opts);
    churn(&vol, 7, 300);
    let sb = vol.superblock().clone();
    let directory = |disk: &SimStorage| {
        let (_, ck): (_, Checkpoint) = newest_checkpoint(&disk.current_image());
        let ext = ck.extension.expect("bit 10");
        let g = zbd_core::meta::MetaGeometry::from_extension(&ext.header, &sb).expect("geometry");
        (*ext.directory.first().expect("a directory page"), g)
    };
    // Idle checkpoints settle the pair-state list; one more then leaves the directory alone.
    vol.checkpoint().expect("checkpoint");
    vol.checkpoint().expect("checkpoint");
    let (settled, _) = directory(&disk);
    vol.checkpoint().expect("checkpoint");
    let ((id, slot), g) = directory(&disk);
    assert_eq!(
        (id, slot),
        settled,
        "an idle checkpoint wrote the directory"
    );
    let at = g.slot_offset(&sb, id, slot, 1).expect("in the id space");
    disk.flip_bit(at + 100, 5);
    let report = vol.check(&|_, _| {});
    let line = format!(
        "metadata page {id} (PairStateDirectory, level 0, position 0): copy 1 is damaged, \
         copy 0 is intact"
    );
    assert!(report.repaired.contains(&line), "{report:?}");
    vol.checkpoint().expect("checkpoint");
    let ((moved, to), _) = directory(&disk);
    assert_eq!(moved, id);
    assert_ne!(to, slot, "the directory page was not written again");
    vol.close().expect("close");
    drop(vol);
    let vol = reopen(&disk);
    let report = vol.check(&|_, _| {});
    assert!(
        report.is_clean() && report.repaired.is_empty(),
        "{report:?}"
    );
}

// ---- Attacks on bit-10 volumes (an adversarial review of the wiring) ----

/// A block written and trimmed again and again between two checkpoints: each trim collapses
/// the tree to a summary (freeing the root's interior page) and each write builds a new root
/// under a new id. The volume is nearly empty: no write may fail, and every block reads what
/// was written last.
#[test]
fn write_trim_cycles_never_run_out_of_page_ids() {
    let opts = bit10(SIZE, 16384, 6);
    let (disk, vol) = sim_volume(&opts);
    let mut rng = SmallRng::seed_from_u64(10);
    let mut last = vec![0u8; 4096];
    for i in 0..400 {
        let data = fill(&mut rng, Fill::Text, 4096);
        vol.write(0, &data, false)
            .unwrap_or_else(|e| panic!("cycle {i}: write: {e}"));
        vol.trim(0, 4096)
            .unwrap_or_else(|e| panic!("cycle {i}: trim: {e}"));
        last = data;
    }
    vol.write(0, &last, false).expect("last write");
    assert!(read_block(&vol, 0).expect("read") == last);
    vol.close().expect("close");
    let vol = reopen(&disk);
    assert!(read_block(&vol, 0).expect("read") == last);
}

/// The same cycles until a write fails (it must not, see above; if it does, it must change
/// nothing, as a NoSpace write does on v2): the failed write's block still reads as trimmed,
/// flushed; after a crash the volume must open and the block must still read as trimmed, not
/// as the data of the write that failed.
#[test]
fn a_failed_write_changes_nothing_across_a_crash() {
    let opts = bit10(SIZE, 16384, 6);
    let (disk, vol) = sim_volume(&opts);
    let mut rng = SmallRng::seed_from_u64(10);
    let mut failed = None;
    let mut failed_data = Vec::new();
    for i in 0..400 {
        let data = fill(&mut rng, Fill::Text, 4096);
        if let Err(e) = vol.write(0, &data, false) {
            failed = Some((i, e));
            failed_data = data;
            break;
        }
        vol.trim(0, 4096).expect("trim");
    }
    let Some((i, e)) = failed else {
        return; // nothing failed: the test above covers it
    };
    eprintln!("cycle {i}: write failed: {e}");
    assert!(
        read_block(&vol, 0).expect("read") == vec![0u8; 4096],
        "live: block 0 not trimmed"
    );
    vol.flush().expect("flush after the failed write");
    vol.abandon();
    let vol = Volume::open(Box::new(std::sync::Arc::clone(&disk)), open_opts())
        .unwrap_or_else(|e| panic!("reopen after a crash: {e}"));
    let got = read_block(&vol, 0).expect("read");
    assert!(
        got == vec![0u8; 4096],
        "after the crash block 0 holds {}, not the trimmed zeros it held live",
        if got == failed_data {
            "the data of the write that failed with NoSpace"
        } else {
            "other data"
        }
    );
}

/// A leaf with no intact copy (as in `a_damaged_leaf_is_an_error_never_data`) stands in as a
/// leaf of damaged entries, as v2's lost map page does: a write under it is taken (a
/// filesystem can repair over it), reads back live and after a flush and a crash (replayed
/// onto the stand-in), while the other blocks under it stay errors, never data; `check`
/// names the leaf. Blocks under other leaves read what they held.
#[test]
fn a_write_under_a_damaged_leaf_is_taken_and_survives_a_crash() {
    let (disk, data, mut rng) = closed_with_leaf0_lost();
    let vol = reopen(&disk);
    let fresh = fill(&mut rng, Fill::Text, 4096);
    vol.write(3 * 4096, &fresh, false)
        .expect("a write under the damaged leaf");
    assert!(read_block(&vol, 3).expect("read") == fresh, "block 3 live");
    vol.write(300 * 4096, &fresh, false)
        .expect("write under another leaf");
    vol.flush().expect("flush");
    vol.abandon();
    let vol = Volume::open(Box::new(std::sync::Arc::clone(&disk)), open_opts())
        .unwrap_or_else(|e| panic!("reopen after a crash: {e}"));
    assert!(
        read_block(&vol, 3).expect("read") == fresh,
        "block 3 after the crash"
    );
    let e = read_block(&vol, 4).expect_err("another block of the damaged leaf");
    assert!(matches!(e, zbd_core::Error::Corrupt { lba: 4 }), "{e}");
    assert!(read_block(&vol, 300).expect("read") == fresh, "block 300");
    let lba = 600;
    assert!(read_block(&vol, lba).expect("read") == data[lba as usize * 4096..][..4096]);
    let report = vol.check(&|_, _| {});
    assert!(
        (report.metadata_problems.iter())
            .any(|l| l.contains("(MapLeaf, level 0, position 0) has no intact copy")),
        "{report:?}"
    );
    assert!(!report.damaged_blocks.contains(&3) && report.damaged_blocks.contains(&4));
    // A clean close writes the leaf again, damaged entries and all: the loss is on the
    // medium now, and the block written reads back.
    vol.close().expect("close");
    drop(vol);
    let vol = reopen(&disk);
    assert!(
        read_block(&vol, 3).expect("read") == fresh,
        "block 3 after a close"
    );
    let e = read_block(&vol, 4).expect_err("still damaged");
    assert!(matches!(e, zbd_core::Error::Corrupt { lba: 4 }), "{e}");
    // The leaf is whole again; what its lost entries counted stays in their extents'
    // accounting (unknown which), as after a lost v2 map page: check says so, nothing more.
    let report = vol.check(&|_, _| {});
    assert!(
        (report.metadata_problems.iter()).all(|l| l.contains("live accounting differs")),
        "{report:?}"
    );
}

/// One bit flipped in one copy of the extent-table page that holds the metadata extents'
/// state-3 entries (and the header): the open reads the other copy, the data reads back and
/// check is clean; with both copies of that page damaged the open refuses, never opens with the
/// stock read as free.
#[test]
fn a_flip_in_the_extent_table_never_frees_metadata_extents() {
    let opts = bit10(SIZE, 16384, 6);
    let (disk, vol) = sim_volume(&opts);
    let model = churn(&vol, 3, 300);
    vol.close().expect("close");
    let sb = vol.superblock().clone();
    drop(vol);
    let clean = disk.current_image();
    let (_, ck) = newest_checkpoint(&clean);
    let g = zbd_core::meta::MetaGeometry::at_enable(&sb).expect("geometry");
    let stock = g.stock_extents(sb.logical_blocks);
    let per_page = zbd_core::format::EXTENT_TABLE_ENTRIES_PER_PAGE as u32;
    let mut pages: Vec<u32> = (g.h - stock..g.h)
        .chain(2 * g.h - stock..2 * g.h)
        .map(|e| e / per_page)
        .collect();
    pages.dedup();
    let mut rng = SmallRng::seed_from_u64(5);
    let mut runs = 0;
    for p in pages {
        let slot = ck.extent_table_slots[p as usize];
        assert_ne!(slot, 0, "table page {p} written");
        let at = |copy: usize| {
            sb.extent_table_offset[copy] + (u64::from(p) * 2 + u64::from(slot - 1)) * 4096
        };
        // Bytes of the page: its header and the entries of the stock extents in it.
        let mut bytes: Vec<u64> = (0..16).collect();
        for e in (g.h - stock..g.h).chain(2 * g.h - stock..2 * g.h) {
            if e / per_page == p {
                let i = u64::from(e % per_page);
                bytes.extend((0..8).map(|k| 16 + i * 8 + k));
            }
        }
        for copy in 0..2 {
            for &b in &bytes {
                let d = std::sync::Arc::new(SimStorage::from_image(clean.clone()));
                d.flip_bit(at(copy) + b, rng.random_range(0..8));
                let vol = Volume::open(Box::new(std::sync::Arc::clone(&d)), open_opts())
                    .unwrap_or_else(|e| panic!("page {p} copy {copy} byte {b}: open: {e}"));
                assert_reads(&vol, &model, &format!("page {p} copy {copy} byte {b}"));
                let report = vol.check(&|_, _| {});
                assert!(
                    report.is_clean(),
                    "page {p} copy {copy} byte {b}: {report:?}"
                );
                vol.abandon();
                runs += 1;
            }
        }
        let d = SimStorage::from_image(clean.clone());
        d.flip_bit(at(0) + 20, 1);
        d.flip_bit(at(1) + 20, 1);
        assert!(
            Volume::open(Box::new(d), open_opts()).is_err(),
            "table page {p} with no intact copy: the open must refuse"
        );
    }
    eprintln!("{runs} flips");
}

/// `check` of a volume whose leaf 0 has no intact copy: every block under it reads EIO, so
/// check must list each of them as damaged (the fault model's oracle), and the blocks under
/// other leaves must not be.
#[test]
fn check_lists_the_blocks_of_a_damaged_leaf() {
    let (disk, _, _) = closed_with_leaf0_lost();
    let vol = reopen(&disk);
    let report = vol.check(&|_, _| {});
    let eio: Vec<u64> = (0..SIZE / 4096)
        .filter(|&l| read_block(&vol, l).is_err())
        .collect();
    eprintln!(
        "{} blocks read EIO; check: {:?}",
        eio.len(),
        report.metadata_problems
    );
    assert_eq!(
        report.damaged_blocks, eio,
        "check must list every EIO block"
    );
}

/// Control for `write_trim_cycles_never_run_out_of_page_ids`: the same cycles on a
/// v2 volume (passes).
#[test]
fn control_v2_write_trim_cycles() {
    let opts = CreateOptions {
        metadata_pages: false,
        ..bit10(SIZE, 16384, 6)
    };
    let (_disk, vol) = sim_volume_v2_map(&opts, open_opts());
    let mut rng = SmallRng::seed_from_u64(10);
    for i in 0..400 {
        let data = fill(&mut rng, Fill::Text, 4096);
        vol.write(0, &data, false)
            .unwrap_or_else(|e| panic!("cycle {i}: write: {e}"));
        vol.trim(0, 4096)
            .unwrap_or_else(|e| panic!("cycle {i}: trim: {e}"));
    }
}

/// One run of R15-A1's sequence (design, "Build order" 1b.3): leaf 0 (a region-0 leaf at its
/// fixed id) durable in slot A or B (`flips` rewrites before), then in one interval trimmed
/// whole and written again, so the id is re-created as it is; flushed; then the checkpoint
/// that writes it, with the power cut at its `cut`-th storage operation. Returns the disk,
/// the flushed content and whether the checkpoint finished before the cut.
fn region0_recreated_then_cut(flips: usize, cut: u64) -> (Arc<SimStorage>, Vec<u8>, bool) {
    let (disk, vol) = sim_volume(&bit10(SIZE, 16384, 6));
    let mut rng = SmallRng::seed_from_u64(15);
    let mut model = fill(&mut rng, Fill::Text, SIZE as usize);
    vol.write(0, &model, false).expect("fill");
    vol.checkpoint().expect("first checkpoint");
    for _ in 0..flips {
        let data = fill(&mut rng, Fill::Text, 4096);
        vol.write(4096, &data, false).expect("rewrite");
        model[4096..8192].copy_from_slice(&data);
        vol.checkpoint().expect("checkpoint that flips leaf 0");
    }
    // Leaf 0 is blocks 0..255: the trim drops the whole page, the write makes it again.
    vol.trim(0, 255 * 4096).expect("trim leaf 0");
    model[..255 * 4096].fill(0);
    let data = fill(&mut rng, Fill::Text, 8 * 4096);
    vol.write(2 * 4096, &data, false)
        .expect("write into leaf 0 again");
    model[2 * 4096..10 * 4096].copy_from_slice(&data);
    vol.flush().expect("flush");
    disk.set_power_loss_at(disk.ops() + cut);
    let finished = vol.checkpoint().is_ok() && !disk.powered_off();
    vol.abandon();
    (disk, model, finished)
}

/// R15-A1: a region-0 leaf trimmed and created again in one interval, whichever slot its
/// durable copy is in, with the power cut at every storage operation of the checkpoint that
/// writes it (after the page write and before the sync among them): every reopen reads the
/// flushed content and `check` passes. It fails if the trim's free is recorded at once (the
/// re-created page would take the slot the durable checkpoint names).
#[test]
fn a_region0_leaf_trimmed_and_recreated_in_one_interval_survives_a_cut_checkpoint() {
    for flips in 0..2 {
        let mut cut = 0;
        loop {
            let (disk, model, finished) = region0_recreated_then_cut(flips, cut);
            let mut rng = SmallRng::seed_from_u64(cut);
            for round in 0..3 {
                let image = if finished {
                    disk.current_image()
                } else {
                    disk.crash_image(&mut rng)
                };
                let disk = Arc::new(SimStorage::from_image(image));
                let vol = Volume::open(Box::new(Arc::clone(&disk)), open_opts())
                    .unwrap_or_else(|e| panic!("flips {flips}, cut {cut}, round {round}: {e}"));
                assert_reads(
                    &vol,
                    &model,
                    &format!("flips {flips}, cut {cut}, round {round}"),
                );
                let report = vol.check(&|_, _| {});
                assert!(
                    report.is_clean(),
                    "flips {flips}, cut {cut}, round {round}: {report:?}"
                );
                vol.close().expect("close");
            }
            if finished {
                break;
            }
            cut += 1;
        }
        assert!(
            cut > 2,
            "flips {flips}: the checkpoint took only {cut} operations"
        );
    }
}

/// A 4 GiB trim and a 4 GiB write-zeroes on a bit-10 volume run in steps of at most 64 leaves
/// (design, "Steps and admission"), each with its own record (no record is extended on bit
/// 10: R7-D1): a crash after a flush replays one record per step, and every block reads its
/// flushed content. A trim step starts at the next block that is mapped (unmapped ones need
/// no record), a zero step where the last one ended. The same on a v2 volume replays one record per range (the control: it
/// shows the record count is what the steps make).
#[test]
fn a_4gib_trim_runs_in_steps_of_64_leaves_each_with_its_own_record() {
    const BIG: u64 = 4 << 30;
    let leaf_bytes = 255 * 4096;
    let step_bytes = 64 * leaf_bytes;
    for metadata_pages in [true, false] {
        let base = CreateOptions {
            extent_bytes: 32768,
            codec: Codec::Lz4,
            capacity_bytes: Some(8 << 20),
            queue_len: Some(8),
            ..CreateOptions::new(BIG)
        };
        let opts = if metadata_pages {
            with_metadata_pages(&base)
        } else {
            base
        };
        let (disk, vol) = sim_volume_v2_map(&opts, open_opts());
        // Blocks scattered over the range, made durable by a checkpoint.
        let mut rng = SmallRng::seed_from_u64(64);
        let mut blocks: Vec<(u64, Vec<u8>)> = (0..40)
            .map(|i| (i * (BIG / 40 / 4096) + 7, fill(&mut rng, Fill::Text, 4096)))
            .collect();
        for (lba, data) in &blocks {
            vol.write(lba * 4096, data, false).expect("write");
        }
        vol.checkpoint().expect("checkpoint");
        // A trim from mid-leaf over most of the range, a zero range behind it, and one block
        // written again after both.
        let trim = (4096 * 3, BIG - 8 * step_bytes);
        let zero = (trim.0 + trim.1, 4 * step_bytes + 4096);
        vol.trim(trim.0, trim.1).expect("trim");
        vol.write_zeroes(zero.0, zero.1).expect("zero");
        let again = fill(&mut rng, Fill::Text, 4096);
        vol.write(blocks[5].0 * 4096, &again, false)
            .expect("write after");
        vol.flush().expect("flush");
        vol.abandon();
        for (lba, data) in blocks.iter_mut() {
            let off = *lba * 4096;
            let inside = |(start, len): (u64, u64)| off >= start && off < start + len;
            if inside(trim) || inside(zero) {
                data.fill(0);
            }
        }
        blocks[5].1 = again;
        let vol = reopen(&disk);
        let replayed = vol.stats().recovery_records_replayed;
        let steps = |(start, len): (u64, u64)| {
            let first = start / 4096;
            let end = (start + len) / 4096;
            (first / 255 * 255..end).step_by(64 * 255).count() as u64
        };
        let trim_steps = {
            let (mut lba, end) = (trim.0.div_ceil(4096), (trim.0 + trim.1) / 4096);
            let mut n = 0;
            while let Some(next) = blocks
                .iter()
                .map(|b| b.0)
                .filter(|&b| b >= lba && b < end)
                .min()
            {
                n += 1;
                lba = end.min((next / 255 + 64) * 255);
            }
            n
        };
        let want = if metadata_pages {
            trim_steps + steps(zero) + 1
        } else {
            3
        };
        assert_eq!(
            replayed, want,
            "bit 10 {metadata_pages}: records replayed (trim and zero steps, one write)"
        );
        for (lba, data) in &blocks {
            assert!(
                read_block(&vol, *lba).expect("read") == *data,
                "bit 10 {metadata_pages}: block {lba} differs after the crash"
            );
        }
        let report = vol.check(&|_, _| {});
        assert!(report.is_clean(), "bit 10 {metadata_pages}: {report:?}");
        vol.close().expect("close");
    }
}

/// A bit-10 volume of 2 GiB whose stock is two extents (copy 0): too few ids for its tree's
/// interior pages, so the carver must take metadata extents from the free data area.
fn small_stock() -> CreateOptions {
    CreateOptions {
        extent_bytes: 32768,
        codec: Codec::Lz4,
        capacity_bytes: Some(16 << 20),
        queue_len: Some(8),
        metadata_pages: true,
        metadata_stock_extents: Some(2),
        ..CreateOptions::new(2 << 30)
    }
}

/// Blocks spread over the whole 2 GiB (one per 64 MiB, under each of the tree's level-1
/// pages), each with its data.
fn spread(rng: &mut SmallRng, offset: u64) -> Vec<(u64, Vec<u8>)> {
    (0..32)
        .map(|i| (i * 16384 + offset, fill(rng, Fill::Text, 4096)))
        .collect()
}

/// The carver (design 1b.5, first form): the ids the stock lacks come from extent pairs a
/// checkpoint carves from the free data area; the first is the open's own, inside create. A
/// power cut at every storage operation of create: each image either has no volume yet (the
/// open refuses it) or opens, and an open carves if create's did not survive. The carved
/// extents stay metadata across a reopen that follows at once (no later write rewrites their
/// extent-table page), writes under every level-1 page then take their ids and read back
/// after a flush and a crash, and `check` passes. Without the carver those writes fail with
/// `NoSpace`.
#[test]
fn the_carver_supplies_the_page_ids_the_stock_lacks_across_crashes() {
    let opts = small_stock();
    let plan = zbd_core::layout::plan(&opts).expect("plan");
    let stock_bytes = plan.metadata_bytes() + 2 * 2 * u64::from(plan.extent_bytes);
    let mut cut = 0;
    let mut opened = 0;
    loop {
        let disk = Arc::new(SimStorage::new(plan.total_bytes() as usize));
        disk.set_power_loss_at(cut);
        let created = Volume::create_with(Box::new(Arc::clone(&disk)), &opts, open_opts());
        let finished = !disk.powered_off();
        let mut rng = SmallRng::seed_from_u64(cut);
        let image = if finished {
            created.expect("create").abandon();
            disk.current_image()
        } else {
            if let Ok(vol) = created {
                vol.abandon();
            }
            disk.crash_image(&mut rng)
        };
        let disk = Arc::new(SimStorage::from_image(image));
        let Ok(vol) = Volume::open(Box::new(Arc::clone(&disk)), open_opts()) else {
            assert!(!finished, "a created volume must open");
            cut += 1;
            continue;
        };
        opened += 1;
        let carved = vol.stats().metadata_bytes;
        assert!(
            carved > stock_bytes,
            "cut {cut}: no metadata extent was carved"
        );
        vol.abandon();
        let vol = reopen(&disk);
        assert_eq!(
            vol.stats().metadata_bytes,
            carved,
            "cut {cut}: the carved extents are not metadata after a reopen"
        );
        let blocks = spread(&mut rng, 3);
        for (lba, data) in &blocks {
            vol.write(lba * 4096, data, false)
                .unwrap_or_else(|e| panic!("cut {cut}: write {lba}: {e}"));
        }
        vol.flush().expect("flush");
        vol.abandon();
        let vol = reopen(&disk);
        for (lba, data) in &blocks {
            assert!(
                read_block(&vol, *lba).expect("read") == *data,
                "cut {cut}: {lba}"
            );
        }
        let report = vol.check(&|_, _| {});
        assert!(report.is_clean(), "cut {cut}: {report:?}");
        vol.close().expect("close");
        if finished {
            break;
        }
        cut += 1;
    }
    assert!(
        opened > 1 && cut > 4,
        "create took {cut} operations, {opened} images opened"
    );
}

/// A carve by a checkpoint other than a volume's first (whose extent table writes every page
/// anyway): on 8 KiB extents the high watermark is more than one phase 1 carves (64 pairs),
/// so the next checkpoint carves again, and its extent table must name those extents as
/// metadata or a reopen would hand them to data over the pages in them.
#[test]
fn a_later_checkpoints_carve_is_in_its_extent_table() {
    let opts = CreateOptions {
        extent_bytes: 8192,
        capacity_bytes: Some(32 << 20),
        ..small_stock()
    };
    let (disk, vol) = sim_volume_v2_map(
        &CreateOptions {
            logical_bytes: 64 << 20,
            ..opts
        },
        open_opts(),
    );
    let first = vol.stats().metadata_bytes;
    vol.checkpoint().expect("checkpoint");
    let carved = vol.stats().metadata_bytes;
    assert!(carved > first, "the second checkpoint carved nothing");
    vol.abandon();
    let vol = reopen(&disk);
    assert_eq!(
        vol.stats().metadata_bytes,
        carved,
        "carved extents read as free"
    );
    let report = vol.check(&|_, _| {});
    assert!(report.is_clean(), "{report:?}");
}

/// Invariant 6's other side, for `check`: a page in use lies in an extent pair the extent
/// table lists as metadata. A table page rewritten with a valid checksum that calls the
/// stock's first extent (which holds the root and the catalog's pages) free either keeps the
/// volume from opening or makes `check` name the page and the extent: never a clean report
/// over metadata that data may overwrite (review 12: a lost carve went unnoticed).
#[test]
fn check_names_a_page_in_use_in_an_extent_the_table_calls_free() {
    let (disk, vol) = sim_volume(&bit10(SIZE, 16384, 6));
    let model = churn(&vol, 12, 100);
    vol.close().expect("close");
    let sb = vol.superblock().clone();
    drop(vol);
    let image = disk.current_image();
    let (_, ck) = newest_checkpoint(&image);
    let g = zbd_core::meta::MetaGeometry::at_enable(&sb).expect("geometry");
    let e = *metadata_extents(&image, &sb, &ck).first().expect("a stock");
    assert!(e < g.h, "copy-0 extents come first");
    let per_page = zbd_core::format::EXTENT_TABLE_ENTRIES_PER_PAGE as u32;
    let p = e / per_page;
    let slot = u64::from(ck.extent_table_slots[p as usize] - 1);
    for copy in 0..2 {
        let at = (sb.extent_table_offset[copy] + (u64::from(p) * 2 + slot) * 4096) as usize;
        let mut page = image[at..at + 4096].to_vec();
        page[16 + (e % per_page) as usize * 8 + 7] = 0;
        page[4..8].fill(0);
        let crc = crc32c::crc32c(&page);
        page[4..8].copy_from_slice(&crc.to_le_bytes());
        disk.write_at(at as u64, &page).expect("write");
    }
    disk.sync().expect("sync");
    let Ok(vol) = Volume::open(Box::new(Arc::clone(&disk)), open_opts()) else {
        return; // refused: nothing served over the damage
    };
    assert_reads(&vol, &model, "after the table rewrite");
    let report = vol.check(&|_, _| {});
    assert!(
        report
            .metadata_problems
            .iter()
            .any(|l| l.contains(&format!("extent {e}, which the extent table"))),
        "check does not name extent {e}: {report:?}"
    );
}
