//! Inline deduplication (`dedup: true`, design.md build order 2b): a written block equal to a
//! stored one becomes a reference with a ref record. Everything must read back as written
//! through overwrites, trims, the cleaner, closes, power cuts and failed syncs; a block
//! acknowledged before a completed flush survives; `zbd check` must agree with the counts.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use zbd_core::{Codec, CreateOptions, OpenOptions, SimStorage, Volume};

const SIZE: u64 = 4 << 20;
const BLOCKS: u64 = SIZE / BS as u64;

fn opts(unit: Option<u32>) -> CreateOptions {
    CreateOptions {
        dedup: true,
        ..with_metadata_pages(&CreateOptions {
            unit_bytes: unit,
            ..small_volume(SIZE, 65536, Codec::Lz4, 3, 6)
        })
    }
}

/// `distinct` contents (half random, half zeros: ~2:1 with lz4).
fn contents(rng: &mut SmallRng, distinct: usize) -> Vec<Vec<u8>> {
    (0..distinct)
        .map(|_| {
            let mut b = fill(rng, Fill::Random, BS / 2);
            b.resize(BS, 0);
            b
        })
        .collect()
}

/// `blocks` blocks drawn from `contents` in a seeded order.
fn drawn(rng: &mut SmallRng, contents: &[Vec<u8>], blocks: u64) -> Vec<u8> {
    let mut data = Vec::with_capacity(blocks as usize * BS);
    for _ in 0..blocks {
        data.extend_from_slice(&contents[rng.random_range(0..contents.len())]);
    }
    data
}

/// Writes `data` at 0 in requests of `chunk` blocks.
fn write_in(vol: &Volume, data: &[u8], chunk: usize) {
    for (i, part) in data.chunks(chunk * BS).enumerate() {
        vol.write((i * chunk * BS) as u64, part, false)
            .expect("write");
    }
}

fn writes_dedup_and_survive(unit: Option<u32>) {
    let (disk, vol) = sim_volume(&opts(unit));
    let mut rng = SmallRng::seed_from_u64(5);
    let set = contents(&mut rng, 40);
    let mut model = drawn(&mut rng, &set, BLOCKS);
    write_in(&vol, &model, 16);
    vol.flush().expect("flush");
    let s = vol.stats();
    let d = s.dedup_index.expect("dedup is on");
    assert!(d.index.verified > 0, "{d:?}");
    assert!(
        s.dedup_ratio > 4.0,
        "40 contents over {BLOCKS} blocks: dedup ratio {}",
        s.dedup_ratio
    );
    assert_reads(&vol, &model, "after inline dedup");
    assert_clean(&vol, "after inline dedup");

    // Overwrites with other copies, trims, new contents, then the cleaner.
    for round in 0..200 {
        let lba = rng.random_range(0..BLOCKS);
        let n = rng.random_range(1..8u64).min(BLOCKS - lba);
        let at = (lba * BS as u64) as usize;
        let len = n as usize * BS;
        if round % 4 == 0 {
            vol.trim(at as u64, len as u64).expect("trim");
            model[at..at + len].fill(0);
        } else {
            let data = if round % 4 == 1 {
                fill(&mut rng, Fill::Text, len)
            } else {
                drawn(&mut rng, &set, n)
            };
            vol.write(at as u64, &data, false).expect("write");
            model[at..at + len].copy_from_slice(&data);
        }
    }
    vol.flush().expect("flush");
    assert_reads(&vol, &model, "after overwrites and trims");
    assert_clean(&vol, "after overwrites and trims");
    vol.compact(&|_, _| {}).expect("compact");
    assert_reads(&vol, &model, "after compaction");
    assert_clean(&vol, "after compaction");
    vol.close().expect("close");
    let vol = reopen(&disk);
    assert!(vol.stats().dedup_index.is_some(), "the setting persists");
    assert_reads(&vol, &model, "after a clean close");
    assert_clean(&vol, "after a clean close");

    // Flushed refs after the last checkpoint, then a power cut: replay applies them. (The
    // index starts empty at an open: the second copy is the one that finds the first.)
    let more = drawn(&mut rng, &set, 256);
    for at in [0, more.len()] {
        vol.write(at as u64, &more, false).expect("write");
        model[at..at + more.len()].copy_from_slice(&more);
    }
    vol.flush().expect("flush");
    let refs = vol.stats().dedup_index.expect("on").index.verified;
    assert!(refs >= 256, "the second copy found the first: {refs}");
    let image = disk.crash_image(&mut rng);
    vol.abandon();
    let vol = reopen(&Arc::new(SimStorage::from_image(image)));
    assert!(vol.stats().recovery_records_replayed > 0);
    assert_reads(&vol, &model, "after a power cut");
    assert_clean(&vol, "after a power cut");
}

#[test]
fn inline_dedup_stores_copies_once_and_everything_reads_back() {
    writes_dedup_and_survive(None);
}

#[test]
fn inline_dedup_of_blocks_of_units_reads_back() {
    writes_dedup_and_survive(Some(16384));
}

/// What each block may read after a crash: its value at the last completed flush, or any value
/// written to it since.
struct Possible {
    durable: Vec<u8>,
    since: Vec<Vec<Vec<u8>>>,
}

impl Possible {
    fn new(model: &[u8]) -> Possible {
        Possible {
            durable: model.to_vec(),
            since: vec![Vec::new(); BLOCKS as usize],
        }
    }

    fn wrote(&mut self, at: usize, data: &[u8]) {
        for (i, b) in data.chunks(BS).enumerate() {
            self.since[at / BS + i].push(b.to_vec());
        }
    }

    fn flushed(&mut self, model: &[u8]) {
        self.durable = model.to_vec();
        self.since.iter_mut().for_each(Vec::clear);
    }

    fn assert_holds(&self, vol: &Volume, ctx: &str) {
        let mut got = vec![0u8; self.durable.len()];
        vol.read(0, &mut got).expect("read");
        for (i, g) in got.chunks(BS).enumerate() {
            let ok =
                g == &self.durable[i * BS..(i + 1) * BS] || self.since[i].iter().any(|v| v == g);
            assert!(
                ok,
                "{ctx}: block {i} reads neither its flushed value nor a later one"
            );
        }
    }
}

/// A power cut, or a failed sync, at storage operations spread over rounds of inline-dedup
/// writes (copies of stored blocks, copies within a request, overwrites of shared blocks),
/// trims and flushes: every block reads what the last completed flush left or a value written
/// after it, and `zbd check` agrees with the counts.
#[test]
fn power_cuts_and_failed_syncs_during_inline_dedup_lose_no_flushed_block() {
    let (disk, vol) = sim_volume(&opts(None));
    let mut rng = SmallRng::seed_from_u64(9);
    let set = contents(&mut rng, 24);
    let base = drawn(&mut rng, &set, BLOCKS / 2);
    vol.write(0, &base, false).expect("write");
    vol.close().expect("close");
    let image = disk.current_image();
    let mut start = vec![0u8; SIZE as usize];
    start[..base.len()].copy_from_slice(&base);
    // One run from the closed image, cut (or a sync failed) at `cut` operations in if given;
    // its operations.
    let run = |cut: Option<u64>, fail_sync: bool, seed: u64| -> u64 {
        let disk = Arc::new(SimStorage::from_image(image.clone()));
        let vol = reopen(&disk);
        let ops0 = disk.ops();
        match cut {
            Some(c) if fail_sync => disk.fail_sync_at(ops0 + c, seed),
            Some(c) => disk.set_power_loss_at(ops0 + c),
            None => {}
        }
        let mut model = start.clone();
        let mut possible = Possible::new(&model);
        let mut rng = SmallRng::seed_from_u64(77);
        for round in 0..24 {
            let lba = rng.random_range(0..BLOCKS - 32);
            let n = rng.random_range(1..32u64);
            let at = (lba * BS as u64) as usize;
            let len = n as usize * BS;
            let ok = if round % 5 == 4 {
                let ok = vol.trim(at as u64, len as u64).is_ok();
                model[at..at + len].fill(0);
                possible.wrote(at, &vec![0u8; len]);
                ok
            } else {
                let data = drawn(&mut rng, &set, n);
                let ok = vol.write(at as u64, &data, false).is_ok();
                model[at..at + len].copy_from_slice(&data);
                possible.wrote(at, &data);
                ok
            };
            if round % 3 == 2 && ok && vol.flush().is_ok() {
                possible.flushed(&model);
            }
        }
        let ops = disk.ops() - ops0;
        if cut.is_none() {
            vol.flush().expect("flush");
            assert!(vol.stats().dedup_index.expect("on").index.verified > 0);
            assert_reads(&vol, &model, "uncut");
        }
        let mut rng = SmallRng::seed_from_u64(seed);
        let crashed = disk.crash_image(&mut rng);
        vol.abandon();
        let disk = Arc::new(SimStorage::from_image(crashed));
        let vol = reopen(&disk);
        let ctx = format!(
            "{} at {cut:?}",
            if fail_sync { "failed sync" } else { "cut" }
        );
        possible.assert_holds(&vol, &ctx);
        assert_clean(&vol, &ctx);
        ops
    };
    let total = run(None, false, 1);
    let step = (total / full_or_light(200, 40)).max(1);
    for cut in (0..total).step_by(step as usize) {
        run(Some(cut), false, cut);
        run(Some(cut), true, cut);
    }
}

/// The referrers of a shared item whose stored bytes rot all read EIO, never other bytes, and
/// a copy written afterwards is not shared with the rotted item (the comparison reads the
/// medium): it is stored again and reads back.
#[test]
fn a_rotted_shared_item_fails_every_referrer_and_is_never_shared_again() {
    let opts = CreateOptions {
        dedup: true,
        ..with_metadata_pages(&small_volume(SIZE, 65536, Codec::None, 3, 6))
    };
    let (disk, vol) = sim_volume(&opts);
    let x = fill(&mut SmallRng::seed_from_u64(21), Fill::Random, BS);
    for lba in 0..3u64 {
        vol.write(lba * BS as u64, &x, false).expect("write");
    }
    vol.close().expect("close");
    drop(vol);
    let image = disk.current_image();
    let copies = image.windows(BS).filter(|w| w == &&x[..]).count();
    assert_eq!(copies, 1, "three writes of one block store it once");
    let at = image
        .windows(BS)
        .position(|w| w == &x[..])
        .expect("stored raw") as u64;
    disk.flip_bit(at + 100, 3);
    let vol = reopen(&disk);
    let mut b = vec![0u8; BS];
    for lba in 0..3u64 {
        assert!(
            vol.read(lba * BS as u64, &mut b).is_err(),
            "block {lba} names the rotted item"
        );
    }
    vol.write(5 * BS as u64, &x, false).expect("write");
    vol.close().expect("close");
    drop(vol);
    let vol = reopen(&disk);
    vol.read(5 * BS as u64, &mut b).expect("a fresh copy reads");
    assert_eq!(b, x);
    assert!(
        vol.read(0, &mut b).is_err(),
        "the rotted item stays an error"
    );
}

/// Dedup needs metadata pages: asked for on a volume without them, the open (and create)
/// refuses with one line naming what to do.
#[test]
fn dedup_on_a_volume_without_metadata_pages_is_refused_by_name() {
    let plain = small_volume(SIZE, 65536, Codec::Lz4, 3, 6);
    let err = zbd_core::layout::plan(&CreateOptions {
        dedup: true,
        metadata_pages: false,
        ..plain.clone()
    })
    .expect_err("refused");
    assert!(err.to_string().contains("metadata pages"), "{err}");
    let (disk, vol) = sim_volume_v2_map(&plain, open_opts());
    vol.close().expect("close");
    let err = Volume::open(
        Box::new(Arc::clone(&disk)),
        OpenOptions {
            dedup: Some(true),
            ..open_opts()
        },
    )
    .err()
    .expect("refused");
    assert!(err.to_string().contains("metadata pages"), "{err}");
}

/// Copies within one request (the index knows none of them yet) are stored once too, and a
/// power cut after the flush replays them.
#[test]
fn copies_within_one_request_are_stored_once() {
    let opts = CreateOptions {
        dedup: true,
        ..with_metadata_pages(&small_volume(SIZE, 65536, Codec::None, 3, 6))
    };
    let (disk, vol) = sim_volume(&opts);
    let mut rng = SmallRng::seed_from_u64(8);
    let x = fill(&mut rng, Fill::Random, BS);
    let y = fill(&mut rng, Fill::Random, BS);
    let data = [&x[..], &y[..], &x[..], &x[..], &y[..], &x[..]].concat();
    vol.write(0, &data, false).expect("write");
    vol.flush().expect("flush");
    let image = disk.crash_image(&mut rng);
    let copies = |b: &[u8]| image.windows(BS).filter(|w| *w == b).count();
    assert_eq!((copies(&x), copies(&y)), (1, 1), "each content stored once");
    vol.abandon();
    let vol = reopen(&Arc::new(SimStorage::from_image(image)));
    let mut model = vec![0u8; SIZE as usize];
    model[..data.len()].copy_from_slice(&data);
    assert_reads(&vol, &model, "after a power cut");
    assert_clean(&vol, "after a power cut");
}

/// Fingerprints cut to 6 bits: nearly every block written collides in the index with a block
/// of other bytes. The byte comparison must refuse every such candidate: each block reads back
/// exactly, through overwrites and a power cut, while real copies are still shared.
#[test]
fn colliding_fingerprints_never_share_different_bytes() {
    let open = OpenOptions {
        dedup_fingerprint_bits: 6,
        ..open_opts()
    };
    let (disk, vol) = sim_volume_with(&opts(None), open.clone());
    let mut rng = SmallRng::seed_from_u64(13);
    let set = contents(&mut rng, 300);
    let mut model = vec![0u8; SIZE as usize];
    for round in 0..400 {
        let lba = rng.random_range(0..BLOCKS - 8);
        let n = rng.random_range(1..8u64);
        let data = drawn(&mut rng, &set, n);
        let at = (lba * BS as u64) as usize;
        vol.write(at as u64, &data, false).expect("write");
        model[at..at + data.len()].copy_from_slice(&data);
        if round % 50 == 49 {
            vol.flush().expect("flush");
        }
    }
    vol.flush().expect("flush");
    let d = vol.stats().dedup_index.expect("on").index;
    assert!(
        d.rejected > 100,
        "candidates with other bytes were proposed: {d:?}"
    );
    assert!(d.verified > 0, "and real copies found: {d:?}");
    assert_reads(&vol, &model, "after colliding writes");
    assert_clean(&vol, "after colliding writes");
    let image = disk.crash_image(&mut rng);
    vol.abandon();
    let vol =
        Volume::open(Box::new(Arc::new(SimStorage::from_image(image))), open).expect("reopen");
    assert_reads(&vol, &model, "after a power cut");
    assert_clean(&vol, "after a power cut");
}
