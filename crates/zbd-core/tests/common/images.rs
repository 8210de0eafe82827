//! A crashed volume image and the history of every block on it, for tests that damage or
//! crash the image further and check that reads return only data a block once held.

use super::{fill, sim_volume, small_volume, Fill, BS};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use zbd_core::Codec;

/// Everything each block ever held (zeros included: the initial state).
pub struct History {
    pub held: Vec<Vec<Vec<u8>>>,
}

impl History {
    pub fn new(blocks: usize) -> Self {
        History {
            held: vec![vec![vec![0u8; BS]]; blocks],
        }
    }
    pub fn wrote(&mut self, lba: usize, data: &[u8]) {
        self.held[lba].push(data.to_vec());
    }
    pub fn ever_held(&self, lba: usize, data: &[u8]) -> bool {
        self.held[lba].iter().any(|h| h == data)
    }
}

pub const FUZZ_SIZE: u64 = 512 * 1024;

/// A small volume with checkpointed data, later overwrites only in the log (so recovery has to
/// replay), a trimmed range and a zeroed range. Returns the crash image and the history.
pub fn crashed_volume_image(seed: u64) -> (Vec<u8>, History) {
    let opts = small_volume(FUZZ_SIZE, 8192, Codec::Lz4, 4, 16);
    let (disk, vol) = sim_volume(&opts);
    let blocks = (FUZZ_SIZE / BS as u64) as usize;
    let mut hist = History::new(blocks);
    let mut rng = SmallRng::seed_from_u64(seed);
    for round in 0..2 {
        for lba in (0..blocks).filter(|l| round == 0 || l % 3 == 0) {
            let kind = if rng.random_bool(0.2) {
                Fill::Random
            } else {
                Fill::Text
            };
            let b = fill(&mut rng, kind, BS);
            vol.write((lba * BS) as u64, &b, false).expect("write");
            hist.wrote(lba, &b);
        }
        if round == 0 {
            vol.checkpoint().expect("checkpoint");
        }
    }
    vol.trim(10 * BS as u64, 4 * BS as u64).expect("trim");
    vol.write_zeroes(20 * BS as u64, 4 * BS as u64)
        .expect("zeroes");
    vol.flush().expect("flush");
    vol.abandon();
    (disk.current_image(), hist)
}
