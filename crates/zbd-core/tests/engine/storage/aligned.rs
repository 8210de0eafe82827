//! 4 KiB-aligned device writes (issue 26 case 5, issue 30): on a storage whose logical block is
//! 4 KiB, every write the engine issues covers whole 4 KiB blocks at 4 KiB offsets, so nothing
//! below reads before it writes and O_DIRECT works. A workload with flushes, FUA, trims,
//! cleaning on a tight data area and crashes must read back as the model says.

use super::block_device::{is_root, Loop};
use crate::common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use zbd_core::{Codec, SimStorage, Storage, Volume};

const ALIGN: u64 = FourKn::BLOCK;

#[test]
fn every_write_on_a_4k_device_is_aligned_and_reads_back() {
    const SIZE: u64 = 2 << 20;
    for seed in 0..6u64 {
        // A tight data area: the cleaner runs.
        let opts = small_volume(SIZE, 32768, Codec::Lz4, 2, 16);
        let sb = zbd_core::layout::plan(&opts).expect("plan");
        let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
        let dev = FourKn::new(&disk);
        let vol =
            Volume::create_with(Box::new(Arc::clone(&dev)), &opts, open_opts()).expect("create");
        let mut model = vec![0u8; SIZE as usize];
        let mut flushed = model.clone();
        for op in workload(seed, SIZE, 600) {
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
