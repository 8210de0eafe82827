//! A dictionary installed (under the state lock, two checkpoints) while another thread's
//! checkpoint is in its phase 2 (parked at a storage call). The install must wait for and commit
//! that checkpoint first, so both checkpoint slots list the dictionary before any block names
//! it; a crash at any later point keeps every flushed block readable.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::mpsc::channel;
use std::sync::Arc;
use zbd_core::{Codec, CreateOptions, OpenOptions, SimStorage, Volume};

const SIZE: u64 = 16 << 20;
const CHUNK: usize = 64 << 10;

fn create_opts() -> CreateOptions {
    CreateOptions {
        unit_bytes: Some(4096),
        ..small_volume(SIZE, 32768, Codec::Zstd(1), 2, 16)
    }
}

fn dict_opts() -> OpenOptions {
    OpenOptions {
        dictionary: Some(true),
        ..open_opts_sync()
    }
}

/// The chunk whose write installs the first dictionary.
fn install_chunk(data: &[u8]) -> usize {
    let (_disk, vol) = sim_volume_with(&create_opts(), dict_opts());
    for (i, c) in data.chunks(CHUNK).enumerate() {
        vol.write((i * CHUNK) as u64, c, false).expect("write");
        if !vol.stats().dictionaries.is_empty() {
            return i;
        }
    }
    panic!("no dictionary was installed");
}

fn scenario(data: &[u8], at: usize, trap: Trap, k: u64, seed: u64) {
    let ctx = format!("trap {trap:?}, power lost {k} ops after the release, seed {seed}");
    let opts = create_opts();
    let sb = zbd_core::layout::plan(&opts).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let (park, prx, rtx) = Parking::new(Arc::clone(&disk));
    let vol = Arc::new(
        Volume::create_with(Box::new(Arc::clone(&park)), &opts, dict_opts()).expect("create"),
    );
    for (i, c) in data.chunks(CHUNK).take(at).enumerate() {
        vol.write((i * CHUNK) as u64, c, false).expect("write");
    }
    vol.flush().expect("flush");
    let mut flushed = at * CHUNK;
    assert!(
        vol.stats().dictionaries.is_empty(),
        "{ctx}: installed early"
    );
    let (dtx, drx) = channel();
    let d = u64::from(sb.dict_bytes);
    park.watch_writes(
        vec![
            sb.dict_offset[0]..sb.dict_offset[0] + d,
            sb.dict_offset[1]..sb.dict_offset[1] + d,
        ],
        dtx,
    );
    park.arm(trap);
    let v = Arc::clone(&vol);
    let ckpt = std::thread::spawn(move || v.checkpoint());
    prx.recv().expect("checkpoint parked");
    // The write of chunk `at` trains and installs while the checkpoint is parked.
    let v = Arc::clone(&vol);
    let c = data[at * CHUNK..(at + 1) * CHUNK].to_vec();
    let writer = std::thread::spawn(move || v.write((at * CHUNK) as u64, &c, false));
    drx.recv().expect("the install began");
    disk.set_power_loss_at(disk.ops() + k);
    rtx.send(()).expect("release");
    let c1 = ckpt.join().expect("checkpoint thread");
    let w = writer.join().expect("writer thread");
    let mut written = at * CHUNK;
    // A failed install does not fail the write (its blocks are stored; the install's failed
    // write or sync stops the volume instead), and whether the parked checkpoint, the write's
    // blocks or the install meet the power loss first depends on the threads' timing.
    if c1.is_ok() && w.is_ok() && vol.stats().failed.is_none() {
        written += CHUNK;
        assert!(!vol.stats().dictionaries.is_empty(), "{ctx}: not installed");
        // Blocks with the dictionary, flushed now and then.
        for (i, c) in data.chunks(CHUNK).enumerate().skip(at + 1) {
            if vol.write((i * CHUNK) as u64, c, false).is_err() {
                break;
            }
            written = (i + 1) * CHUNK;
            if i % 3 == 0 {
                if vol.flush().is_err() {
                    break;
                }
                flushed = written;
            }
        }
    }
    let image = disk.crash_image(&mut SmallRng::seed_from_u64(seed));
    let vol2 = Volume::open(
        Box::new(SimStorage::from_image(image)),
        OpenOptions {
            dictionary: Some(true),
            ..open_opts()
        },
    )
    .unwrap_or_else(|e| panic!("{ctx}: reopen: {e}"));
    for lba in 0..written.min(data.len()) / BS {
        let got =
            read_block(&vol2, lba as u64).unwrap_or_else(|e| panic!("{ctx}: block {lba}: {e}"));
        let want = &data[lba * BS..(lba + 1) * BS];
        if lba * BS < flushed {
            assert!(got == want, "{ctx}: flushed block {lba} differs");
        } else {
            assert!(
                got == want || got.iter().all(|&b| b == 0),
                "{ctx}: block {lba} holds data it never held"
            );
        }
    }
    assert!(vol2.check(&|_, _| {}).is_clean(), "{ctx}: check");
    match Arc::try_unwrap(vol) {
        Ok(v) => v.abandon(),
        Err(_) => panic!("{ctx}: volume still shared"),
    }
}

#[test]
fn a_dictionary_installed_during_a_checkpoint_phase_2_survives_crashes() {
    let data = log_records(3, 3 << 20);
    let at = install_chunk(&data);
    let sb = zbd_core::layout::plan(&create_opts()).expect("plan");
    let pages = sb.map_offset..sb.checkpoint_offset1;
    for (n, k) in [0u64, 2, 5, 9, 14, 20, 30, 60, 200, 100_000]
        .into_iter()
        .enumerate()
    {
        scenario(&data, at, Trap::Sync(1), k, n as u64);
        scenario(&data, at, Trap::Write(pages.clone()), k, n as u64);
    }
}
