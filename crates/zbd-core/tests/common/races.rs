//! The reader of the race tests: blocks carry a header naming their block and version, and
//! the writers publish which versions they completed and started.
use super::BS;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use zbd_core::Volume;

/// The (block, version) header at the start of a race test block.
pub fn header(buf: &[u8]) -> (u64, u64) {
    (
        u64::from_le_bytes(buf[..8].try_into().expect("8 bytes")),
        u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes")),
    )
}

/// The reader of the race tests: random single-block reads of `blocks` blocks (seeded) until
/// `stop` and at least 2,000 reads, each checked against the writers' bookkeeping: a version
/// between the block's last completed and last started write (and `data_ok` of its bytes), or
/// zeros only if a trim is among those versions.
pub fn spawn_checking_reader(
    vol: Arc<Volume>,
    [started, completed]: [Arc<Vec<AtomicU64>>; 2],
    trims: Arc<Mutex<HashSet<(usize, u64)>>>,
    stop: Arc<AtomicBool>,
    (blocks, seed): (usize, u64),
    data_ok: fn(usize, u64, &[u8]) -> bool,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut buf = vec![0u8; BS];
        let mut reads = 0u64;
        while !stop.load(Ordering::SeqCst) || reads < 2000 {
            let b = rng.random_range(0..blocks);
            let lo = completed[b].load(Ordering::SeqCst);
            vol.read((b * BS) as u64, &mut buf)
                .unwrap_or_else(|e| panic!("block {b}: {e}"));
            let hi = started[b].load(Ordering::SeqCst);
            if buf.iter().all(|&x| x == 0) {
                let t = trims.lock().expect("lock");
                assert!(
                    (lo..=hi).any(|v| t.contains(&(b, v))),
                    "block {b}: zeros, but no trim among versions {lo}..={hi}"
                );
            } else {
                let (id, v) = header(&buf);
                assert!(
                    id == b as u64 && (lo..=hi).contains(&v) && data_ok(b, v, &buf),
                    "block {b}: read ({id}, {v}), expected a version in {lo}..={hi}"
                );
            }
            reads += 1;
        }
    })
}
