//! Adversarial storage-correctness tests (review): damaged metadata must stay reported across
//! rewrites, crashes inside recovery itself, request edge cases, and damaged or truncated volume
//! files that must give errors, never panics. Seeds are printed; rerun with the same seed.

mod common;

use common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use zbd_core::format::{Superblock, MAP_PAGE_BYTES, SUPERBLOCK_BYTES};
use zbd_core::{Codec, Error, OpenOptions, SimStorage, Volume};

fn read_block(vol: &Volume, lba: u64) -> zbd_core::Result<Vec<u8>> {
    let mut b = vec![0u8; BS];
    vol.read(lba * BS as u64, &mut b)?;
    Ok(b)
}

fn reopen(disk: &Arc<SimStorage>) -> Volume {
    Volume::open(Box::new(Arc::clone(disk)), open_opts()).expect("reopen")
}

/// A damaged map page makes its blocks unreadable (Corrupt). Writing one block of that page
/// dirties it; the checkpoint then rewrites the page. The blocks whose location was lost must
/// stay Corrupt after a reopen, not silently turn into holes that read as zeros.
#[test]
fn damaged_map_page_stays_damaged_after_the_page_is_rewritten() {
    let opts = small_volume(1 << 20, 32768, Codec::Lz4, 4, 16);
    let (disk, vol) = sim_volume(&opts);
    let mut rng = SmallRng::seed_from_u64(41);
    let data = fill(&mut rng, Fill::Text, 1 << 20);
    vol.write(0, &data, false).expect("write");
    vol.close().expect("close");
    let sb = vol.superblock().clone();
    drop(vol);
    disk.flip_bit(sb.map_offset + 200, 1);
    disk.flip_bit(sb.map_offset + MAP_PAGE_BYTES as u64 + 200, 1);
    let vol = reopen(&disk);
    assert!(matches!(read_block(&vol, 3), Err(Error::Corrupt { lba: 3 })));
    // A new write into the damaged page, then a checkpoint that rewrites the page.
    let fresh = fill(&mut rng, Fill::Text, BS);
    vol.write(5 * BS as u64, &fresh, false).expect("write into damaged page");
    vol.close().expect("close");
    drop(vol);
    let vol = reopen(&disk);
    assert_eq!(read_block(&vol, 5).expect("rewritten block"), fresh);
    match read_block(&vol, 3) {
        Err(Error::Corrupt { lba: 3 }) => {}
        Ok(b) => panic!(
            "block 3 lost its location with the damaged page but now reads {} (zeros: {})",
            if b == data[3 * BS..4 * BS] { "its old data" } else { "other data" },
            b.iter().all(|&x| x == 0)
        ),
        Err(e) => panic!("block 3: unexpected error {e}"),
    }
    let report = vol.check(&|_, _| {});
    assert!(report.damaged_blocks.contains(&3), "{report:?}");
    assert!(!report.damaged_blocks.contains(&5), "{report:?}");
    // Overwriting or trimming a damaged block repairs it.
    vol.write(3 * BS as u64, &fresh, false).expect("overwrite");
    vol.trim(4 * BS as u64, BS as u64).expect("trim");
    vol.close().expect("close");
    drop(vol);
    let vol = reopen(&disk);
    assert_eq!(read_block(&vol, 3).expect("repaired"), fresh);
    assert_eq!(read_block(&vol, 4).expect("trimmed"), vec![0u8; BS]);
    assert!(matches!(read_block(&vol, 6), Err(Error::Corrupt { lba: 6 })));
}
