//! Faults around `zbd upgrade` and seeded item checksums, found by an adversarial review of
//! format v3's first step: failed syncs of either superblock copy followed by a same-boot open
//! (the open must make both copies durable before it writes anything), a bit flip in a
//! cleaner's copy on an upgraded volume (replay must still fall back on the victim's copy by
//! checksum), and state-bit flips in map entries (data from the other copy, never other data).
//! Guards against an upgrade that strands a volume between formats.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::collections::HashMap;
use std::sync::Arc;
use zbd_core::format::{Superblock, SUPERBLOCK_BYTES};
use zbd_core::{Codec, CreateOptions, OpenOptions, SimStorage, Volume};

const SIZE: u64 = 2 << 20;
const BLOCKS: u64 = SIZE / BS as u64;

fn opts(version: u32) -> CreateOptions {
    CreateOptions {
        format_version: version,
        unit_bytes: None,
        ..small_volume(SIZE, 8192, Codec::Lz4, 2, 32)
    }
}

fn clean_opts() -> OpenOptions {
    OpenOptions {
        clean_watermarks: Some((89, 90)),
        ..open_opts_sync()
    }
}

/// A closed volume of `version` (upgraded to 3 when `upgrade`) whose extents are half dead:
/// the cleaner has victims. Returns the image and the block contents.
fn half_dead(version: u32, upgrade: bool) -> (Vec<u8>, Vec<Vec<u8>>) {
    let (disk, vol) = sim_volume_v2_map(&opts(version), open_opts());
    let mut rng = SmallRng::seed_from_u64(7);
    let mut blocks: Vec<Vec<u8>> = (0..BLOCKS).map(|_| part_random(&mut rng)).collect();
    for (b, data) in blocks.iter().enumerate() {
        vol.write((b * BS) as u64, data, false).expect("write");
    }
    vol.flush().expect("flush");
    // Overwrite every other block: every extent keeps half its items live.
    for b in (0..BLOCKS as usize).step_by(2) {
        blocks[b] = part_random(&mut rng);
        vol.write((b * BS) as u64, &blocks[b], false)
            .expect("write");
    }
    if upgrade {
        vol.close_upgraded().expect("upgrade");
    } else {
        vol.close().expect("close");
    }
    drop(vol);
    (disk.current_image(), blocks)
}

/// The window replay's "same checksum" rule exists for: a cleaning pass commits while a
/// checkpoint is parked before its slot write; host writes and two flushes make the pass's
/// records durable and covered by a later segment's durable watermark; the image is taken
/// there (the newest checkpoint still maps the moved blocks to their victims, which are
/// intact). Then one bit of one moved copy flips. Returns (moves tried, blocks lost).
fn parked_pass_flip(version: u32, upgrade: bool) -> (usize, Vec<String>) {
    let (base, mut blocks) = half_dead(version, upgrade);
    let disk = Arc::new(SimStorage::from_image(base));
    let (park, prx, rtx) = Parking::new(Arc::clone(&disk));
    let vol = Arc::new(Volume::open(Box::new(Arc::clone(&park)), clean_opts()).expect("open"));
    let sb = vol.superblock().clone();
    let trap = Trap::Write(sb.checkpoint_offset..sb.map_offset);
    let ctx = format!("v{version}, upgraded {upgrade}");
    let (ckpt, cleaner) = checkpoint_parked_beside_a_pass(&vol, &park, &prx, trap, &ctx);
    let mut rng = SmallRng::seed_from_u64(11);
    for lba in [0usize, 2] {
        blocks[lba] = part_random(&mut rng);
        vol.write((lba * BS) as u64, &blocks[lba], false)
            .expect("write");
        vol.flush().expect("flush");
    }
    let image = disk.current_image();
    rtx.send(()).expect("release");
    let _ = ckpt.join();
    let _ = cleaner.join();
    match Arc::try_unwrap(vol) {
        Ok(v) => v.abandon(),
        Err(_) => panic!("volume still shared"),
    }

    let before: HashMap<_, _> = data_entries(&image).into_iter().collect();
    let probe = Arc::new(SimStorage::from_image(image.clone()));
    let vol = Volume::open(Box::new(Arc::clone(&probe)), open_opts_sync()).expect("probe");
    for (lba, want) in blocks.iter().enumerate() {
        assert!(
            read_block(&vol, lba as u64).expect("probe read") == *want,
            "probe: block {lba}"
        );
    }
    vol.close().expect("close probe");
    drop(vol);
    let after: HashMap<_, _> = data_entries(&probe.current_image()).into_iter().collect();
    let mut tried = 0;
    let mut lost = Vec::new();
    let mut lbas: Vec<_> = after.keys().copied().collect();
    lbas.sort();
    for lba in lbas {
        let a = after[&lba];
        let Some(b) = before.get(&lba) else { continue };
        if lba == 0 || lba == 2 || (a.extent, a.offset) == (b.extent, b.offset) {
            continue;
        }
        if a.codec != b.codec || a.len != b.len {
            continue; // recompressed, not a verbatim copy
        }
        tried += 1;
        let mut img = image.clone();
        let at = sb.extent_offset(a.extent) + u64::from(a.offset) + u64::from(a.len) / 2;
        img[at as usize] ^= 0x10;
        let d = Arc::new(SimStorage::from_image(img));
        let vol = Volume::open(Box::new(Arc::clone(&d)), open_opts_sync()).expect("open");
        match read_block(&vol, lba) {
            Ok(got) => assert!(got == blocks[lba as usize], "block {lba} read wrong data"),
            Err(e) => lost.push(format!(
                "block {lba} (victim entry seeded={} crc={:#x}; moved copy seeded={} crc={:#x}): {e}",
                b.seeded, b.crc, a.seeded, a.crc
            )),
        }
        vol.abandon();
    }
    eprintln!(
        "v{version} upgrade={upgrade}: tried {tried}, lost {}",
        lost.len()
    );
    (tried, lost)
}

/// `parked_pass_flip`'s outcome: some moves were tried and no block was lost.
fn every_moved_block_survives((tried, lost): (usize, Vec<String>)) {
    assert!(tried > 0, "no move");
    assert!(
        lost.is_empty(),
        "{} of {tried} lost:\n{}",
        lost.len(),
        lost.join("\n")
    );
}

#[test]
fn parked_v2_moved_copy_flip_falls_back_to_the_victim() {
    every_moved_block_survives(parked_pass_flip(2, false));
}

#[test]
fn parked_v3_moved_copy_flip_falls_back_to_the_victim() {
    every_moved_block_survives(parked_pass_flip(3, false));
}

/// An upgraded volume: the pass copies plain (v2) items verbatim with their checksum, so the
/// "same checksum" rule still recognises the victim's copy (a pass that re-seeded them lost 96
/// of 97 blocks here).
#[test]
fn parked_upgraded_moved_copy_flip_falls_back_to_the_victim() {
    every_moved_block_survives(parked_pass_flip(2, true));
}

/// A closed v2 volume of `log_records` blocks whose `zbd upgrade` failed at the sync of
/// superblock copy `copy` (0 = A, 1 = B) on a seed where the device dropped that write: the
/// medium holds the v2 copy while reads (the page cache) see v3. Returns the disk, the block
/// contents and the RNG to go on with.
fn upgrade_whose_device_drops_copy(copy: usize) -> (Arc<SimStorage>, Vec<Vec<u8>>, SmallRng) {
    let opts = CreateOptions {
        format_version: 2,
        ..small_volume(SIZE, 16384, Codec::Lz4, 2, 8)
    };
    let (disk, vol) = sim_volume(&opts);
    let mut rng = SmallRng::seed_from_u64(5);
    let blocks: Vec<Vec<u8>> = (0..BLOCKS).map(|b| log_records(b, BS)).collect();
    for (b, data) in blocks.iter().enumerate() {
        vol.write((b * BS) as u64, data, false).expect("write");
    }
    vol.close().expect("close");
    drop(vol);
    let base = disk.current_image();
    // Dry run: the storage operations of open + upgrade end with write A, sync, write B, sync.
    let dry = Arc::new(SimStorage::from_image(base.clone()));
    let vol = Volume::open(Box::new(Arc::clone(&dry)), open_opts_sync()).expect("open");
    vol.close_upgraded().expect("dry upgrade");
    drop(vol);
    let sync_op = dry.ops() - if copy == 0 { 3 } else { 1 };
    let at = copy * SUPERBLOCK_BYTES;
    for seed in 0..64 {
        let disk = Arc::new(SimStorage::from_image(base.clone()));
        let vol = Volume::open(Box::new(Arc::clone(&disk)), open_opts_sync()).expect("open");
        disk.fail_sync_at(sync_op, seed);
        let r = vol.close_upgraded();
        drop(vol);
        assert!(r.is_err(), "the sync of copy {copy} failed");
        assert_eq!(disk.sync_failures(), 1);
        let durable = disk.crash_image(&mut rng); // nothing pending after the failed sync
        let on_medium =
            Superblock::decode(&durable[at..at + SUPERBLOCK_BYTES]).expect("superblock copy");
        if on_medium.version == 2 {
            return (disk, blocks, rng);
        }
    }
    panic!("no seed where the device dropped superblock copy {copy}");
}

/// `zbd upgrade` whose sync of superblock copy A fails (EIO; the write dropped by the device,
/// the page still reading v3, like Linux after a writeback error), then, in the same boot, the
/// volume is opened again (a retried `zbd upgrade`, or `zbd serve`): the open sees copy A as
/// v3 and takes flushed writes (seeded items, v3 segments and checkpoints). Unless the open
/// rewrote both copies durably first, after a power loss copy A on the medium is still the v2
/// one and decides: the volume opens as v2, where v3 checkpoints and segments are invalid
/// (older data, or no checkpoint at all). Every block written after the upgrade must read back.
fn failed_sync_of_a_then_same_boot(clean_close: bool, rewrite: usize) {
    let (disk, mut blocks, mut rng) = upgrade_whose_device_drops_copy(0);
    // Reads see v3 in copy A (the page cache): the same boot opens the volume as v3.
    let vol = reopen(&disk);
    assert_eq!(vol.stats().format_version, 3, "same boot sees v3");
    for (b, block) in blocks.iter_mut().enumerate().take(rewrite) {
        *block = part_random(&mut rng);
        vol.write((b * BS) as u64, block, false).expect("write");
    }
    vol.flush().expect("flush");
    if clean_close {
        vol.close().expect("clean close");
        drop(vol);
    } else {
        vol.abandon();
    }

    // Power loss (everything was synced: the crash image is the medium).
    let crashed = Arc::new(SimStorage::from_image(disk.crash_image(&mut rng)));
    let vol = match Volume::open(Box::new(Arc::clone(&crashed)), open_opts()) {
        Ok(v) => v,
        Err(e) => panic!("after a flush (clean close: {clean_close}) and a power loss the volume does not open: {e}"),
    };
    let version = vol.stats().format_version;
    let mut bad = Vec::new();
    for (b, want) in blocks.iter().enumerate() {
        match read_block(&vol, b as u64) {
            Ok(got) if got == *want => {}
            Ok(_) => bad.push(format!("block {b}: OLDER/WRONG DATA")),
            Err(e) => bad.push(format!("block {b}: {e}")),
        }
    }
    assert!(
        bad.is_empty(),
        "opened as v{version}; {} of {BLOCKS} flushed blocks lost, first: {:?}",
        bad.len(),
        &bad[..bad.len().min(4)]
    );
}

#[test]
fn failed_sync_of_superblock_a_then_same_boot_open_and_close_strands_the_volume() {
    failed_sync_of_a_then_same_boot(true, BLOCKS as usize);
}

/// The same with the session crashing after its flush of four blocks (no close): the volume
/// opens as v2 from the v2 checkpoint of the upgrade's close, and the flushed writes read as
/// their older data.
#[test]
fn failed_sync_of_superblock_a_then_same_boot_flush_reads_older_data() {
    failed_sync_of_a_then_same_boot(false, 4);
}

/// `zbd upgrade` whose sync of copy B fails (the device dropped B; the page reads v3), then
/// the same boot opens the volume: both copies read v3. Unless the open rewrites both, the
/// medium keeps a v2 copy B behind a v3 copy A for good, and a later single bit flip in copy A
/// (what the second copy is for) opens the volume as v2, where no v3 checkpoint is valid.
#[test]
fn failed_sync_of_superblock_b_leaves_a_v2_copy_b_for_good() {
    let (disk, mut blocks, mut rng) = upgrade_whose_device_drops_copy(1);
    let vol = reopen(&disk);
    assert_eq!(vol.stats().format_version, 3);
    for (b, block) in blocks.iter_mut().enumerate().take(8) {
        *block = part_random(&mut rng);
        vol.write((b * BS) as u64, block, false).expect("write");
    }
    vol.close().expect("clean close");
    drop(vol);
    let image = disk.crash_image(&mut rng);
    let b = Superblock::decode(&image[SUPERBLOCK_BYTES..2 * SUPERBLOCK_BYTES]).expect("B");
    eprintln!(
        "copy B on the medium after a writable open and a clean close: v{}",
        b.version
    );
    // One bit of copy A rots.
    let crashed = Arc::new(SimStorage::from_image(image));
    crashed.flip_bit(100, 3);
    let vol = Volume::open(Box::new(Arc::clone(&crashed)), open_opts())
        .unwrap_or_else(|e| panic!("one bit flip in copy A: the volume does not open: {e}"));
    for (b, want) in blocks.iter().enumerate() {
        let got = read_block(&vol, b as u64).unwrap_or_else(|e| panic!("block {b}: {e}"));
        assert!(got == *want, "block {b}: older data");
    }
}

/// Held check: one flipped bit in any of the low three state-byte bits of a map entry (2 <-> 5,
/// 5 -> 4/7/1...) in the newest checkpoint's map page, copy A then copy B: every block reads
/// its data or an error, never other data.
#[test]
fn map_state_bit_flips_are_errors_or_data() {
    let (disk, vol) = sim_volume_v2_map(&opts(3), open_opts());
    let mut rng = SmallRng::seed_from_u64(9);
    let blocks: Vec<Vec<u8>> = (0..BLOCKS).map(|_| part_random(&mut rng)).collect();
    for (b, data) in blocks.iter().enumerate() {
        vol.write((b * BS) as u64, data, false).expect("write");
    }
    vol.close().expect("close");
    drop(vol);
    let image = disk.current_image();
    let (sb, ck) = newest_checkpoint(&image);
    let slot = ck.page_slots[0];
    for copy in 0..2u8 {
        for entry in [0usize, 1, 100] {
            for bit in 0..3u8 {
                let at = sb.map_page_offset(0, slot - 1, copy) + 16 + 16 * entry as u64;
                let d = Arc::new(SimStorage::from_image(image.clone()));
                d.flip_bit(at, bit);
                let vol = Volume::open(Box::new(Arc::clone(&d)), open_opts_sync()).expect("open");
                if let Ok(got) = read_block(&vol, entry as u64) {
                    assert!(
                        got == blocks[entry],
                        "copy {copy} entry {entry} bit {bit}: wrong data"
                    );
                } else {
                    panic!("copy {copy} entry {entry} bit {bit}: error although the other copy is intact");
                }
                vol.abandon();
            }
        }
    }
}
