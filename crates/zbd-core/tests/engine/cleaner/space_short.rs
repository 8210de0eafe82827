//! "Space short" (docs/design.md, "Room first, sequence last"): on a volume whose map is a page
//! tree (bit 10), placement never cleans under the state lock. A write that needs an extent at
//! the host floor lets the lock go, cleans (waiting for the pass in flight first) and places
//! again; it gets `NoSpace` only when cleaning gains nothing. Records without payload (trims)
//! skip it. v2 volumes keep cleaning under the lock (`make_space`) where cleaning ahead fell
//! behind: the same workload shows that it reaches that point.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use zbd_core::{Codec, CreateOptions, Error, Volume};

/// 2 MiB logical on about as much data area, 32 KiB extents: raw overwrites need the cleaner
/// within a few writes.
const SIZE: u64 = 2 << 20;
const BLOCKS: u64 = SIZE / BS as u64;
/// Blocks holding live data before the overwrites: three quarters.
const LIVE: u64 = BLOCKS * 3 / 4;
/// Each overwrite: 256 KiB (8 extents of raw blocks), more than cleaning ahead keeps free
/// (twice the cleaner's reserve of 4), so placement meets the floor inside one write.
const RUN: u64 = 64;

fn tight(bit10: bool) -> CreateOptions {
    let o = small_volume(SIZE, 32 * 1024, Codec::Lz4, 1, 32);
    if bit10 {
        with_metadata_pages(&o)
    } else {
        o
    }
}

/// Fills `LIVE` blocks with random data, then overwrites random runs of them for `rounds`;
/// checks every block against the model live and after a reopen. Returns the volume's stats
/// before the reopen.
fn overwrite_runs(bit10: bool, rounds: usize) -> zbd_core::Stats {
    let (disk, vol) = sim_volume_v2_map(&tight(bit10), open_opts());
    let mut rng = SmallRng::seed_from_u64(11);
    let mut model = fill(&mut rng, Fill::Random, (LIVE * BS as u64) as usize);
    vol.write(0, &model, false).expect("fill");
    for _ in 0..rounds {
        let first = rng.random_range(0..LIVE - RUN);
        let data = fill(&mut rng, Fill::Random, (RUN * BS as u64) as usize);
        let at = (first * BS as u64) as usize;
        vol.write(at as u64, &data, false).expect("overwrite");
        model[at..at + data.len()].copy_from_slice(&data);
    }
    vol.flush().expect("flush");
    let check = |vol: &Volume, ctx: &str| {
        let mut got = vec![0u8; model.len()];
        vol.read(0, &mut got).expect("read");
        assert!(got == model, "{ctx}: the volume differs from the model");
    };
    check(&vol, "live");
    let stats = vol.stats();
    vol.abandon();
    let vol = reopen(&disk);
    check(&vol, "after a crash");
    let report = vol.check(&|_, _| {});
    assert!(report.is_clean(), "{report:?}");
    stats
}

/// The workload reaches the host floor inside writes: v2 cleans there under the lock.
#[test]
fn v2_cleans_under_the_lock_where_cleaning_ahead_falls_behind() {
    let s = overwrite_runs(false, 40);
    assert!(s.locked_cleanings > 0, "{s:?}");
    assert_eq!(s.space_short_rounds, 0);
}

/// The same workload on bit 10: every write succeeds and reads back, no cleaning under the
/// lock, and writers found space short and cleaned outside it.
#[test]
fn bit10_never_cleans_under_the_lock_and_writes_wait_for_their_round() {
    let s = overwrite_runs(true, 40);
    assert_eq!(s.locked_cleanings, 0, "cleaned under the state lock");
    assert!(s.space_short_rounds > 0, "never met space short: {s:?}");
    assert!(s.counters.extents_reclaimed > 0);
}

/// Live data beyond the area on bit 10: a write fails with `NoSpace` (its round gains
/// nothing), not a hang, and everything written before reads back. A trim there (a record
/// without payload, which skips "space short") succeeds, and the space it frees takes writes.
#[test]
fn bit10_full_area_fails_writes_with_no_space_and_trims_still_free_it() {
    let (disk, vol) = sim_volume_v2_map(&tight(true), open_opts());
    let mut rng = SmallRng::seed_from_u64(12);
    let mut written: Vec<Vec<u8>> = Vec::new();
    let err = loop {
        let lba = written.len() as u64;
        assert!(
            lba < BLOCKS,
            "the whole logical size fit: nothing ran short"
        );
        let b = fill(&mut rng, Fill::Random, BS);
        match vol.write(lba * BS as u64, &b, false) {
            Ok(()) => written.push(b),
            Err(e) => break e,
        }
    };
    assert!(matches!(err, Error::NoSpace), "{err}");
    assert!(vol.stats().space_short_rounds > 0);
    assert_eq!(vol.stats().locked_cleanings, 0);
    // Half of what was written goes away; the writes that failed now fit.
    let half = written.len() as u64 / 2;
    vol.trim(0, half * BS as u64).expect("trim at the floor");
    let again = fill(&mut rng, Fill::Random, BS);
    let lba = written.len() as u64;
    vol.write(lba * BS as u64, &again, false)
        .expect("a write after the trim");
    vol.flush().expect("flush");
    vol.abandon();
    let vol = reopen(&disk);
    let mut back = vec![0u8; BS];
    for (l, b) in written.iter().enumerate().skip(half as usize) {
        vol.read(l as u64 * BS as u64, &mut back).expect("read");
        assert!(back == *b, "block {l} lost after NoSpace");
    }
    vol.read(0, &mut back).expect("read a trimmed block");
    assert!(back.iter().all(|&x| x == 0), "a trimmed block reads data");
    vol.read(lba * BS as u64, &mut back).expect("read");
    assert!(back == again, "the write after the trim did not read back");
}
