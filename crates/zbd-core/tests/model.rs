//! Model-based tests: random unaligned reads, writes, zero-writes, trims, flushes and reopens
//! against a plain byte vector. proptest prints the failing operation list; the seeded loop
//! prints its seed.

mod common;

use common::*;
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use zbd_core::{AllocState, Codec, SimStorage, Volume};

const SIZE: u64 = 512 * 1024;

#[derive(Clone, Debug)]
enum MOp {
    Write {
        offset: u64,
        len: u64,
        seed: u64,
        kind: u8,
    },
    Read {
        offset: u64,
        len: u64,
    },
    Zero {
        offset: u64,
        len: u64,
    },
    Trim {
        offset: u64,
        len: u64,
    },
    Flush,
    Reopen,
    /// Flush, then the process dies (no close): reopening must roll the log forward.
    FlushKill,
}

fn range() -> impl Strategy<Value = (u64, u64)> {
    (0..SIZE - 1).prop_flat_map(|o| (Just(o), 1..=(SIZE - o).min(40_000)))
}

fn mop() -> impl Strategy<Value = MOp> {
    prop_oneof![
        6 => (range(), any::<u64>(), 0u8..3).prop_map(|((offset, len), seed, kind)| MOp::Write { offset, len, seed, kind }),
        4 => range().prop_map(|(offset, len)| MOp::Read { offset, len }),
        1 => range().prop_map(|(offset, len)| MOp::Zero { offset, len }),
        1 => range().prop_map(|(offset, len)| MOp::Trim { offset, len }),
        1 => Just(MOp::Flush),
        1 => Just(MOp::Reopen),
        1 => Just(MOp::FlushKill),
    ]
}

fn reopen(disk: &Arc<SimStorage>, vol: Volume) -> Volume {
    vol.close().expect("close");
    drop(vol);
    Volume::open(Box::new(Arc::clone(disk)), open_opts()).expect("reopen")
}

fn flush_kill(disk: &mut Arc<SimStorage>, vol: Volume) -> Volume {
    vol.flush().expect("flush");
    vol.abandon();
    *disk = Arc::new(SimStorage::from_image(disk.current_image()));
    Volume::open(Box::new(Arc::clone(disk)), open_opts()).expect("reopen after kill")
}

fn run(ops: &[MOp], extent: u32, codec: Codec) -> Result<(), TestCaseError> {
    let opts = small_volume(SIZE, extent, codec, 16, 8);
    let (mut disk, mut vol) = sim_volume(&opts);
    let mut model = vec![0u8; SIZE as usize];
    for (i, op) in ops.iter().enumerate() {
        match op {
            MOp::Write {
                offset,
                len,
                seed,
                kind,
            } => {
                let mut rng = SmallRng::seed_from_u64(*seed);
                let k = [Fill::Random, Fill::Text, Fill::Zeros][*kind as usize];
                let data = fill(&mut rng, k, *len as usize);
                vol.write(*offset, &data, false)
                    .map_err(|e| TestCaseError::fail(format!("op {i} write: {e}")))?;
                apply_model(
                    &mut model,
                    &Op::Write {
                        offset: *offset,
                        data,
                        fua: false,
                    },
                );
            }
            MOp::Read { offset, len } => {
                let mut buf = vec![0u8; *len as usize];
                vol.read(*offset, &mut buf)
                    .map_err(|e| TestCaseError::fail(format!("op {i} read: {e}")))?;
                prop_assert!(
                    buf[..] == model[*offset as usize..(*offset + *len) as usize],
                    "op {} read mismatch",
                    i
                );
            }
            MOp::Zero { offset, len } => {
                vol.write_zeroes(*offset, *len)
                    .map_err(|e| TestCaseError::fail(format!("op {i} zero: {e}")))?;
                apply_model(
                    &mut model,
                    &Op::Zero {
                        offset: *offset,
                        len: *len,
                    },
                );
            }
            MOp::Trim { offset, len } => {
                vol.trim(*offset, *len)
                    .map_err(|e| TestCaseError::fail(format!("op {i} trim: {e}")))?;
                apply_model(
                    &mut model,
                    &Op::Trim {
                        offset: *offset,
                        len: *len,
                    },
                );
            }
            MOp::Flush => vol
                .flush()
                .map_err(|e| TestCaseError::fail(format!("op {i} flush: {e}")))?,
            MOp::Reopen => vol = reopen(&disk, vol),
            MOp::FlushKill => vol = flush_kill(&mut disk, vol),
        }
    }
    // Full comparison, allocation report consistency, and the same after a reopen.
    for round in 0..2 {
        let mut all = vec![0u8; SIZE as usize];
        vol.read(0, &mut all)
            .map_err(|e| TestCaseError::fail(format!("final read: {e}")))?;
        prop_assert!(all == model, "final content differs (round {})", round);
        let mut pos = 0u64;
        for (len, state) in vol
            .allocation(0, SIZE)
            .map_err(|e| TestCaseError::fail(e.to_string()))?
        {
            if state != AllocState::Data {
                prop_assert!(
                    model[pos as usize..(pos + len) as usize]
                        .iter()
                        .all(|&b| b == 0),
                    "non-data range holds data"
                );
            }
            pos += len;
        }
        prop_assert_eq!(pos, SIZE);
        let report = vol.check(&|_, _| {});
        prop_assert!(report.is_clean(), "check: {:?}", report);
        vol = reopen(&disk, vol);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn volume_matches_byte_model(ops in proptest::collection::vec(mop(), 1..60), e in 0usize..3, c in 0usize..4) {
        let extent = [8192u32, 16384, 65536][e];
        let codec = [Codec::Lz4, Codec::Zstd(1), Codec::Lzo, Codec::None][c];
        run(&ops, extent, codec)?;
    }
}

/// A longer seeded run; the seed is printed on failure.
#[test]
fn seeded_long_runs() {
    for seed in 0..4u64 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let ops: Vec<MOp> = (0..300)
            .map(|_| {
                let offset = rng.random_range(0..SIZE - 1);
                let len = rng.random_range(1..=(SIZE - offset).min(40_000));
                match rng.random_range(0..15) {
                    0..=5 => MOp::Write {
                        offset,
                        len,
                        seed: rng.random(),
                        kind: rng.random_range(0..3),
                    },
                    6..=9 => MOp::Read { offset, len },
                    10 => MOp::Zero { offset, len },
                    11 => MOp::Trim { offset, len },
                    12 => MOp::Flush,
                    13 => MOp::FlushKill,
                    _ => MOp::Reopen,
                }
            })
            .collect();
        if let Err(e) = run(&ops, 16384, Codec::Lz4) {
            panic!("seeded model run failed, replay with seed {seed}: {e}");
        }
    }
}
