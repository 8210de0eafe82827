//! The extent buffer (paper II-B): blocks are packed into a few open extents in RAM, best fit,
//! and written back as segments appended past each extent's durable end. An extent leaves the
//! buffer when it is nearly full, least recently used with the buffer full, or past the aging
//! timeout. Extents come from the checkpoint's allocation queue (`alloc`), which is what bounds
//! recovery to the queued extents.

use crate::format::{segment_padded_len, segment_raw_len, Record};
use std::time::{Duration, Instant};

/// Free extents host writes never take: what the cleaner compacts partly dead extents into (one
/// is enough: a pass reuses the victims it drains, see `cleaner::stream`).
pub(crate) const CLEANER_EXTENTS_MIN: usize = 1;

/// An extent in the extent buffer.
pub struct OpenExtent {
    /// Extent index.
    pub extent: u32,
    /// Allocation sequence its segments carry.
    pub alloc_seq: u64,
    /// Format version of its segments (the volume's).
    pub version: u32,
    /// The extent's bytes (durable part and pending segment).
    pub buf: Vec<u8>,
    /// Bytes already written to storage (sector aligned).
    pub durable_end: usize,
    /// Payload bytes in the pending segment.
    pub payload_len: usize,
    /// Records of the pending segment.
    pub records: Vec<Record>,
    /// When it was opened (aging timeout).
    pub opened: Instant,
    /// `State::next_seq` just after its last append (or at its opening): the least recently
    /// used has the smallest, and no two extents appended to have the same.
    pub last_used: u64,
}

impl OpenExtent {
    /// Bytes used if the pending segment grew by `payload` bytes and `records` records.
    fn end_with(&self, payload: usize, records: usize) -> usize {
        let n = self.records.len() + records;
        if n == 0 {
            return self.durable_end;
        }
        self.durable_end + segment_padded_len(self.version, self.payload_len + payload, n) as usize
    }

    pub(crate) fn fits(&self, payload: usize, records: usize, extent_bytes: usize) -> bool {
        self.end_with(payload, records) <= extent_bytes
    }

    /// Free space left for one more block's payload.
    pub(crate) fn free_bytes(&self, extent_bytes: usize) -> usize {
        extent_bytes.saturating_sub(self.end_with(0, 1))
    }

    /// What `place` needs to know of it, in a few bytes.
    pub(crate) fn room(&self, extent_bytes: usize) -> Room {
        let raw_end = self.durable_end as u64
            + segment_raw_len(self.version, self.payload_len, self.records.len() + 1);
        Room {
            free: self.free_bytes(extent_bytes) as u32,
            // Padding only adds to a segment: no payload larger than this fits with any number
            // of records.
            payload_max: (extent_bytes as u64).saturating_sub(raw_end) as u32,
            last_used: self.last_used,
            opened: self.opened,
        }
    }
}

/// What the scans of every open extent for each block placed (`State::place`) and each write
/// (`State::age`) need to know of one, kept beside it in `State::room`: these scans read a
/// few bytes per extent instead of the extents themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Room {
    /// `OpenExtent::free_bytes`: what best fit minimises.
    pub free: u32,
    /// The largest payload that could fit at all: no other extent is looked at.
    pub payload_max: u32,
    /// `OpenExtent::last_used`.
    pub last_used: u64,
    /// `OpenExtent::opened`.
    pub opened: Instant,
}

/// A block ready to be stored.
pub enum Prepared {
    /// All zeros: map state only.
    Zero,
    /// Stored bytes with codec id and checksum: one block, or a compression unit of `blocks`
    /// consecutive blocks.
    Data {
        /// Codec id.
        codec: u8,
        /// Stored bytes.
        bytes: Vec<u8>,
        /// CRC32C of `bytes`.
        crc: u32,
        /// Logical blocks they hold (1, or a unit's size).
        blocks: u8,
        /// Dictionary they were compressed with (0 = none).
        dict: u8,
    },
}

impl Prepared {
    /// Logical blocks it covers.
    pub fn blocks(&self) -> usize {
        match self {
            Prepared::Zero => 1,
            Prepared::Data { blocks, .. } => usize::from(*blocks),
        }
    }
}

/// Tunables applied at open time.
#[derive(Clone, Debug)]
pub struct BufferConfig {
    /// Maximum extents open in the extent buffer.
    pub max_open: usize,
    /// Maximum time an extent stays open.
    pub aging: Duration,
    /// Extents host writes leave to the cleaner (they may use them only when cleaning fails).
    pub reserve: usize,
}

/// Queued extents left when the allocation queue asks for a refill (`State::alloc`): enough
/// for the writes that come while the checkpoint syncs (in the background thread: handle.rs).
pub(crate) fn refill_at(sb: &crate::format::Superblock) -> usize {
    (sb.queue_len as usize / 8).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extent(version: u32, durable_end: usize, payload_len: usize, records: usize) -> OpenExtent {
        OpenExtent {
            extent: 0,
            alloc_seq: 0,
            version,
            buf: Vec::new(),
            durable_end,
            payload_len,
            records: vec![Record::new(crate::format::RecordKind::Zero, 0, 1, 0); records],
            opened: Instant::now(),
            last_used: 0,
        }
    }

    /// `place` skips an extent whose `payload_max` is below the payload: that must never skip
    /// one that fits, for any fill, version or number of records.
    #[test]
    fn payload_max_never_hides_an_extent_that_fits() {
        const EXT: usize = 32 * 1024;
        let mut checked = 0;
        for version in [1, 2] {
            for durable_end in (0..EXT).step_by(SECTOR_BYTES * 7) {
                for payload_len in [0, 1, 100, 511, 512, 3000, 4096, 9000] {
                    for records in [0, 1, 2, 5] {
                        let oe = extent(version, durable_end, payload_len, records);
                        let room = oe.room(EXT);
                        for len in (0..=EXT).step_by(97) {
                            for n in [1, 2, 16] {
                                if oe.fits(len, n, EXT) {
                                    checked += 1;
                                    assert!(
                                        len <= room.payload_max as usize,
                                        "v{version} end {durable_end} payload {payload_len} \
                                         records {records}: {len} bytes x {n} fit, max {}",
                                        room.payload_max
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(
            checked > 10_000,
            "too few fitting cases exercised: {checked}"
        );
    }
}
