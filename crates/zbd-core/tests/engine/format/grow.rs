//! Growing a volume in place (`layout::grow`, `layout::write_superblock_update`, `zbd grow`): a
//! crash at any point of the superblock writes leaves a volume that opens, as it was or grown,
//! with its data; a grown copy A with an old copy B is repaired from A. Guards against a grow
//! that strands a volume between two geometries.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::Arc;
use zbd_core::format::SUPERBLOCK_BYTES;
use zbd_core::{SimStorage, Storage, Volume};

/// A 1 MiB volume (255 + 1 map pages) with a 256 KiB data area of 8 KiB extents, on a disk
/// already long enough for the grown one, holding `data` at 0; and the grown superblock.
fn volume_and_grown() -> (
    Arc<SimStorage>,
    Vec<u8>,
    zbd_core::format::Superblock,
    zbd_core::format::Superblock,
) {
    let opts = zbd_core::CreateOptions {
        capacity_bytes: Some(256 * 1024),
        extent_bytes: 8192,
        ..zbd_core::CreateOptions::new(1 << 20)
    };
    let old = zbd_core::layout::plan(&opts).expect("plan");
    let max_logical = zbd_core::layout::logical_bytes_max(&old);
    let max_capacity = zbd_core::layout::extent_count_max(&old) * 8192;
    let (disk, data, old, grown) = grown_volume(&opts, max_logical, max_capacity);
    assert!(grown.logical_blocks > old.logical_blocks && grown.extent_count > old.extent_count);
    (disk, data, old, grown)
}

/// A volume of `opts` on a disk long enough for it grown to `logical` bytes and a data area of
/// `capacity`, holding 64 KiB of random `data` at 0, closed; its superblock and the grown one.
fn grown_volume(
    opts: &zbd_core::CreateOptions,
    logical: u64,
    capacity: u64,
) -> (
    Arc<SimStorage>,
    Vec<u8>,
    zbd_core::format::Superblock,
    zbd_core::format::Superblock,
) {
    let planned = zbd_core::layout::plan(opts).expect("plan");
    let grown = zbd_core::layout::grow(&planned, Some(logical), Some(capacity)).expect("grow");
    let disk = Arc::new(SimStorage::new(grown.total_bytes() as usize));
    let vol = Volume::create_with(Box::new(Arc::clone(&disk)), opts, open_opts()).expect("create");
    let mut rng = SmallRng::seed_from_u64(11);
    let data = fill(&mut rng, Fill::Random, 64 * 1024);
    vol.write(0, &data, false).expect("write");
    vol.close().expect("close");
    let old = vol.superblock().clone();
    drop(vol);
    let grown = zbd_core::layout::grow(&old, Some(logical), Some(capacity)).expect("grow");
    (disk, data, old, grown)
}

fn reads_back(vol: &Volume, data: &[u8]) {
    let mut buf = vec![0u8; data.len()];
    vol.read(0, &mut buf).expect("read");
    assert!(buf == data, "data changed");
}

/// Copy A grown, copy B old (a crash between the two writes): the volume opens grown, copy B
/// is rewritten from A by the writable open, and the new room takes data.
#[test]
fn grow_interrupted_after_copy_a_opens_grown() {
    let (disk, data, old, grown) = volume_and_grown();
    disk.write_at(0, &grown.encode()).expect("copy A");
    disk.sync().expect("sync");
    let vol = reopen(&disk);
    assert_eq!(vol.superblock(), &grown);
    reads_back(&vol, &data);
    let mut rng = SmallRng::seed_from_u64(12);
    let more = fill(&mut rng, Fill::Random, 200 * 1024);
    vol.write(data.len() as u64, &more, false)
        .expect("the grown data area takes more than the old one held");
    vol.close().expect("close");
    drop(vol);
    let mut b = vec![0u8; SUPERBLOCK_BYTES];
    disk.read_at(SUPERBLOCK_BYTES as u64, &mut b)
        .expect("read B");
    assert_eq!(b, grown.encode(), "copy B repaired from A");
    let vol = reopen(&disk);
    assert!(vol.check(&|_, _| {}).is_clean());
    assert_ne!(&old, vol.superblock());
}

/// Copy A torn by the crash (its checksum fails): the volume opens as it was, from copy B.
#[test]
fn grow_with_a_torn_copy_a_opens_as_it_was() {
    let (disk, data, old, grown) = volume_and_grown();
    let mut torn = grown.encode();
    torn[SUPERBLOCK_BYTES / 2..].copy_from_slice(&old.encode()[SUPERBLOCK_BYTES / 2..]);
    torn[40] ^= 0xff;
    disk.write_at(0, &torn).expect("torn copy A");
    disk.sync().expect("sync");
    let vol = reopen(&disk);
    assert_eq!(vol.superblock(), &old);
    reads_back(&vol, &data);
    drop(vol);
    // Done properly now: both copies, and the volume is grown.
    zbd_core::layout::write_superblock_update(&*disk, &old, &grown).expect("grow");
    let vol = reopen(&disk);
    assert_eq!(vol.superblock(), &grown);
    reads_back(&vol, &data);
    assert!(vol.check(&|_, _| {}).is_clean());
}

/// Growing refuses storage that is too short, and a superblock that is not the one planned
/// from (another writer), and writes nothing then.
#[test]
fn grow_refuses_short_storage_and_a_changed_volume() {
    let (disk, _, old, grown) = volume_and_grown();
    let short = SimStorage::new(old.total_bytes() as usize);
    assert!(zbd_core::layout::write_superblock_update(&short, &old, &grown).is_err());
    let mut other = old.clone();
    other.extent_count += 1;
    let e = zbd_core::layout::write_superblock_update(&*disk, &other, &grown).expect_err("changed");
    assert!(
        e.to_string().contains("the volume changed meanwhile"),
        "{e}"
    );
    let vol = reopen(&disk);
    assert_eq!(vol.superblock(), &old);
}

/// A volume made with room to grow (format 3: `max_logical_bytes`, `max_capacity_bytes`) grows
/// past its last map and extent-table pages: it opens from the checkpoint written before the
/// grow (which lists fewer pages), reads back, takes data at new LBAs and in new extents, and a
/// crash after flushed writes there recovers them; `check` is clean.
#[test]
fn a_volume_with_room_grows_past_its_last_pages() {
    let opts = zbd_core::CreateOptions {
        capacity_bytes: Some(256 * 1024),
        extent_bytes: 8192,
        max_logical_bytes: Some(8 << 20),
        max_capacity_bytes: Some(8 << 20),
        ..zbd_core::CreateOptions::new(1 << 20)
    };
    let (disk, data, old, grown) = grown_volume(&opts, 8 << 20, 8 << 20);
    assert!(
        grown.map_pages > old.map_pages + 1,
        "past the last map page"
    );
    assert!(
        grown.extent_table_pages > old.extent_table_pages,
        "past the last table page"
    );
    zbd_core::layout::write_superblock_update(&*disk, &old, &grown).expect("grow");
    let mut rng = SmallRng::seed_from_u64(21);

    let vol = reopen(&disk);
    assert_eq!(vol.superblock(), &grown);
    reads_back(&vol, &data);
    // 1 MiB of incompressible data at 6 MiB: new LBAs, and more than the old data area held.
    let far = fill(&mut rng, Fill::Random, 1 << 20);
    vol.write(6 << 20, &far, false)
        .expect("write to the grown part");
    vol.flush().expect("flush");
    vol.abandon();
    let crashed = Arc::new(SimStorage::from_image(disk.crash_image(&mut rng)));
    let vol = reopen(&crashed);
    reads_back(&vol, &data);
    let mut buf = vec![0u8; far.len()];
    vol.read(6 << 20, &mut buf).expect("read");
    assert!(buf == far, "flushed writes to the grown part recovered");
    let report = vol.check(&|_, _| {});
    assert!(report.is_clean(), "{report:?}");
}

/// What a crash during an online grow must leave, besides a volume that opens.
struct Expect {
    old: zbd_core::format::Superblock,
    /// Written and flushed before the grow: must survive any crash.
    flushed: Vec<u8>,
    /// Written (acknowledged) after the flush, at `UNFLUSHED_AT`: each block reads as written
    /// or as before (zeros), never anything else.
    unflushed: Vec<u8>,
}

const UNFLUSHED_AT: u64 = 256 * 1024;
const GROWN_SIZE: u64 = 4 << 20;
const GROWN_CAPACITY: u64 = 1 << 20;

/// A 1 MiB volume with a 256 KiB data area of 8 KiB extents and room for 4 MiB and 1 MiB.
fn online_opts() -> zbd_core::CreateOptions {
    zbd_core::CreateOptions {
        capacity_bytes: Some(256 * 1024),
        extent_bytes: 8192,
        max_logical_bytes: Some(GROWN_SIZE),
        max_capacity_bytes: Some(GROWN_CAPACITY),
        ..zbd_core::CreateOptions::new(1 << 20)
    }
}

/// A served volume's state just before `zbd grow` closes it: `online_opts`, open on a disk
/// long enough for it grown to `GROWN_SIZE` and `GROWN_CAPACITY`, with flushed and unflushed
/// writes. Deterministic: the same storage operations every time.
fn online_grow_setup() -> (Arc<SimStorage>, Volume, Expect) {
    let opts = online_opts();
    let planned = zbd_core::layout::plan(&opts).expect("plan");
    let grown =
        zbd_core::layout::grow(&planned, Some(GROWN_SIZE), Some(GROWN_CAPACITY)).expect("grow");
    let disk = Arc::new(SimStorage::new(grown.total_bytes() as usize));
    let vol = Volume::create_with(Box::new(Arc::clone(&disk)), &opts, open_opts()).expect("create");
    let mut rng = SmallRng::seed_from_u64(31);
    let flushed = fill(&mut rng, Fill::Random, 64 * 1024);
    vol.write(0, &flushed, false).expect("write");
    vol.flush().expect("flush");
    let unflushed = fill(&mut rng, Fill::Text, 32 * 1024);
    vol.write(UNFLUSHED_AT, &unflushed, false).expect("write");
    let old = vol.superblock().clone();
    let expect = Expect {
        old,
        flushed,
        unflushed,
    };
    (disk, vol, expect)
}

/// Opens `image` and checks what any crash during an online grow must leave: the old or the
/// grown geometry, the flushed data, each unflushed block as written or as before (as written,
/// and grown, once the grow has `completed`: its close made them durable); a grown volume
/// takes data in its new blocks and extents, flushed across another crash. Returns whether it
/// opened grown.
fn opens_old_or_grown(
    image: Vec<u8>,
    x: &Expect,
    completed: bool,
    rng: &mut SmallRng,
    ctx: &str,
) -> bool {
    let disk = Arc::new(SimStorage::from_image(image));
    let vol = reopen(&disk);
    let grown = vol.superblock() != &x.old;
    assert!(grown || !completed, "{ctx}: a completed grow opens grown");
    if grown {
        assert_eq!(vol.size_bytes(), GROWN_SIZE, "{ctx}");
        assert_eq!(
            u64::from(vol.superblock().extent_count) * 8192,
            GROWN_CAPACITY,
            "{ctx}"
        );
    }
    reads_back(&vol, &x.flushed);
    let mut buf = vec![0u8; x.unflushed.len()];
    vol.read(UNFLUSHED_AT, &mut buf).expect("read");
    for (b, (got, want)) in buf.chunks(BS).zip(x.unflushed.chunks(BS)).enumerate() {
        assert!(
            got == want || (!completed && got.iter().all(|&v| v == 0)),
            "{ctx}: unflushed block {b} reads neither as written nor as before"
        );
    }
    if grown {
        // 160 KiB of incompressible data at 3 MiB: past the old end, and more than the old
        // data area had free (one such block per 8 KiB extent: 40 extents; 32 in all before).
        let far = fill(rng, Fill::Random, 160 * 1024);
        vol.write(3 << 20, &far, false)
            .unwrap_or_else(|e| panic!("{ctx}: write to the grown part: {e}"));
        vol.flush().expect("flush");
        vol.abandon();
        let again = Arc::new(SimStorage::from_image(disk.crash_image(rng)));
        let vol = reopen(&again);
        reads_back(&vol, &x.flushed);
        let mut back = vec![0u8; far.len()];
        vol.read(3 << 20, &mut back).expect("read");
        assert!(back == far, "{ctx}: flushed writes to the grown part lost");
        let report = vol.check(&|_, _| {});
        assert!(report.is_clean(), "{ctx}: {report:?}");
    } else {
        vol.abandon();
    }
    grown
}

/// Crash images taken at each step of the sweeps below.
const IMAGES_PER_STEP: usize = 24;

/// `Volume::close_grown` (online `zbd grow`: the server closes the volume, grows it, opens it
/// again) with power lost at every storage operation of it, from the first write of the close
/// to the last sync of superblock copy B: every crash image opens, old or grown, with every
/// flushed write, and both outcomes occur. Guards against a grow that loses data the close
/// should have made durable or strands the volume between geometries.
#[test]
fn online_grow_survives_power_loss_at_every_step() {
    let (disk, vol, _) = online_grow_setup();
    let start = disk.ops();
    let grown = vol
        .close_grown(Some(GROWN_SIZE), Some(GROWN_CAPACITY))
        .expect("dry run");
    assert!(vol.is_closed());
    let steps = disk.ops() - start;
    assert!(
        steps >= 4,
        "close and two superblock copies: {steps} operations"
    );
    drop(vol);
    let clean = Arc::new(SimStorage::from_image(disk.current_image()));
    assert_eq!(reopen(&clean).superblock(), &grown);

    let mut rng = SmallRng::seed_from_u64(32);
    let (mut old, mut new) = (0, 0);
    for step in 0..=steps {
        let (disk, vol, expect) = online_grow_setup();
        disk.set_power_loss_at(disk.ops() + step);
        let r = vol.close_grown(Some(GROWN_SIZE), Some(GROWN_CAPACITY));
        assert_eq!(r.is_ok(), step == steps, "step {step}: {r:?}");
        vol.abandon();
        // Several crash images each: the writes pending at the crash (both superblock copies
        // at the last sync) land whole, torn or not at all, by the seed.
        for image in 0..IMAGES_PER_STEP {
            let ctx = format!("power lost at step {step} of {steps}, image {image}");
            let image = disk.crash_image(&mut rng);
            if opens_old_or_grown(image, &expect, r.is_ok(), &mut rng, &ctx) {
                new += 1;
            } else {
                old += 1;
            }
        }
    }
    assert!(old > 0 && new > 0, "{old} crashes opened old, {new} grown");
}

/// The same with a failed sync (the Linux way: the unsynced writes reach the medium whole, torn
/// or not at all, the error is reported once) at each sync of the grow, then a crash: the grow
/// reports the error, and the disk opens old or grown with every flushed write.
#[test]
fn online_grow_with_a_failed_sync_at_any_step_keeps_flushed_data() {
    let (disk, vol, _) = online_grow_setup();
    let (start, syncs_before) = (disk.ops(), disk.syncs());
    vol.close_grown(Some(GROWN_SIZE), Some(GROWN_CAPACITY))
        .expect("dry run");
    let (steps, syncs) = (disk.ops() - start, disk.syncs() - syncs_before);
    drop(vol);
    assert!(syncs >= 3, "checkpoint, copy A, copy B: {syncs} syncs");
    let mut rng = SmallRng::seed_from_u64(33);
    let mut failed = 0;
    let mut last_sync = None;
    for step in 0..steps {
        let (disk, vol, expect) = online_grow_setup();
        let at = disk.ops() + step;
        disk.fail_sync_at(at, step);
        let r = vol.close_grown(Some(GROWN_SIZE), Some(GROWN_CAPACITY));
        assert_eq!(
            disk.sync_failures(),
            1,
            "step {step}: a sync follows every write"
        );
        assert!(r.is_err(), "step {step}: a failed sync must fail the grow");
        vol.abandon();
        // Steps up to the same sync fail the same sync: check each sync once.
        let sync_op = disk.ops();
        if last_sync == Some(sync_op) {
            continue;
        }
        last_sync = Some(sync_op);
        failed += 1;
        for image in 0..IMAGES_PER_STEP {
            let ctx = format!("sync failed at op {at}, image {image}");
            opens_old_or_grown(disk.crash_image(&mut rng), &expect, false, &mut rng, &ctx);
        }
    }
    assert!(failed >= 3, "{failed} different syncs failed");
}

/// A grow `close_grown` refuses (beyond the room, storage too short) writes nothing and leaves
/// the handle open: it still takes writes, and closes as before.
#[test]
fn online_grow_refused_leaves_the_volume_open() {
    let (disk, vol, expect) = online_grow_setup();
    let ops = disk.ops();
    let e = vol
        .close_grown(Some(GROWN_SIZE * 2), None)
        .expect_err("beyond the room");
    assert!(e.to_string().contains("--max-size"), "{e}");
    assert_eq!(disk.ops(), ops, "a refused grow wrote");
    assert!(!vol.is_closed());
    let block = &expect.flushed[..BS];
    vol.write(UNFLUSHED_AT, block, false)
        .expect("still writable");
    vol.close().expect("close");
    drop(vol);
    let vol = reopen(&disk);
    assert_eq!(vol.superblock(), &expect.old);
    let mut buf = vec![0u8; BS];
    vol.read(UNFLUSHED_AT, &mut buf).expect("read");
    assert!(buf == block);
    drop(vol);

    // On storage only as long as the volume (a file not extended yet).
    let opts = online_opts();
    let (short, vol) = sim_volume_v2_map(&opts, open_opts());
    let ops = short.ops();
    let e = vol
        .close_grown(None, Some(GROWN_CAPACITY))
        .expect_err("storage too short");
    assert!(e.to_string().contains("extend it first"), "{e}");
    assert_eq!(short.ops(), ops, "a refused grow wrote");
    assert!(!vol.is_closed());
    vol.close().expect("close");
}
