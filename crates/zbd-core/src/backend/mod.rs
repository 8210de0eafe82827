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
    /// range. The engine hands it every extent one host read needs. A local file reads them one
    /// after the other (the default); a network store, where each read is a round trip, has
    /// them all in flight at once.
    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Vec<Result<()>> {
        reads
            .iter_mut()
            .map(|(offset, buf)| self.read_at(*offset, buf))
            .collect()
    }
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
