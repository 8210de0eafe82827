//! Storage backends: the one trait the engine does I/O through ([`Storage`]) and what
//! implements it. `file` (a file or block device), `mem` (RAM, for benchmarks), `queued` (the
//! I/O thread pool in front of a device), `fence` (the failed state above everything), `sim`
//! (the simulated disk of crash and fault tests). Ceph RADOS lives in its own crate (zbd-rados)
//! behind the same trait.

pub(crate) mod fence;
pub mod file;
pub mod mem;
pub mod queued;
pub mod sim;

pub use file::FileStorage;
pub use mem::MemStorage;
pub use queued::{IoOptions, QueuedStorage};
pub use sim::SimStorage;

use crate::error::Result;
use crate::format::SECTOR_BYTES;

/// The largest write alignment the engine pads to (4 KiB-sector devices). Every on-disk
/// structure other than log segments (superblocks, checkpoint slots, map and table pages,
/// dictionary regions, extents) is laid out in multiples of 4 KiB already.
pub const WRITE_ALIGN_MAX: usize = 4096;

/// Byte-addressed storage below a volume. Implementations must be usable from many threads.
///
/// Assumptions the engine makes (docs/format.md, "medium"): a write that returned may be lost or
/// torn at 512-byte sector granularity until `sync` returns; after `sync` returns it is durable;
/// `discard` releases a range, which may afterwards read back as zeros, as its old contents, or
/// (some devices after a block discard) as anything at all: the engine validates everything it
/// reads from an extent (magic, uuid, allocation sequence, CRCs), so it never trusts freed space.
pub trait Storage: Send + Sync {
    /// Size in bytes.
    fn len_bytes(&self) -> Result<u64>;
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()>;
    /// Writes all of `data` at `offset`.
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()>;
    /// [`Storage::write_at`] of bytes the caller shares: a layer that keeps written bytes after
    /// returning (the I/O queue) keeps this buffer instead of a copy of it, so a checkpoint's map
    /// pages and a sealed segment are not in RAM twice while queued.
    fn write_shared(&self, offset: u64, data: &std::sync::Arc<[u8]>) -> Result<()> {
        self.write_at(offset, data)
    }
    /// Makes every completed write durable.
    fn sync(&self) -> Result<()>;
    /// Releases a range (punches a hole in a file; BLKDISCARD on a block device). Best effort.
    fn discard(&self, offset: u64, len: u64) -> Result<()>;
    /// Writes at offsets and of lengths that are multiples of this need no read-modify-write
    /// below (the device's logical block where it is known): the engine pads its log segments
    /// to it. A power of two from 512 to [`WRITE_ALIGN_MAX`].
    fn write_align(&self) -> usize {
        SECTOR_BYTES
    }
    /// Reads several ranges, each `(offset, buffer)` filled as by `read_at`; one result per
    /// range. The engine hands it every extent one host read needs. The default reads them one
    /// after the other (a buffered file: mostly the page cache); a store where each read is a
    /// round trip has them in flight at once (RADOS; a file with O_DIRECT through
    /// [`read_concurrently`]).
    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<Result<()>> {
        reads
            .iter_mut()
            .map(|(offset, buf)| self.read_at(*offset, buf))
            .collect()
    }
}

/// Reads `reads` as [`Storage::read_many`] does, with up to `width` of them in flight at once:
/// the calling thread and up to `width - 1` scoped helper threads each take the next range from
/// a shared cursor until none is left. For a storage whose every read is a device round trip
/// (a file or device opened with O_DIRECT): read one after the other, the extents of one host
/// read cost one device latency each, and on a disk that charges milliseconds per request
/// (issue 30: PostMark on XFS, one host read in six needed 2-5 device reads) that latency is
/// what the reader waits for. Helpers are only started for two or more ranges; if the system
/// refuses a thread, fewer run (the caller alone at worst), never an error.
pub fn read_concurrently<S: Storage + ?Sized>(
    storage: &S,
    reads: &mut [(u64, &mut [u8])],
    width: usize,
) -> Vec<Result<()>> {
    if reads.len() < 2 || width < 2 {
        return reads
            .iter_mut()
            .map(|(offset, buf)| storage.read_at(*offset, buf))
            .collect();
    }
    let helpers = width.min(reads.len()) - 1;
    let mut results: Vec<Option<Result<()>>> = reads.iter().map(|_| None).collect();
    let cursor = parking_lot::Mutex::new(reads.iter_mut().zip(results.iter_mut()));
    let work = || loop {
        let next = cursor.lock().next();
        let Some(((offset, buf), slot)) = next else {
            break;
        };
        *slot = Some(storage.read_at(*offset, buf));
    };
    std::thread::scope(|scope| {
        for _ in 0..helpers {
            let started = std::thread::Builder::new()
                .name("zbd-read".into())
                .spawn_scoped(scope, work);
            if started.is_err() {
                break;
            }
        }
        work();
    });
    results
        .into_iter()
        .map(|r| r.expect("every range was taken and read before the scope ended"))
        .collect()
}

impl<S: Storage + ?Sized> Storage for std::sync::Arc<S> {
    fn len_bytes(&self) -> Result<u64> {
        (**self).len_bytes()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        (**self).read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        (**self).write_at(offset, data)
    }
    fn write_shared(&self, offset: u64, data: &std::sync::Arc<[u8]>) -> Result<()> {
        (**self).write_shared(offset, data)
    }
    fn sync(&self) -> Result<()> {
        (**self).sync()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        (**self).discard(offset, len)
    }
    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<Result<()>> {
        (**self).read_many(reads)
    }
    fn write_align(&self) -> usize {
        (**self).write_align()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use parking_lot::{Condvar, Mutex};
    use std::time::Duration;

    /// Counts reads in flight. Until `company` reads have once been in flight together, each
    /// read waits for them (at most `patience`), so reads issued one after the other show as one
    /// in flight at a time; after that meeting nobody waits. Each read fills its buffer with the
    /// low byte of its offset (offsets past `len` fail).
    struct Counting {
        company: usize,
        patience: Duration,
        len: u64,
        in_flight: Mutex<usize>,
        met: Mutex<bool>,
        most: Mutex<usize>,
        arrived: Condvar,
    }

    impl Counting {
        /// `company` readers must meet; the wait is long, so a slow thread start on a loaded
        /// machine cannot make a concurrent batch look serial.
        fn new(company: usize) -> Self {
            Counting::with_patience(company, Duration::from_secs(20))
        }

        fn with_patience(company: usize, patience: Duration) -> Self {
            Counting {
                company,
                patience,
                len: 1 << 20,
                in_flight: Mutex::new(0),
                met: Mutex::new(false),
                most: Mutex::new(0),
                arrived: Condvar::new(),
            }
        }
    }

    impl Storage for Counting {
        fn len_bytes(&self) -> Result<u64> {
            Ok(self.len)
        }
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
            {
                let mut n = self.in_flight.lock();
                *n += 1;
                let mut most = self.most.lock();
                *most = (*most).max(*n);
                drop(most);
                if *n >= self.company {
                    *self.met.lock() = true;
                }
                self.arrived.notify_all();
                let company = self.company;
                self.arrived.wait_while_for(
                    &mut n,
                    |n| *n < company && !*self.met.lock(),
                    self.patience,
                );
            }
            let result = if offset + buf.len() as u64 > self.len {
                Err(Error::Io(std::io::Error::other("past the end")))
            } else {
                buf.fill(offset as u8);
                Ok(())
            };
            *self.in_flight.lock() -= 1;
            result
        }
        fn write_at(&self, _offset: u64, _data: &[u8]) -> Result<()> {
            Ok(())
        }
        fn sync(&self) -> Result<()> {
            Ok(())
        }
        fn discard(&self, _offset: u64, _len: u64) -> Result<()> {
            Ok(())
        }
    }

    fn batch(offsets: &[u64]) -> Vec<(u64, Vec<u8>)> {
        offsets.iter().map(|&o| (o, vec![0u8; 4096])).collect()
    }

    fn read(storage: &Counting, ranges: &mut [(u64, Vec<u8>)], width: usize) -> Vec<Result<()>> {
        let mut reads: Vec<(u64, &mut [u8])> = ranges
            .iter_mut()
            .map(|(o, b)| (*o, b.as_mut_slice()))
            .collect();
        read_concurrently(storage, &mut reads, width)
    }

    #[test]
    fn a_batch_is_in_flight_together_up_to_the_width() {
        let storage = Counting::new(4);
        let mut ranges = batch(&[1, 2, 3, 4, 5, 6]);
        let results = read(&storage, &mut ranges, 4);
        assert!(results.iter().all(|r| r.is_ok()));
        for (offset, buf) in &ranges {
            assert!(
                buf.iter().all(|&b| b == *offset as u8),
                "range {offset} misread"
            );
        }
        assert_eq!(*storage.most.lock(), 4, "reads in flight at most");
    }

    #[test]
    fn width_one_reads_one_after_the_other() {
        // Serial reads never meet: each waits out its patience, and a second read in flight
        // during that wait would show.
        let storage = Counting::with_patience(2, Duration::from_millis(300));
        let mut ranges = batch(&[1, 2, 3]);
        assert!(read(&storage, &mut ranges, 1).iter().all(|r| r.is_ok()));
        assert_eq!(*storage.most.lock(), 1);
    }

    #[test]
    fn a_failed_range_fails_alone_and_results_keep_their_order() {
        let storage = Counting::new(3);
        let mut ranges = batch(&[7, 2 << 20, 9]);
        let results = read(&storage, &mut ranges, 8);
        assert!(results[0].is_ok() && results[1].is_err() && results[2].is_ok());
        assert!(ranges[0].1.iter().all(|&b| b == 7) && ranges[2].1.iter().all(|&b| b == 9));
        assert_eq!(*storage.most.lock(), 3);
    }
}
