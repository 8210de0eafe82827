//! Focused volume tests: capacity, corruption, concurrency, exclusive open, replay ordering.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::Arc;
use zbd_core::format::SUPERBLOCK_BYTES;
use zbd_core::{Codec, CreateOptions, Error, FileStorage, SimStorage, Storage, Volume};

fn kill_and_reopen(disk: &Arc<SimStorage>, vol: Volume) -> (Arc<SimStorage>, Volume) {
    vol.flush().expect("flush");
    vol.abandon();
    let d = Arc::new(SimStorage::from_image(disk.current_image()));
    let v = Volume::open(Box::new(Arc::clone(&d)), open_opts()).expect("reopen");
    (d, v)
}

fn read_block(vol: &Volume, lba: u64) -> zbd_core::Result<Vec<u8>> {
    let mut b = vec![0u8; BS];
    vol.read(lba * BS as u64, &mut b)?;
    Ok(b)
}

#[test]
fn full_incompressible_write_fits_default_capacity() {
    for extent in [8192u32, 32768, 1 << 20] {
        let size = 8u64 << 20;
        let opts = CreateOptions {
            extent_bytes: extent,
            ..CreateOptions::new(size)
        };
        let (_disk, vol) = sim_volume(&opts);
        let mut rng = SmallRng::seed_from_u64(extent as u64);
        let data = fill(&mut rng, Fill::Random, size as usize);
        // Worst case for packing: a flush after every block for the first megabyte.
        for lba in 0..256u64 {
            vol.write(
                lba * BS as u64,
                &data[lba as usize * BS..(lba as usize + 1) * BS],
                false,
            )
            .expect("write");
            vol.flush().expect("flush");
        }
        vol.write(1 << 20, &data[1 << 20..], false)
            .unwrap_or_else(|e| panic!("extent {extent}: {e}"));
        vol.flush().expect("flush");
        let mut back = vec![0u8; size as usize];
        vol.read(0, &mut back).expect("read");
        assert!(back == data, "extent {extent}: data differs");
        let s = vol.stats();
        assert_eq!(s.raw_blocks, size / BS as u64);
    }
}

#[test]
fn no_space_is_an_error_not_corruption() {
    // Capacity far below the logical size: incompressible data must run out cleanly.
    let opts = CreateOptions {
        capacity_bytes: Some(256 * 1024),
        extent_bytes: 8192,
        ..CreateOptions::new(4 << 20)
    };
    let (disk, vol) = sim_volume(&opts);
    let mut rng = SmallRng::seed_from_u64(1);
    let mut written = Vec::new();
    let mut hit = false;
    for lba in 0..1024u64 {
        let d = fill(&mut rng, Fill::Random, BS);
        match vol.write(lba * BS as u64, &d, false) {
            Ok(()) => written.push(d),
            Err(Error::NoSpace) => {
                hit = true;
                break;
            }
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert!(hit, "never ran out of space");
    assert_eq!(Error::NoSpace.errno(), 28);
    let (_d, vol) = kill_and_reopen(&disk, vol);
    for (lba, d) in written.iter().enumerate() {
        assert_eq!(
            &read_block(&vol, lba as u64).expect("read"),
            d,
            "block {lba}"
        );
    }
}

#[test]
fn replay_orders_overwrites_across_extents() {
    // Zero block 5, data for block 6 in another extent, then zero block 6: the second zero must
    // not be folded into the first record (it would replay before the data).
    let opts = small_volume(256 * 1024, 8192, Codec::None, 8, 16);
    let (disk, vol) = sim_volume(&opts);
    let mut rng = SmallRng::seed_from_u64(2);
    vol.write(0, &fill(&mut rng, Fill::Random, BS), false)
        .expect("write");
    vol.write_zeroes(5 * BS as u64, BS as u64).expect("zero");
    vol.write(6 * BS as u64, &fill(&mut rng, Fill::Random, BS), false)
        .expect("write");
    vol.write_zeroes(6 * BS as u64, BS as u64).expect("zero");
    let (_d, vol) = kill_and_reopen(&disk, vol);
    assert_eq!(read_block(&vol, 6).expect("read"), vec![0u8; BS]);
    assert!(vol.stats().recovery_records_replayed > 0);
}

#[test]
fn data_corruption_fails_the_read_and_check_finds_it() {
    let (disk, data, sb) = closed_text_volume(3);
    let data_offset = sb.data_offset;
    // Flip a bit inside the first extent's first payload.
    disk.flip_bit(data_offset + 100, 3);
    let vol = Volume::open(Box::new(Arc::clone(&disk)), open_opts()).expect("open");
    let mut all = vec![0u8; 1 << 20];
    let err = vol.read(0, &mut all).expect_err("corrupt read must fail");
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    assert_eq!(err.errno(), 5);
    let report = vol.check(&|_, _| {});
    // The text is stored in compression units: the damaged one fails all its blocks, no more.
    let unit = u64::from(sb.unit_blocks);
    let bad = &report.damaged_blocks;
    assert_eq!(bad.len() as u64, unit, "{report:?}");
    assert!(bad[0].is_multiple_of(unit) && bad.windows(2).all(|w| w[1] == w[0] + 1));
    // Every other block still reads correctly.
    for lba in (0..256u64).filter(|l| !bad.contains(l)) {
        assert_eq!(
            read_block(&vol, lba).expect("read"),
            data[lba as usize * BS..(lba as usize + 1) * BS]
        );
    }
    assert!(vol.stats().counters.corrupt_reads >= 2);
}

#[test]
fn map_page_corruption_is_reported_not_returned() {
    let opts = small_volume(1 << 20, 32768, Codec::Lz4, 4, 16);
    let (disk, vol) = sim_volume_v2_map(&opts, open_opts());
    let mut rng = SmallRng::seed_from_u64(4);
    vol.write(0, &fill(&mut rng, Fill::Text, 1 << 20), false)
        .expect("write");
    vol.close().expect("close");
    let sb = vol.superblock().clone();
    drop(vol);
    // Damage both copies of map page 0 (whichever is current).
    damage_map_page_everywhere(&disk, &sb, 0);
    let vol = Volume::open(Box::new(Arc::clone(&disk)), open_opts()).expect("open");
    assert!(matches!(
        read_block(&vol, 3),
        Err(Error::Corrupt { lba: 3 })
    ));
    let report = vol.check(&|_, _| {});
    assert!(!report.metadata_problems.is_empty());
    assert!(report.damaged_blocks.contains(&0));
    // Blocks on other map pages are fine.
    assert!(read_block(&vol, 255).is_ok());
}

#[test]
fn superblock_damage_and_foreign_or_truncated_files_are_clean_errors() {
    let opts = small_volume(1 << 20, 32768, Codec::Lz4, 4, 16);
    let (disk, vol) = sim_volume(&opts);
    vol.close().expect("close");
    drop(vol);
    disk.flip_bit(40, 0);
    // Copy B takes over, and a writable open writes copy A again from it.
    let vol = Volume::open(Box::new(Arc::clone(&disk)), open_opts()).expect("open with copy B");
    let report = vol.check(&|_, _| {});
    assert!(
        report
            .repaired
            .iter()
            .any(|p| p.contains("superblock copy A was damaged")),
        "{report:?}"
    );
    assert!(report.metadata_problems.is_empty(), "{report:?}");
    vol.close().expect("close");
    drop(vol);
    // Both copies damaged: a clean error.
    disk.flip_bit(40, 0);
    disk.flip_bit(SUPERBLOCK_BYTES as u64 + 40, 0);
    let e = Volume::open(Box::new(Arc::clone(&disk)), open_opts())
        .err()
        .expect("both copies damaged");
    assert!(matches!(e, Error::CorruptMetadata(_)), "{e}");
    let foreign = SimStorage::from_image(vec![0x55; 1 << 20]);
    let e = Volume::open(Box::new(foreign), open_opts())
        .err()
        .expect("foreign");
    assert!(matches!(e, Error::NotAVolume(_)), "{e}");
    let (disk, vol) = sim_volume(&opts);
    vol.close().expect("close");
    drop(vol);
    let mut img = disk.current_image();
    img.truncate(img.len() / 2);
    let e = Volume::open(Box::new(SimStorage::from_image(img)), open_opts())
        .err()
        .expect("truncated");
    assert!(e.to_string().contains("truncated"), "{e}");
    let e = Volume::open(Box::new(SimStorage::from_image(vec![1, 2, 3])), open_opts())
        .err()
        .expect("tiny");
    assert!(matches!(e, Error::NotAVolume(_)), "{e}");
}

#[test]
fn concurrent_writers_and_sector_writes_into_one_block() {
    let opts = small_volume(4 << 20, 32768, Codec::Lz4, 3, 64);
    let (_disk, vol) = sim_volume(&opts);
    let vol = Arc::new(vol);
    let threads = 4;
    std::thread::scope(|s| {
        for t in 0..threads {
            let vol = Arc::clone(&vol);
            s.spawn(move || {
                let mut rng = SmallRng::seed_from_u64(t);
                // Each thread owns every 4th 512-byte sector of the first 64 blocks (so threads
                // race on the same 4 KiB blocks), and a private 512 KiB region.
                for round in 0..3u8 {
                    for lba in 0..64u64 {
                        for sector in (t as usize..8).step_by(threads as usize) {
                            let v = vec![(t as u8) << 4 | round; 512];
                            vol.write(lba * BS as u64 + sector as u64 * 512, &v, false)
                                .expect("sector write");
                        }
                    }
                }
                let base = (1 << 20) + t * (512 << 10);
                let d = fill(&mut rng, Fill::Text, 512 << 10);
                vol.write(base, &d, false).expect("write");
                let mut back = vec![0u8; d.len()];
                vol.read(base, &mut back).expect("read");
                assert!(back == d);
            });
        }
    });
    for lba in 0..64u64 {
        let b = read_block(&vol, lba).expect("read");
        for sector in 0..8usize {
            let t = sector % threads as usize;
            assert!(
                b[sector * 512..(sector + 1) * 512]
                    .iter()
                    .all(|&x| x == ((t as u8) << 4 | 2)),
                "lba {lba} sector {sector}"
            );
        }
    }
}

#[test]
fn second_open_of_a_file_is_refused_as_in_use() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v.zbd");
    let opts = CreateOptions::new(1 << 20);
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let vol = Volume::create(
        Box::new(FileStorage::create(&path, sb.total_bytes()).expect("create")),
        &opts,
    )
    .expect("volume");
    let e = FileStorage::open(&path, true).expect_err("second open must fail");
    assert!(matches!(e, Error::InUse(_)), "{e}");
    assert!(e.to_string().contains("in use"));
    vol.close().expect("close");
    drop(vol);
    assert!(FileStorage::open(&path, true).is_ok());
}

#[test]
fn trimmed_space_goes_back_to_the_host() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v.zbd");
    let opts = CreateOptions {
        queue_len: Some(16),
        ..CreateOptions::new(16 << 20)
    };
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let storage = FileStorage::create(&path, sb.total_bytes()).expect("create");
    let vol = Volume::create(Box::new(storage), &opts).expect("volume");
    let mut rng = SmallRng::seed_from_u64(5);
    vol.write(0, &fill(&mut rng, Fill::Random, 16 << 20), false)
        .expect("write");
    vol.close().expect("close");
    let used = |p: &std::path::Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).expect("meta").blocks() * 512
    };
    let full = used(&path);
    drop(vol);
    let vol = Volume::open(
        Box::new(FileStorage::open(&path, true).expect("open")),
        open_opts(),
    )
    .expect("open");
    vol.trim(0, 16 << 20).expect("trim");
    vol.close().expect("close");
    drop(vol);
    let after = used(&path);
    assert!(full > 16 << 20, "full volume uses {full}");
    assert!(
        after < 4 << 20,
        "after trim the file still uses {after} bytes (was {full})"
    );
}

#[test]
fn storage_len_matches_geometry() {
    let opts = CreateOptions::new(1 << 20);
    let (disk, vol) = sim_volume(&opts);
    assert_eq!(
        disk.len_bytes().expect("len"),
        vol.superblock().total_bytes()
    );
}

#[test]
fn recovery_reads_are_bounded_by_the_queue_not_the_volume() {
    // 64 MiB written, then a crash: opening reads the map pages and at most K extents of log.
    let opts = CreateOptions {
        queue_len: Some(32),
        ..CreateOptions::new(64 << 20)
    };
    let (disk, vol) = sim_volume(&opts);
    let mut rng = SmallRng::seed_from_u64(11);
    let chunk = fill(&mut rng, Fill::Text, 1 << 20);
    for i in 0..64u64 {
        vol.write(i << 20, &chunk, false).expect("write");
    }
    vol.flush().expect("flush");
    let sb = vol.superblock().clone();
    vol.abandon();
    let image = Arc::new(SimStorage::from_image(disk.current_image()));
    let vol = Volume::open(Box::new(Arc::clone(&image)), open_opts()).expect("recover");
    let map_bytes = sb.data_offset; // superblocks + checkpoints + map area
    let log_bytes = u64::from(sb.queue_len) * u64::from(sb.extent_bytes);
    let read = image.bytes_read();
    assert!(
        read <= map_bytes + log_bytes,
        "recovery read {read} bytes (map {map_bytes} + log {log_bytes})"
    );
    assert!(vol.stats().recovery_records_replayed > 0);
    let mut b = vec![0u8; 1 << 20];
    vol.read(63 << 20, &mut b).expect("read");
    assert!(b == chunk);
}
