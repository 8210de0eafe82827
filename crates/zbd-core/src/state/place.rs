//! The state's side of the extent buffer: placing a block (best fit, else a new extent from
//! the allocation queue, evicting the least recently used), sealing segments into the outbox,
//! closing and aging open extents.

use super::{Ctx, State};
use crate::buffer::{refill_at, OpenExtent, CLEANER_EXTENTS_MIN};
use crate::error::{Error, Result};
use crate::format::{QueueEntry, SECTOR_BYTES};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Who takes a free extent, each down to its own floor ([`State::floor`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consumer {
    /// A host write opening an extent: at its floor, space is short and the writer cleans
    /// first (the cleaner's reserve, and the space reserve while it is held, stay free).
    HostWrite,
    /// Any open once cleaning has run: the last free extents belong to the cleaner even when
    /// cleaning could not help just now. With nothing left to compact into, dead space made
    /// later (the host trims or overwrites half of every extent) could never be reclaimed and
    /// NoSpace would stick although the live data fits. Zero and trim ranges need no extent
    /// (`log_range`). Above them, the space reserve (while held) is kept for a filesystem's
    /// repair.
    AfterCleaning,
    /// A record without payload (trim, zero) on a volume that never cleans under the lock
    /// (bit 10): it skips "space short" and opens an extent down to the cleaner's last ones,
    /// so the steps that free space never wait for the cleaner; below, it takes the escape
    /// (`State::log_range`: a checkpoint instead of a record).
    Record,
}

impl State {
    /// Chooses the open extent for `len` payload bytes and `records` records: best fit
    /// (fullest extent that still has room), else a new extent, evicting the least recently
    /// used one when the buffer is full (`room_to_open` says whether one may open).
    pub(crate) fn place(&mut self, cx: &Ctx, len: usize, records: usize) -> Result<usize> {
        if let Some(i) = self.buffer.best_fit(len, records) {
            return Ok(i);
        }
        // Closed first, as before cleaning: the extent it closes may be the victim that makes
        // room.
        if self.buffer.is_full() {
            if let Some(i) = self.buffer.least_recently_used() {
                self.close_open(cx, i)?;
            }
        }
        let record = len == 0;
        self.room_to_open(cx, record)?;
        // A record's extent is payload-less when payload could not have opened it.
        let payload_less =
            record && self.cleans_unlocked() && self.free_now() <= self.floor(Consumer::HostWrite);
        self.open_new(cx, payload_less)?;
        Ok(self.buffer.len() - 1)
    }

    /// Whether this volume cleans only with the state lock released: placement reports "space
    /// short" instead of running `make_space` (bit 10; a page-tree map would fault leaves for
    /// every block a pass moves while every other request waits).
    pub fn cleans_unlocked(&self) -> bool {
        matches!(self.map, crate::map::VolumeMap::Tree(_))
    }

    /// Whether an extent may open for a payload or for a `record` without one. v2 cleans
    /// under the lock at the host floor (`make_space`). A volume that `cleans_unlocked`
    /// reports `SpaceShort` there before anything changes, unless the writer's round found
    /// nothing to clean (`below_host_floor`); records skip "space short" down to their floor.
    fn room_to_open(&mut self, cx: &Ctx, record: bool) -> Result<()> {
        self.rearm_reserve_if_room();
        if self.cleans_unlocked() {
            let (consumer, short) = if record {
                (Consumer::Record, Error::NoSpace)
            } else if self.below_host_floor {
                (Consumer::AfterCleaning, Error::NoSpace)
            } else {
                (Consumer::HostWrite, Error::SpaceShort)
            };
            if self.free_now() <= self.floor(consumer) {
                return Err(short);
            }
            return Ok(());
        }
        if self.free_now() <= self.floor(Consumer::HostWrite) {
            // Space is short: host writes wait for the cleaner (run inline, under the lock).
            self.locked_cleanings += 1;
            (cx.make_space)(self, cx)?;
        }
        if self.free_now() <= self.floor(Consumer::AfterCleaning) {
            return Err(Error::NoSpace);
        }
        Ok(())
    }

    fn open_new(&mut self, cx: &Ctx, payload_less: bool) -> Result<()> {
        let q = self.alloc(cx)?;
        self.extents_opened += 1;
        self.extents.open(q.extent);
        let oe = OpenExtent {
            extent: q.extent,
            alloc_seq: q.alloc_seq,
            form: cx.form,
            buf: vec![0; cx.sb.extent_bytes as usize],
            durable_end: 0,
            payload_len: 0,
            records: Vec::new(),
            opened: Instant::now(),
            last_used: self.next_seq,
            payload_less,
        };
        self.buffer.push(oe);
        Ok(())
    }

    /// Extents free now (queued or free).
    pub fn free_now(&self) -> usize {
        self.queue.len() + self.free.len()
    }

    /// Free extents at or below which `consumer` stops taking them. Every threshold on free
    /// extents is this one function (docs/design.md, "Room first, sequence last": bit-10
    /// volumes add their consumers here), so no two places can disagree about a floor.
    pub fn floor(&self, consumer: Consumer) -> usize {
        let held = self.reserve_held();
        match consumer {
            Consumer::HostWrite => self.buffer.config().reserve.max(CLEANER_EXTENTS_MIN) + held,
            Consumer::AfterCleaning => CLEANER_EXTENTS_MIN + held,
            // The cleaner's outputs are chosen at its commit from what is free then (no
            // reserved outputs yet: `cleaner_held` is 0), so only its last extent stays.
            Consumer::Record => CLEANER_EXTENTS_MIN,
        }
    }

    /// Extents host writes may fill: the data area less the floor they stop at with the space
    /// reserve held: the space reserve and the cleaner's last extent (once the cleaner finds
    /// nothing to reclaim, writes go on into its reserve: `Consumer::AfterCleaning`). On a
    /// small data area the space reserve is a large share, so a fullness warning is a share
    /// of this, not of the data area, or writes fail before it fires; counting the cleaner's
    /// whole reserve too, a 16 MiB area filled with live data reached 110 % of it.
    pub fn writable_extents(&self) -> usize {
        let lent = if self.reserve_lent {
            self.space_reserve
        } else {
            0
        };
        let floor = self.floor(Consumer::AfterCleaning) + lent;
        self.extents.len().saturating_sub(floor)
    }

    /// Opening `need` more extents would reach the point where opening one cleans under the
    /// state lock (`open_new`): a writer cleans ahead without it (`Volume::clean_ahead`).
    pub fn space_short_for(&self, need: usize) -> bool {
        self.free_now() <= self.floor(Consumer::HostWrite) + need
    }

    /// Whether cleaning ahead goes on once `reclaimed` emptied victims are free (after a
    /// checkpoint): until the goal of foreground cleaning under the lock (`make_space`).
    pub fn space_short_after(&self, reclaimed: usize) -> bool {
        self.free_now() + reclaimed <= self.clean_goal()
    }

    /// Free extents foreground cleaning aims for: twice the cleaner's reserve, above the space
    /// reserve while it is held.
    pub fn clean_goal(&self) -> usize {
        2 * self.buffer.config().reserve + self.reserve_held()
    }

    /// Free extents host writes leave untouched beyond the cleaner's: the space reserve, unless
    /// it is lent.
    pub fn reserve_held(&self) -> usize {
        if self.reserve_lent {
            0
        } else {
            self.space_reserve
        }
    }

    /// Free extents at or below which an open lends the reserve (`lend_reserve_if_full`): the
    /// reserve plus the room foreground cleaning keeps, i.e. host writes were already being
    /// held back by the reserve (or nearly).
    fn reserve_full_at(&self) -> usize {
        self.space_reserve + 2 * self.buffer.config().reserve
    }

    /// A writable open that finds the volume at its reserve (its last writes got ENOSPC, most
    /// likely) lends the reserve to host writes: the filesystem on top can now replay its
    /// journal and be repaired. True when it did.
    pub fn lend_reserve_if_full(&mut self) -> bool {
        if self.space_reserve == 0 || self.reserve_lent || self.free_now() > self.reserve_full_at()
        {
            return false;
        }
        self.reserve_lent = true;
        // Debug: a server says it in its own words (`zbd serve`'s open line).
        tracing::debug!(
            "space reserve lent: the volume opened at its reserve ({} extents free, reserve {}); \
             writes may use it now (to repair the filesystem: fsck), until free space is back \
             above {} extents",
            self.free_now(),
            self.space_reserve,
            self.reserve_rearm_above()
        );
        true
    }

    /// Free extents above which a lent reserve is held again: the reserve back, and as much
    /// again (hysteresis: a repair that frees and takes a few extents does not flip it).
    fn reserve_rearm_above(&self) -> usize {
        self.space_reserve + self.reserve_full_at()
    }

    /// Takes a lent reserve back once free space is well above it (trims, overwrites that
    /// compress better, the cleaner, a larger data area).
    pub fn rearm_reserve_if_room(&mut self) {
        if self.reserve_lent && self.free_now() > self.reserve_rearm_above() {
            self.reserve_lent = false;
            tracing::info!(
                "space reserve held again: {} extents free (reserve {})",
                self.free_now(),
                self.space_reserve
            );
        }
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
        let durable_seq = cx.durable_seq.load(Ordering::SeqCst);
        if let Some((extent, start, bytes)) = self.buffer.seal(i, &cx.sb.uuid, durable_seq) {
            let offset = cx.sb.extent_offset(extent) + start as u64;
            cx.outbox.push(extent, start, offset, bytes);
            self.counters.data_bytes_written += bytes.len() as u64;
        }
        Ok(())
    }

    /// Writes back open extent `i` and drops it from the buffer.
    pub fn close_open(&mut self, cx: &Ctx, i: usize) -> Result<()> {
        self.write_segment(cx, i)?;
        let oe = self.buffer.remove(i);
        let stamp = self.next_seq as u32;
        self.extents.close(oe.extent, stamp);
        Ok(())
    }

    /// Closes extents past the aging timeout.
    pub fn age(&mut self, cx: &Ctx) -> Result<()> {
        let now = Instant::now();
        while let Some(i) = self.buffer.aged(now) {
            self.close_open(cx, i)?;
        }
        Ok(())
    }

    /// Writes every pending segment (no sync). Extents too full to take another block are closed.
    pub fn write_pending(&mut self, cx: &Ctx) -> Result<()> {
        let mut i = 0;
        while i < self.buffer.len() {
            self.write_segment(cx, i)?;
            if self.buffer.free_bytes(i) < SECTOR_BYTES {
                self.close_open(cx, i)?;
            } else {
                i += 1;
            }
        }
        Ok(())
    }
}
