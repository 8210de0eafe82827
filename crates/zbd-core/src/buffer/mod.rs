//! The extent buffer (paper II-B): blocks are packed into a few open extents in RAM, best fit,
//! and written back as segments appended past each extent's durable end. An extent leaves the
//! buffer when it is nearly full, least recently used with the buffer full, or past the aging
//! timeout. Extents come from the checkpoint's allocation queue (`alloc`), which is what bounds
//! recovery to the queued extents.

use crate::error::{Error, Result};
use crate::format::{
    seal_segment, segment_padded_len, segment_raw_len, QueueEntry, Record, SegmentHeader,
    SECTOR_BYTES,
};
use crate::state::{Ctx, ExtentState, State};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Free extents host writes never take: what the cleaner compacts partly dead extents into (one
/// is enough: a pass reuses the victims it drains, see `cleaner::stream`).
const CLEANER_EXTENTS_MIN: usize = 1;

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
    fn room(&self, extent_bytes: usize) -> Room {
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

impl State {
    /// Chooses the open extent for `len` payload bytes and `records` records: best fit
    /// (fullest extent that still has room), else a new extent, evicting the least recently
    /// used one when the buffer is full.
    pub(crate) fn place(&mut self, cx: &Ctx, len: usize, records: usize) -> Result<usize> {
        let ext_bytes = cx.sb.extent_bytes as usize;
        debug_assert!(
            self.room.len() == self.open.len()
                && (self.open.iter().zip(&self.room)).all(|(o, &r)| o.room(ext_bytes) == r),
            "room out of step with the open extents"
        );
        // Best fit, as a scan of every open extent would choose (the first of the fullest that
        // fit), looking only at those whose room says the payload could fit.
        let mut best: Option<(usize, u32)> = None;
        for (i, room) in self.room.iter().enumerate() {
            if room.payload_max as usize >= len
                && best.is_none_or(|(_, free)| room.free < free)
                && self.open[i].fits(len, records, ext_bytes)
            {
                best = Some((i, room.free));
            }
        }
        if let Some((i, _)) = best {
            return Ok(i);
        }
        if self.open.len() >= self.buffer.max_open.max(1) {
            let lru = self
                .room
                .iter()
                .enumerate()
                .min_by_key(|(_, r)| r.last_used)
                .map(|(i, _)| i);
            if let Some(i) = lru {
                self.close_open(cx, i)?;
            }
        }
        self.open_new(cx)?;
        Ok(self.open.len() - 1)
    }

    /// Records the room left in open extent `i` after a change to it; returns its free bytes.
    pub(crate) fn note_room(&mut self, i: usize, ext_bytes: usize) -> usize {
        self.room[i] = self.open[i].room(ext_bytes);
        self.room[i].free as usize
    }

    fn open_new(&mut self, cx: &Ctx) -> Result<()> {
        if self.free_now() <= self.buffer.reserve.max(CLEANER_EXTENTS_MIN) {
            // Space is short: host writes wait for the cleaner (run inline, under the lock).
            (cx.make_space)(self, cx)?;
        }
        // The last free extents belong to the cleaner even when cleaning could not help just
        // now: with nothing left to compact into, dead space made later (the host trims or
        // overwrites half of every extent) could never be reclaimed and NoSpace would stick
        // although the live data fits. Zero and trim ranges need no extent (`log_range`).
        if self.free_now() <= CLEANER_EXTENTS_MIN {
            return Err(Error::NoSpace);
        }
        let q = self.alloc(cx)?;
        self.extents_opened += 1;
        self.extents[q.extent as usize].state = ExtentState::Open;
        let oe = OpenExtent {
            extent: q.extent,
            alloc_seq: q.alloc_seq,
            version: cx.sb.version,
            buf: vec![0; cx.sb.extent_bytes as usize],
            durable_end: 0,
            payload_len: 0,
            records: Vec::new(),
            opened: Instant::now(),
            last_used: self.next_seq,
        };
        self.room.push(oe.room(cx.sb.extent_bytes as usize));
        self.open.push(oe);
        Ok(())
    }

    /// Extents free now (queued or free).
    pub fn free_now(&self) -> usize {
        self.queue.len() + self.free.len()
    }

    /// Opening `need` more extents would reach the point where opening one cleans under the
    /// state lock (`open_new`): a writer cleans ahead without it (`Volume::clean_ahead`).
    pub fn space_short_for(&self, need: usize) -> bool {
        self.free_now() <= self.buffer.reserve.max(CLEANER_EXTENTS_MIN) + need
    }

    /// Whether cleaning ahead goes on once `reclaimed` emptied victims are free (after a
    /// checkpoint): until the goal of foreground cleaning under the lock (`make_space`).
    pub fn space_short_after(&self, reclaimed: usize) -> bool {
        self.free_now() + reclaimed <= 2 * self.buffer.reserve
    }

    /// Takes the next extent of the allocation queue, refilling the queue with a checkpoint
    /// (which also releases extents freed since the last one).
    /// The refill is asked for early (an eighth of the queue left), to run outside the state
    /// lock (`Volume::checkpoint_unlocked`); only a queue that runs dry all the same makes the
    /// caller write it (or wait for the one in flight) with the lock held.
    pub fn alloc(&mut self, cx: &Ctx) -> Result<QueueEntry> {
        if self.queue.is_empty() {
            self.join_checkpoint(cx)?;
        }
        if self.queue.is_empty() {
            self.checkpoint(cx)?;
        }
        let q = self.queue.pop_front().ok_or(Error::NoSpace)?;
        if self.refill_early && self.queue.len() <= refill_at(cx.sb) && self.inflight.is_none() {
            self.ckpt_wanted = true;
        }
        Ok(q)
    }

    /// Seals the pending segment of open extent `i` and hands it to the outbox, which issues it
    /// to the storage once the state lock is released (no sync).
    pub(crate) fn write_segment(&mut self, cx: &Ctx, i: usize) -> Result<()> {
        let oe = &mut self.open[i];
        if oe.records.is_empty() {
            return Ok(());
        }
        let h = SegmentHeader {
            version: cx.sb.version,
            alloc_seq: oe.alloc_seq,
            extent: oe.extent,
            seg_offset: oe.durable_end as u32,
            payload_len: oe.payload_len as u32,
            record_count: oe.records.len() as u32,
            durable_seq: cx.durable_seq.load(Ordering::SeqCst),
        };
        let n = seal_segment(&mut oe.buf, &cx.sb.uuid, &h, &oe.records);
        let start = oe.durable_end;
        cx.outbox.push(
            oe.extent,
            start,
            cx.sb.extent_offset(oe.extent) + start as u64,
            &oe.buf[start..start + n],
        );
        oe.durable_end += n;
        oe.payload_len = 0;
        oe.records.clear();
        self.note_room(i, cx.sb.extent_bytes as usize);
        self.counters.data_bytes_written += n as u64;
        Ok(())
    }

    /// Writes back open extent `i` and drops it from the buffer.
    pub fn close_open(&mut self, cx: &Ctx, i: usize) -> Result<()> {
        self.write_segment(cx, i)?;
        let oe = self.open.swap_remove(i);
        self.room.swap_remove(i);
        let stamp = self.next_seq as u32;
        let x = &mut self.extents[oe.extent as usize];
        x.state = if x.live_blocks == 0 {
            ExtentState::PendingFree
        } else {
            ExtentState::Closed
        };
        x.stamp = stamp;
        Ok(())
    }

    /// Closes extents past the aging timeout.
    pub fn age(&mut self, cx: &Ctx) -> Result<()> {
        let now = Instant::now();
        while let Some(i) = self
            .room
            .iter()
            .position(|r| now.duration_since(r.opened) > self.buffer.aging)
        {
            self.close_open(cx, i)?;
        }
        Ok(())
    }

    /// Writes every pending segment (no sync). Extents too full to take another block are closed.
    pub fn write_pending(&mut self, cx: &Ctx) -> Result<()> {
        let mut i = 0;
        while i < self.open.len() {
            self.write_segment(cx, i)?;
            if (self.room[i].free as usize) < SECTOR_BYTES {
                self.close_open(cx, i)?;
            } else {
                i += 1;
            }
        }
        Ok(())
    }
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
