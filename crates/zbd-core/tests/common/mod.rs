//! Shared test helpers of the engine's test binaries (engine, durability, model; zbd's ceph test
//! includes this file too): seeded data and workloads, a plain byte-vector model of a volume,
//! and storages that inject faults.
#![allow(dead_code)]

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::Duration;
use zbd_core::format::{SegmentForm, CKPT_FLAG_V3_SEGMENTS, FORMAT_VERSION};
use zbd_core::{Codec, CreateOptions, IoOptions, OpenOptions, SimStorage, Storage, Volume};

mod faulty;
mod images;
mod parking;
mod races;
#[allow(unused_imports)]
pub use faulty::*;
#[allow(unused_imports)]
pub use images::*;
#[allow(unused_imports)]
pub use parking::*;
#[allow(unused_imports)]
pub use races::*;

pub const BS: usize = 4096;

/// Data of a chosen compressibility.
#[derive(Clone, Copy, Debug)]
pub enum Fill {
    Random,
    Text,
    Zeros,
}

pub fn fill(rng: &mut SmallRng, kind: Fill, len: usize) -> Vec<u8> {
    match kind {
        Fill::Random => (0..len).map(|_| rng.random()).collect(),
        Fill::Zeros => vec![0; len],
        Fill::Text => {
            let words: [&[u8]; 6] = [b"block ", b"extent ", b"zbd ", b"compress ", b"the ", b"\n"];
            let mut v = Vec::with_capacity(len + 16);
            while v.len() < len {
                v.extend_from_slice(words[rng.random_range(0..words.len())]);
                if rng.random_bool(0.05) {
                    v.push(rng.random());
                }
            }
            v.truncate(len);
            v
        }
    }
}

/// One operation of a workload.
#[derive(Clone, Debug)]
pub enum Op {
    Write {
        offset: u64,
        data: Vec<u8>,
        fua: bool,
    },
    Zero {
        offset: u64,
        len: u64,
    },
    Trim {
        offset: u64,
        len: u64,
    },
    Flush,
}

/// A random workload over `size` bytes: mostly block-aligned writes, some unaligned, zero and
/// trim ranges, and flushes.
pub fn workload(seed: u64, size: u64, ops: usize) -> Vec<Op> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let blocks = size / BS as u64;
    (0..ops)
        .map(|_| {
            let r = rng.random_range(0..100);
            let lba = rng.random_range(0..blocks);
            let nb = rng.random_range(1..=4u64).min(blocks - lba);
            match r {
                0..=54 => {
                    let kind =
                        [Fill::Random, Fill::Text, Fill::Text, Fill::Zeros][rng.random_range(0..4)];
                    let data = fill(&mut rng, kind, nb as usize * BS);
                    Op::Write {
                        offset: lba * BS as u64,
                        data,
                        fua: rng.random_bool(0.05),
                    }
                }
                55..=69 => {
                    let offset = rng.random_range(0..size - 1);
                    let len = rng.random_range(1..=(size - offset).min(9000));
                    let kind = if rng.random_bool(0.5) {
                        Fill::Random
                    } else {
                        Fill::Text
                    };
                    Op::Write {
                        offset,
                        data: fill(&mut rng, kind, len as usize),
                        fua: false,
                    }
                }
                70..=76 => Op::Zero {
                    offset: lba * BS as u64,
                    len: nb * BS as u64,
                },
                77..=82 => {
                    let offset = rng.random_range(0..size - 1);
                    let len = rng.random_range(1..=(size - offset).min(20000));
                    Op::Trim { offset, len }
                }
                _ => Op::Flush,
            }
        })
        .collect()
}

/// Overwrite-heavy workload over the first `blocks` blocks: single-block text writes (which
/// split the compression units), 16 KiB aligned writes (units), a few trims and flushes (keeps
/// the cleaner busy on a tight data area).
pub fn overwrite_workload(seed: u64, blocks: u64, ops: usize) -> Vec<Op> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..ops)
        .map(|_| {
            let lba = rng.random_range(0..blocks);
            match rng.random_range(0..100) {
                0..=9 if blocks >= 4 => {
                    let first = lba / 4 * 4;
                    Op::Write {
                        offset: first * BS as u64,
                        data: fill(&mut rng, Fill::Text, (4.min(blocks - first)) as usize * BS),
                        fua: false,
                    }
                }
                0..=84 => Op::Write {
                    offset: lba * BS as u64,
                    data: fill(&mut rng, Fill::Text, BS),
                    fua: false,
                },
                85..=89 => Op::Trim {
                    offset: lba * BS as u64,
                    len: BS as u64,
                },
                _ => Op::Flush,
            }
        })
        .collect()
}

/// Compression unit size of the test volumes: `ZBD_TEST_UNIT_SIZE` (e.g. `4K` for single
/// blocks, `64K`), else the volume default (8K, or what the extent holds). The same tests run
/// with units of each size as a parameter (`make bench` runs them with 4K and 16K too).
pub fn test_unit_bytes(extent: u32) -> Option<u32> {
    let s = std::env::var("ZBD_TEST_UNIT_SIZE").ok()?;
    let u = zbd_core::layout::parse_size(&s).expect("ZBD_TEST_UNIT_SIZE: a size like 4K") as u32;
    // Never more than the extent holds (a unit must fit an empty extent).
    let widest = SegmentForm::widest(FORMAT_VERSION, test_segment_flags(), extent);
    Some(u.min(u32::from(zbd_core::layout::unit_blocks_max(extent, widest)) * BS as u32))
}

/// Volume options for small test volumes: frequent checkpoints, no aging surprises.
pub fn small_volume(
    size: u64,
    extent: u32,
    codec: Codec,
    capacity_factor: u64,
    queue_len: u32,
) -> CreateOptions {
    CreateOptions {
        extent_bytes: extent,
        codec,
        capacity_bytes: Some(size * capacity_factor),
        queue_len: Some(queue_len),
        unit_bytes: test_unit_bytes(extent),
        ..CreateOptions::new(size)
    }
}

/// A map cache of four pages (see `open_opts_with`).
pub const TINY_MAP_CACHE: usize = 4 * 4200;

pub fn open_opts() -> OpenOptions {
    // Writes held by the I/O layer and completed in a seeded random order: deterministic, and
    // reads must find them in the queue.
    open_opts_with(IoOptions::reordered(0x5eed))
}

/// `open_opts` with every write done in order by the caller (errors seen by the request).
pub fn open_opts_sync() -> OpenOptions {
    open_opts_with(IoOptions::synchronous())
}

pub fn open_opts_with(io: IoOptions) -> OpenOptions {
    OpenOptions {
        aging: Duration::from_secs(3600),
        buffer_bytes: 64 * 1024,
        // Deterministic storage-operation sequences (crash sweeps): cleaning only inline.
        background_cleaner: false,
        io,
        // A few map pages: on volumes of more than 1 MiB pages are evicted and read back all
        // the time.
        map_cache_bytes: TINY_MAP_CACHE,
        ..OpenOptions::default()
    }
}

/// Applies `op` to a byte-vector model.
pub fn apply_model(model: &mut [u8], op: &Op) {
    match op {
        Op::Write { offset, data, .. } => {
            model[*offset as usize..*offset as usize + data.len()].copy_from_slice(data)
        }
        Op::Zero { offset, len } | Op::Trim { offset, len } => {
            model[*offset as usize..(*offset + *len) as usize].fill(0)
        }
        Op::Flush => {}
    }
}

/// Applies `op` to a volume.
pub fn apply_volume(vol: &Volume, op: &Op) -> zbd_core::Result<()> {
    match op {
        Op::Write { offset, data, fua } => vol.write(*offset, data, *fua),
        Op::Zero { offset, len } => vol.write_zeroes(*offset, *len),
        Op::Trim { offset, len } => vol.trim(*offset, *len),
        Op::Flush => vol.flush(),
    }
}

/// A 1 MiB lz4 volume on a fresh simulated disk, filled with seeded text and closed cleanly:
/// the disk, the data written and the superblock (to find the places to damage).
pub fn closed_text_volume(seed: u64) -> (Arc<SimStorage>, Vec<u8>, zbd_core::format::Superblock) {
    let opts = small_volume(1 << 20, 32768, Codec::Lz4, 4, 16);
    let (disk, vol) = sim_volume(&opts);
    let mut rng = SmallRng::seed_from_u64(seed);
    let data = fill(&mut rng, Fill::Text, 1 << 20);
    vol.write(0, &data, false).expect("write");
    vol.close().expect("close");
    let sb = vol.superblock().clone();
    (disk, data, sb)
}

/// Creates a volume on a fresh simulated disk big enough for `opts`.
pub fn sim_volume(opts: &CreateOptions) -> (Arc<SimStorage>, Volume) {
    sim_volume_with(opts, open_opts())
}

/// `sim_volume` opened with `open`.
pub fn sim_volume_with(opts: &CreateOptions, open: OpenOptions) -> (Arc<SimStorage>, Volume) {
    sim_volume_v2_map(&with_test_format(opts), open)
}

/// `sim_volume_with` whatever `ZBD_TEST_METADATA_PAGES` says: for tests that read v2's map
/// pages from the image (`data_entries`, `damage_map_page_everywhere`) or its map cache.
pub fn sim_volume_v2_map(opts: &CreateOptions, open: OpenOptions) -> (Arc<SimStorage>, Volume) {
    let sb = zbd_core::layout::plan(opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let vol = Volume::create_with(Box::new(Arc::clone(&disk)), opts, open).expect("create");
    (disk, vol)
}

/// Whether the suites run on bit-10 volumes (`ZBD_TEST_METADATA_PAGES=1`, `make test-bit10`).
fn test_bit10() -> bool {
    std::env::var("ZBD_TEST_METADATA_PAGES").is_ok_and(|v| v == "1")
}

/// The checkpoint flags that decide the segment form of a default test volume: bit 11 on
/// bit-10 runs (a volume created with metadata pages writes 64-byte records).
pub fn test_segment_flags() -> u32 {
    if test_bit10() {
        CKPT_FLAG_V3_SEGMENTS
    } else {
        0
    }
}

/// The segment form a default test volume writes on the simulated disk (512-byte alignment).
pub fn test_segment_form() -> SegmentForm {
    SegmentForm::for_volume(FORMAT_VERSION, test_segment_flags(), 512, 1 << 20)
}

/// `opts` with metadata pages (checkpoint flag bit 10) when `ZBD_TEST_METADATA_PAGES=1`: the
/// suites then run on page-tree maps (`make test-bit10`).
pub fn with_test_format(opts: &CreateOptions) -> CreateOptions {
    let bit10 = test_bit10() && opts.format_version >= 3;
    if bit10 && !opts.metadata_pages {
        with_metadata_pages(opts)
    } else {
        opts.clone()
    }
}

/// `opts` with metadata pages, the carved stock on top of the data area the test asked for
/// (the stock grows with the area: settled in a few rounds).
pub fn with_metadata_pages(opts: &CreateOptions) -> CreateOptions {
    // `ZBD_TEST_METADATA_STOCK=N`: a stock of N extents, so that the carver supplies the
    // rest of the ids (`make test-bit10`'s second run).
    let stock = std::env::var("ZBD_TEST_METADATA_STOCK").ok().map(|v| {
        v.parse()
            .expect("ZBD_TEST_METADATA_STOCK: a number of extents")
    });
    // `ZBD_TEST_LIST_CAPACITY=4096`: the pair-state list of volumes created before 6349d060.
    let list = std::env::var("ZBD_TEST_LIST_CAPACITY").ok().map(|v| {
        v.parse()
            .expect("ZBD_TEST_LIST_CAPACITY: a number of entries")
    });
    let mut o = CreateOptions {
        metadata_pages: true,
        metadata_stock_extents: opts.metadata_stock_extents.or(stock),
        list_capacity: opts.list_capacity.or(list),
        ..opts.clone()
    };
    let Some(asked) = opts.capacity_bytes else {
        return o;
    };
    // The stock is capped at half the area: a small area grows over a few rounds first.
    for _ in 0..64 {
        let sb = zbd_core::layout::plan(&o).expect("plan");
        let g = zbd_core::meta::MetaGeometry::at_enable(&sb).expect("geometry");
        let mut stock = u64::from(zbd_core::layout::stock_extents_for(
            &o,
            &g,
            sb.logical_blocks,
        ));
        if o.metadata_stock_extents.is_some() {
            // Room for what the open's checkpoint carves on top: up to the high watermark,
            // and past one map change's ids (two root-to-leaf paths and a fold's two pages).
            let (_, high) = zbd_core::meta::pairs::PairAllocator::new(g).watermarks();
            let change = 2 * usize::from(zbd_core::meta::tree::DEPTH_MAX) + 3;
            stock += high.max(change).div_ceil(g.pairs_per_extent as usize) as u64;
        }
        let want = asked + 2 * stock * u64::from(sb.extent_bytes);
        if o.capacity_bytes == Some(want) {
            break;
        }
        o.capacity_bytes = Some(want);
    }
    o
}

/// Flips a bit in every slot and copy of map page `page`: the page has no intact copy left.
pub fn damage_map_page_everywhere(disk: &SimStorage, sb: &zbd_core::format::Superblock, page: u32) {
    for copy in 0..sb.metadata_copies() {
        for slot in 0..2 {
            disk.flip_bit(sb.map_page_offset(page, slot, copy) + 200, 1);
        }
    }
}

/// Reads logical block `lba`.
pub fn read_block(vol: &Volume, lba: u64) -> zbd_core::Result<Vec<u8>> {
    let mut b = vec![0u8; BS];
    vol.read(lba * BS as u64, &mut b)?;
    Ok(b)
}

/// Log-like records that share vocabulary and layout (what a dictionary is good at), seeded.
pub fn log_records(seed: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 200);
    let mut k = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while out.len() < len {
        k ^= k << 13;
        k ^= k >> 7;
        k ^= k << 17;
        let line = format!(
            "{{\"ts\":{},\"user\":\"u{:04}\",\"state\":\"{}\",\"path\":\"/srv/data/{:x}/part-{}.log\",\"bytes\":{}}}\n",
            1_700_000_000 + (k % 10_000_000),
            (k >> 8) % 977,
            ["active", "idle", "closed", "failed", "pending"][(k >> 20) as usize % 5],
            (k >> 24) & 0xffff,
            (k >> 40) % 64,
            (k >> 30) % 100_000
        );
        out.extend_from_slice(line.as_bytes());
    }
    out.truncate(len);
    out
}

/// Reads a batch with every read on its own thread at once: a network store's `read_many`
/// (RADOS has all of them in flight), for test storages that stand in for one.
pub fn concurrently(
    storage: &dyn Storage,
    reads: &mut [(u64, &mut [u8])],
) -> Vec<zbd_core::Result<()>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = reads
            .iter_mut()
            .map(|(offset, buf)| scope.spawn(move || storage.read_at(*offset, buf)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("read thread"))
            .collect()
    })
}

/// The extents (copy 0 and partners) the extent table of `ck` names as metadata (state 3): the
/// stock and whatever the carver added.
pub fn metadata_extents(
    image: &[u8],
    sb: &zbd_core::format::Superblock,
    ck: &zbd_core::format::Checkpoint,
) -> Vec<u32> {
    let per_page = zbd_core::format::EXTENT_TABLE_ENTRIES_PER_PAGE as u32;
    (0..sb.extent_count)
        .filter(|&e| {
            let p = e / per_page;
            let slot = ck.extent_table_slots[p as usize];
            let page =
                sb.extent_table_offset[0] + (u64::from(p) * 2 + u64::from(slot.max(1) - 1)) * 4096;
            // Entries of 8 bytes after a 16-byte header; byte 7 is the state (3: metadata).
            slot != 0 && image[(page + 16 + u64::from(e % per_page) * 8 + 7) as usize] == 3
        })
        .collect()
}

/// The newest valid checkpoint of a volume image (copy 0 of each slot), with its superblock.
pub fn newest_checkpoint(
    image: &[u8],
) -> (zbd_core::format::Superblock, zbd_core::format::Checkpoint) {
    use zbd_core::format::{Checkpoint, Superblock, SUPERBLOCK_BYTES};
    let sb = Superblock::decode(&image[..SUPERBLOCK_BYTES]).expect("superblock");
    let ck = (0..2u64)
        .filter_map(|slot| {
            let at = sb.checkpoint_slot_offset(slot, 0) as usize;
            Checkpoint::decode(&image[at..at + sb.checkpoint_slot_bytes as usize], &sb).ok()
        })
        .max_by_key(|c| c.seq)
        .expect("a checkpoint");
    (sb, ck)
}

/// The map entries of data blocks, by LBA in ascending order, in the newest checkpoint of a
/// volume image (copy 0 of each page).
pub fn data_entries(image: &[u8]) -> Vec<(u64, zbd_core::format::MapEntry)> {
    use zbd_core::format::{
        decode_map_page, BlockState, MapEntry, MAP_ENTRIES_PER_PAGE, MAP_PAGE_BYTES,
    };
    let (sb, ck) = newest_checkpoint(image);
    let mut out = Vec::new();
    for (p, &slot) in ck.page_slots.iter().enumerate() {
        if slot == 0 {
            continue;
        }
        let at = sb.map_page_offset(p as u32, slot - 1, 0) as usize;
        let first = (p * MAP_ENTRIES_PER_PAGE) as u64;
        let n = MAP_ENTRIES_PER_PAGE.min((sb.logical_blocks - first) as usize);
        let mut entries = vec![MapEntry::UNMAPPED; n];
        decode_map_page(
            &image[at..at + MAP_PAGE_BYTES],
            p as u32,
            ck.seq,
            &mut entries,
        )
        .expect("map page");
        out.extend(
            (first..)
                .zip(entries)
                .filter(|(_, e)| e.state == BlockState::Data),
        );
    }
    out
}

/// `full` under `ZBD_TEST_HEAVY=1` (`make test-heavy`), else `light`: the size of a sweep that
/// `make test` samples (every n-th crash point, fewer points) to stay within its time, and
/// `make test-heavy` runs whole.
pub fn full_or_light<T>(full: T, light: T) -> T {
    if std::env::var_os("ZBD_TEST_HEAVY").is_some_and(|v| v == "1") {
        full
    } else {
        light
    }
}

/// Reopens the volume on `disk` with the test options.
pub fn reopen(disk: &Arc<SimStorage>) -> Volume {
    Volume::open(Box::new(Arc::clone(disk)), open_opts()).expect("reopen")
}

/// A block that compresses to about 1.2 KiB (several per 8 KiB extent).
pub fn part_random(rng: &mut SmallRng) -> Vec<u8> {
    let mut b = fill(rng, Fill::Random, 1200);
    b.resize(BS, 0);
    b
}

/// An I/O mode of the engine, by name.
pub type IoMode = (&'static str, fn() -> IoOptions);

pub const IO_MODES: [IoMode; 3] = [
    ("synchronous", IoOptions::synchronous),
    ("reordered", || IoOptions::reordered(11)),
    ("threads", IoOptions::default),
];

/// Reads the volume from 0 and asserts it equals `model`, naming the first block that differs.
pub fn assert_reads(vol: &Volume, model: &[u8], ctx: &str) {
    let mut got = vec![0u8; model.len()];
    vol.read(0, &mut got).expect("read");
    for (i, (g, m)) in got.chunks(BS).zip(model.chunks(BS)).enumerate() {
        assert!(g == m, "{ctx}: block {i} differs from the model");
    }
}

/// `zbd check` finds nothing.
pub fn assert_clean(vol: &Volume, ctx: &str) {
    let r = vol.check(&|_, _| {});
    assert!(r.is_clean(), "{ctx}: {r:?}");
}

/// The id of device `name`.
pub fn id_of(vol: &Volume, name: &str) -> u32 {
    vol.devices()
        .into_iter()
        .find(|d| d.name == name)
        .map(|d| d.id)
        .unwrap_or_else(|| panic!("no device {name}"))
}

/// Referenced and unique bytes of device `name` (`Volume::device_space`).
pub fn space_of(vol: &Volume, name: &str) -> zbd_core::DeviceSpace {
    let id = id_of(vol, name);
    vol.device_space()
        .expect("space")
        .into_iter()
        .find(|s| s.id == id)
        .unwrap_or_else(|| panic!("no space for {name}"))
}

/// Stored bytes the volume counters hold live.
pub fn live(vol: &Volume) -> u64 {
    vol.stats().physical_bytes_live
}

/// Finishes the device deletes a crash stopped (rows listed as "deleting", which take no
/// request): each delete again must finish, leave the volume clean, and drop the row.
pub fn finish_deletes(vol: &Volume, ctx: &str) {
    let stopped: Vec<String> = vol
        .devices()
        .into_iter()
        .filter(|d| d.kind == "deleting")
        .map(|d| d.name)
        .collect();
    for name in &stopped {
        let id = vol
            .devices()
            .iter()
            .find(|d| &d.name == name)
            .expect("listed")
            .id;
        let mut buf = vec![0u8; 4096];
        assert!(
            vol.read_in(id, 0, &mut buf).is_err(),
            "{ctx}: {name} being deleted was read"
        );
        vol.delete_device(name)
            .unwrap_or_else(|e| panic!("{ctx}: finishing the delete of {name}: {e}"));
        assert!(
            vol.devices().iter().all(|d| &d.name != name),
            "{ctx}: {name} still listed after its delete finished"
        );
        assert_clean(vol, &format!("{ctx}, {name}'s delete finished"));
    }
}
