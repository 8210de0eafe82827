//! The extent buffer (paper II-B): blocks are packed into a few open extents in RAM, best fit,
//! and written back as segments appended past each extent's durable end. An extent leaves the
//! buffer when it is nearly full, least recently used with the buffer full, or past the aging
//! timeout. Extents come from the checkpoint's allocation queue (`alloc`), which is what bounds
//! recovery to the queued extents.

use crate::format::{
    align_up, seal_segment, Record, RecordKind, SegmentForm, SegmentHeader, SEGMENT_HEADER_BYTES,
    UNIT_BLOCKS_MAX,
};
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
    /// Layout of its segments (the volume's, `Ctx::form`).
    pub form: SegmentForm,
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
    /// Opened by a record without payload at or below the host payload floor (bit 10: the
    /// volume's one payload-less extent, docs/design.md "Room first, sequence last"): best fit
    /// never puts payload in it, so payload never takes the cleaner's last extents that way.
    pub payload_less: bool,
}

impl OpenExtent {
    /// Bytes used if the pending segment grew by `payload` bytes and `records` records.
    fn end_with(&self, payload: usize, records: usize) -> usize {
        let n = self.records.len() + records;
        if n == 0 {
            return self.durable_end;
        }
        self.durable_end + self.form.padded_len(self.payload_len + payload, n) as usize
    }

    pub(crate) fn fits(&self, payload: usize, records: usize, extent_bytes: usize) -> bool {
        self.end_with(payload, records) <= extent_bytes
    }

    /// Free space left for one more block's payload.
    pub(crate) fn free_bytes(&self, extent_bytes: usize) -> usize {
        extent_bytes.saturating_sub(self.end_with(0, 1))
    }

    /// What `place` needs to know of it, in a few bytes.
    fn room(&self, extent_bytes: usize) -> Room {
        let raw_end =
            self.durable_end as u64 + self.form.raw_len(self.payload_len, self.records.len() + 1);
        Room {
            free: self.free_bytes(extent_bytes) as u32,
            // Padding only adds to a segment: no payload larger than this fits with any number
            // of records. A payload-less extent takes records only.
            payload_max: if self.payload_less {
                0
            } else {
                (extent_bytes as u64).saturating_sub(raw_end) as u32
            },
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
        /// Item checksum of `bytes` (`format::item_crc`).
        crc: u32,
        /// Whether `crc` is seeded (v3).
        seeded: bool,
        /// Logical blocks they hold (1, or a unit's size).
        blocks: u8,
        /// Dictionary they were compressed with (0 = none).
        dict: u8,
        /// Per block, the fingerprint its record carries (`Record::fingerprint`; 0 = none:
        /// segments without 64-byte records have no room for it).
        fingerprints: [u32; UNIT_BLOCKS_MAX as usize],
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
/// for the writes that come while the checkpoint syncs (in the background thread: volume.rs).
pub(crate) fn refill_at(sb: &crate::format::Superblock) -> usize {
    (sb.queue_len as usize / 8).max(1)
}

/// The open extents, each with its [`Room`] kept beside it (the invariant `room[i] ==
/// open[i].room(..)` is kept by every change, all of which go through this type).
pub struct ExtentBuffer {
    open: Vec<OpenExtent>,
    room: Vec<Room>,
    config: BufferConfig,
    extent_bytes: usize,
    /// Sealed segments are padded to this (`Storage::write_align`), so each write-back covers
    /// whole device blocks and the next segment starts on one.
    write_align: usize,
}

impl ExtentBuffer {
    /// An empty buffer for extents of `extent_bytes`, sealing segments padded to `write_align`
    /// (a power of two that divides `extent_bytes`).
    pub fn new(config: BufferConfig, extent_bytes: usize, write_align: usize) -> Self {
        assert!(
            write_align.is_power_of_two() && extent_bytes.is_multiple_of(write_align),
            "write alignment {write_align} does not divide extents of {extent_bytes}"
        );
        ExtentBuffer {
            open: Vec::new(),
            room: Vec::new(),
            config,
            extent_bytes,
            write_align,
        }
    }

    /// Its tunables.
    pub fn config(&self) -> &BufferConfig {
        &self.config
    }

    /// Its tunables, to change (tests).
    #[cfg(test)]
    pub fn config_mut(&mut self) -> &mut BufferConfig {
        &mut self.config
    }

    /// Open extents.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// Open extent `i`.
    pub fn get(&self, i: usize) -> &OpenExtent {
        &self.open[i]
    }

    /// Every open extent.
    pub fn iter(&self) -> impl Iterator<Item = &OpenExtent> {
        self.open.iter()
    }

    /// Where open extent `extent` is in the buffer, if it is open.
    pub fn position(&self, extent: u32) -> Option<usize> {
        self.open.iter().position(|o| o.extent == extent)
    }

    /// Best fit for `len` payload bytes and `records` records: the first of the fullest open
    /// extents they fit in, looking only at those whose room says the payload could fit.
    pub fn best_fit(&self, len: usize, records: usize) -> Option<usize> {
        debug_assert!(
            self.room.len() == self.open.len()
                && (self.open.iter().zip(&self.room)).all(|(o, &r)| o.room(self.extent_bytes) == r),
            "room out of step with the open extents"
        );
        let mut best: Option<(usize, u32)> = None;
        for (i, room) in self.room.iter().enumerate() {
            if room.payload_max as usize >= len
                && best.is_none_or(|(_, free)| room.free < free)
                && self.open[i].fits(len, records, self.extent_bytes)
            {
                best = Some((i, room.free));
            }
        }
        best.map(|(i, _)| i)
    }

    /// Whether another extent may open only after one is closed.
    pub fn is_full(&self) -> bool {
        self.open.len() >= self.config.max_open.max(1)
    }

    /// The least recently used open extent.
    pub fn least_recently_used(&self) -> Option<usize> {
        (self.room.iter().enumerate())
            .min_by_key(|(_, r)| r.last_used)
            .map(|(i, _)| i)
    }

    /// The first open extent past the aging timeout at `now`.
    pub fn aged(&self, now: Instant) -> Option<usize> {
        (self.room.iter()).position(|r| now.duration_since(r.opened) > self.config.aging)
    }

    /// Free bytes left in open extent `i` for one more block's payload.
    pub fn free_bytes(&self, i: usize) -> usize {
        self.room[i].free as usize
    }

    /// Adds a newly opened extent (it becomes the last).
    pub fn push(&mut self, oe: OpenExtent) {
        self.room.push(oe.room(self.extent_bytes));
        self.open.push(oe);
    }

    /// Takes open extent `i` out of the buffer (the last one takes its place).
    pub fn remove(&mut self, i: usize) -> OpenExtent {
        self.room.swap_remove(i);
        self.open.swap_remove(i)
    }

    /// Where the next payload appended to open extent `i` starts in the extent.
    pub fn next_offset(&self, i: usize) -> usize {
        let oe = &self.open[i];
        oe.durable_end + SEGMENT_HEADER_BYTES + oe.payload_len
    }

    /// Appends a payload and the records naming it to the pending segment of open extent `i`
    /// (at [`ExtentBuffer::next_offset`]); `used` is its new last use. Returns its free bytes.
    pub fn append(&mut self, i: usize, bytes: &[u8], records: Vec<Record>, used: u64) -> usize {
        let offset = self.next_offset(i);
        let oe = &mut self.open[i];
        oe.buf[offset..offset + bytes.len()].copy_from_slice(bytes);
        oe.payload_len += bytes.len();
        oe.records.extend(records);
        oe.last_used = used;
        self.note_room(i)
    }

    /// Extends the zero or trim record written last (sequence `last_seq`) by `count` blocks if
    /// it ends at `lba` (sequential zeroing); false when there is no such record.
    pub fn extend_range(&mut self, kind: RecordKind, lba: u64, count: u32, last_seq: u64) -> bool {
        for oe in self.open.iter_mut() {
            if let Some(r) = oe.records.last_mut() {
                if r.kind == kind && r.seq == last_seq && r.lba + u64::from(r.count) == lba {
                    if let Some(c) = r.count.checked_add(count) {
                        r.count = c;
                        return true;
                    }
                }
            }
        }
        false
    }

    /// Seals the pending segment of open extent `i` (nothing when it has no record): returns
    /// the extent, the segment's start in it and its bytes, to be written there, padded with
    /// zeros to the write alignment (the next segment starts past the padding).
    pub fn seal(
        &mut self,
        i: usize,
        uuid: &[u8; 16],
        durable_seq: u64,
    ) -> Option<(u32, usize, &[u8])> {
        let oe = &mut self.open[i];
        if oe.records.is_empty() {
            return None;
        }
        let h = SegmentHeader {
            version: oe.form.version,
            flags: oe.form.flags,
            alloc_seq: oe.alloc_seq,
            extent: oe.extent,
            seg_offset: oe.durable_end as u32,
            payload_len: oe.payload_len as u32,
            record_count: oe.records.len() as u32,
            durable_seq,
        };
        let n = seal_segment(&mut oe.buf, uuid, &h, &oe.records);
        let start = oe.durable_end;
        debug_assert_eq!(start % self.write_align, 0, "segment start not aligned");
        // The extent's bytes past the segment were never written (zeros): padding. The extent
        // size is a multiple of the alignment, so the padded end stays inside it.
        let n = align_up((start + n) as u64, self.write_align as u64) as usize - start;
        debug_assert!(oe.buf[start..start + n].len() == n && start + n <= oe.buf.len());
        oe.durable_end += n;
        oe.payload_len = 0;
        oe.records.clear();
        self.note_room(i);
        let oe = &self.open[i];
        Some((oe.extent, start, &oe.buf[start..start + n]))
    }

    /// Records the room left in open extent `i` after a change to it; returns its free bytes.
    fn note_room(&mut self, i: usize) -> usize {
        self.room[i] = self.open[i].room(self.extent_bytes);
        self.room[i].free as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{SECTOR_BYTES, SEG_FLAG_4K, SEG_FLAG_WIDE_RECORDS};

    fn extent(
        form: SegmentForm,
        durable_end: usize,
        payload_len: usize,
        records: usize,
    ) -> OpenExtent {
        OpenExtent {
            extent: 0,
            alloc_seq: 0,
            form,
            buf: Vec::new(),
            durable_end,
            payload_len,
            records: vec![Record::new(crate::format::RecordKind::Zero, 0, 1, 0); records],
            opened: Instant::now(),
            last_used: 0,
            payload_less: false,
        }
    }

    /// `place` skips an extent whose `payload_max` is below the payload: that must never skip
    /// one that fits, for any fill, form or number of records.
    #[test]
    fn payload_max_never_hides_an_extent_that_fits() {
        const EXT: usize = 32 * 1024;
        let mut checked = 0;
        let wide = SEG_FLAG_WIDE_RECORDS;
        let forms = [(1, 0), (2, 0), (3, wide), (3, wide | SEG_FLAG_4K)]
            .map(|(version, flags)| SegmentForm { version, flags });
        for form in forms {
            for durable_end in (0..EXT).step_by(SECTOR_BYTES * 7) {
                for payload_len in [0, 1, 100, 511, 512, 3000, 4096, 9000] {
                    for records in [0, 1, 2, 5] {
                        let oe = extent(form, durable_end, payload_len, records);
                        let room = oe.room(EXT);
                        for len in (0..=EXT).step_by(97) {
                            for n in [1, 2, 16] {
                                if oe.fits(len, n, EXT) {
                                    checked += 1;
                                    assert!(
                                        len <= room.payload_max as usize,
                                        "{form:?} end {durable_end} payload {payload_len} \
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
