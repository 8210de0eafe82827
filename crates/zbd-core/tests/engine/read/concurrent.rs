//! Host reads over a storage that asks for concurrent reads, with compression units, the read
//! cache and streaming reads mixed: every read matches a byte model while writes, partial
//! overwrites of units, trims, flushes, checkpoints and cleaning go on. A block must never come
//! back with another block's bytes, zeros it never held, or older data.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use zbd_core::{Codec, OpenOptions, SimStorage, Storage, Volume};

/// A simulated disk that reads a batch concurrently (like RADOS).
struct Wide(Arc<SimStorage>);

impl Storage for Wide {
    fn len_bytes(&self) -> zbd_core::Result<u64> {
        self.0.len_bytes()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> zbd_core::Result<()> {
        self.0.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> zbd_core::Result<()> {
        self.0.write_at(offset, data)
    }
    fn sync(&self) -> zbd_core::Result<()> {
        self.0.sync()
    }
    fn discard(&self, offset: u64, len: u64) -> zbd_core::Result<()> {
        self.0.discard(offset, len)
    }
    /// Like RADOS: every read of a batch in flight at once.
    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<zbd_core::Result<()>> {
        concurrently(&*self.0, reads)
    }
}

fn run(seed: u64, unit: u32, codec: Codec) {
    const SIZE: u64 = 4 << 20;
    let blocks = SIZE as usize / BS;
    let opts = zbd_core::CreateOptions {
        unit_bytes: Some(unit),
        ..small_volume(SIZE, 64 * 1024, codec, 1, 64)
    };
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let vol = Volume::create_with(
        Box::new(Wide(Arc::clone(&disk))),
        &opts,
        OpenOptions {
            read_cache_bytes: 1 << 20,
            clean_watermarks: Some((60, 70)),
            ..open_opts_sync()
        },
    )
    .expect("create");
    let mut model = vec![0u8; SIZE as usize];
    let mut rng = SmallRng::seed_from_u64(seed);
    for step in 0..1500 {
        let ctx = format!("seed {seed}, unit {unit}, {codec}, step {step}");
        match rng.random_range(0..100) {
            0..=44 => {
                let n = rng.random_range(1..=24usize);
                let b = rng.random_range(0..blocks - n);
                let kind = match rng.random_range(0..10) {
                    0 => Fill::Random,
                    1 => Fill::Zeros,
                    _ => Fill::Text,
                };
                let data = fill(&mut rng, kind, n * BS);
                vol.write((b * BS) as u64, &data, false)
                    .unwrap_or_else(|e| panic!("{ctx}: write: {e}"));
                model[b * BS..(b + n) * BS].copy_from_slice(&data);
            }
            45..=49 => {
                let n = rng.random_range(1..=8usize);
                let b = rng.random_range(0..blocks - n);
                vol.trim((b * BS) as u64, (n * BS) as u64)
                    .unwrap_or_else(|e| panic!("{ctx}: trim: {e}"));
                model[b * BS..(b + n) * BS].fill(0);
            }
            50..=52 => vol.flush().expect("flush"),
            53 => vol.checkpoint().expect("checkpoint"),
            54..=55 => vol.clean().expect("clean"),
            _ => {
                // Small reads fill the cache; 64+ blocks stream past it.
                let n = if rng.random_bool(0.3) {
                    rng.random_range(64..=160usize)
                } else {
                    rng.random_range(1..=12usize)
                };
                let start = rng.random_range(0..(blocks - n) * BS);
                let len = n * BS - rng.random_range(0..BS);
                let mut buf = vec![0u8; len];
                vol.read(start as u64, &mut buf)
                    .unwrap_or_else(|e| panic!("{ctx}: read: {e}"));
                if buf != model[start..start + len] {
                    let at = (0..len).find(|&i| buf[i] != model[start + i]).unwrap_or(0);
                    panic!("{ctx}: read of {len} bytes at {start} differs at byte {at}");
                }
            }
        }
    }
    let s = vol.stats();
    assert!(s.counters.cleaner_runs > 0, "the cleaner never ran: {s:?}");
    vol.close().expect("close");
}

#[test]
fn concurrent_reads_with_units_cache_and_streaming_match_the_model() {
    for seed in 0..4 {
        run(seed, 16 * 1024, Codec::Lz4);
        run(seed, 8 * 1024, Codec::Zstd(1));
    }
}
