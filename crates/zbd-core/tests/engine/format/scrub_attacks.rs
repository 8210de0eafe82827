//! Review 11's attacks on the bit-10 scrub, each of which failed on its first commit (fixed
//! since), and its probes, which held: the scrub reads the device table's pages, rewrites a
//! directory page from memory when both copies are damaged, reports every damaged leaf of
//! several chunks and nothing on an undamaged volume beside checkpoints (also while one
//! creates a pair-state page); two writers at "space short" never get `NoSpace`. (Its fourth
//! finding, writers waiting behind a background pass, hung
//! `cleaner::clean_ahead::a_pass_dropped_by_make_space_does_not_unlist_a_later_pass_victim`.)

use crate::common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use zbd_core::format::{Checkpoint, PairSlot};
use zbd_core::{Codec, CreateOptions, OpenOptions, SimStorage, Volume};

// ---- The bit-10 scrub ----

const MSIZE: u64 = 4 << 20;
/// The space-short probe's volume: 2 MiB on about as much data area.
const SIZE: u64 = 2 << 20;

fn bit10(size: u64, extent: u32, queue: u32) -> CreateOptions {
    CreateOptions {
        metadata_pages: true,
        ..small_volume(size, extent, Codec::Lz4, 3, queue)
    }
}

fn geometry(disk: &SimStorage) -> (Checkpoint, zbd_core::meta::MetaGeometry) {
    let (sb, ck): (_, Checkpoint) = newest_checkpoint(&disk.current_image());
    let ext = ck.extension.clone().expect("bit 10");
    let g = zbd_core::meta::MetaGeometry::from_extension(&ext.header, &sb).expect("geometry");
    (ck, g)
}

/// The device table's list page (and its device-table pages) are metadata pages the open
/// cannot do without, written once and never again while the device rows keep their page ids.
/// The scrub reads only the default tree's pages, the pair-state pages and the directory: a
/// copy 1 of the list page that rots is never reported nor rewritten, and when copy 0 rots
/// later the volume no longer opens.
#[test]
fn check_scrubs_the_device_table_list_page() {
    let (disk, vol) = sim_volume(&bit10(MSIZE, 32768, 16));
    let mut rng = SmallRng::seed_from_u64(6);
    let data = fill(&mut rng, Fill::Text, MSIZE as usize);
    vol.write(0, &data, false).expect("write");
    vol.close().expect("close");
    let sb = vol.superblock().clone();
    drop(vol);
    let (ck, g) = geometry(&disk);
    let list = ck.extension.as_ref().expect("bit 10").header.device_list;
    let damage = |copy: u8| {
        for slot in [PairSlot::A, PairSlot::B] {
            let at = g
                .slot_offset(&sb, list, slot, copy)
                .expect("in the id space");
            disk.flip_bit(at + 300, 2);
        }
    };
    damage(1);
    let vol = reopen(&disk);
    let report = vol.check(&|_, _| {});
    let named = |l: &String| l.contains(&format!("metadata page {list} "));
    let found = report.repaired.iter().any(named) || report.metadata_problems.iter().any(named);
    vol.close().expect("close");
    drop(vol);
    // What the scrub missing it costs: copy 0 rots too, and the volume is gone.
    damage(0);
    let reopened = Volume::open(Box::new(Arc::clone(&disk)), open_opts()).map(|_| ());
    assert!(
        found,
        "the scrub did not report the device-table list page {list} with a damaged copy 1 \
         ({report:?}); after copy 0 rots too, the open says: {reopened:?}"
    );
}

/// A pair-state directory page is resident as decoded entries (never in the page pool), so
/// with both durable copies damaged the scrub can still have it written again from memory,
/// as its doc comment promises ("from the page in memory when neither copy is intact").
/// It asks the pool instead (`TreeMap::resident`), reports the page as lost and queues
/// nothing; the next checkpoints leave the directory where it is and the next open fails.
#[test]
fn check_rewrites_a_directory_page_with_both_copies_damaged_from_memory() {
    let (disk, vol) = sim_volume(&bit10(MSIZE, 16384, 6));
    for op in workload(7, MSIZE, 300) {
        apply_volume(&vol, &op).expect("op");
    }
    let sb = vol.superblock().clone();
    // Idle checkpoints settle the pair-state list (as check_scrubs_the_pair_state_directory_
    // and_rewrites_it does).
    vol.checkpoint().expect("checkpoint");
    vol.checkpoint().expect("checkpoint");
    vol.checkpoint().expect("checkpoint");
    let (ck, g) = geometry(&disk);
    let (id, slot) = *ck
        .extension
        .as_ref()
        .expect("bit 10")
        .directory
        .first()
        .expect("a directory page");
    for copy in 0..2 {
        let at = g.slot_offset(&sb, id, slot, copy).expect("in the id space");
        disk.flip_bit(at + 100, 5);
    }
    let report = vol.check(&|_, _| {});
    vol.checkpoint().expect("checkpoint");
    vol.close().expect("close");
    drop(vol);
    let reopened = Volume::open(Box::new(Arc::clone(&disk)), open_opts()).map(|_| ());
    assert!(
        reopened.is_ok(),
        "the directory page {id} (in memory the whole time) was not written again: the open \
         fails with {reopened:?}; the scrub said {report:?}"
    );
}

/// Probe (held): every leaf of a volume of three scrub chunks with copy 1 damaged is reported.
#[test]
fn probe_scrub_reports_every_leaf_of_several_chunks() {
    let size: u64 = 128 << 20;
    let opts = CreateOptions {
        metadata_pages: true,
        ..small_volume(size, 32768, Codec::Lz4, 1, 16)
    };
    let (disk, vol) = sim_volume(&opts);
    let mut rng = SmallRng::seed_from_u64(9);
    let blocks = size / BS as u64;
    let mut leaves = 0u32;
    for lba in (0..blocks).step_by(255) {
        let d = fill(&mut rng, Fill::Text, BS);
        vol.write(lba * BS as u64, &d, false).expect("write");
        leaves += 1;
    }
    vol.close().expect("close");
    let sb = vol.superblock().clone();
    drop(vol);
    for page in 0..leaves {
        for slot in 0..2 {
            disk.flip_bit(sb.map_page_offset(page, slot, 1) + 700, 3);
        }
    }
    let vol = reopen(&disk);
    let report = vol.check(&|_, _| {});
    let n = report
        .repaired
        .iter()
        .filter(|l| l.contains("MapLeaf") && l.contains("copy 1 is damaged"))
        .count();
    assert_eq!(n as u32, leaves, "{report:?}");
    // The rewrites queued: 64 a phase 1.
    for i in 0..4 {
        vol.checkpoint()
            .unwrap_or_else(|e| panic!("checkpoint {i} after the scrub: {e}"));
    }
    let d = fill(&mut rng, Fill::Text, BS);
    vol.write(0, &d, false).expect("a write after the rewrites");
    vol.close().expect("close");
    drop(vol);
    let vol = reopen(&disk);
    let report = vol.check(&|_, _| {});
    assert!(
        report.is_clean() && report.repaired.is_empty(),
        "{report:?}"
    );
}

/// Probe: a scrub beside writers, trims and checkpoints reports no damaged copy (there is
/// none).
#[test]
fn probe_scrub_beside_checkpoints_reports_nothing() {
    let opts = CreateOptions {
        metadata_pages: true,
        ..small_volume(MSIZE * 4, 16384, Codec::Lz4, 2, 8)
    };
    let (_disk, vol) = sim_volume_with(&opts, open_opts_with(zbd_core::IoOptions::default()));
    let vol = Arc::new(vol);
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (vol, stop) = (Arc::clone(&vol), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(3);
            let blocks = MSIZE * 4 / BS as u64;
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let lba = rng.random_range(0..blocks - 300);
                if i.is_multiple_of(7) {
                    vol.trim(lba * BS as u64, 300 * BS as u64).expect("trim");
                } else {
                    let d = fill(&mut rng, Fill::Text, 4 * BS);
                    vol.write(lba * BS as u64, &d, false).expect("write");
                }
                if i.is_multiple_of(5) {
                    vol.checkpoint().expect("checkpoint");
                }
                i += 1;
            }
        })
    };
    let mut bad = Vec::new();
    let until = std::time::Instant::now() + Duration::from_secs(8);
    let mut scrubs = 0;
    while std::time::Instant::now() < until {
        scrubs += 1;
        let r = vol.scrub(None, &|_, _| {});
        bad.extend(r.repaired.iter().cloned());
        bad.extend(r.metadata_problems.iter().cloned());
    }
    stop.store(true, Ordering::SeqCst);
    worker.join().expect("worker");
    eprintln!(
        "{scrubs} scrubs, {} checkpoints",
        vol.stats().counters.checkpoints
    );
    assert!(bad.is_empty(), "{bad:?}");
}

/// Probe: two writers overwriting runs of a tight bit-10 area at three quarters live, the
/// background cleaner on: no write fails, everything reads back.
#[test]
fn probe_two_writers_at_space_short_never_get_no_space() {
    for background in [false, true] {
        let o = small_volume(SIZE, 32 * 1024, Codec::Lz4, 1, 32);
        let o = with_metadata_pages(&o);
        let open = OpenOptions {
            background_cleaner: background,
            ..open_opts_with(zbd_core::IoOptions::default())
        };
        let (disk, vol) = sim_volume_v2_map(&o, open);
        let vol = Arc::new(vol);
        let live = (SIZE / BS as u64) * 3 / 4;
        let mut rng = SmallRng::seed_from_u64(11);
        let fillv = fill(&mut rng, Fill::Random, (live * BS as u64) as usize);
        vol.write(0, &fillv, false).expect("fill");
        let model = Arc::new(Mutex::new(fillv));
        let half = live / 2;
        let threads: Vec<_> = (0..2u64)
            .map(|t| {
                let (vol, model) = (Arc::clone(&vol), Arc::clone(&model));
                std::thread::spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(100 + t);
                    for i in 0..100 {
                        let n = 64u64;
                        let first = t * half + rng.random_range(0..half - n);
                        let data = fill(&mut rng, Fill::Random, (n * BS as u64) as usize);
                        vol.write(first * BS as u64, &data, false)
                            .unwrap_or_else(|e| panic!("writer {t} write {i}: {e}"));
                        let at = (first * BS as u64) as usize;
                        model.lock().expect("model")[at..at + data.len()].copy_from_slice(&data);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("writer");
        }
        vol.flush().expect("flush");
        let model = model.lock().expect("model").clone();
        let mut got = vec![0u8; model.len()];
        vol.read(0, &mut got).expect("read");
        assert!(got == model, "live differs (background {background})");
        eprintln!("{:?}", vol.stats().space_short_rounds);
        let vol = Arc::try_unwrap(vol).ok().expect("one handle");
        vol.abandon();
        let vol = reopen(&disk);
        vol.read(0, &mut got).expect("read");
        assert!(
            got == model,
            "after a crash differs (background {background})"
        );
    }
}

/// A pair-state page a fold creates (its directory entry names slot B until the commit, so
/// that its first write takes slot A) is listed by the scrub with that placeholder slot while
/// the checkpoint that writes it is in flight: a scrub then reads two copies that were never
/// written and reports the page as damaged ("both copies are damaged, the copy in memory is
/// intact") on a volume with no damage at all (`MetaStore::own_pages_copies` leaves out
/// nothing a checkpoint in flight writes, whatever its doc says). On a small volume every
/// pair-state page exists from the create on; a volume of a little more than 16,320 region-0
/// leaves has its carved ids in pair-state page 1 and makes page 0 at its first leaf.
#[test]
fn a_scrub_beside_a_checkpoint_creating_a_pair_state_page_reports_no_damage() {
    let leaves: u64 = 16_320 + 8;
    let size = leaves * 255 * BS as u64;
    // A small data area (its stock capped at half of it): a small pair-state list, folded
    // whole at every phase 1.
    let opts = CreateOptions {
        metadata_pages: true,
        capacity_bytes: Some(64 << 20),
        ..small_volume(size, 32768, Codec::Lz4, 1, 16)
    };
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let (park, parked, release) = Parking::new(Arc::clone(&disk));
    let vol = Arc::new(
        Volume::create_with(Box::new(Arc::clone(&park)), &opts, open_opts_sync()).expect("create"),
    );
    let mut rng = SmallRng::seed_from_u64(12);
    // The carved ids start at `pairs0` (past 16,320): pair-state page 1 holds theirs from the
    // start, page 0 is made by the first fold of a leaf below 16,320. The first leaf written:
    // its fixed id's pair state is listed at the next commit and folded (into a new pair-state
    // page 0) by the phase 1 after it.
    let lba = 0;
    vol.write(lba * BS as u64, &fill(&mut rng, Fill::Text, BS), false)
        .expect("write");
    // Each of the next checkpoints parks in its phase 2 while a scrub runs: the one whose
    // phase 1 folded the leaf's pair state into the new page is among them.
    let mut report = zbd_core::CheckReport::default();
    for _ in 0..3 {
        park.arm(Trap::Sync(1));
        let ck = {
            let vol = Arc::clone(&vol);
            std::thread::spawn(move || vol.checkpoint())
        };
        parked.recv().expect("the checkpoint parked in its phase 2");
        let r = vol.check(&|_, _| {});
        release.send(()).expect("release");
        ck.join().expect("checkpoint thread").expect("checkpoint");
        report.repaired.extend(r.repaired);
        report.metadata_problems.extend(r.metadata_problems);
    }
    assert!(
        report.repaired.is_empty() && report.metadata_problems.is_empty(),
        "a scrub beside a checkpoint reported damage on an undamaged volume: {report:?}"
    );
}
