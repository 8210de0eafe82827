//! A volume on a real file written past the point where write-back starts reads back.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use zbd_core::{CreateOptions, OpenOptions, Volume};

/// A file volume with the default options (background thread, I/O threads) written well past
/// the 4 MiB at which `FileStorage` starts the kernel's writeback (`sync_file_range`), with
/// checkpoints asked for by the writes along the way: everything reads back after a reopen and
/// `check` is clean. (Whether starting writeback could hide a write error from the next
/// fdatasync needs a failing device to test: the review's report argues it cannot.)
#[test]
fn a_file_volume_written_past_the_writeback_start_reads_back() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let path = dir.path().join("vol");
    let opts = CreateOptions {
        queue_len: Some(16),
        ..CreateOptions::new(16 << 20)
    };
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let storage = zbd_core::FileStorage::create(&path, sb.total_bytes()).expect("file");
    let vol = Volume::create(Box::new(storage), &opts).expect("create");
    let mut rng = SmallRng::seed_from_u64(12);
    let data = fill(&mut rng, Fill::Random, 12 << 20);
    for (i, chunk) in data.chunks(1 << 20).enumerate() {
        vol.write((i << 20) as u64, chunk, false).expect("write");
    }
    vol.flush().expect("flush");
    let checkpoints = vol.stats().counters.checkpoints;
    assert!(checkpoints > 3, "only {checkpoints} checkpoints");
    let guard = super::fork_guard();
    vol.close().expect("close");
    drop(vol);
    let storage = zbd_core::FileStorage::open(&path, true).expect("open file");
    drop(guard);
    let vol = Volume::open(Box::new(storage), OpenOptions::default()).expect("open");
    let mut back = vec![0u8; data.len()];
    vol.read(0, &mut back).expect("read");
    assert!(back == data, "data differs after reopen");
    assert!(vol.check(&|_, _| {}).is_clean());
}
