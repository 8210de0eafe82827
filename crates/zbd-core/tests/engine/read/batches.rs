//! Reads decoded straight into the caller's buffer from one `Storage::read_many` batch, and
//! the I/O queue's `read_many` over held writes: an error of one extent fails exactly its
//! blocks and is not cached, queued writes are seen per range, reads across many open extents
//! match the model, and a flipped bit is an error on every read path, never data.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use zbd_core::{Codec, IoOptions, OpenOptions, QueuedStorage, SimStorage, Storage, Volume};

/// A disk whose reads overlapping `bad` fail with EIO, and whose `read_many` runs the batch
/// concurrently and last-first (as a network store may finish them): a result put at the wrong
/// index, or an error lost in the batch, shows as data read from the wrong place.
struct BadReads {
    disk: Arc<SimStorage>,
    bad: Mutex<Option<Range<u64>>>,
    /// Batches of more than one read seen (the test must exercise real batches).
    batches: AtomicU64,
    /// Device reads.
    reads: AtomicU64,
}

impl BadReads {
    fn new(disk: Arc<SimStorage>) -> Arc<BadReads> {
        Arc::new(BadReads {
            disk,
            bad: Mutex::new(None),
            batches: AtomicU64::new(0),
            reads: AtomicU64::new(0),
        })
    }

    fn set_bad(&self, r: Option<Range<u64>>) {
        *self.bad.lock().expect("lock") = r;
    }
}

impl Storage for BadReads {
    fn len_bytes(&self) -> zbd_core::Result<u64> {
        self.disk.len_bytes()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> zbd_core::Result<()> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let end = offset + buf.len() as u64;
        if let Some(b) = &*self.bad.lock().expect("lock") {
            if offset < b.end && b.start < end {
                // What a failing device leaves in the buffer is not data: make it look like
                // plausible data (zeros would hide a caller that ignores the error on a hole).
                buf.fill(0x5a);
                return Err(zbd_core::Error::Io(std::io::Error::other("bad sector")));
            }
        }
        self.disk.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> zbd_core::Result<()> {
        self.disk.write_at(offset, data)
    }
    fn sync(&self) -> zbd_core::Result<()> {
        self.disk.sync()
    }
    fn discard(&self, offset: u64, len: u64) -> zbd_core::Result<()> {
        self.disk.discard(offset, len)
    }
    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<zbd_core::Result<()>> {
        if reads.len() > 1 {
            self.batches.fetch_add(1, Ordering::Relaxed);
        }
        let mut results: Vec<Option<zbd_core::Result<()>>> =
            (0..reads.len()).map(|_| None).collect();
        std::thread::scope(|scope| {
            let handles: Vec<_> = reads
                .iter_mut()
                .enumerate()
                .rev()
                .map(|(i, (offset, buf))| (i, scope.spawn(move || self.read_at(*offset, buf))))
                .collect();
            for (i, h) in handles {
                results[i] = Some(h.join().expect("read thread"));
            }
        });
        results
            .into_iter()
            .map(|r| r.expect("every read ran"))
            .collect()
    }
}

/// Hypothesis: an I/O error of one extent's read in a `read_many` batch is lost, given to the
/// wrong extent's blocks, or leaves its (garbage) bytes in the read cache for a later read.
/// Expected: exactly the blocks stored in the failing extent are errors (a host read touching
/// one fails as a whole, `check` names exactly them), every other block of the same batch reads
/// its data, and once the device reads again every block reads its data (nothing cached from
/// the failed read).
#[test]
fn an_extent_read_error_in_a_batch_fails_exactly_its_blocks_and_is_not_cached() {
    const SIZE: u64 = 2 << 20;
    const BLOCKS: u64 = SIZE / BS as u64;
    for (mode, io) in IO_MODES {
        let opts = small_volume(SIZE, 32 * 1024, Codec::Lz4, 2, 16);
        let sb = zbd_core::layout::plan(&opts).expect("plan");
        let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
        let bad = BadReads::new(Arc::clone(&disk));
        let open = OpenOptions {
            read_cache_bytes: 8 << 20,
            ..open_opts_with(io())
        };
        let vol =
            Volume::create_with(Box::new(Arc::clone(&bad)), &opts, open.clone()).expect("create");
        let mut rng = SmallRng::seed_from_u64(7);
        let mut model = vec![0u8; SIZE as usize];
        // Mixed blocks (raw and compressed), some 16 KiB writes (units), written out of order so
        // that neighbouring blocks live in different extents.
        for _ in 0..3 {
            for lba in (0..BLOCKS).step_by(4) {
                let lba = (lba * 37) % BLOCKS / 4 * 4;
                let data: Vec<u8> = if rng.random_bool(0.3) {
                    (0..4).flat_map(|_| mixed_block(&mut rng)).collect()
                } else {
                    mixed_block(&mut rng)
                };
                let off = (lba * BS as u64) as usize;
                model[off..off + data.len()].copy_from_slice(&data);
                vol.write(off as u64, &data, false).expect("write");
            }
        }
        vol.close().expect("close");
        drop(vol);
        // Reopened: nothing is in an open extent, every block is read from the device.
        let vol = Volume::open(Box::new(Arc::clone(&bad)), open).expect("reopen");
        let data_start = sb.extent_offset(0);
        let ext = u64::from(sb.extent_bytes);
        // The first extent holding some, not all, blocks.
        let mut found = None;
        for e in 0..sb.extent_count {
            let r = data_start + u64::from(e) * ext..data_start + u64::from(e + 1) * ext;
            bad.set_bad(Some(r.clone()));
            let failing: Vec<u64> = (0..BLOCKS)
                .filter(|&lba| read_block(&vol, lba).is_err())
                .collect();
            if !failing.is_empty() {
                found = Some((r, failing));
                break;
            }
        }
        let (range, failing) = found.expect("some extent holds blocks");
        assert!((failing.len() as u64) < BLOCKS, "{mode}");
        bad.set_bad(Some(range.clone()));
        // One host read over everything: one batch over many extents; it fails.
        let mut all = vec![0u8; SIZE as usize];
        assert!(
            vol.read(0, &mut all).is_err(),
            "{mode}: error lost in the batch"
        );
        // Reads that include no failing block, as large as possible: they succeed with data.
        let mut lba = 0;
        while lba < BLOCKS {
            let end = failing
                .iter()
                .copied()
                .find(|&f| f >= lba)
                .unwrap_or(BLOCKS);
            if end > lba {
                let mut buf = vec![0u8; ((end - lba) * BS as u64) as usize];
                vol.read(lba * BS as u64, &mut buf)
                    .unwrap_or_else(|e| panic!("{mode}: blocks {lba}..{end}: {e}"));
                let off = (lba * BS as u64) as usize;
                assert!(
                    buf == model[off..off + buf.len()],
                    "{mode}: blocks {lba}..{end}"
                );
            }
            lba = end + 1;
        }
        // Check reads in chunks (batches): it names exactly the failing blocks.
        let report = vol.check(&|_, _| {});
        assert_eq!(report.damaged_blocks, failing, "{mode}");
        // The device reads again: nothing of the failed reads was kept.
        bad.set_bad(None);
        let mut all = vec![0u8; SIZE as usize];
        vol.read(0, &mut all).expect("read");
        assert!(
            all == model,
            "{mode}: a failed read left bytes in the read cache"
        );
        for &lba in &failing {
            let off = (lba * BS as u64) as usize;
            assert_eq!(
                read_block(&vol, lba).expect("read"),
                model[off..off + BS],
                "{mode}: block {lba}"
            );
        }
        assert!(
            bad.batches.load(Ordering::Relaxed) > 0,
            "{mode}: reads were batched"
        );
        vol.close().expect("close");
    }
}

/// Writes 24 random blocks in one go on a volume made with `opts`, reopens it and reads them
/// back: one device request for the whole run, over at least two neighbouring extents.
fn a_run_written_in_one_go_is_read_in_one_request(
    opts: &zbd_core::CreateOptions,
) -> (Arc<BadReads>, Volume, zbd_core::format::Superblock) {
    const RUN: u64 = 24;
    let sb = zbd_core::layout::plan(opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let bad = BadReads::new(Arc::clone(&disk));
    let open = open_opts_sync();
    let vol = Volume::create_with(Box::new(Arc::clone(&bad)), opts, open.clone()).expect("create");
    let mut rng = SmallRng::seed_from_u64(30);
    let data: Vec<u8> = (0..RUN)
        .flat_map(|_| fill(&mut rng, Fill::Random, BS))
        .collect();
    vol.write(0, &data, false).expect("write");
    vol.close().expect("close");
    drop(vol);
    let vol = Volume::open(Box::new(Arc::clone(&bad)), open).expect("reopen");
    // Fault in the map page first: only data reads are counted below.
    read_block(&vol, 100).expect("read an unwritten block");
    let before = bad.reads.load(Ordering::Relaxed);
    let mut buf = vec![0u8; data.len()];
    vol.read(0, &mut buf).expect("read");
    assert!(buf == data, "the run reads back");
    let extents = (RUN * BS as u64).div_ceil(u64::from(sb.extent_bytes));
    assert_eq!(
        bad.reads.load(Ordering::Relaxed) - before,
        1,
        "{RUN} blocks over at least {extents} neighbouring extents: one request"
    );
    (bad, vol, sb)
}

/// Issue 30: blocks that end one extent and start the next (a file written in one go) are read
/// with one device request, the bytes between them read and dropped; an error in those bytes
/// (here the next extent's segment header, which no block needs) fails no block: the runs are
/// then read one by one.
#[test]
fn neighbouring_extents_are_read_in_one_request_and_a_bad_gap_fails_no_block() {
    let (bad, vol, sb) = a_run_written_in_one_go_is_read_in_one_request(&small_volume(
        2 << 20,
        32 * 1024,
        Codec::None,
        2,
        16,
    ));
    // The second extent's segment header goes bad: every block still reads (cache bypassed).
    let header = sb.extent_offset(1)..sb.extent_offset(1) + 64;
    bad.set_bad(Some(header));
    let report = vol.check(&|_, _| {});
    assert!(
        report.damaged_blocks.is_empty(),
        "{:?}",
        report.damaged_blocks
    );
    vol.close().expect("close");
}

/// Hypothesis: `QueuedStorage::read_many` lays a queued write over the wrong read of the batch,
/// misses one that overlaps only part of a range, or hides a read error of one element behind
/// the queued bytes (or another element's success).
#[test]
fn queued_read_many_sees_held_writes_per_range_and_keeps_each_error() {
    let disk = Arc::new(SimStorage::new(1 << 16));
    disk.write_at(0, &[0xaa; 1 << 16]).expect("fill");
    let bad = BadReads::new(Arc::clone(&disk));
    // Reorder mode holds every write until a sync needs it: all of them are still queued.
    let q = QueuedStorage::new(Arc::clone(&bad), &IoOptions::reordered(3)).expect("queue");
    q.write_at(1000, &[1; 3000]).expect("write");
    q.write_at(8192, &[2; 4096]).expect("write");
    q.write_shared(20_000, &Arc::from(&[3u8; 100][..]))
        .expect("write");
    q.write_at(30_000, &[4; 512]).expect("write");
    let mut below = [0u8; 1];
    disk.read_at(1000, &mut below).expect("read");
    assert_eq!(below[0], 0xaa, "the writes are held, not on the disk yet");
    // The read of the last range fails below; the third write overlaps it entirely.
    bad.set_bad(Some(20_010..20_020));
    let mut b = [
        vec![0u8; 5000],
        vec![0u8; 300],
        vec![0u8; 100],
        vec![0u8; 200],
        vec![0u8; 1024],
    ];
    let offsets = [0u64, 8000, 12_000, 19_950, 29_800];
    let results = {
        let mut reads: Vec<(u64, &mut [u8])> = offsets
            .iter()
            .copied()
            .zip(b.iter_mut().map(|v| v.as_mut_slice()))
            .collect();
        q.read_many(&mut reads)
    };
    let want = |off: u64, len: usize| -> Vec<u8> {
        (off..off + len as u64)
            .map(|x| match x {
                1000..4000 => 1,
                8192..12288 => 2,
                20_000..20_100 => 3,
                30_000..30_512 => 4,
                _ => 0xaa,
            })
            .collect()
    };
    for (i, r) in results.iter().enumerate() {
        if i == 3 {
            assert!(r.is_err(), "range {i}: the device's error was hidden");
        } else {
            assert!(r.is_ok(), "range {i}: {r:?}");
            assert!(b[i] == want(offsets[i], b[i].len()), "range {i}");
        }
    }
    // After the sync, from the disk: the same bytes.
    bad.set_bad(None);
    q.sync().expect("sync");
    for (i, &off) in offsets.iter().enumerate() {
        let mut buf = vec![0u8; b[i].len()];
        disk.read_at(off, &mut buf).expect("read");
        assert!(buf == want(off, buf.len()), "range {i} on disk");
    }
}

/// Hypothesis: the lookup's remembered open extent ("the previous block's") is applied to a
/// block of another extent, or survives a seal, so a read returns another extent's bytes or
/// bytes of a sealed extent from a stale buffer. Many open extents (best fit interleaves
/// neighbouring blocks across them), segments sealed and issued in between, writes held by the
/// I/O queue: every whole-region read matches the model, after every write.
#[test]
fn whole_region_reads_across_many_open_extents_match_the_model() {
    const SIZE: u64 = 1 << 20;
    const BLOCKS: u64 = SIZE / BS as u64;
    for seed in 0..4u64 {
        // 256 extents: up to 8 open (a 32nd of them, and what the buffer holds).
        let opts = small_volume(SIZE, 32 * 1024, Codec::Lz4, 8, 64);
        let open = OpenOptions {
            buffer_bytes: 8 * 32 * 1024,
            read_cache_bytes: if seed % 2 == 0 { 0 } else { 4 << 20 },
            ..open_opts_with(IoOptions::reordered(seed))
        };
        let (_disk, vol) = sim_volume_with(&opts, open);
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut model = vec![0u8; SIZE as usize];
        let mut buf = vec![0u8; SIZE as usize];
        let mut most_open = 0;
        for step in 0..600 {
            let lba = rng.random_range(0..BLOCKS - 8);
            let n = rng.random_range(1..=8u64);
            let data: Vec<u8> = (0..n).flat_map(|_| mixed_block(&mut rng)).collect();
            let off = (lba * BS as u64) as usize;
            model[off..off + data.len()].copy_from_slice(&data);
            vol.write(off as u64, &data, false).expect("write");
            match rng.random_range(0..40) {
                0 => vol.flush().expect("flush"),
                1 => vol.checkpoint().expect("checkpoint"),
                2 => {
                    let t = rng.random_range(0..BLOCKS - 4);
                    vol.trim(t * BS as u64, 4 * BS as u64).expect("trim");
                    let o = (t * BS as u64) as usize;
                    model[o..o + 4 * BS].fill(0);
                }
                _ => {}
            }
            if step % 3 == 0 {
                most_open = most_open.max(vol.stats().extents_open);
                vol.read(0, &mut buf).expect("read");
                assert!(buf == model, "seed {seed} step {step}: whole-volume read");
                // And unaligned, through the scratch path.
                let a = rng.random_range(0..SIZE as usize - 20_000);
                let mut part = vec![0u8; rng.random_range(1..20_000)];
                vol.read(a as u64, &mut part).expect("read");
                assert!(
                    part == model[a..a + part.len()],
                    "seed {seed} step {step}: unaligned"
                );
            }
        }
        assert!(
            most_open > 2,
            "seed {seed}: at most {most_open} extents were open"
        );
        vol.close().expect("close");
    }
}

/// Hypothesis: a unit decoded in place into the caller's buffer (an aligned read of whole
/// units), or a decoded unit kept in the read cache, turns a flipped bit into data: the
/// caller's buffer already held the right bytes (a re-read), so an `Ok` would pass them off.
/// For bits flipped across the first extent's stored bytes, each block either reads its data or
/// is an error, the same whether read alone, by unit (in place) or in one whole-volume read,
/// again after the read cache saw it, and `check` names exactly the blocks that fail alone.
#[test]
fn a_flipped_bit_is_an_error_on_every_read_path_never_data() {
    let mut damaged_somewhere = false;
    for at in [100u64, 700, 1500, 3000, 5000, 9000, 20_000] {
        let (disk, data, sb) = closed_text_volume(at);
        disk.flip_bit(sb.data_offset + at, (at % 8) as u8);
        let open = OpenOptions {
            read_cache_bytes: 4 << 20,
            ..open_opts()
        };
        let vol = Volume::open(Box::new(Arc::clone(&disk)), open).expect("open");
        let blocks = data.len() / BS;
        let alone: Vec<bool> = (0..blocks)
            .map(|b| match read_block(&vol, b as u64) {
                Ok(got) => {
                    assert!(got == data[b * BS..(b + 1) * BS], "bit at {at}: block {b}");
                    false
                }
                Err(_) => true,
            })
            .collect();
        let failing: Vec<u64> = (0..blocks as u64).filter(|&b| alone[b as usize]).collect();
        damaged_somewhere |= !failing.is_empty();
        for round in 0..2 {
            // By 16 KiB (whole units of the default 8 KiB, decoded in place) and whole volume.
            for b in (0..blocks).step_by(4) {
                let mut buf = data[b * BS..(b + 4) * BS].to_vec();
                let r = vol.read((b * BS) as u64, &mut buf);
                assert_eq!(
                    r.is_err(),
                    alone[b..b + 4].iter().any(|&x| x),
                    "bit at {at}, round {round}: blocks {b}..{}",
                    b + 4
                );
                if r.is_ok() {
                    assert!(buf == data[b * BS..(b + 4) * BS]);
                }
            }
            let mut all = data.clone();
            let r = vol.read(0, &mut all);
            assert_eq!(r.is_err(), !failing.is_empty(), "bit at {at}: whole volume");
        }
        assert_eq!(vol.check(&|_, _| {}).damaged_blocks, failing, "bit at {at}");
        vol.close().expect("close");
    }
    assert!(damaged_somewhere, "no flipped bit landed in stored data");
}

/// Review 4 (644d55f2): issue 30's one request for a run written in one go over neighbouring
/// extents holds on a volume with metadata pages too. The allocation queue had taken each
/// fresh extent's carving partner (`e + H`) right after it, so a file written in one go
/// landed in extents `e`, `e + H`, `e + 1`, ... and its read took a request per extent; the
/// partners now come after the run (2f99b3c0).
#[test]
fn review4_a_run_written_in_one_go_on_a_bit10_volume_is_read_in_one_request() {
    let opts = with_metadata_pages(&small_volume(2 << 20, 32 * 1024, Codec::None, 2, 16));
    let (_, vol, _) = a_run_written_in_one_go_is_read_in_one_request(&opts);
    vol.close().expect("close");
}
