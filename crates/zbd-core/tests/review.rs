//! Adversarial storage-correctness tests (review): damaged metadata must stay reported across
//! rewrites, crashes inside recovery itself, request edge cases, and damaged or truncated volume
//! files that must give errors, never panics. Seeds are printed; rerun with the same seed.

mod common;

use common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use zbd_core::format::{Superblock, SUPERBLOCK_BYTES};
use zbd_core::{Codec, Error, IoOptions, OpenOptions, SimStorage, Volume};

fn read_block(vol: &Volume, lba: u64) -> zbd_core::Result<Vec<u8>> {
    let mut b = vec![0u8; BS];
    vol.read(lba * BS as u64, &mut b)?;
    Ok(b)
}

fn reopen(disk: &Arc<SimStorage>) -> Volume {
    Volume::open(Box::new(Arc::clone(disk)), open_opts()).expect("reopen")
}

/// A damaged map page makes its blocks unreadable (Corrupt). Writing one block of that page
/// dirties it; the checkpoint then rewrites the page. The blocks whose location was lost must
/// stay Corrupt after a reopen, not silently turn into holes that read as zeros.
#[test]
fn damaged_map_page_stays_damaged_after_the_page_is_rewritten() {
    let opts = small_volume(1 << 20, 32768, Codec::Lz4, 4, 16);
    let (disk, vol) = sim_volume(&opts);
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

/// Everything each block ever held (zeros included: the initial state).
struct History {
    held: Vec<Vec<Vec<u8>>>,
}

impl History {
    fn new(blocks: usize) -> Self {
        History {
            held: vec![vec![vec![0u8; BS]]; blocks],
        }
    }
    fn wrote(&mut self, lba: usize, data: &[u8]) {
        self.held[lba].push(data.to_vec());
    }
    fn ever_held(&self, lba: usize, data: &[u8]) -> bool {
        self.held[lba].iter().any(|h| h == data)
    }
}

const FUZZ_SIZE: u64 = 512 * 1024;

/// A small volume with checkpointed data, later overwrites only in the log (so recovery has to
/// replay), a trimmed range and a zeroed range. Returns the crash image and the history.
fn crashed_volume_image(seed: u64) -> (Vec<u8>, History) {
    let opts = small_volume(FUZZ_SIZE, 8192, Codec::Lz4, 4, 16);
    let (disk, vol) = sim_volume(&opts);
    let blocks = (FUZZ_SIZE / BS as u64) as usize;
    let mut hist = History::new(blocks);
    let mut rng = SmallRng::seed_from_u64(seed);
    for round in 0..2 {
        for lba in (0..blocks).filter(|l| round == 0 || l % 3 == 0) {
            let kind = if rng.random_bool(0.2) {
                Fill::Random
            } else {
                Fill::Text
            };
            let b = fill(&mut rng, kind, BS);
            vol.write((lba * BS) as u64, &b, false).expect("write");
            hist.wrote(lba, &b);
        }
        if round == 0 {
            vol.checkpoint().expect("checkpoint");
        }
    }
    vol.trim(10 * BS as u64, 4 * BS as u64).expect("trim");
    vol.write_zeroes(20 * BS as u64, 4 * BS as u64)
        .expect("zeroes");
    vol.flush().expect("flush");
    vol.abandon();
    (disk.current_image(), hist)
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
    let seed: u64 = std::env::var("ZBD_REVIEW_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_0001);
    eprintln!("seed {seed} (set ZBD_REVIEW_SEED to replay)");
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

/// Power fails at every storage operation of recovery itself (its map pages, checkpoint and
/// syncs), with any subset of those writes surviving torn: the next open still finds every
/// flushed block, and so does a third open after a clean recovery.
#[test]
fn crash_inside_recovery_checkpoint_loses_nothing_flushed() {
    let (image, hist) = crashed_volume_image(11);
    let expected: Vec<Vec<u8>> = hist
        .held
        .iter()
        .enumerate()
        .map(|(lba, h)| {
            if (10..14).contains(&lba) || (20..24).contains(&lba) {
                vec![0u8; BS]
            } else {
                h.last().expect("history").clone()
            }
        })
        .collect();
    let verify = |vol: &Volume, ctx: &str| {
        let mut b = vec![0u8; BS];
        for (lba, want) in expected.iter().enumerate() {
            vol.read((lba * BS) as u64, &mut b)
                .unwrap_or_else(|e| panic!("{ctx}: block {lba}: {e}"));
            assert!(&b == want, "{ctx}: block {lba} differs");
        }
    };
    let mut point = 0u64;
    loop {
        let disk = Arc::new(SimStorage::from_image(image.clone()));
        disk.set_power_loss_at(point);
        let ctx = format!("power lost at recovery op {point}");
        match Volume::open(Box::new(Arc::clone(&disk)), open_opts()) {
            Ok(vol) => {
                verify(&vol, &ctx);
                vol.abandon();
                break;
            }
            Err(_) => {
                let mut rng = SmallRng::seed_from_u64(point);
                let img = disk.crash_image(&mut rng);
                let disk2 = Arc::new(SimStorage::from_image(img));
                let vol = reopen(&disk2);
                verify(&vol, &ctx);
                // Reopen twice more without writes: replay must be idempotent.
                vol.close().expect("close");
                drop(vol);
                let vol = reopen(&disk2);
                vol.close().expect("close");
                drop(vol);
                verify(&reopen(&disk2), &format!("{ctx}, third open"));
            }
        }
        point += 1;
        assert!(point < 1000, "recovery never completed");
    }
    eprintln!("recovery crashed at {point} storage operations, each verified");
    assert!(point > 3, "recovery took only {point} storage operations");
}

/// Out-of-range, zero-length and overflowing requests are errors (or no-ops), never panics;
/// unaligned zero/trim ranges at the device end touch exactly the bytes asked for.
#[test]
fn request_edges_and_unaligned_ranges_at_the_end() {
    let size = 64 * 1024u64;
    let opts = small_volume(size, 8192, Codec::Lz4, 4, 16);
    let (_disk, vol) = sim_volume(&opts);
    let mut model = vec![0u8; size as usize];
    let mut rng = SmallRng::seed_from_u64(5);
    let data = fill(&mut rng, Fill::Random, size as usize);
    vol.write(0, &data, false).expect("fill");
    model.copy_from_slice(&data);
    let mut one = [0u8; 1];
    for (offset, len) in [
        (size, 1u64),
        (size - 1, 2),
        (u64::MAX, 1),
        (u64::MAX - 10, 100),
        (1, u64::MAX),
        (size + 1, 0),
    ] {
        let oor = |r: zbd_core::Result<()>, what: &str| {
            assert!(
                matches!(r, Err(Error::OutOfRange { .. })),
                "{what} at {offset}+{len}: {r:?}"
            )
        };
        oor(vol.write_zeroes(offset, len), "write_zeroes");
        oor(vol.trim(offset, len), "trim");
        assert!(
            vol.allocation(offset, len).is_err(),
            "allocation {offset}+{len}"
        );
        if len <= 2 {
            let mut b = vec![0u8; len as usize];
            oor(vol.read(offset, &mut b), "read");
            oor(vol.write(offset, &b, false), "write");
        }
    }
    // Zero-length requests at the very end are no-ops.
    vol.read(size, &mut []).expect("empty read");
    vol.write(size, &[], true).expect("empty write");
    vol.trim(size, 0).expect("empty trim");
    vol.write_zeroes(size, 0).expect("empty zeroes");
    vol.read(size - 1, &mut one).expect("last byte");
    assert_eq!(one[0], model[size as usize - 1]);
    // Unaligned ranges ending at the device end.
    for (offset, len, trim) in [
        (size - 1, 1, true),
        (size - 4097, 4097, false),
        (size - 5000, 4000, true),
        (size - 3 * 4096 - 17, 3 * 4096 + 17, true),
        (size - 10000, 9999, false),
    ] {
        if trim {
            vol.trim(offset, len).expect("trim");
        } else {
            vol.write_zeroes(offset, len).expect("zeroes");
        }
        model[offset as usize..(offset + len) as usize].fill(0);
        let mut all = vec![0u8; size as usize];
        vol.read(0, &mut all).expect("read all");
        assert!(all == model, "after zeroing {offset}+{len}");
    }
    let runs = vol.allocation(0, size).expect("allocation");
    assert_eq!(runs.iter().map(|r| r.0).sum::<u64>(), size);
    assert!(vol.check(&|_, _| {}).is_clean());
}

/// A 4 MiB volume with a data area of only `capacity` bytes (8 KiB extents).
fn overcommitted(capacity: u64) -> zbd_core::CreateOptions {
    zbd_core::CreateOptions {
        capacity_bytes: Some(capacity),
        extent_bytes: 8192,
        ..zbd_core::CreateOptions::new(4 << 20)
    }
}

/// Writes blocks from 0 up until the volume reports NoSpace; returns how many fit.
fn fill_until_no_space(
    vol: &Volume,
    rng: &mut SmallRng,
    block: &dyn Fn(&mut SmallRng) -> Vec<u8>,
) -> u64 {
    let mut written = 0u64;
    loop {
        match vol.write(written * BS as u64, &block(rng), false) {
            Ok(()) => written += 1,
            Err(Error::NoSpace) => return written,
            Err(e) => panic!("unexpected error {e}"),
        }
        assert!(written < 1024, "never ran out of space");
    }
}

/// An over-committed volume that ran out of space must still accept trims and zero ranges (they
/// free space and need none), after which writes fit again: NoSpace only while live data truly
/// does not fit, and never a dead end the host cannot get out of.
#[test]
fn full_volume_still_accepts_trim_and_then_writes() {
    let (disk, vol) = sim_volume(&overcommitted(256 * 1024));
    let mut rng = SmallRng::seed_from_u64(9);
    let written = fill_until_no_space(&vol, &mut rng, &|rng| fill(rng, Fill::Random, BS));
    vol.flush().expect("flush on a full volume");
    // Zeroing one block and trimming the rest must not need data space.
    vol.write_zeroes(0, BS as u64)
        .expect("write_zeroes on a full volume");
    vol.trim(BS as u64, (written - 1) * BS as u64)
        .expect("trim on a full volume");
    vol.trim(0, 4 << 20).expect("trim everything");
    for lba in 0..written / 2 {
        let d = fill(&mut rng, Fill::Random, BS);
        vol.write(lba * BS as u64, &d, false)
            .unwrap_or_else(|e| panic!("write {lba} after the trim: {e}"));
    }
    vol.close().expect("close");
    drop(vol);
    let vol = reopen(&disk);
    assert!(vol.check(&|_, _| {}).is_clean());
}

/// A block that compresses to about 1.2 KiB (several per 8 KiB extent).
fn part_random(rng: &mut SmallRng) -> Vec<u8> {
    let mut b = fill(rng, Fill::Random, 1200);
    b.resize(BS, 0);
    b
}

/// A full volume whose host then frees half of every extent (scattered trims, nothing whole)
/// must take new writes again: the live data is half the capacity. The cleaner needs at least
/// one free extent to compact into, so host writes must not have used up every last one.
#[test]
fn full_volume_with_scattered_trims_takes_writes_again() {
    let (disk, vol) = sim_volume(&overcommitted(512 * 1024));
    let mut rng = SmallRng::seed_from_u64(10);
    let written = fill_until_no_space(&vol, &mut rng, &|rng| part_random(rng));
    let mut model: Vec<Option<Vec<u8>>> = vec![None; 1024];
    for lba in (0..written).step_by(2) {
        vol.trim(lba * BS as u64, BS as u64).expect("trim");
    }
    // A third of the written amount again, into fresh blocks.
    for i in 0..written / 3 {
        let lba = written + i;
        let d = part_random(&mut rng);
        vol.write(lba * BS as u64, &d, false).unwrap_or_else(|e| {
            panic!(
                "write {i} of {} after freeing half of {written} blocks: {e}",
                written / 3
            )
        });
        model[lba as usize] = Some(d);
    }
    vol.close().expect("close");
    drop(vol);
    let vol = reopen(&disk);
    for (lba, d) in model.iter().enumerate() {
        if let Some(d) = d {
            assert_eq!(
                &read_block(&vol, lba as u64).expect("read"),
                d,
                "block {lba}"
            );
        }
    }
    assert!(vol.check(&|_, _| {}).is_clean());
}

/// Released extents must be consistently free even when discarding them fails: before, the
/// first failing discard aborted the release loop after the free list had taken every released
/// extent, leaving the rest "pending free" and so released (and queued) again at the next
/// checkpoint: one extent handed out twice.
#[test]
fn failing_discard_neither_fails_writes_nor_double_allocates() {
    let size = 256 * 1024u64;
    let opts = small_volume(size, 8192, Codec::Lz4, 2, 8);
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let vol = Volume::create_with(Box::new(NoDiscard(Arc::clone(&disk))), &opts, open_opts())
        .expect("create");
    let blocks = size / BS as u64;
    let mut model = vec![vec![0u8; BS]; blocks as usize];
    let mut rng = SmallRng::seed_from_u64(12);
    for i in 0..3000u64 {
        let lba = rng.random_range(0..blocks);
        let d = part_random(&mut rng);
        vol.write(lba * BS as u64, &d, false)
            .unwrap_or_else(|e| panic!("write {i}: {e}"));
        model[lba as usize] = d;
        if i % 97 == 0 {
            vol.checkpoint()
                .unwrap_or_else(|e| panic!("checkpoint {i}: {e}"));
        }
    }
    let check = |vol: &Volume, ctx: &str| {
        for (lba, d) in model.iter().enumerate() {
            let got = read_block(vol, lba as u64).unwrap_or_else(|e| panic!("{ctx}: {lba}: {e}"));
            assert!(&got == d, "{ctx}: block {lba} differs");
        }
        let report = vol.check(&|_, _| {});
        assert!(report.is_clean(), "{ctx}: {report:?}");
    };
    check(&vol, "live");
    vol.close().expect("close");
    drop(vol);
    check(&reopen(&disk), "reopened");
}

/// Incompressible blocks (three per 16 KiB extent) overwritten at random, 37 % live: cleaning
/// must keep up however few extents are free. The cleaner's footprint estimate is looser than
/// exact packing (sector padding, whole blocks), so with two free extents a pass could ask for a
/// third output and was then dropped altogether: NoSpace with most of the data area dead.
#[test]
fn random_overwrites_of_raw_blocks_never_run_out_of_space() {
    let opts = zbd_core::CreateOptions {
        extent_bytes: 16384,
        capacity_bytes: Some(512 * 1024),
        queue_len: Some(16),
        ..zbd_core::CreateOptions::new(1 << 20)
    };
    let (disk, vol) = sim_volume(&opts);
    let blocks = 48u64;
    let mut model = vec![vec![0u8; BS]; blocks as usize];
    let mut rng = SmallRng::seed_from_u64(13);
    for i in 0..6000 {
        let lba = rng.random_range(0..blocks);
        let d = fill(&mut rng, Fill::Random, BS);
        vol.write(lba * BS as u64, &d, false).unwrap_or_else(|e| {
            let s = vol.stats();
            panic!(
                "write {i}: {e} ({} live bytes, {} dead, {} extents free)",
                s.physical_bytes_live, s.dead_bytes, s.extents_free
            )
        });
        model[lba as usize] = d;
    }
    vol.close().expect("close");
    drop(vol);
    let vol = reopen(&disk);
    for (lba, d) in model.iter().enumerate() {
        assert!(
            &read_block(&vol, lba as u64).expect("read") == d,
            "block {lba}"
        );
    }
}

/// A disk on which exactly one storage operation (read, write, sync or discard, counted from
/// when the fault is armed) fails with EIO; the process goes on, unlike a power cut.
struct OneFault {
    disk: Arc<SimStorage>,
    countdown: std::sync::atomic::AtomicI64,
}

impl OneFault {
    fn hit(&self) -> zbd_core::Result<()> {
        if self
            .countdown
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
            == 0
        {
            return Err(Error::Io(std::io::Error::other("injected EIO")));
        }
        Ok(())
    }
}

impl zbd_core::Storage for OneFault {
    fn len_bytes(&self) -> zbd_core::Result<u64> {
        self.disk.len_bytes()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> zbd_core::Result<()> {
        self.hit()?;
        self.disk.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> zbd_core::Result<()> {
        self.hit()?;
        self.disk.write_at(offset, data)
    }
    fn sync(&self) -> zbd_core::Result<()> {
        self.hit()?;
        self.disk.sync()
    }
    fn discard(&self, offset: u64, len: u64) -> zbd_core::Result<()> {
        self.hit()?;
        self.disk.discard(offset, len)
    }
}

/// One I/O error injected at each storage operation of a workload in turn (redb's fuzzer does
/// this). A failed read fails that request only (each of its blocks then holds the old or the
/// new data) and the volume carries on. A failed write or sync stops the volume (the failed
/// state, docs/design.md): every later write and flush fails with EIO, reads are still served,
/// and after reopening every block holds its last flushed value or one written after it,
/// never a checksum error. Runs with synchronous writes (the request that issued the failing
/// write sees it) and with the I/O queue in reordered mode (a queued write's error fails the
/// next sync, or a later write that has to wait for it: io.rs), which must stop the volume too.
#[test]
fn an_io_error_at_any_operation_corrupts_nothing() {
    let size = 128 * 1024u64;
    let blocks = size / BS as u64;
    // Tight data area, the cleaner busy; then roomy, with unaligned writes, zeroes and trims.
    let tight = small_volume(size, 8192, Codec::Lz4, 1, 4);
    let overwrites = overwrite_workload(17, blocks, 300);
    let faults = io_fault_sweep(size, &tight, &overwrites, IoOptions::synchronous())
        + io_fault_sweep(size, &tight, &overwrites, IoOptions::reordered(17))
        + io_fault_sweep(
            size,
            &small_volume(size, 16384, Codec::Zstd(1), 4, 4),
            &workload(18, size, 150),
            IoOptions::synchronous(),
        );
    eprintln!("{faults} injected I/O errors survived");
}

/// Every block of `vol` reads back exactly as in `model`.
fn assert_holds(vol: &Volume, model: &[u8], ctx: &str) {
    for (b, want) in model.chunks(BS).enumerate() {
        let got = read_block(vol, b as u64).unwrap_or_else(|e| panic!("{ctx}: block {b}: {e}"));
        assert!(
            got == want,
            "{ctx}: block {b} differs from what the requests left"
        );
    }
}

/// Per-block contents at the last completed flush and written since (any may survive).
struct Flushed {
    durable: Vec<u8>,
    since: Vec<Vec<Vec<u8>>>,
}

impl Flushed {
    /// Every block of `vol` holds its last flushed value or one written since.
    fn check(&self, vol: &Volume, ctx: &str) {
        for b in 0..self.since.len() {
            let got = read_block(vol, b as u64).unwrap_or_else(|e| panic!("{ctx}: block {b}: {e}"));
            assert!(
                got == self.durable[b * BS..(b + 1) * BS] || self.since[b].contains(&got),
                "{ctx}: block {b} lost flushed data"
            );
        }
    }
}

/// Returns how many storage operations the workload made (one run per fault position).
fn io_fault_sweep(size: u64, opts: &zbd_core::CreateOptions, work: &[Op], io: IoOptions) -> i64 {
    let sb = zbd_core::layout::plan(opts).expect("plan");
    let blocks = size as usize / BS;
    let mut fault_at = 0i64;
    let mut stopped_runs = 0;
    loop {
        let sim = Arc::new(SimStorage::new(sb.total_bytes() as usize));
        let storage = Arc::new(OneFault {
            disk: Arc::clone(&sim),
            countdown: i64::MAX.into(),
        });
        let vol = Volume::create_with(
            Box::new(Arc::clone(&storage)),
            opts,
            open_opts_with(io.clone()),
        )
        .expect("create");
        storage
            .countdown
            .store(fault_at, std::sync::atomic::Ordering::SeqCst);
        let mut model = vec![0u8; size as usize];
        let mut flushed = Flushed {
            durable: model.clone(),
            since: vec![Vec::new(); blocks],
        };
        let mut failed = 0;
        let ctx = format!("EIO at storage op {fault_at} ({io:?})");
        for (i, op) in work.iter().enumerate() {
            let before = model.clone();
            apply_model(&mut model, op);
            let (offset, len) = match op {
                Op::Write { offset, data, .. } => (*offset, data.len() as u64),
                Op::Trim { offset, len } | Op::Zero { offset, len } => (*offset, *len),
                Op::Flush => (0, 0),
            };
            let range_blocks = if len == 0 {
                0..=0usize
            } else {
                (offset / BS as u64) as usize..=((offset + len - 1) / BS as u64) as usize
            };
            if len > 0 {
                for b in range_blocks.clone() {
                    flushed.since[b].push(model[b * BS..(b + 1) * BS].to_vec());
                }
            }
            let r = apply_volume(&vol, op);
            if r.is_ok() {
                if matches!(op, Op::Flush | Op::Write { fua: true, .. }) {
                    flushed.durable.copy_from_slice(&model);
                    flushed.since.iter_mut().for_each(|s| s.clear());
                }
                continue;
            }
            failed += 1;
            // A failed request may have changed some of its blocks and not others (never part
            // of one block): read them back (the fault has fired, reads work) and go on from
            // what the volume holds.
            if len > 0 {
                for b in range_blocks {
                    let got = read_block(&vol, b as u64)
                        .unwrap_or_else(|e| panic!("{ctx}, op {i}: block {b}: {e}"));
                    let range = b * BS..(b + 1) * BS;
                    assert!(
                        got == before[range.clone()] || got == model[range.clone()],
                        "{ctx}, op {i} failed: block {b} is neither old nor new"
                    );
                    model[range].copy_from_slice(&got);
                }
            }
            if vol.stats().failed.is_some() {
                // Stopped: nothing is written any more, and it says so.
                let again = vol.write(0, &vec![1u8; BS], false);
                assert!(matches!(again, Err(Error::Failed(_))), "{ctx}: {again:?}");
                assert!(matches!(vol.flush(), Err(Error::Failed(_))), "{ctx}");
                assert_eq!(
                    again.err().map(|e| e.errno()),
                    Some(zbd_core::error::errno::EIO)
                );
                stopped_runs += 1;
                break;
            }
        }
        // Faults are injected into the workload only (a failed close is a crash, crash.rs).
        let fired = storage
            .countdown
            .swap(i64::MAX, std::sync::atomic::Ordering::SeqCst)
            < 0;
        let stopped = vol.stats().failed.is_some();
        if !stopped {
            // A crash right after a successful flush keeps everything, failed request or not.
            vol.flush().unwrap_or_else(|e| panic!("{ctx}: flush: {e}"));
            flushed.durable.copy_from_slice(&model);
            flushed.since.iter_mut().for_each(|s| s.clear());
        }
        let mut rng = SmallRng::seed_from_u64(fault_at as u64);
        let crashed = Volume::open(
            Box::new(SimStorage::from_image(sim.crash_image(&mut rng))),
            open_opts_sync(),
        )
        .unwrap_or_else(|e| panic!("{ctx}: open after crash: {e}"));
        flushed.check(&crashed, &format!("{ctx}, crash"));
        crashed.abandon();
        let closed = vol.close();
        assert_eq!(closed.is_err(), stopped, "{ctx}: close: {closed:?}");
        drop(vol);
        let vol = Volume::open(Box::new(sim), open_opts_sync())
            .unwrap_or_else(|e| panic!("{ctx}: reopen: {e}"));
        if stopped {
            flushed.check(&vol, &format!("{ctx}, reopen"));
        } else {
            assert_holds(&vol, &model, &ctx);
        }
        let report = vol.check(&|_, _| {});
        assert!(report.is_clean(), "{ctx}: {report:?}");
        if !fired {
            break;
        }
        assert!(failed <= 1, "{ctx}: {failed} requests failed after one EIO");
        fault_at += 1;
    }
    assert!(
        fault_at > 100,
        "the workload made only {fault_at} storage operations"
    );
    assert!(stopped_runs > 0, "no fault ever stopped the volume");
    fault_at
}
