//! Retiring trained dictionaries (dicts.rs, "Retirement order"): a dictionary no live block
//! names is dropped by a checkpoint and its id and region bytes are reused only after a later
//! one; a crash at any storage operation around that leaves every block reading back what was
//! written (flushed blocks exactly), never an error and never another dictionary's data. And
//! `zbd check` notices a per-dictionary count that disagrees with the map.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::Arc;
use zbd_core::format::CKPT_FLAG_DICT_COUNTS;
use zbd_core::{Codec, CreateOptions, OpenOptions, SimStorage, Volume};

/// 8 MiB: the dictionary region holds two dictionaries, so every retrain after the first
/// needs a retired one's room.
const SIZE: u64 = 8 << 20;
/// Blocks the scenario writes (1 MiB).
const BLOCKS: usize = 256;

fn create() -> CreateOptions {
    CreateOptions {
        unit_bytes: Some(4096),
        ..small_volume(SIZE, 16384, Codec::Lz4, 2, 8)
    }
}

fn opts() -> OpenOptions {
    OpenOptions {
        dictionary: Some(true),
        ..open_opts()
    }
}

#[derive(Clone, Copy, Debug)]
enum Step {
    /// Log-like records (a dictionary pays on them) over blocks `from..to`.
    Write {
        from: usize,
        to: usize,
        seed: u64,
    },
    Flush,
    Checkpoint,
    /// A forced retrain: `true` when the probe run must see it install a dictionary.
    Retrain {
        seed: u64,
        must: bool,
    },
    Compact,
}

fn steps() -> Vec<Step> {
    use Step::*;
    let all = |seed| Write {
        from: 0,
        to: BLOCKS,
        seed,
    };
    vec![
        all(1),
        Flush,
        Retrain {
            seed: 100,
            must: false,
        },
        all(2),
        Flush,
        // The older dictionary has no live block left: retired, then freed.
        Checkpoint,
        Checkpoint,
        Retrain {
            seed: 101,
            must: true,
        },
        Write {
            from: 0,
            to: BLOCKS / 2,
            seed: 3,
        },
        Write {
            from: BLOCKS / 2,
            to: BLOCKS,
            seed: 4,
        },
        Flush,
        Compact,
        Checkpoint,
        Checkpoint,
        Retrain {
            seed: 102,
            must: true,
        },
        Write {
            from: BLOCKS / 4,
            to: BLOCKS,
            seed: 5,
        },
        Flush,
        // Blocks 0..BLOCKS/4 still name the previous dictionary: the cleaner moves them to the
        // current one, then it can go.
        Compact,
        Checkpoint,
        Checkpoint,
        Retrain {
            seed: 103,
            must: true,
        },
        Write {
            from: 0,
            to: 64,
            seed: 6,
        },
    ]
}

/// What each block may read as after a crash: its value at the last flush, or any written
/// since.
struct Model {
    flushed: Vec<Vec<u8>>,
    since: Vec<Vec<Vec<u8>>>,
}

impl Model {
    fn new() -> Model {
        Model {
            flushed: vec![vec![0u8; BS]; BLOCKS],
            since: vec![Vec::new(); BLOCKS],
        }
    }

    fn durable(&mut self) {
        for (f, s) in self.flushed.iter_mut().zip(self.since.iter_mut()) {
            if let Some(last) = s.pop() {
                *f = last;
            }
            s.clear();
        }
    }
}

/// Runs the steps until one fails (the power loss); returns how many retrains installed.
fn run(vol: &Volume, model: &mut Model) -> Result<Vec<bool>, String> {
    let mut installed = Vec::new();
    for step in steps() {
        match step {
            Step::Write { from, to, seed } => {
                let data = log_records(seed, BLOCKS * BS);
                for lba in from..to {
                    model.since[lba].push(data[lba * BS..(lba + 1) * BS].to_vec());
                }
                vol.write((from * BS) as u64, &data[from * BS..to * BS], false)
                    .map_err(|e| format!("write: {e}"))?;
            }
            Step::Flush => {
                vol.flush().map_err(|e| format!("flush: {e}"))?;
                model.durable();
            }
            Step::Checkpoint => {
                vol.checkpoint().map_err(|e| format!("checkpoint: {e}"))?;
                model.durable();
            }
            Step::Retrain { seed, .. } => {
                let samples = log_records(seed, 256 << 10)
                    .chunks(BS)
                    .map(<[u8]>::to_vec)
                    .collect();
                let now = vol
                    .retrain_dictionary(samples)
                    .map_err(|e| format!("retrain: {e}"))?;
                // A failed install does not fail the caller: the volume stops instead.
                vol.flush().map_err(|e| format!("after retrain: {e}"))?;
                installed.push(now == zbd_core::Retrained::Installed);
            }
            Step::Compact => {
                vol.compact(&|_, _| {})
                    .map_err(|e| format!("compact: {e}"))?;
            }
        }
    }
    Ok(installed)
}

fn verify(vol: &Volume, model: &Model, at: u64) {
    for lba in 0..BLOCKS {
        let got = read_block(vol, lba as u64)
            .unwrap_or_else(|e| panic!("crash at {at}: block {lba}: {e}"));
        assert!(
            got == model.flushed[lba] || model.since[lba].contains(&got),
            "crash at {at}: block {lba} reads neither its flushed value nor a later one"
        );
    }
}

fn crash_run(at: u64, seed: u64) {
    let (disk, vol) = sim_volume_with(&create(), opts());
    disk.set_power_loss_at(disk.ops() + at);
    let mut model = Model::new();
    let _ = run(&vol, &mut model);
    let image = disk.crash_image(&mut SmallRng::seed_from_u64(seed));
    vol.abandon();
    let disk = Arc::new(SimStorage::from_image(image));
    let vol = Volume::open(Box::new(Arc::clone(&disk)), opts())
        .unwrap_or_else(|e| panic!("crash at {at}: open: {e}"));
    verify(&vol, &model, at);
    // The recovered volume retires and reuses room too: everything stays readable.
    let data = log_records(seed + 50, BLOCKS * BS);
    vol.write(0, &data, false).expect("write after recovery");
    vol.flush().expect("flush");
    for _ in 0..2 {
        vol.checkpoint().expect("checkpoint");
    }
    let samples = log_records(seed + 60, 256 << 10)
        .chunks(BS)
        .map(<[u8]>::to_vec)
        .collect();
    vol.retrain_dictionary(samples).expect("retrain");
    let more = log_records(seed + 70, BLOCKS / 2 * BS);
    vol.write(0, &more, false).expect("write");
    vol.close().expect("close");
    drop(vol);
    let vol = Volume::open(Box::new(Arc::clone(&disk)), opts()).expect("reopen");
    let mut b = vec![0u8; BLOCKS * BS];
    vol.read(0, &mut b).expect("read");
    assert!(b[..more.len()] == more[..], "crash at {at}: written after");
    assert!(
        b[more.len()..] == data[more.len()..],
        "crash at {at}: written after"
    );
    let report = vol.check(&|_, _| {});
    assert!(report.is_clean(), "crash at {at}: check: {report:?}");
}

#[test]
fn crash_at_every_storage_operation_around_retirement() {
    // Probe: where each step's storage operations lie, and that the retrains after the first
    // really needed (and got) a retired dictionary's room.
    let (disk, vol) = sim_volume_with(&create(), opts());
    let base = disk.ops();
    let mut model = Model::new();
    let installed = run(&vol, &mut model).expect("probe run");
    let total = disk.ops() - base;
    let must: Vec<bool> = steps()
        .iter()
        .filter_map(|s| match s {
            Step::Retrain { must, .. } => Some(*must),
            _ => None,
        })
        .collect();
    for (i, (&got, &must)) in installed.iter().zip(&must).enumerate() {
        assert!(got || !must, "retrain {i} installed nothing: {installed:?}");
    }
    let ids: Vec<u16> = vol.stats().dictionaries.iter().map(|d| d.id).collect();
    assert!(ids.len() <= 2, "the region holds two: {ids:?}");
    verify(&vol, &model, u64::MAX);
    drop(vol);
    // Every operation (the scenario is mostly retirement, reuse and migration), bounded: 600
    // crash points under make test-heavy, 200 spread the same way under make test.
    let step = (total / full_or_light(600, 200)).max(1);
    for (n, at) in (0..total).step_by(step as usize).enumerate() {
        crash_run(at, n as u64);
    }
}

#[test]
fn check_detects_a_wrong_per_dictionary_count() {
    let (disk, vol) = sim_volume_with(&create(), opts());
    let mut model = Model::new();
    run(&vol, &mut model).expect("run");
    vol.close().expect("close");
    drop(vol);
    let mut image = disk.current_image();
    let (sb, mut ck) = newest_checkpoint(&image);
    assert!(ck.flags & CKPT_FLAG_DICT_COUNTS != 0, "counts announced");
    let e = ck
        .dicts
        .iter_mut()
        .find(|d| d.id != 0 && d.live_blocks > 0)
        .expect("a dictionary with live blocks");
    e.live_blocks -= 1;
    let bytes = ck.encode(&sb).expect("encode");
    for copy in 0..sb.metadata_copies() {
        let at = sb.checkpoint_slot_offset(ck.seq, copy) as usize;
        image[at..at + bytes.len()].copy_from_slice(&bytes);
    }
    let disk = Arc::new(SimStorage::from_image(image.clone()));
    let vol = Volume::open_read_only(Box::new(Arc::clone(&disk))).expect("open");
    let report = vol.check(&|_, _| {});
    assert!(
        report
            .metadata_problems
            .iter()
            .any(|p| p.contains("volume counters differ")),
        "check: {report:?}"
    );
    // Without the flag (an older build wrote it) the counts are rebuilt at a writable open.
    let (sb, mut ck) = newest_checkpoint(&image);
    ck.flags &= !CKPT_FLAG_DICT_COUNTS;
    for d in ck.dicts.iter_mut() {
        d.live_blocks = 0;
    }
    let bytes = ck.encode(&sb).expect("encode");
    for copy in 0..sb.metadata_copies() {
        let at = sb.checkpoint_slot_offset(ck.seq, copy) as usize;
        image[at..at + bytes.len()].copy_from_slice(&bytes);
    }
    let disk = Arc::new(SimStorage::from_image(image));
    let vol = Volume::open(Box::new(Arc::clone(&disk)), opts()).expect("open");
    assert!(vol
        .stats()
        .dictionaries
        .iter()
        .all(|d| d.live_blocks.is_some()));
    let report = vol.check(&|_, _| {});
    assert!(report.is_clean(), "check after recount: {report:?}");
    let listed: u64 = vol
        .stats()
        .dictionaries
        .iter()
        .filter_map(|d| d.live_blocks)
        .sum();
    assert!(listed > 0, "recounted");
}
