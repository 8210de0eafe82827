//! The paged map (issue 9): opening reads nothing proportional to the volume, whole-page ranges
//! cost per page touched, and reads racing checkpoints (tiny map cache) never see stale data.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use zbd_core::format::MAP_PAGE_BYTES;
use zbd_core::{AllocState, CreateOptions, FileStorage, OpenOptions, SimStorage, Storage, Volume};

/// Counts the bytes read through it.
struct Counting {
    inner: Arc<dyn Storage>,
    read: Arc<AtomicU64>,
}

impl Storage for Counting {
    fn len_bytes(&self) -> zbd_core::Result<u64> {
        self.inner.len_bytes()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> zbd_core::Result<()> {
        self.read.fetch_add(buf.len() as u64, Ordering::SeqCst);
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> zbd_core::Result<()> {
        self.inner.write_at(offset, data)
    }
    fn sync(&self) -> zbd_core::Result<()> {
        self.inner.sync()
    }
    fn discard(&self, offset: u64, len: u64) -> zbd_core::Result<()> {
        self.inner.discard(offset, len)
    }
}

/// Block `lba`'s content at `version`: both are in the first 16 bytes, text after.
fn block(lba: u64, version: u64) -> Vec<u8> {
    let mut b = vec![b'z'; 4096];
    b[..8].copy_from_slice(&lba.to_le_bytes());
    b[8..16].copy_from_slice(&version.to_le_bytes());
    b
}

#[test]
fn opening_a_large_sparse_volume_reads_no_map() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("big.zbd");
    let size = 64u64 << 30;
    let opts = CreateOptions::new(size);
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let open = OpenOptions {
        map_cache_bytes: 64 << 10,
        ..open_opts_sync()
    };
    let blocks = size / 4096;
    let mut rng = SmallRng::seed_from_u64(9);
    let lbas: Vec<u64> = (0..300).map(|_| rng.random_range(0..blocks)).collect();
    {
        let file = FileStorage::create(&path, sb.total_bytes()).expect("file");
        let vol = Volume::create_with(Box::new(file), &opts, open.clone()).expect("create");
        for (i, &lba) in lbas.iter().enumerate() {
            vol.write(lba * 4096, &block(lba, i as u64), false)
                .expect("write");
        }
        vol.close().expect("close");
    }
    let read = Arc::new(AtomicU64::new(0));
    let counting = |read: &Arc<AtomicU64>| Counting {
        inner: Arc::new(FileStorage::open(&path, true).expect("open file")),
        read: Arc::clone(read),
    };
    let vol = Volume::open(Box::new(counting(&read)), open.clone()).expect("open");
    let at_open = read.load(Ordering::SeqCst);
    let map_bytes = 2 * u64::from(sb.map_pages) * MAP_PAGE_BYTES as u64;
    // Superblock, checkpoint slots, the extent-table pages in use and the queued extents'
    // first sectors; the map alone is 2 x 257 MiB.
    assert!(
        at_open < 4 << 20,
        "open read {at_open} bytes (map: {map_bytes})"
    );
    let distinct: std::collections::HashSet<u64> = lbas.iter().copied().collect();
    let before = read.load(Ordering::SeqCst);
    let stats = vol.stats();
    // 300 scattered blocks dirty ~300 map pages with a 15-page cache: dirty pages brought
    // checkpoints forward (without that: open, close and reopen make three).
    assert!(
        stats.counters.checkpoints > 5,
        "{} checkpoints",
        stats.counters.checkpoints
    );
    assert_eq!(read.load(Ordering::SeqCst), before, "stats read the disk");
    assert_eq!(stats.data_blocks, distinct.len() as u64);
    // The latest version of every block written.
    let mut latest = std::collections::HashMap::new();
    for (i, &lba) in lbas.iter().enumerate() {
        latest.insert(lba, i as u64);
    }
    let mut buf = vec![0u8; 4096];
    for (&lba, &v) in &latest {
        vol.read(lba * 4096, &mut buf).expect("read");
        assert_eq!(buf, block(lba, v), "block {lba}");
    }
    // A whole-volume trim reads only the pages that hold data (their old entries are needed
    // for the accounting), and block status answers from page summaries.
    let before = read.load(Ordering::SeqCst);
    vol.trim(0, size).expect("trim all");
    let trim_read = read.load(Ordering::SeqCst) - before;
    assert!(
        trim_read <= 2 * distinct.len() as u64 * MAP_PAGE_BYTES as u64,
        "trim read {trim_read} bytes"
    );
    assert_eq!(
        vol.allocation(0, size).expect("allocation"),
        vec![(size, AllocState::Hole)]
    );
    assert_eq!(vol.stats().data_blocks, 0);
    vol.close().expect("close");
    drop(vol);
    // The counters and summaries persisted: the reopened volume agrees without a scan.
    read.store(0, Ordering::SeqCst);
    let vol = Volume::open(Box::new(counting(&read)), open).expect("reopen");
    assert!(read.load(Ordering::SeqCst) < 4 << 20);
    assert_eq!(vol.stats().data_blocks, 0);
    assert_eq!(vol.stats().unmapped_blocks, blocks);
}

#[test]
fn reads_during_checkpoints_never_see_stale_data() {
    // 8 MiB: 8 map pages and more, with a one-page cache: reads fault pages in while the
    // writer dirties others and a third thread checkpoints.
    let opts = small_volume(8 << 20, 32768, zbd_core::Codec::Lz4, 4, 16);
    // v2's map cache, whose budget this test sets (a page pool has a floor far above it).
    let (_disk, vol) = sim_volume_v2_map(&opts, open_opts());
    let vol = Arc::new(vol);
    let blocks = (8u64 << 20) / 4096;
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..blocks).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (vol, acked) = (Arc::clone(&vol), Arc::clone(&acked));
        std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(1);
            for version in 1..=3000u64 {
                let lba = rng.random_range(0..blocks);
                vol.write(lba * 4096, &block(lba, version), false)
                    .expect("write");
                acked[lba as usize].store(version, Ordering::SeqCst);
            }
        })
    };
    let checkpointer = {
        let (vol, stop) = (Arc::clone(&vol), Arc::clone(&stop));
        std::thread::spawn(move || {
            // At least one checkpoint, however the threads are scheduled.
            let mut n = 0u64;
            loop {
                vol.checkpoint().expect("checkpoint");
                n += 1;
                if stop.load(Ordering::SeqCst) {
                    break n;
                }
            }
        })
    };
    let mut rng = SmallRng::seed_from_u64(2);
    let mut buf = vec![0u8; 4096];
    let mut checked = 0u64;
    // While the writer runs, and at least until some written block was checked and a page was
    // faulted in (a loaded machine may run the whole writer before this thread's first read,
    // and pages stay pinned while dirty: the checkpointer goes on cleaning them meanwhile).
    // Bounded, so that a cache that never faults fails the assertion below instead of hanging.
    let mut after = 0u32;
    while !writer.is_finished()
        || checked == 0
        || (vol.stats().map_cache.faults == 0 && after < 100_000)
    {
        if writer.is_finished() {
            after += 1;
        }
        let lba = rng.random_range(0..blocks);
        let floor = acked[lba as usize].load(Ordering::SeqCst);
        vol.read(lba * 4096, &mut buf).expect("read");
        if floor == 0 && buf.iter().all(|&b| b == 0) {
            continue;
        }
        let got_lba = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"));
        let got = u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes"));
        assert_eq!(got_lba, lba, "block {lba} holds another block's data");
        assert!(
            got >= floor,
            "block {lba}: version {got} read after {floor} was acked"
        );
        assert_eq!(buf, block(lba, got));
        checked += 1;
    }
    writer.join().expect("writer");
    stop.store(true, Ordering::SeqCst);
    let checkpoints = checkpointer.join().expect("checkpointer");
    assert!(checked > 0 && checkpoints > 0);
    let stats = vol.stats();
    assert!(stats.map_cache.faults > 0, "the tiny cache never faulted");
    // Every block at its last acked version.
    for lba in 0..blocks {
        let v = acked[lba as usize].load(Ordering::SeqCst);
        vol.read(lba * 4096, &mut buf).expect("read");
        if v == 0 {
            assert!(buf.iter().all(|&b| b == 0));
        } else {
            assert_eq!(buf, block(lba, v));
        }
    }
}

#[test]
fn counters_survive_reopen_and_match_a_recount() {
    // A mix of data, zero and trimmed blocks over many map pages; the counters persisted with
    // the checkpoint must match what `check` recounts from the whole map.
    let opts = small_volume(4 << 20, 32768, zbd_core::Codec::Lz4, 4, 16);
    let (disk, vol) = sim_volume_with(&opts, open_opts());
    let mut rng = SmallRng::seed_from_u64(3);
    for _ in 0..400 {
        let lba = rng.random_range(0..1020u64);
        match rng.random_range(0..4) {
            0 => vol.write_zeroes(lba * 4096, 4096 * 3).expect("zero"),
            1 => vol.trim(lba * 4096, 4096 * 2).expect("trim"),
            _ => vol.write(lba * 4096, &block(lba, 1), false).expect("write"),
        }
    }
    let before = vol.stats();
    vol.close().expect("close");
    let vol = Volume::open(
        Box::new(SimStorage::from_image(disk.current_image())),
        open_opts(),
    )
    .expect("reopen");
    let after = vol.stats();
    assert_eq!(
        (
            after.data_blocks,
            after.zero_blocks,
            after.physical_bytes_live
        ),
        (
            before.data_blocks,
            before.zero_blocks,
            before.physical_bytes_live
        )
    );
    let report = vol.check(&|_, _| {});
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(
        after.data_blocks + after.zero_blocks + after.unmapped_blocks,
        1024
    );
}

/// Scattered writes dirty one map page each; however large the cache, a checkpoint comes by
/// 1536 dirty pages (at 2048 at the latest, under the lock, when writers outrun it), so a reopen after a crash replays and rewrites at most that many.
#[test]
fn dirty_map_pages_are_capped_whatever_the_cache() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("dirty.zbd");
    let size = 4u64 << 30;
    let opts = CreateOptions::new(size);
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let open = OpenOptions {
        map_cache_bytes: 64 << 20,
        ..open_opts_sync()
    };
    let file = FileStorage::create(&path, sb.total_bytes()).expect("file");
    let vol = Volume::create_with(Box::new(file), &opts, open).expect("create");
    let per_page = zbd_core::format::MAP_ENTRIES_PER_PAGE as u64;
    let mut most = 0;
    for i in 0..3000u64 {
        let lba = i * per_page;
        vol.write(lba * 4096, &block(lba, i), false).expect("write");
        most = most.max(vol.stats().map_cache.dirty_pages);
    }
    assert!(most <= 2048, "{most} dirty map pages");
    // More than a checkpoint's worth was written: the cap, not the end of the test, bounded it.
    // One writer: the checkpoint brought forward at the soft limit (3/4 of the cap, 1536 pages)
    // runs right after its request, so the hard cap itself is never reached here.
    assert!(
        most >= 1500,
        "{most} dirty map pages: checkpoints came too early"
    );
    vol.close().expect("close");
}
