//! Review of space per device (061da9d5) and of deletes in checkpointed steps (cafdaa7b):
//! scenarios that try to lose data or break counts through a delete stopped between or
//! inside its steps, and that compare what `device_space` says with what a delete frees.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use zbd_core::{Codec, CreateOptions, SimStorage, Storage, Volume};

const LEAF: usize = 255;

fn opts(size: u64, dedup: bool) -> CreateOptions {
    CreateOptions {
        dedup,
        ..with_metadata_pages(&small_volume(size, 65536, Codec::Lz4, 2, 6))
    }
}

fn read_dev(vol: &Volume, id: u32, size: u64) -> Vec<u8> {
    let mut got = vec![0u8; size as usize];
    vol.read_in(id, 0, &mut got).expect("read");
    got
}

fn assert_dev(vol: &Volume, id: u32, model: &[u8], ctx: &str) {
    let got = read_dev(vol, id, model.len() as u64);
    for (i, (g, m)) in got.chunks(BS).zip(model.chunks(BS)).enumerate() {
        assert!(
            g == m,
            "{ctx}: device {id} block {i} differs from its model"
        );
    }
}

/// `zbd check` finds nothing but shared items counted higher than the slots naming them
/// (a reference drop whose SBT page could not be read: a leak the design accepts and the
/// check names, never a premature free). Returns how many such leaks it found.
fn assert_clean_but_leaks(vol: &Volume, ctx: &str) -> usize {
    let r = vol.check(&|_, _| {});
    let mut leaks = 0;
    for p in &r.metadata_problems {
        let leak = p.starts_with("shared item ")
            && p.split(": count ")
                .nth(1)
                .and_then(|t| {
                    let (c, rest) = t.split_once(" but ")?;
                    let (n, _) = rest.split_once(' ')?;
                    Some(c.parse::<u64>().ok()? > n.parse::<u64>().ok()?)
                })
                .unwrap_or(false);
        assert!(leak, "{ctx}: {p} ({r:?})");
        leaks += 1;
    }
    assert!(r.damaged_blocks.is_empty(), "{ctx}: {r:?}");
    leaks
}

/// A simulated disk whose reads fail (EIO) from the `countdown`-th one on, until disarmed:
/// a medium that went bad in the middle of an operation, the process going on.
struct ReadsFailFrom {
    disk: Arc<SimStorage>,
    countdown: AtomicI64,
}

impl ReadsFailFrom {
    fn arm(&self, n: i64) {
        self.countdown.store(n, Ordering::SeqCst);
    }
    fn disarm(&self) {
        self.countdown.store(i64::MAX, Ordering::SeqCst);
    }
    fn failed(&self) -> bool {
        self.countdown.load(Ordering::SeqCst) < 0
    }
}

/// Opens `image` and deletes "s" with reads failing from the `k`-th on (still armed).
fn delete_with_reads_failing_from(
    image: &[u8],
    k: i64,
) -> (
    Arc<SimStorage>,
    Arc<ReadsFailFrom>,
    Volume,
    zbd_core::Result<()>,
) {
    let sim = Arc::new(SimStorage::from_image(image.to_vec()));
    let storage = Arc::new(ReadsFailFrom {
        disk: Arc::clone(&sim),
        countdown: AtomicI64::new(i64::MAX),
    });
    let vol = Volume::open(Box::new(Arc::clone(&storage)), open_opts()).expect("open");
    storage.arm(k);
    let r = vol.delete_device("s");
    (sim, storage, vol, r)
}

impl Storage for ReadsFailFrom {
    fn len_bytes(&self) -> zbd_core::Result<u64> {
        self.disk.len_bytes()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> zbd_core::Result<()> {
        if self.countdown.fetch_sub(1, Ordering::SeqCst) <= 0 {
            buf.fill(0x5a);
            return Err(eio());
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
}

/// A read error in the middle of a release step (a leaf, a PCT or SBT page that cannot be
/// read) fails the delete, and the volume goes on (a failed read trips no fence). What the
/// step did before the error (leaves freed, counts of pages the origin shares dropped) must
/// be what the tree says afterwards: the volume checks clean, and deleting again (as the
/// docs say) finishes without touching what the origin still names. With the slots given up
/// before the error left in the page, the retry visits them again: a leaf the origin shares
/// is released a second time (now at count 1: freed under the origin), a freed leaf is read.
#[test]
fn a_read_error_inside_a_release_step_leaves_a_tree_a_retry_finishes() {
    const SIZE: u64 = 16 << 20;
    // Leaves of count 2 (shared) and of count 1 (the snapshot's own) in turn, under a root
    // only the snapshot names.
    let (image, _, now) = snapshot_image(SIZE, 31);

    let mut k = 0i64;
    let mut stopped = 0;
    let mut leaked = 0;
    loop {
        let (sim, storage, vol, r) = delete_with_reads_failing_from(&image, k);
        let hit = storage.failed();
        storage.disarm();
        let ctx = format!("reads failing from the {k}-th of the delete");
        if !hit {
            r.expect("a delete with no failed read");
            assert_clean(&vol, &ctx);
            break;
        }
        if r.is_err() {
            stopped += 1;
        }
        assert_clean_but_leaks(&vol, &format!("{ctx}, after the failed delete"));
        if vol.devices().iter().any(|d| d.name == "s") {
            vol.delete_device("s")
                .unwrap_or_else(|e| panic!("{ctx}: deleting again: {e}"));
        }
        assert_eq!(vol.devices().len(), 1, "{ctx}");
        assert_dev(&vol, 1, &now, &ctx);
        if assert_clean_but_leaks(&vol, &format!("{ctx}, deleted again")) == 0 {
            assert_eq!(space_of(&vol, "default").unique_bytes, live(&vol), "{ctx}");
        } else {
            leaked += 1;
        }
        vol.close().expect("close");
        let vol = reopen(&sim);
        assert_dev(&vol, 1, &now, &format!("{ctx}, reopened"));
        assert_clean_but_leaks(&vol, &format!("{ctx}, reopened"));
        k += 1;
    }
    assert!(stopped > 3, "few reads failed a delete ({stopped})");
    eprintln!("{stopped} deletes stopped by a read error, {leaked} leaving a leak");
}

/// The origin's image with a snapshot "s" of it (a 16 MiB default device, written whole),
/// then a block rewritten in every other leaf, closed: the snapshot's tree is leaves of
/// count 2 and of count 1 in turn. Returns the image, what "s" holds and what the origin
/// holds.
fn snapshot_image(size: u64, seed: u64) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let blocks = (size / BS as u64) as usize;
    let (disk, vol) = sim_volume(&opts(size, false));
    let mut rng = SmallRng::seed_from_u64(seed);
    let old: Vec<u8> = (0..blocks).flat_map(|_| part_random(&mut rng)).collect();
    vol.write(0, &old, false).expect("write");
    vol.snapshot("default", "s").expect("snapshot");
    let mut now = old.clone();
    for leaf in (1..blocks / LEAF).step_by(2) {
        let b = leaf * LEAF + 7;
        let data = part_random(&mut rng);
        vol.write((b * BS) as u64, &data, false).expect("write");
        now[b * BS..(b + 1) * BS].copy_from_slice(&data);
    }
    vol.close().expect("close");
    (disk.current_image(), old, now)
}

/// Opens `image` and stops a delete of "s" part way (reads failing from the right one on):
/// the row is left "deleting", its tree partly given up. Returns the disk and the volume.
fn stopped_delete(image: &[u8]) -> (Arc<SimStorage>, Volume) {
    let whole = {
        let vol = reopen(&Arc::new(SimStorage::from_image(image.to_vec())));
        space_of(&vol, "s").referenced_bytes
    };
    for k in 2..200 {
        let (sim, storage, vol, r) = delete_with_reads_failing_from(image, k);
        storage.disarm();
        if r.is_ok() {
            break;
        }
        let s = vol.devices().into_iter().find(|d| d.name == "s");
        if s.is_some_and(|d| d.kind == "deleting") {
            let left = space_of(&vol, "s").referenced_bytes;
            if left > 0 && left < whole {
                return (sim, vol);
            }
        }
    }
    panic!("no failed read stopped the delete part way");
}

/// A snapshot being deleted (a delete an error or a crash stopped, listed "deleting") is
/// no snapshot any more: part of its tree is gone. A clone of it, a snapshot of a device
/// being deleted, a rollback to it or a diff against it must be refused; a clone made of
/// it would hold the part not yet given up, and read zeros for the rest, as if the
/// snapshot had held them.
#[test]
fn a_device_being_deleted_is_no_source_of_clones_snapshots_or_diffs() {
    const SIZE: u64 = 16 << 20;
    let (image, old, _now) = snapshot_image(SIZE, 32);
    let (_disk, vol) = stopped_delete(&image);
    let c = vol.clone_snapshot("s", "c");
    if let Ok(id) = c {
        let got = read_dev(&vol, id, SIZE);
        let lost = got
            .chunks(BS)
            .zip(old.chunks(BS))
            .filter(|(g, m)| g != m)
            .count();
        panic!("a clone of the snapshot being deleted was made; {lost} of its blocks differ from the snapshot's");
    }
    assert!(
        vol.diff("default", "s").is_err(),
        "a diff against a device being deleted"
    );
    assert!(
        vol.rollback("default", "s").is_err(),
        "a rollback to a snapshot being deleted"
    );
    vol.delete_device("s").expect("finish the delete");
    assert_clean_but_leaks(&vol, "finished");
}
/// A leaf only a snapshot names is lost (both copies damaged): the snapshot reads its blocks
/// as errors, and `zbd stat` counts them damaged. Deleting the snapshot gives the lost leaf
/// up with the rest: no damaged block is left, and the counter says so (the release finds
/// the leaf lost, then counted it found once the next map call drained the lost list: 255
/// damaged blocks for ever). What the lost leaf named stays counted (shared items one
/// reference high, the volume counters until a recount): no stand-in knows it.
#[test]
fn deleting_a_snapshot_with_a_lost_leaf_leaves_no_damage_counted() {
    const SIZE: u64 = 4 << 20;
    let (disk, vol) = sim_volume(&opts(SIZE, false));
    let mut rng = SmallRng::seed_from_u64(70);
    let old: Vec<u8> = (0..SIZE as usize / BS)
        .flat_map(|_| part_random(&mut rng))
        .collect();
    vol.write(0, &old, false).expect("write");
    vol.snapshot("default", "s").expect("snapshot");
    // The origin copies leaf 1: the snapshot alone names page 1 (region 0's fixed id).
    vol.write((300 * BS) as u64, &part_random(&mut rng), false)
        .expect("write");
    vol.close().expect("close");
    let sb = vol.superblock().clone();
    drop(vol);
    damage_map_page_everywhere(&disk, &sb, 1);
    // Found lost by a read of the snapshot before its delete, or by the delete itself.
    for read_first in [true, false] {
        let disk = Arc::new(SimStorage::from_image(disk.current_image()));
        let vol = reopen(&disk);
        let ctx = format!("lost leaf read first: {read_first}");
        if read_first {
            let mut b = vec![0u8; BS];
            let s = id_of(&vol, "s");
            assert!(vol.read_in(s, (300 * BS) as u64, &mut b).is_err(), "{ctx}");
            assert_eq!(
                vol.stats().damaged_blocks,
                255,
                "{ctx}: the lost leaf counted"
            );
        }
        vol.delete_device("s").expect("delete");
        read_block(&vol, 0).expect("read");
        assert_eq!(
            vol.stats().damaged_blocks,
            0,
            "{ctx}: damage counted after the snapshot went"
        );
    }
}
