//! The extent buffer's `State::room` (kept beside the open extents, scanned by best fit, LRU
//! eviction and aging). A dev-profile `debug_assert` in `State::place` compares it with the open
//! extents on every block placed; these workloads change open extents in every way there is
//! (blocks of many stored sizes, unit and single-block writes, zero and trim records and their
//! extension, flushes, checkpoints asked for by a short allocation queue, inline cleaning on a
//! nearly full data area, compaction, aging, reopen and crash) on small extents with many of
//! them open, on format v2 and on the committed v1 fixture, against a byte model.

use crate::common::*;
use flate2::read::GzDecoder;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;
use zbd_core::{Codec, CreateOptions, OpenOptions, SimStorage, Volume};

/// Data whose stored size is anywhere from a few bytes to a whole block: `random` bytes of
/// noise at the start of each block, then text or zeros.
pub(crate) fn mixed(rng: &mut SmallRng, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        let random = rng.random_range(0..=BS);
        let mut b = fill(rng, Fill::Random, random);
        let rest = if rng.random_bool(0.5) {
            fill(rng, Fill::Text, BS - random)
        } else {
            vec![0; BS - random]
        };
        b.extend(rest);
        v.extend(b);
    }
    v.truncate(len);
    v
}

struct Run {
    disk: Arc<SimStorage>,
    vol: Option<Volume>,
    model: Vec<u8>,
    open: OpenOptions,
    rng: SmallRng,
    /// Most extents seen open at once after a write.
    peak_open: u64,
}

impl Run {
    fn vol(&self) -> &Volume {
        self.vol.as_ref().expect("open")
    }

    fn check_range(&self, offset: u64, len: u64, what: &str) {
        let mut b = vec![0u8; len as usize];
        self.vol()
            .read(offset, &mut b)
            .unwrap_or_else(|e| panic!("{what}: read {len} at {offset}: {e}"));
        let want = &self.model[offset as usize..(offset + len) as usize];
        if b != want {
            let at = b.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
            panic!("{what}: {len} bytes at {offset} differ from byte {at}");
        }
    }

    fn check_all(&self, what: &str) {
        self.check_range(0, self.model.len() as u64, what);
    }

    fn range(&mut self) -> (u64, u64) {
        let size = self.model.len() as u64;
        let aligned = self.rng.random_bool(0.8);
        let max = if self.rng.random_bool(0.1) {
            96 << 10
        } else {
            20 << 10
        };
        let mut offset = self.rng.random_range(0..size - 1);
        let mut len = self.rng.random_range(1..=max.min(size - offset));
        if aligned {
            offset -= offset % BS as u64;
            len = len.div_ceil(BS as u64) * BS as u64;
            len = len.min(size - offset);
        }
        (offset, len)
    }

    fn reopen(&mut self, crash: bool) {
        let vol = self.vol.take().expect("open");
        let image = if crash {
            // Everything acknowledged was flushed just before: nothing may be lost.
            vol.flush().expect("flush before the crash");
            vol.abandon();
            self.disk.crash_image(&mut self.rng)
        } else {
            vol.close().expect("close");
            drop(vol);
            self.disk.current_image()
        };
        self.disk = Arc::new(SimStorage::from_image(image));
        self.vol = Some(
            Volume::open(Box::new(Arc::clone(&self.disk)), self.open.clone()).expect("reopen"),
        );
    }

    /// `steps` random operations, the volume compared with the model as it goes.
    fn steps(&mut self, steps: usize, label: &str) {
        let mut zero_run: Option<u64> = None;
        for step in 0..steps {
            let what = format!("{label} step {step}");
            let size = self.model.len() as u64;
            match self.rng.random_range(0..100) {
                0..=49 => {
                    let (offset, len) = self.range();
                    let data = match self.rng.random_range(0..4) {
                        0 => fill(&mut self.rng, Fill::Random, len as usize),
                        1 => fill(&mut self.rng, Fill::Text, len as usize),
                        _ => mixed(&mut self.rng, len as usize),
                    };
                    let fua = self.rng.random_bool(0.05);
                    self.vol()
                        .write(offset, &data, fua)
                        .unwrap_or_else(|e| panic!("{what}: write {len} at {offset}: {e}"));
                    self.model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
                    self.peak_open = self.peak_open.max(self.vol().stats().extents_open);
                }
                50..=57 => {
                    // Block after block, so that each extends the record before it (until
                    // a write in between).
                    let lba = match zero_run {
                        Some(l) if l + 2 < size / BS as u64 => l,
                        _ => self.rng.random_range(0..size / BS as u64 - 2),
                    };
                    let n = self.rng.random_range(1..=2);
                    self.vol()
                        .write_zeroes(lba * BS as u64, n * BS as u64)
                        .unwrap_or_else(|e| panic!("{what}: zero: {e}"));
                    self.model[lba as usize * BS..(lba + n) as usize * BS].fill(0);
                    zero_run = Some(lba + n);
                }
                58..=65 => {
                    let (offset, len) = self.range();
                    let trim = self.rng.random_bool(0.5);
                    if trim {
                        self.vol().trim(offset, len)
                    } else {
                        self.vol().write_zeroes(offset, len)
                    }
                    .unwrap_or_else(|e| panic!("{what}: trim/zero {len} at {offset}: {e}"));
                    self.model[offset as usize..(offset + len) as usize].fill(0);
                }
                66..=79 => {
                    let (offset, len) = self.range();
                    self.check_range(offset, len, &what);
                }
                80..=87 => self.vol().flush().expect("flush"),
                88..=92 => self.vol().checkpoint().expect("checkpoint"),
                93 => {
                    self.vol().compact(&|_, _| {}).expect("compact");
                }
                94..=95 => self.reopen(false),
                96..=97 => self.reopen(true),
                _ => self.check_all(&what),
            }
        }
        self.check_all(label);
        let report = self.vol().check(&|_, _| {});
        assert!(report.is_clean(), "{label}: {report:?}");
        let c = self.vol().stats().counters;
        eprintln!(
            "{label}: peak open {}, checkpoints {}, cleaner runs {}, reclaimed {}",
            self.peak_open, c.checkpoints, c.cleaner_runs, c.extents_reclaimed
        );
        self.reopen(true);
        self.check_all(&format!("{label} after the last crash"));
    }
}

fn fresh(opts: &CreateOptions, open: OpenOptions, seed: u64) -> Run {
    let (disk, vol) = sim_volume_with(opts, open.clone());
    Run {
        disk,
        vol: Some(vol),
        model: vec![0; opts.logical_bytes as usize],
        open,
        rng: SmallRng::seed_from_u64(seed),
        peak_open: 0,
    }
}

/// 8 KiB extents, a buffer of up to 16 of them, a data area that leaves the cleaner room.
#[test]
fn many_small_open_extents() {
    for seed in 0..3 {
        let opts = CreateOptions {
            unit_bytes: Some([4096, 8192][seed as usize % 2]),
            ..small_volume(1 << 20, 8192, Codec::Lz4, 4, 64)
        };
        let open = OpenOptions {
            buffer_bytes: 16 * 8192,
            ..open_opts()
        };
        let mut run = fresh(&opts, open, seed);
        assert!(
            run.vol().stats().extents_open <= 16,
            "buffer larger than asked"
        );
        run.steps(1500, &format!("many open, seed {seed}"));
        assert!(run.peak_open >= 8, "few extents open: {}", run.peak_open);
    }
}

/// A data area barely larger than the volume: writes clean inline (under the state lock, from
/// inside `place`) and checkpoints come from a queue of 8 extents.
#[test]
fn tight_area_cleans_while_placing() {
    for seed in 10..13 {
        let opts = CreateOptions {
            capacity_bytes: Some((1 << 20) * 5 / 4),
            unit_bytes: Some(4096),
            ..small_volume(1 << 20, 8192, Codec::Zstd(1), 1, 8)
        };
        let open = OpenOptions {
            buffer_bytes: 8 * 8192,
            ..open_opts_sync()
        };
        let mut run = fresh(&opts, open, seed);
        run.steps(1500, &format!("tight, seed {seed}"));
        assert!(
            run.vol().stats().counters.cleaner_runs > 0,
            "the cleaner never ran"
        );
    }
}

/// Every extent is past its aging timeout at the next write: `age` closes them all, from
/// `room`, every time.
#[test]
fn aging_closes_from_room() {
    let opts = CreateOptions {
        unit_bytes: Some(4096),
        ..small_volume(512 << 10, 8192, Codec::Lz4, 3, 32)
    };
    let open = OpenOptions {
        aging: Duration::ZERO,
        buffer_bytes: 8 * 8192,
        ..open_opts()
    };
    fresh(&opts, open, 20).steps(800, "aging 0");
}

/// The committed version-1 volume (8 KiB extents, one-sector minimum segments) written the
/// same way.
#[test]
fn v1_fixture_under_the_same_workload() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/v1-small.zbd.gz"
    );
    let mut gz = Vec::new();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut gz))
        .expect("fixture");
    let mut img = Vec::new();
    GzDecoder::new(&gz[..])
        .read_to_end(&mut img)
        .expect("gunzip");
    for seed in 30..33 {
        let disk = Arc::new(SimStorage::from_image(img.clone()));
        let open = OpenOptions {
            buffer_bytes: 16 * 8192,
            ..open_opts()
        };
        let vol = Volume::open(Box::new(Arc::clone(&disk)), open.clone()).expect("open v1");
        assert_eq!(vol.stats().format_version, 1);
        let mut model = vec![0u8; vol.size_bytes() as usize];
        vol.read(0, &mut model).expect("read the fixture");
        let mut run = Run {
            disk,
            vol: Some(vol),
            model,
            open,
            rng: SmallRng::seed_from_u64(seed),
            peak_open: 0,
        };
        run.steps(1200, &format!("v1, seed {seed}"));
        assert_eq!(run.vol().stats().format_version, 1);
    }
}
