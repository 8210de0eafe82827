//! A checkpoint held in its phase 2 on purpose: a simulated disk that parks one chosen storage
//! call (the n-th sync, or the first write into a range) until the test releases it, and the
//! per-block expectation that the crash tests around it verify.

use super::{fill, Fill, BS};
use rand::rngs::SmallRng;
use rand::Rng;
use std::ops::Range;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use zbd_core::{SimStorage, Storage, Volume};

/// Which storage call parks.
#[derive(Clone, Debug)]
pub enum Trap {
    /// The n-th sync from now (1 = the next).
    Sync(u32),
    /// The first write that starts in this byte range.
    Write(Range<u64>),
}

/// Byte ranges whose first write is reported (without parking) on the sender.
pub type WriteWatch = Option<(Vec<Range<u64>>, Sender<()>)>;

/// A simulated disk whose next operation matching the armed trap waits for `release`.
pub struct Parking {
    pub disk: Arc<SimStorage>,
    trap: Mutex<Option<(Trap, u32)>>,
    parked: Mutex<Sender<()>>,
    release: Mutex<Receiver<()>>,
    watch: Mutex<WriteWatch>,
    /// Name of the thread that parked last (which thread writes a checkpoint).
    parked_by: Mutex<Option<String>>,
}

impl Parking {
    /// The disk, the receiver told when a call parks, and the sender that releases it.
    pub fn new(disk: Arc<SimStorage>) -> (Arc<Parking>, Receiver<()>, Sender<()>) {
        let (ptx, prx) = channel();
        let (rtx, rrx) = channel();
        let park = Arc::new(Parking {
            disk,
            trap: Mutex::new(None),
            parked: Mutex::new(ptx),
            release: Mutex::new(rrx),
            watch: Mutex::new(None),
            parked_by: Mutex::new(None),
        });
        (park, prx, rtx)
    }

    pub fn arm(&self, trap: Trap) {
        *self.trap.lock().expect("lock") = Some((trap, 0));
    }

    /// The name of the thread that parked last (`None`: none did, or it has no name).
    pub fn parked_by(&self) -> Option<String> {
        self.parked_by.lock().expect("lock").clone()
    }

    /// Tells `seen` (once) when a write starts in one of `ranges`.
    pub fn watch_writes(&self, ranges: Vec<Range<u64>>, seen: Sender<()>) {
        *self.watch.lock().expect("lock") = Some((ranges, seen));
    }

    /// Parks the caller if the op is the armed trap's: tells the test, waits.
    fn maybe_park(&self, is_sync: bool, offset: u64) {
        if !is_sync {
            let mut w = self.watch.lock().expect("lock");
            if let Some((ranges, tx)) = &*w {
                if ranges.iter().any(|r| r.contains(&offset)) {
                    let _ = tx.send(());
                    *w = None;
                }
            }
        }
        let hit = {
            let mut t = self.trap.lock().expect("lock");
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
            *self.parked_by.lock().expect("lock") = std::thread::current().name().map(String::from);
            self.parked
                .lock()
                .expect("lock")
                .send(())
                .expect("test gone");
            self.release
                .lock()
                .expect("lock")
                .recv()
                .expect("test gone");
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

/// Per-block expectation: the value at the last completed flush, and values written since.
pub struct Expect {
    pub durable: Vec<Vec<u8>>,
    pub since: Vec<Vec<Vec<u8>>>,
}

impl Expect {
    pub fn new(blocks: usize) -> Expect {
        Expect {
            durable: vec![vec![0; BS]; blocks],
            since: vec![Vec::new(); blocks],
        }
    }

    pub fn blocks(&self) -> usize {
        self.durable.len()
    }

    pub fn wrote(&mut self, b: usize, data: &[u8]) {
        self.since[b].push(data.to_vec());
    }

    pub fn flushed(&mut self) {
        for (b, s) in self.since.iter_mut().enumerate() {
            if let Some(last) = s.pop() {
                self.durable[b] = last;
            }
            s.clear();
        }
    }

    /// Every block reads its flushed value or one written since, and `check` is clean.
    pub fn verify(&self, vol: &Volume, ctx: &str) {
        let mut buf = vec![0u8; BS];
        for b in 0..self.blocks() {
            vol.read((b * BS) as u64, &mut buf)
                .unwrap_or_else(|e| panic!("{ctx}: block {b} unreadable: {e}"));
            assert!(
                buf == self.durable[b] || self.since[b].contains(&buf),
                "{ctx}: block {b} lost flushed data or holds data it never held"
            );
        }
        let report = vol.check(&|_, _| {});
        assert!(report.is_clean(), "{ctx}: check: {report:?}");
    }
}

/// One block: text (compressible) mostly, random (stored raw) one time in five.
pub fn mixed_block(rng: &mut SmallRng) -> Vec<u8> {
    let kind = if rng.random_bool(0.2) {
        Fill::Random
    } else {
        Fill::Text
    };
    fill(rng, kind, BS)
}

/// Writes `n` mixed blocks at random places, recording them in `exp`.
pub fn write_some(vol: &Volume, exp: &mut Expect, rng: &mut SmallRng, n: usize) {
    for _ in 0..n {
        let b = rng.random_range(0..exp.blocks());
        let data = mixed_block(rng);
        exp.wrote(b, &data);
        vol.write((b * BS) as u64, &data, false).expect("write");
    }
}

/// Only to turn a deadlock into a failure: nothing waits for it to pass.
pub const STUCK: Duration = Duration::from_secs(120);

/// Runs `f` on another thread; fails the test if it has not finished after `STUCK` (it is
/// then blocked behind a parked storage call).
pub fn must_finish<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(STUCK)
        .unwrap_or_else(|_| panic!("{what} waited for the checkpoint's parked storage call"))
}

/// A checkpoint parked at `trap` in its phase 2 and a background cleaning pass that committed
/// beside it (its moves are in the map while the checkpoint's snapshot still names the
/// victims). Returns the two threads; the caller releases the checkpoint (`Parking::new`'s
/// sender) and joins them.
pub fn checkpoint_parked_beside_a_pass(
    vol: &Arc<Volume>,
    park: &Parking,
    parked: &Receiver<()>,
    trap: Trap,
    ctx: &str,
) -> (
    JoinHandle<zbd_core::Result<()>>,
    JoinHandle<zbd_core::Result<()>>,
) {
    park.arm(trap);
    let v = Arc::clone(vol);
    let ckpt = std::thread::spawn(move || v.checkpoint());
    parked.recv().expect("checkpoint parked");
    let moved_before = vol.stats().counters.cleaner_bytes_moved;
    // The pass commits under the state lock (phase 2 holds no lock); then it waits for the
    // checkpoint lock to write its own checkpoint.
    let v = Arc::clone(vol);
    let cleaner = std::thread::spawn(move || v.clean());
    while vol.stats().counters.cleaner_bytes_moved == moved_before && !cleaner.is_finished() {
        std::thread::yield_now();
    }
    assert!(
        vol.stats().counters.cleaner_bytes_moved > moved_before,
        "{ctx}: no pass committed during the checkpoint"
    );
    (ckpt, cleaner)
}
