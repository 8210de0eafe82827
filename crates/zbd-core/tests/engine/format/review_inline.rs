//! Adversarial review of inline dedup (commit 0d97bfa8): races between a writer's verify
//! read and other writers, ref replay after damage, and the counts `zbd check` verifies.

use crate::common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use zbd_core::{Codec, CreateOptions, SimStorage, Storage, Volume};

const SIZE: u64 = 4 << 20;
const BLOCKS: u64 = SIZE / BS as u64;

fn opts(unit: Option<u32>, codec: Codec) -> CreateOptions {
    CreateOptions {
        dedup: true,
        ..with_metadata_pages(&CreateOptions {
            unit_bytes: unit,
            ..small_volume(SIZE, 65536, codec, 3, 6)
        })
    }
}

fn block(vol: &Volume, lba: u64) -> Vec<u8> {
    let mut b = vec![0u8; BS];
    vol.read(lba * BS as u64, &mut b)
        .unwrap_or_else(|e| panic!("block {lba}: {e}"));
    b
}

fn put(vol: &Volume, lba: u64, data: &[u8]) {
    vol.write(lba * BS as u64, data, false).expect("write");
}

/// A simulated disk that parks the thread named `w1` at its storage reads numbered in `at`
/// (1-based, counting only that thread's reads), telling the test and waiting for a release.
struct TrapReads {
    disk: Arc<SimStorage>,
    at: Mutex<(Vec<u32>, u32)>,
    log: Mutex<Vec<u64>>,
    parked: Mutex<Sender<u32>>,
    release: Mutex<Receiver<()>>,
}

impl TrapReads {
    fn new(disk: Arc<SimStorage>) -> (Arc<TrapReads>, Receiver<u32>, Sender<()>) {
        let (ptx, prx) = channel();
        let (rtx, rrx) = channel();
        let t = Arc::new(TrapReads {
            disk,
            at: Mutex::new((Vec::new(), 0)),
            log: Mutex::new(Vec::new()),
            parked: Mutex::new(ptx),
            release: Mutex::new(rrx),
        });
        (t, prx, rtx)
    }
    fn arm(&self, at: Vec<u32>) {
        *self.at.lock().expect("lock") = (at, 0);
    }
}

impl Storage for TrapReads {
    fn len_bytes(&self) -> zbd_core::Result<u64> {
        self.disk.len_bytes()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> zbd_core::Result<()> {
        if std::thread::current().name() == Some("w1") {
            let n = {
                let mut a = self.at.lock().expect("lock");
                a.1 += 1;
                self.log.lock().expect("lock").push(offset);
                a.0.contains(&a.1).then_some(a.1)
            };
            if let Some(n) = n {
                self.parked.lock().expect("lock").send(n).expect("send");
                self.release.lock().expect("lock").recv().expect("recv");
            }
        }
        self.disk.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> zbd_core::Result<()> {
        self.disk.write_at(offset, data)
    }
    fn sync(&self) -> zbd_core::Result<()> {
        self.disk.sync()
    }
    fn discard(&self, offset: u64, len: u64) -> zbd_core::Result<()> {
        self.disk.discard(offset, len)
    }
}

fn random_block(rng: &mut SmallRng) -> Vec<u8> {
    fill(rng, Fill::Random, BS)
}

/// Finding 1 (ABA on the candidate's map entry). A writer notes the copy its candidate LBA
/// names (shared item K), then reads the candidate *through the LBA*: meanwhile the LBA was
/// overwritten with the writer's own bytes X, so the read compares equal; before the writer
/// takes the lock the LBA is written back to K's content, which inline dedup turns into a ref
/// to K again: the same StoredCopy. `put_ref` saw "still names the compared copy" and made
/// the writer's block a reference to K, which reads K's bytes, not X (fixed: the writer now
/// compares the bytes of the copy it noted, fetched in the same lock hold).
#[test]
fn review_inline_verify_read_aba_through_the_candidate_lba() {
    let sb = zbd_core::layout::plan(&with_test_format(&opts(None, Codec::None))).expect("plan");
    let disk = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let (trap, parked, release) = TrapReads::new(Arc::clone(&disk));
    let vol = Arc::new(
        Volume::create_with(
            Box::new(Arc::clone(&trap)),
            &with_test_format(&opts(None, Codec::None)),
            open_opts_sync(),
        )
        .expect("create"),
    );
    let mut rng = SmallRng::seed_from_u64(1);
    let a = random_block(&mut rng);
    let x = random_block(&mut rng);
    let p = random_block(&mut rng);
    let q = random_block(&mut rng);
    // K: A at 0, shared by 1.
    put(&vol, 0, &a);
    put(&vol, 1, &a);
    // The index learns fp(X) -> 2; then 2 becomes a ref to K.
    put(&vol, 2, &x);
    put(&vol, 2, &a);
    put(&vol, 50, &p);
    put(&vol, 60, &q);
    // Fill enough to seal the extents holding P and Q (so the writer reads them from the
    // medium, where the trap is).
    for lba in 200..400u64 {
        put(&vol, lba, &random_block(&mut rng));
    }
    vol.flush().expect("flush");
    assert_eq!(block(&vol, 2), a);

    // The writer: [P, X, Q] at 100..103; candidates 50, 2, 60. Before the fix it read each
    // run through its LBA, one storage read at a time, and the test parked it at its first and
    // second read to put X at LBA 2 before the read of 2 and A (K again) after it. Now every
    // candidate's bytes are fetched from the copy noted under the lock, in one batch: it parks
    // at its first read, after noting, and LBA 2 goes to X meanwhile. The bytes it compares
    // must be K's (A), which differ from X (a rejected candidate), never X read through the
    // LBA (an equal one, which the old code then kept unless the LBA changed again).
    trap.arm(vec![1]);
    let w = {
        let vol = Arc::clone(&vol);
        let mut data = p.clone();
        data.extend_from_slice(&x);
        data.extend_from_slice(&q);
        std::thread::Builder::new()
            .name("w1".into())
            .spawn(move || vol.write(100 * BS as u64, &data, false))
            .expect("spawn")
    };
    // Parked at its first medium read: its candidates' copies are noted.
    assert_eq!(parked.recv_timeout(STUCK).expect("parked"), 1);
    put(&vol, 2, &x); // the candidate LBA now holds X (stored: its bytes differ from K)
    let rejected = |vol: &Volume| vol.stats().dedup_index.expect("on").index.rejected;
    let before = rejected(&vol);
    release.send(()).expect("release");
    w.join().expect("join").expect("writer");
    assert_eq!(
        rejected(&vol),
        before + 1,
        "the writer compared X with K's bytes, not with LBA 2's new ones"
    );
    put(&vol, 2, &a); // back to K, by a dedup hit: the same stored copy as noted
    assert!(block(&vol, 2) == a);
    let got = block(&vol, 101);
    assert!(
        got != a || a == x,
        "block 101 was written X and reads block 2's other bytes (A)"
    );
    assert!(got == x, "block 101 was written X and reads other bytes");
}

/// Finding 1 without a trap: four writers, each owning its own range of blocks, write blocks
/// drawn from a small shared set of contents (so blocks keep returning to references to the
/// same shared items, the ABA of finding 1) and trim now and then. Each block must read what
/// its owner wrote last, and `zbd check` must be clean.
fn concurrent_writers_with_shared_contents(seed: u64, rounds: usize) {
    let (_disk, vol) = sim_volume_with(
        &opts(None, Codec::Lz4),
        open_opts_with(zbd_core::IoOptions::default()),
    );
    let vol = Arc::new(vol);
    let mut rng = SmallRng::seed_from_u64(seed);
    let set: Arc<Vec<Vec<u8>>> = Arc::new(
        (0..6)
            .map(|_| {
                let mut b = fill(&mut rng, Fill::Random, BS / 2);
                b.resize(BS, 0);
                b
            })
            .collect(),
    );
    const THREADS: u64 = 4;
    const PER: u64 = 32;
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let vol = Arc::clone(&vol);
            let set = Arc::clone(&set);
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed * 100 + t);
                let mut model = vec![vec![0u8; BS]; PER as usize];
                for _ in 0..rounds {
                    let i = rng.random_range(0..PER);
                    let n = rng.random_range(1..4u64).min(PER - i);
                    let lba = t * PER + i;
                    if rng.random_bool(0.1) {
                        vol.trim(lba * BS as u64, n * BS as u64).expect("trim");
                        (i..i + n).for_each(|k| model[k as usize] = vec![0u8; BS]);
                        continue;
                    }
                    let mut data = Vec::new();
                    for k in 0..n {
                        let b = set[rng.random_range(0..set.len())].clone();
                        data.extend_from_slice(&b);
                        model[(i + k) as usize] = b;
                    }
                    vol.write(lba * BS as u64, &data, false).expect("write");
                }
                model
            })
        })
        .collect();
    let models: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("join"))
        .collect();
    let mut wrong = Vec::new();
    for (t, model) in models.iter().enumerate() {
        for (i, want) in model.iter().enumerate() {
            let lba = t as u64 * PER + i as u64;
            if &block(&vol, lba) != want {
                wrong.push(lba);
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "seed {seed}: blocks {wrong:?} read other bytes than last written"
    );
    assert_clean(&vol, "after concurrent writers");
}

#[test]
fn review_inline_concurrent_writers_of_few_contents_read_back() {
    for seed in 0..full_or_light(40, 10) {
        concurrent_writers_with_shared_contents(seed, 2000);
    }
}

/// A crash and failed-sync sweep over inline dedup with 16 KiB units, partial (read-modify-
/// write) overwrites of shared blocks, trims and flushes, on a 4 KiB-sector device.
fn sweep(unit: Option<u32>, four_k: bool, extent: u32) {
    let o = CreateOptions {
        dedup: true,
        ..with_metadata_pages(&CreateOptions {
            unit_bytes: unit,
            ..small_volume(SIZE, extent, Codec::Lz4, 3, 6)
        })
    };
    let sb = zbd_core::layout::plan(&with_test_format(&o)).expect("plan");
    let base = Arc::new(SimStorage::new(sb.total_bytes() as usize));
    let mut rng = SmallRng::seed_from_u64(3);
    let set: Vec<Vec<u8>> = (0..12)
        .map(|_| {
            let mut b = fill(&mut rng, Fill::Random, BS / 2);
            b.resize(BS, 0);
            b
        })
        .collect();
    let boxed = |d: &Arc<SimStorage>| -> Box<dyn Storage> {
        if four_k {
            Box::new(FourKn::new(d))
        } else {
            Box::new(Arc::clone(d))
        }
    };
    let vol =
        Volume::create_with(boxed(&base), &with_test_format(&o), open_opts()).expect("create");
    let mut start = vec![0u8; SIZE as usize];
    for lba in 0..BLOCKS / 2 {
        let b = &set[rng.random_range(0..set.len())];
        start[(lba as usize) * BS..(lba as usize + 1) * BS].copy_from_slice(b);
    }
    vol.write(0, &start[..SIZE as usize / 2], false)
        .expect("write");
    vol.close().expect("close");
    drop(vol);
    let image = base.current_image();
    let run = |cut: Option<u64>, fail_sync: bool, seed: u64| -> u64 {
        let disk = Arc::new(SimStorage::from_image(image.clone()));
        let vol = Volume::open(boxed(&disk), open_opts()).expect("open");
        let ops0 = disk.ops();
        match cut {
            Some(c) if fail_sync => disk.fail_sync_at(ops0 + c, seed),
            Some(c) => disk.set_power_loss_at(ops0 + c),
            None => {}
        }
        let mut model = start.clone();
        let mut durable = model.clone();
        let mut since: Vec<Vec<Vec<u8>>> = vec![Vec::new(); BLOCKS as usize];
        let mut rng = SmallRng::seed_from_u64(77);
        for round in 0..30 {
            let lba = rng.random_range(0..BLOCKS - 40);
            let n = rng.random_range(1..32u64);
            let at = (lba * BS as u64) as usize;
            let len = n as usize * BS;
            let (ok, range) = match round % 6 {
                5 => {
                    let ok = vol.trim(at as u64, len as u64).is_ok();
                    model[at..at + len].fill(0);
                    (ok, at..at + len)
                }
                4 => {
                    // A partial write across shared blocks: read-modify-write of each end.
                    let off = at + 1000;
                    let data = fill(&mut rng, Fill::Random, len);
                    let ok = vol.write(off as u64, &data, false).is_ok();
                    model[off..off + len].copy_from_slice(&data);
                    (ok, at..off + len)
                }
                _ => {
                    let mut data = Vec::new();
                    for _ in 0..n {
                        data.extend_from_slice(&set[rng.random_range(0..set.len())]);
                    }
                    let ok = vol.write(at as u64, &data, false).is_ok();
                    model[at..at + len].copy_from_slice(&data);
                    (ok, at..at + len)
                }
            };
            let _ = ok;
            for b in range.start / BS..range.end.div_ceil(BS) {
                since[b].push(model[b * BS..(b + 1) * BS].to_vec());
            }
            if round % 3 == 2 && vol.flush().is_ok() {
                durable = model.clone();
                since.iter_mut().for_each(Vec::clear);
            }
        }
        let ops = disk.ops() - ops0;
        if cut.is_none() {
            vol.flush().expect("flush");
            assert!(vol.stats().dedup_index.expect("on").index.verified > 0);
        }
        let mut rng = SmallRng::seed_from_u64(seed);
        let (disk, vol) = if fail_sync {
            // Reopen in the same boot (the failed sync's pages still readable), then a
            // power cut.
            vol.abandon();
            let again = Volume::open(boxed(&disk), open_opts()).expect("reopen same boot");
            let crashed = disk.crash_image(&mut rng);
            again.abandon();
            let disk = Arc::new(SimStorage::from_image(crashed));
            let vol = Volume::open(boxed(&disk), open_opts()).expect("reopen");
            (disk, vol)
        } else {
            let crashed = disk.crash_image(&mut rng);
            vol.abandon();
            let disk = Arc::new(SimStorage::from_image(crashed));
            let vol = Volume::open(boxed(&disk), open_opts()).expect("reopen");
            (disk, vol)
        };
        let _ = &disk;
        let ctx = format!(
            "{} at {cut:?}",
            if fail_sync { "failed sync" } else { "cut" }
        );
        let mut got = vec![0u8; SIZE as usize];
        vol.read(0, &mut got)
            .unwrap_or_else(|e| panic!("{ctx}: read: {e}"));
        for (i, g) in got.chunks(BS).enumerate() {
            let ok = g == &durable[i * BS..(i + 1) * BS] || since[i].iter().any(|v| v == g);
            assert!(
                ok,
                "{ctx}: block {i} reads neither its flushed value nor a later one"
            );
        }
        assert_clean(&vol, &ctx);
        ops
    };
    let total = run(None, false, 1);
    let step = (total / full_or_light(120, 30)).max(1);
    for cut in (0..total).step_by(step as usize) {
        run(Some(cut), false, cut);
        run(Some(cut), true, cut);
    }
}

#[test]
fn review_inline_sweep_units_partial_writes() {
    sweep(Some(16384), false, 65536);
}

#[test]
fn review_inline_sweep_units64k_on_4k_sectors() {
    sweep(Some(65536), true, 262144);
}

#[test]
fn review_inline_sweep_single_blocks_on_4k_sectors() {
    sweep(None, true, 65536);
}
