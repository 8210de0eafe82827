//! Damaged and foreign volume files: a map page with no intact copy stays reported after the
//! page is rewritten, a file cut short at any length is refused, superblocks with absurd
//! geometry are refused (no overflow panic, no huge allocation), and random damage to metadata
//! and log never panics or invents data. Guards against damage turning into holes, zeros or
//! another block's bytes. Seeds are printed; `ZBD_DAMAGE_SEED` replays one.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use zbd_core::format::{Superblock, SUPERBLOCK_BYTES};
use zbd_core::{Codec, Error, OpenOptions, SimStorage, Volume};

/// A damaged map page makes its blocks unreadable (Corrupt). Writing one block of that page
/// dirties it; the checkpoint then rewrites the page. The blocks whose location was lost must
/// stay Corrupt after a reopen, not silently turn into holes that read as zeros.
#[test]
fn damaged_map_page_stays_damaged_after_the_page_is_rewritten() {
    let opts = small_volume(1 << 20, 32768, Codec::Lz4, 4, 16);
    // v2's map: a damaged page stays damaged and takes writes (the tree has no repair yet).
    let (disk, vol) = sim_volume_v2_map(&opts, open_opts());
    let mut rng = SmallRng::seed_from_u64(41);
    let data = fill(&mut rng, Fill::Text, 1 << 20);
    vol.write(0, &data, false).expect("write");
    vol.close().expect("close");
    let sb = vol.superblock().clone();
    drop(vol);
    damage_map_page_everywhere(&disk, &sb, 0);
    let vol = reopen(&disk);
    assert!(matches!(
        read_block(&vol, 3),
        Err(Error::Corrupt { lba: 3 })
    ));
    // A new write into the damaged page, then a checkpoint that rewrites the page.
    let fresh = fill(&mut rng, Fill::Text, BS);
    vol.write(5 * BS as u64, &fresh, false)
        .expect("write into damaged page");
    vol.close().expect("close");
    drop(vol);
    let vol = reopen(&disk);
    assert_eq!(read_block(&vol, 5).expect("rewritten block"), fresh);
    match read_block(&vol, 3) {
        Err(Error::Corrupt { lba: 3 }) => {}
        Ok(b) => panic!(
            "block 3 lost its location with the damaged page but now reads {} (zeros: {})",
            if b == data[3 * BS..4 * BS] {
                "its old data"
            } else {
                "other data"
            },
            b.iter().all(|&x| x == 0)
        ),
        Err(e) => panic!("block 3: unexpected error {e}"),
    }
    let report = vol.check(&|_, _| {});
    assert!(report.damaged_blocks.contains(&3), "{report:?}");
    assert!(!report.damaged_blocks.contains(&5), "{report:?}");
    // Overwriting or trimming a damaged block repairs it.
    vol.write(3 * BS as u64, &fresh, false).expect("overwrite");
    vol.trim(4 * BS as u64, BS as u64).expect("trim");
    vol.close().expect("close");
    drop(vol);
    let vol = reopen(&disk);
    assert_eq!(read_block(&vol, 3).expect("repaired"), fresh);
    assert_eq!(read_block(&vol, 4).expect("trimmed"), vec![0u8; BS]);
    assert!(matches!(
        read_block(&vol, 6),
        Err(Error::Corrupt { lba: 6 })
    ));
}

fn try_open(image: Vec<u8>, read_only: bool) -> zbd_core::Result<(Arc<SimStorage>, Volume)> {
    let disk = Arc::new(SimStorage::from_image(image));
    let opts = OpenOptions {
        read_only,
        ..open_opts()
    };
    let vol = Volume::open(Box::new(Arc::clone(&disk)), opts)?;
    Ok((disk, vol))
}

/// Reads every block of an opened (possibly damaged) volume: a read may fail, but data it
/// returns must be something the block once held.
fn assert_reads_only_held_data(vol: &Volume, hist: &History, ctx: &str) {
    let mut b = vec![0u8; BS];
    for lba in 0..hist.held.len() {
        if vol.read((lba * BS) as u64, &mut b).is_ok() {
            assert!(
                hist.ever_held(lba, &b),
                "{ctx}: block {lba} reads data it never held"
            );
        }
    }
}

/// Opening a volume cut short at any length fails with a clear error, never a panic, and never
/// "succeeds" on a file missing part of its data area.
#[test]
fn truncated_volume_files_are_refused_cleanly() {
    let (image, _) = crashed_volume_image(7);
    let full = image.len();
    let mut cuts: Vec<usize> = vec![0, 1, 7, 511, 512, 4095, 4096, 4097, 8191, 8192, 8193];
    cuts.extend((1..64).map(|i| i * full / 64));
    cuts.extend([full - 4096, full - 512, full - 1]);
    for cut in cuts {
        for read_only in [false, true] {
            let mut img = image.clone();
            img.truncate(cut);
            match try_open(img, read_only) {
                Ok(_) => panic!("volume cut at {cut} of {full} bytes opened"),
                Err(e) => {
                    let msg = e.to_string();
                    assert!(
                        matches!(e, Error::NotAVolume(_) | Error::CorruptMetadata(_)),
                        "cut at {cut}: unexpected error kind: {msg}"
                    );
                    assert!(
                        !msg.contains('\n'),
                        "cut at {cut}: multi-line error {msg:?}"
                    );
                }
            }
        }
    }
}

/// Random damage to the metadata area (superblocks, checkpoints, map) and to the log: opening,
/// reading, checking and writing never panic, and reads return only data a block once held.
#[test]
fn damaged_metadata_and_log_never_panic_or_invent_data() {
    let seed: u64 = std::env::var("ZBD_DAMAGE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_0001);
    eprintln!("seed {seed} (set ZBD_DAMAGE_SEED to replay)");
    let (image, hist) = crashed_volume_image(seed);
    let sb = Superblock::decode(&image[..SUPERBLOCK_BYTES]).expect("superblock");
    let mut rng = SmallRng::seed_from_u64(seed);
    let (mut opened, mut refused) = (0, 0);
    for round in 0..160 {
        let mut img = image.clone();
        let flips = rng.random_range(1..=6);
        // Mostly metadata; some damage to the queued extents the log lives in.
        let region_end = if round % 4 == 3 {
            (sb.data_offset + 16 * u64::from(sb.extent_bytes)) as usize
        } else {
            sb.data_offset as usize
        };
        for _ in 0..flips {
            let at = rng.random_range(0..region_end);
            img[at] ^= 1 << rng.random_range(0..8);
        }
        // Some rounds also recompute the superblock CRC so field damage gets past it.
        if round % 5 == 0 {
            if let Ok(mut s) = Superblock::decode(&image[..SUPERBLOCK_BYTES]) {
                s.queue_len = rng.random_range(0..64);
                let enc = s.encode();
                img[..SUPERBLOCK_BYTES].copy_from_slice(&enc);
            }
        }
        let ctx = format!("seed {seed} round {round}");
        match try_open(img, round % 2 == 1) {
            Err(e) => {
                refused += 1;
                assert!(!e.to_string().contains('\n'), "{ctx}: {e}");
            }
            Ok((_disk, vol)) => {
                opened += 1;
                assert_reads_only_held_data(&vol, &hist, &ctx);
                let _ = vol.check(&|_, _| {});
                if round % 2 == 0 {
                    let _ = vol.write(0, &vec![0x11; BS], true);
                    let _ = vol.close();
                }
            }
        }
    }
    eprintln!("{opened} damaged images opened, {refused} refused");
    assert!(opened > 0 && refused > 0, "damage never hit both outcomes");
}

/// A change to a superblock's fields.
type Edit = Box<dyn Fn(&mut Superblock)>;

/// Superblocks with a valid checksum but absurd geometry (a foreign or hostile file) are
/// refused with an error, never an arithmetic overflow panic or a huge allocation.
#[test]
fn superblocks_with_absurd_fields_are_refused() {
    let (image, _) = crashed_volume_image(3);
    let good = Superblock::decode(&image[..SUPERBLOCK_BYTES]).expect("superblock");
    let edits: Vec<(&str, Edit)> = vec![
        (
            "checkpoint_offset max",
            Box::new(|s| s.checkpoint_offset = u64::MAX),
        ),
        (
            "checkpoint_offset near max",
            Box::new(|s| s.checkpoint_offset = u64::MAX - 4096),
        ),
        ("map_offset max", Box::new(|s| s.map_offset = u64::MAX)),
        ("data_offset max", Box::new(|s| s.data_offset = u64::MAX)),
        (
            "data_offset near max",
            Box::new(|s| s.data_offset = u64::MAX - 8192),
        ),
        (
            "slot bytes max",
            Box::new(|s| s.checkpoint_slot_bytes = u32::MAX),
        ),
        ("slot bytes 0", Box::new(|s| s.checkpoint_slot_bytes = 0)),
        ("extent count max", Box::new(|s| s.extent_count = u32::MAX)),
        ("extent count 0", Box::new(|s| s.extent_count = 0)),
        ("queue len max", Box::new(|s| s.queue_len = u32::MAX)),
        (
            "logical blocks max",
            Box::new(|s| {
                s.logical_blocks = u64::MAX;
                s.map_pages = u32::MAX;
            }),
        ),
        (
            "huge but consistent map",
            Box::new(|s| {
                s.map_pages = u32::MAX;
                s.logical_blocks = u64::from(u32::MAX) * 255;
            }),
        ),
        (
            "overlapping map",
            Box::new(|s| s.map_offset = s.checkpoint_offset),
        ),
        (
            "data before map",
            Box::new(|s| s.data_offset = s.map_offset),
        ),
        ("codec unknown", Box::new(|s| s.codec_id = 200)),
        ("watermarks inverted", Box::new(|s| s.clean_low_pct = 99)),
    ];
    for (what, edit) in edits {
        let mut s = good.clone();
        edit(&mut s);
        let enc = s.encode();
        let mut img = image.clone();
        img[..SUPERBLOCK_BYTES].copy_from_slice(&enc);
        img[SUPERBLOCK_BYTES..2 * SUPERBLOCK_BYTES].copy_from_slice(&enc);
        for read_only in [false, true] {
            let r = try_open(img.clone(), read_only);
            assert!(r.is_err(), "{what}: opened");
        }
    }
}
