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
