//! 4 KiB-aligned device writes (issue 26 case 5, issue 30): on a storage whose logical block is
//! 4 KiB, every write the engine issues covers whole 4 KiB blocks at 4 KiB offsets, so nothing
//! below reads before it writes and O_DIRECT works. A workload with flushes, FUA, trims,
//! cleaning on a tight data area and crashes must read back as the model says.

use super::block_device::{is_root, Loop};
use crate::common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use zbd_core::{Codec, CreateOptions, SimStorage, Storage, Volume};

const ALIGN: u64 = FourKn::BLOCK;

#[test]
fn every_write_on_a_4k_device_is_aligned_and_reads_back() {
    aligned_workload(|o| o.clone(), 0..6, 600, false);
}

/// The same on volumes of bit 11, whose segments there take the 4 KiB form: what the cleaner
/// plans fits its outputs in that form too. (4,000 operations: the queue holds at most half
/// the free extents there, so checkpoints come twice as often and release space before the
/// cleaner is needed; at 3,000 seed 8 never cleaned.)
#[test]
fn every_write_in_4k_form_segments_is_aligned_and_reads_back() {
    aligned_workload(with_metadata_pages, 6..10, 4000, true);
}

/// `ops` random operations per seed on volumes `format` makes; `needs_cleaner`: fail a seed
/// whose cleaner never wrote.
fn aligned_workload(
    format: impl Fn(&CreateOptions) -> CreateOptions,
    seeds: Range<u64>,
    ops: usize,
    needs_cleaner: bool,
) {
    const SIZE: u64 = 2 << 20;
    for seed in seeds {
        // A tight data area.
        let opts = format(&small_volume(SIZE, 32768, Codec::Lz4, 2, 16));
        let sb = zbd_core::layout::plan(&opts).expect("plan");
        let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
        let dev = FourKn::new(&disk);
        let vol =
            Volume::create_with(Box::new(Arc::clone(&dev)), &opts, open_opts()).expect("create");
        let mut model = vec![0u8; SIZE as usize];
        let mut flushed = model.clone();
        for op in workload(seed, SIZE, ops) {
            apply_volume(&vol, &op).unwrap_or_else(|e| panic!("seed {seed}: {op:?}: {e}"));
            apply_model(&mut model, &op);
            if matches!(op, Op::Flush) {
                flushed.clone_from(&model);
            }
        }
        vol.flush().expect("flush");
        flushed.clone_from(&model);
        let mut back = vec![0u8; SIZE as usize];
        vol.read(0, &mut back).expect("read");
        assert!(
            back == model,
            "seed {seed}: live reads differ from the model"
        );
        assert!(
            !needs_cleaner || vol.stats().counters.cleaner_bytes_written > 0,
            "seed {seed}: the cleaner never ran"
        );
        vol.abandon();
        assert_eq!(dev.unaligned.load(Ordering::Relaxed), 0, "seed {seed}");
        assert!(
            dev.writes.load(Ordering::Relaxed) > 100,
            "seed {seed}: too few writes"
        );

        // Power cut, then reopen on the same 4 KiB device: the flushed state, still aligned.
        let image = disk.crash_image(&mut SmallRng::seed_from_u64(seed));
        let disk = Arc::new(SimStorage::from_image(image));
        let dev = FourKn::new(&disk);
        let vol = Volume::open(Box::new(Arc::clone(&dev)), open_opts()).expect("reopen");
        vol.read(0, &mut back).expect("read after the crash");
        assert!(back == flushed, "seed {seed}: flushed data lost");
        for op in workload(seed + 100, SIZE, 200) {
            apply_volume(&vol, &op).expect("write after reopen");
        }
        vol.close().expect("close");
        assert_eq!(
            dev.unaligned.load(Ordering::Relaxed),
            0,
            "seed {seed} after reopen"
        );
        assert!(
            Volume::open_read_only(Box::new(disk))
                .expect("open")
                .check(&|_, _| {})
                .is_clean(),
            "seed {seed}: check"
        );
    }
}

#[test]
fn direct_io_works_on_a_4k_sector_device() {
    if !is_root() {
        return;
    }
    let opts = zbd_core::CreateOptions::new(8 << 20);
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let image = dir.path().join("4kn.img");
    std::fs::File::create(&image)
        .and_then(|f| f.set_len(sb.total_bytes().div_ceil(ALIGN) * ALIGN))
        .expect("image");
    let dev = Loop::attach_with(&image, &["--sector-size", "4096"]);
    let open = |create: bool| {
        let s = if create {
            zbd_core::FileStorage::create(&dev.0, sb.total_bytes())
        } else {
            zbd_core::FileStorage::open(&dev.0, true)
        }
        .expect("open the loop device");
        assert_eq!(
            s.write_align(),
            4096,
            "the device's 4 KiB sectors are not seen"
        );
        s.into_direct(&dev.0)
            .expect("O_DIRECT on a 4 KiB-sector device")
    };
    let data = fill(&mut SmallRng::seed_from_u64(4), Fill::Text, 3 << 20);
    let vol = Volume::create(Box::new(open(true)), &opts).expect("create");
    // Unaligned offsets and lengths, flushes between: segments of every size.
    for (i, chunk) in data.chunks(70_001).enumerate() {
        vol.write(i as u64 * 70_001 + 333, chunk, false)
            .expect("write");
        if i % 3 == 0 {
            vol.flush().expect("flush");
        }
    }
    let guard = super::fork_guard();
    vol.close().expect("close");
    drop(vol);
    let storage = open(false);
    drop(guard);
    let vol = Volume::open(Box::new(storage), zbd_core::OpenOptions::default()).expect("reopen");
    let mut back = vec![0u8; data.len()];
    vol.read(333, &mut back).expect("read");
    assert!(back == data, "data differs after a reopen through O_DIRECT");
    assert!(vol.check(&|_, _| {}).is_clean());
}

/// Bit 11's 4 KiB form on a 4 KiB-sector device (issue 26): after a flushed write and a power
/// cut, any one 4 KiB sector the write changed may come back garbled, and each block then reads
/// its flushed value or an error, never the value it had before. (Segments of 40-byte records
/// keep both copies of a small record table in their last sector: there, that sector took the
/// write's records with it and the blocks read their older values.)
#[test]
fn a_garbled_4k_sector_of_a_flushed_write_never_brings_back_older_data() {
    const BLOCKS: usize = 6;
    let opts = with_metadata_pages(&CreateOptions {
        extent_bytes: 128 << 10,
        codec: Codec::Lz4,
        ..CreateOptions::new(16 << 20)
    });
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let mut rng = SmallRng::seed_from_u64(26);
    let old = fill(&mut rng, Fill::Random, BLOCKS * BS);
    let new = fill(&mut rng, Fill::Random, BLOCKS * BS);
    let vol =
        Volume::create_with(Box::new(FourKn::new(&disk)), &opts, open_opts_sync()).expect("create");
    vol.write(0, &old, false).expect("write the old values");
    vol.close().expect("close");
    // The old values are in the map of the open's checkpoint; the new ones only in the log.
    let vol = Volume::open(Box::new(FourKn::new(&disk)), open_opts_sync()).expect("open");
    let before = disk.current_image();
    vol.write(0, &new, false).expect("write");
    vol.flush().expect("flush");
    // A later segment carries the durable watermark that tells recovery a sync covered the
    // write (without one, a damaged payload above it is taken for a torn write: see
    // docs/design.md, "Torn or damaged").
    vol.write(100 * BS as u64, &old[..BS], false)
        .expect("a later write");
    vol.flush().expect("flush");
    let after = disk.current_image();
    vol.abandon();
    let changed: Vec<usize> = (0..after.len())
        .step_by(ALIGN as usize)
        .filter(|&s| before[s..s + ALIGN as usize] != after[s..s + ALIGN as usize])
        .collect();
    assert!(changed.len() > BLOCKS, "the write changed {changed:?}");
    let mut garbled_reads = 0;
    for &sector in &changed {
        let mut image = after.clone();
        image[sector..sector + ALIGN as usize].fill(0xa5);
        let disk = Arc::new(SimStorage::from_image(image));
        let vol = Volume::open(Box::new(FourKn::new(&disk)), open_opts_sync())
            .unwrap_or_else(|e| panic!("sector at {sector} garbled: open: {e}"));
        let mut back = vec![0u8; BS];
        for b in 0..BLOCKS {
            let at = b * BS;
            match vol.read(at as u64, &mut back) {
                Ok(()) => assert!(
                    back == new[at..at + BS],
                    "sector at {sector} garbled: block {b} reads {}",
                    if back == old[at..at + BS] {
                        "its older value"
                    } else {
                        "other bytes"
                    }
                ),
                Err(zbd_core::Error::Corrupt { .. }) => garbled_reads += 1,
                Err(e) => panic!("sector at {sector} garbled: block {b}: {e}"),
            }
        }
    }
    // The sectors holding payload made their blocks errors.
    assert!(garbled_reads >= BLOCKS - 1, "{garbled_reads} errors");
}
