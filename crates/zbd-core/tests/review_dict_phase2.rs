//! Review (adversarial): a dictionary installed (under the state lock, two checkpoints) while
//! another thread's checkpoint is in its phase 2 (parked at a storage call). The install must
//! wait for and commit that checkpoint first, so both checkpoint slots list the dictionary
//! before any block names it; a crash at any later point keeps every flushed block readable.

mod common;

use common::*;
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::ops::Range;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use zbd_core::{Codec, CreateOptions, OpenOptions, SimStorage, Storage, Volume};

const SIZE: u64 = 16 << 20;
const CHUNK: usize = 64 << 10;

#[derive(Clone, Debug)]
enum Trap {
    Sync(u32),
    Write(Range<u64>),
}

/// Dictionary region ranges and whom to tell when one is written.
type DictWatch = Option<(Vec<Range<u64>>, Sender<()>)>;

/// Parks the first operation matching the trap; tells `dict_seen` when the dictionary region
/// is written (an install has begun, state lock held).
struct Parking {
    disk: Arc<SimStorage>,
    trap: Mutex<Option<(Trap, u32)>>,
    parked: Mutex<Sender<()>>,
    release: Mutex<Receiver<()>>,
    dict: Mutex<DictWatch>,
}

impl Parking {
    fn maybe_park(&self, is_sync: bool, offset: u64) {
        if !is_sync {
            let mut d = self.dict.lock();
            if let Some((ranges, tx)) = &*d {
                if ranges.iter().any(|r| r.contains(&offset)) {
                    let _ = tx.send(());
                    *d = None;
                }
            }
        }
        let hit = {
            let mut t = self.trap.lock();
            let hit = match &mut *t {
                Some((Trap::Sync(n), seen)) if is_sync => {
                    *seen += 1;
                    *seen == *n
                }
                Some((Trap::Write(r), _)) if !is_sync => r.contains(&offset),
                _ => false,
            };
            if hit {
                *t = None;
            }
            hit
        };
        if hit {
            self.parked.lock().send(()).expect("test gone");
            self.release.lock().recv().expect("test gone");
        }
    }
}

impl Storage for Parking {
    fn len_bytes(&self) -> zbd_core::Result<u64> {
        self.disk.len_bytes()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> zbd_core::Result<()> {
        self.disk.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> zbd_core::Result<()> {
        self.maybe_park(false, offset);
        self.disk.write_at(offset, data)
    }
    fn sync(&self) -> zbd_core::Result<()> {
        self.maybe_park(true, 0);
        self.disk.sync()
    }
    fn discard(&self, offset: u64, len: u64) -> zbd_core::Result<()> {
        self.disk.discard(offset, len)
    }
}

fn create_opts() -> CreateOptions {
    CreateOptions {
        unit_bytes: Some(4096),
        ..small_volume(SIZE, 32768, Codec::Zstd(1), 2, 16)
    }
}

fn dict_opts() -> OpenOptions {
    OpenOptions {
        dictionary: true,
        ..open_opts_sync()
    }
}

/// Log-like records (as tests/dicts.rs): a dictionary is adopted for them.
fn records(seed: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 200);
    let mut k = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while out.len() < len {
        k ^= k << 13;
        k ^= k >> 7;
        k ^= k << 17;
        let line = format!(
            "{{\"ts\":{},\"user\":\"u{:04}\",\"state\":\"{}\",\"path\":\"/srv/data/{:x}/part-{}.log\",\"bytes\":{}}}\n",
            1_700_000_000 + (k % 10_000_000),
            (k >> 8) % 977,
            ["active", "idle", "closed", "failed", "pending"][(k >> 20) as usize % 5],
            (k >> 24) & 0xffff,
            (k >> 40) % 64,
            (k >> 30) % 100_000
        );
        out.extend_from_slice(line.as_bytes());
    }
    out.truncate(len);
    out
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
    let (ptx, prx) = channel();
    let (rtx, rrx) = channel();
    let park = Arc::new(Parking {
        disk: Arc::clone(&disk),
        trap: Mutex::new(None),
        parked: Mutex::new(ptx),
        release: Mutex::new(rrx),
        dict: Mutex::new(None),
    });
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
    *park.dict.lock() = Some((
        vec![
            sb.dict_offset[0]..sb.dict_offset[0] + d,
            sb.dict_offset[1]..sb.dict_offset[1] + d,
        ],
        dtx,
    ));
    *park.trap.lock() = Some((trap, 0));
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
    if c1.is_ok() && w.is_ok() {
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
            dictionary: true,
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
    let data = records(3, 3 << 20);
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
