//! Upgrading a format 2 volume to format 3 in place (`Volume::close_upgraded`, `zbd upgrade`)
//! and the seeded item checksums v3 brings: an upgraded volume keeps every block, old items
//! keep their plain checksums (moved verbatim too), new ones are seeded, and a power loss at
//! any storage operation of the upgrade leaves a volume that opens, as v2 or v3, with its data.
//! Guards against an upgrade that strands a volume between two formats or loses the v2 log.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::Arc;
use zbd_core::format::{Superblock, FORMAT_VERSION, SUPERBLOCK_BYTES};
use zbd_core::{Codec, CreateOptions, Error, SimStorage, Volume};

const SIZE: u64 = 2 << 20;
const BLOCKS: u64 = SIZE / BS as u64;

fn v2_options() -> CreateOptions {
    CreateOptions {
        format_version: 2,
        ..small_volume(SIZE, 16384, Codec::Lz4, 2, 8)
    }
}

/// A closed v2 volume holding compressible and random blocks, with a log tail written after
/// its last checkpoint (flushed, not closed): what a crashed v2 server leaves.
fn v2_volume() -> (Arc<SimStorage>, Vec<Vec<u8>>) {
    let (disk, vol) = sim_volume(&v2_options());
    assert_eq!(vol.superblock().version, 2);
    let mut rng = SmallRng::seed_from_u64(3);
    let blocks: Vec<Vec<u8>> = (0..BLOCKS)
        .map(|b| {
            if b % 3 == 0 {
                fill(&mut rng, Fill::Random, BS)
            } else {
                log_records(b, BS)
            }
        })
        .collect();
    for (b, data) in blocks.iter().enumerate() {
        vol.write((b * BS) as u64, data, false).expect("write");
        if b as u64 == BLOCKS / 2 {
            vol.checkpoint().expect("checkpoint");
        }
    }
    vol.flush().expect("flush");
    vol.abandon();
    (disk, blocks)
}

fn reads_back(vol: &Volume, blocks: &[Vec<u8>], ctx: &str) {
    for (b, want) in blocks.iter().enumerate() {
        let got = read_block(vol, b as u64).unwrap_or_else(|e| panic!("{ctx}: block {b}: {e}"));
        assert!(got == *want, "{ctx}: block {b} changed");
    }
}

/// Upgrade of a v2 volume with a log tail: the tail is replayed and made durable by the open,
/// the superblock says 3 in both copies, every block reads back and `check` is clean; old
/// items keep plain checksums, also when `compact` moves them (verbatim: replay falls back on
/// a victim's copy by checksum, and damage is never given a valid one); new writes are seeded.
#[test]
fn a_v2_volume_upgrades_in_place_keeping_old_checksums_and_seeding_new_items() {
    let (disk, blocks) = v2_volume();
    let vol = reopen(&disk);
    let up = vol.close_upgraded().expect("upgrade");
    assert_eq!(up.version, FORMAT_VERSION);
    drop(vol);
    let image = disk.current_image();
    for copy in 0..2 {
        let at = copy * SUPERBLOCK_BYTES;
        let sb = Superblock::decode(&image[at..at + SUPERBLOCK_BYTES]).expect("superblock");
        assert_eq!(sb.version, 3, "superblock copy {copy}");
    }
    let entries = data_entries(&image);
    assert!(!entries.is_empty() && entries.iter().all(|(_, e)| !e.seeded));

    let vol = reopen(&disk);
    assert_eq!(vol.stats().format_version, 3);
    reads_back(&vol, &blocks, "upgraded");
    assert!(vol.check(&|_, _| {}).is_clean());
    let fresh = log_records(999, BS);
    vol.write(0, &fresh, false).expect("write");
    vol.close().expect("close");
    drop(vol);
    let before = data_entries(&disk.current_image());
    let seeded: Vec<u64> = before
        .iter()
        .filter(|(_, e)| e.seeded)
        .map(|(l, _)| *l)
        .collect();
    assert_eq!(
        seeded,
        [0],
        "the new write is seeded, the old items are not"
    );

    let vol = reopen(&disk);
    vol.compact(&|_, _| {}).expect("compact");
    vol.close().expect("close");
    drop(vol);
    let after = data_entries(&disk.current_image());
    let moved: Vec<_> = after
        .iter()
        .zip(&before)
        .filter(|((_, a), (_, b))| (a.extent, a.offset) != (b.extent, b.offset))
        .collect();
    assert!(!moved.is_empty(), "compact moved items");
    assert!(
        moved
            .iter()
            .all(|((_, a), (_, b))| (a.crc, a.seeded) == (b.crc, b.seeded)),
        "a moved item keeps its checksum"
    );
    let vol = reopen(&disk);
    let mut want = blocks;
    want[0] = fresh;
    reads_back(&vol, &want, "compacted");
    assert!(vol.check(&|_, _| {}).is_clean());
}

/// A power loss at each storage operation of open + upgrade: the volume opens afterwards (as
/// v2 before copy A is durable, as v3 after), every flushed block reads back, `check` is clean,
/// and a v3 open leaves both superblock copies at 3.
#[test]
fn a_power_loss_anywhere_in_an_upgrade_leaves_a_volume_of_either_format() {
    let (disk, blocks) = v2_volume();
    let base = disk.current_image();
    let mut seen = [false; 2];
    let step = full_or_light(1, 3);
    for n in (0u64..).step_by(step) {
        let disk = Arc::new(SimStorage::from_image(base.clone()));
        disk.set_power_loss_at(n);
        let done = Volume::open(Box::new(Arc::clone(&disk)), open_opts())
            .and_then(|vol| vol.close_upgraded());
        let mut rng = SmallRng::seed_from_u64(n);
        let crashed = Arc::new(SimStorage::from_image(disk.crash_image(&mut rng)));
        let vol = reopen(&crashed);
        let version = vol.stats().format_version;
        seen[(version - 2) as usize] = true;
        reads_back(&vol, &blocks, &format!("power loss at op {n}, v{version}"));
        let report = vol.check(&|_, _| {});
        assert!(report.is_clean(), "power loss at op {n}: {report:?}");
        vol.close().expect("close");
        drop(vol);
        if version == 3 {
            let image = crashed.current_image();
            assert_eq!(
                image[..SUPERBLOCK_BYTES],
                image[SUPERBLOCK_BYTES..2 * SUPERBLOCK_BYTES],
                "op {n}: the v3 open rewrote copy B"
            );
        }
        if done.is_ok() {
            break;
        }
    }
    assert_eq!(seen, [true, true], "the sweep crossed the upgrade");
}

/// Only format 2 is upgraded in place: format 3 and format 1 are refused in one line, and
/// nothing is written.
#[test]
fn upgrade_refuses_a_current_volume_and_leaves_it_open() {
    let (disk, vol) = sim_volume(&small_volume(SIZE, 16384, Codec::Lz4, 2, 8));
    let ops = disk.ops();
    let e = vol.close_upgraded().expect_err("already current");
    assert!(matches!(e, Error::Invalid(_)), "{e}");
    assert!(e.to_string().contains("already format 3"), "{e}");
    assert_eq!(disk.ops(), ops, "nothing written");
    vol.write(0, &[1; BS], false).expect("still open");
}
