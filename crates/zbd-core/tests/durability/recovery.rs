//! Recovery itself: a power cut at any storage operation of recovery (its map pages, checkpoint
//! and syncs), with any subset of those writes surviving torn, loses nothing flushed, and a
//! later open after a clean recovery finds everything too.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::Arc;
use zbd_core::{SimStorage, Volume};

/// Power fails at every storage operation of recovery itself (its map pages, checkpoint and
/// syncs), with any subset of those writes surviving torn: the next open still finds every
/// flushed block, and so does a third open after a clean recovery.
#[test]
fn crash_inside_recovery_checkpoint_loses_nothing_flushed() {
    let (image, hist) = crashed_volume_image(11);
    let expected: Vec<Vec<u8>> = hist
        .held
        .iter()
        .enumerate()
        .map(|(lba, h)| {
            if (10..14).contains(&lba) || (20..24).contains(&lba) {
                vec![0u8; BS]
            } else {
                h.last().expect("history").clone()
            }
        })
        .collect();
    let verify = |vol: &Volume, ctx: &str| {
        let mut b = vec![0u8; BS];
        for (lba, want) in expected.iter().enumerate() {
            vol.read((lba * BS) as u64, &mut b)
                .unwrap_or_else(|e| panic!("{ctx}: block {lba}: {e}"));
            assert!(&b == want, "{ctx}: block {lba} differs");
        }
    };
    let mut point = 0u64;
    loop {
        let disk = Arc::new(SimStorage::from_image(image.clone()));
        disk.set_power_loss_at(point);
        let ctx = format!("power lost at recovery op {point}");
        match Volume::open(Box::new(Arc::clone(&disk)), open_opts()) {
            Ok(vol) => {
                verify(&vol, &ctx);
                vol.abandon();
                break;
            }
            Err(_) => {
                let mut rng = SmallRng::seed_from_u64(point);
                let img = disk.crash_image(&mut rng);
                let disk2 = Arc::new(SimStorage::from_image(img));
                let vol = reopen(&disk2);
                verify(&vol, &ctx);
                // Reopen twice more without writes: replay must be idempotent.
                vol.close().expect("close");
                drop(vol);
                let vol = reopen(&disk2);
                vol.close().expect("close");
                drop(vol);
                verify(&reopen(&disk2), &format!("{ctx}, third open"));
            }
        }
        point += 1;
        assert!(point < 1000, "recovery never completed");
    }
    eprintln!("recovery crashed at {point} storage operations, each verified");
    assert!(point > 3, "recovery took only {point} storage operations");
}
