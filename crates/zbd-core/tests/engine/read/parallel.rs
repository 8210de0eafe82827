//! The extents of one host read reach the storage as one batch (`Storage::read_many`), which a
//! network store reads concurrently; every byte still comes back right, including a damaged
//! block among them (an error for its unit, data for the rest).

use crate::common::*;
use parking_lot::{Condvar, Mutex};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use zbd_core::{Codec, Error, SimStorage, Storage, Volume};

/// Counts reads in flight. Each read waits (bounded) for a second one to start, so a volume that
/// reads its runs one after the other is seen as such: only ever one in flight.
struct Concurrent {
    disk: Arc<SimStorage>,
    width: usize,
    /// Set once the volume is open: only the data reads of the host read under test wait (not
    /// map page faults, which are single reads under the state lock).
    armed: AtomicBool,
    data_offset: u64,
    in_flight: Mutex<usize>,
    most: Mutex<usize>,
    arrived: Condvar,
}

impl Concurrent {
    fn new(disk: Arc<SimStorage>, width: usize, data_offset: u64) -> Arc<Concurrent> {
        Arc::new(Concurrent {
            disk,
            width,
            data_offset,
            armed: AtomicBool::new(false),
            in_flight: Mutex::new(0),
            most: Mutex::new(0),
            arrived: Condvar::new(),
        })
    }
}

impl Storage for Concurrent {
    fn len_bytes(&self) -> zbd_core::Result<u64> {
        self.disk.len_bytes()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> zbd_core::Result<()> {
        {
            let mut n = self.in_flight.lock();
            *n += 1;
            let mut most = self.most.lock();
            *most = (*most).max(*n);
            drop(most);
            self.arrived.notify_all();
            // Until two reads have overlapped once, a lone read waits for company (bounded: a
            // volume that never reads concurrently only gets slower, and the test sees it).
            if self.armed.load(Ordering::SeqCst)
                && offset >= self.data_offset
                && *self.most.lock() < 2
            {
                self.arrived
                    .wait_while_for(&mut n, |n| *n < 2, Duration::from_secs(10));
            }
        }
        let res = self.disk.read_at(offset, buf);
        *self.in_flight.lock() -= 1;
        res
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
    /// Width 1: the default (one read after the other); wider: the batch's reads run
    /// concurrently, as RADOS has them in flight at once.
    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<zbd_core::Result<()>> {
        if self.width == 1 {
            return reads.iter_mut().map(|(o, b)| self.read_at(*o, b)).collect();
        }
        reads
            .chunks_mut(self.width)
            .flat_map(|batch| concurrently(self, batch))
            .collect()
    }
}

/// A closed 1 MiB volume of random (raw, one unit per 8 KiB) blocks in 32 KiB extents: a read of
/// all of it needs about 32 extents.
fn closed_random_volume() -> (Arc<SimStorage>, Vec<u8>, zbd_core::format::Superblock) {
    let opts = small_volume(1 << 20, 32768, Codec::Lz4, 4, 16);
    let (disk, vol) = sim_volume(&opts);
    let mut rng = SmallRng::seed_from_u64(11);
    let data = fill(&mut rng, Fill::Random, 1 << 20);
    vol.write(0, &data, false).expect("write");
    vol.close().expect("close");
    let sb = vol.superblock().clone();
    (disk, data, sb)
}

#[test]
fn one_host_read_reads_its_extents_concurrently() {
    let (disk, data, sb) = closed_random_volume();
    let store = Concurrent::new(disk, 8, sb.data_offset);
    let vol = Volume::open(Box::new(Arc::clone(&store)), open_opts()).expect("open");
    *store.most.lock() = 0;
    store.armed.store(true, Ordering::SeqCst);
    let mut buf = vec![0u8; data.len()];
    vol.read(0, &mut buf).expect("read");
    assert!(
        buf == data,
        "bytes read concurrently differ from those written"
    );
    let most = *store.most.lock();
    assert!(most >= 2, "reads in flight at most {most}: not concurrent");
    assert!(
        most <= 8,
        "reads in flight {most} exceed the storage's width 8"
    );
}

#[test]
fn width_one_reads_one_after_the_other() {
    let (disk, data, sb) = closed_random_volume();
    let store = Concurrent::new(disk, 1, sb.data_offset);
    let vol = Volume::open(Box::new(Arc::clone(&store)), open_opts()).expect("open");
    *store.most.lock() = 0;
    let mut buf = vec![0u8; data.len()];
    vol.read(0, &mut buf).expect("read");
    assert!(buf == data);
    assert_eq!(*store.most.lock(), 1);
}

#[test]
fn a_damaged_extent_among_concurrent_reads_fails_only_its_blocks() {
    let (disk, data, sb) = closed_random_volume();
    // The first stored bytes of the data area: the first block written (lba 0's unit).
    disk.flip_bit(sb.data_offset + 700, 2);
    let store = Concurrent::new(disk, 8, sb.data_offset);
    let vol = Volume::open(Box::new(Arc::clone(&store)), open_opts()).expect("open");
    store.armed.store(true, Ordering::SeqCst);
    let mut buf = vec![0u8; data.len()];
    match vol.read(0, &mut buf) {
        Err(Error::Corrupt { lba }) => assert!(lba < 16, "corrupt lba {lba}"),
        other => panic!("read over a flipped bit returned {other:?}"),
    }
    // Past the damaged unit, everything reads back.
    let from = 16 * 4096;
    let mut tail = vec![0u8; data.len() - from];
    vol.read(from as u64, &mut tail)
        .expect("read past the damage");
    assert!(tail == data[from..]);
}
