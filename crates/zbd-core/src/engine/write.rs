//! The write path: compress outside the lock (single blocks or compression units, in
//! parallel), then, under the state lock, place into the extent buffer and set the map
//! (`State::put_block`); partial blocks by read-modify-write; zeroes and trims as ranges.

use super::*;
use crate::backend::Storage;
use crate::buffer::Prepared;
use crate::codec::dict::Dictionary;
use crate::codec::{self, unit, Codec};
use crate::dedup::Fingerprint;
use crate::error::{Error, Result};
use crate::format::{
    BlockState, MapEntry, RecordKind, BLOCK_BYTES, SECTOR_BYTES, SEG_FLAG_WIDE_RECORDS,
    UNIT_BLOCKS_MAX,
};
use crate::state::{is_zero, State};

/// One piece of a whole-block write, as prepared outside the lock.
enum Piece {
    /// A block or unit to store (or a zero block).
    Item(Prepared),
    /// A block equal to a stored one (inline dedup).
    Ref(crate::state::Hit),
    /// A block equal to the request's block at this index (inline dedup).
    Copy(usize),
}

impl Inner {
    /// Whether `p` names no dictionary or one the directory lists (`State::lists_dict`).
    pub(super) fn listed(st: &State, p: &Prepared) -> bool {
        match p {
            Prepared::Zero => true,
            Prepared::Data { dict, .. } => st.lists_dict(*dict),
        }
    }

    /// Compresses one full block (outside any lock).
    pub(super) fn prepare(&self, block: &[u8]) -> Prepared {
        self.prepare_with(block, &[])
    }

    /// [`Inner::prepare`], given the block's fingerprint if inline dedup computed it.
    fn prepare_with(&self, block: &[u8], known: &[Option<Fingerprint>]) -> Prepared {
        if is_zero(block) {
            return Prepared::Zero;
        }
        let active = self.dicts.active();
        let z = match &active {
            Some(d) => d.compress(self.codec, block),
            None => self.codec.compress(block),
        };
        // Keep the compressed form only if it saves at least one sector.
        let (codec, bytes, dict) = match z {
            Some(z) if z.len() + SECTOR_BYTES <= BLOCK_BYTES => {
                if active.is_some() {
                    self.dicts.note(BLOCK_BYTES, z.len());
                }
                self.dicts.sample(block);
                (self.codec.id(), z, active)
            }
            _ => (codec::id::RAW, block.to_vec(), None),
        };
        self.prepared(block, codec, bytes, dict.as_deref(), known)
    }

    /// A prepared item of the blocks `raw`, stored as `bytes`, with the checksum new items of
    /// this volume carry (seeded from v3) and, where its records have room (bit 11), each
    /// block's fingerprint (`known`: the blocks' fingerprints as inline dedup computed them,
    /// not computed twice; empty or `None` where it did not).
    fn prepared(
        &self,
        raw: &[u8],
        codec: u8,
        bytes: Vec<u8>,
        dict: Option<&Dictionary>,
        known: &[Option<Fingerprint>],
    ) -> Prepared {
        let blocks = (raw.len() / BLOCK_BYTES) as u8;
        let id = dict.map(|d| d.identity());
        let (crc, seeded) = self
            .sb
            .new_item_checksum(codec, blocks, id.as_ref(), &bytes);
        let mut fingerprints = [0; UNIT_BLOCKS_MAX as usize];
        if self.seg_form.flags & SEG_FLAG_WIDE_RECORDS != 0 {
            for (i, (f, b)) in fingerprints
                .iter_mut()
                .zip(raw.chunks(BLOCK_BYTES))
                .enumerate()
            {
                *f = known
                    .get(i)
                    .copied()
                    .flatten()
                    .unwrap_or_else(|| match &self.dedup {
                        Some(dd) => dd.fingerprint(b),
                        None => Fingerprint::of(b),
                    })
                    .manifest_part();
            }
        }
        Prepared::Data {
            codec,
            bytes,
            crc,
            seeded,
            blocks,
            dict: dict.map_or(0, |d| d.id() as u8),
            fingerprints,
        }
    }

    /// Compresses consecutive non-zero blocks as one unit (outside any lock). A unit that does
    /// not save a sector is stored as raw single blocks: never more than `none` would store,
    /// and reads of them decode nothing.
    pub(super) fn prepare_unit(&self, data: &[u8], known: &[Option<Fingerprint>]) -> Vec<Prepared> {
        let n = data.len() / BLOCK_BYTES;
        if n == 1 {
            return vec![self.prepare_with(data, known)];
        }
        let active = self.dicts.active();
        match unit::compress_unit(self.codec, active.as_deref(), data) {
            Ok(u) if u.codec_id != codec::id::RAW => {
                if u.dict_id != 0 {
                    self.dicts.note(data.len(), u.bytes.len());
                }
                self.dicts.sample(data);
                let dict = active.as_deref().filter(|_| u.dict_id != 0);
                vec![self.prepared(data, u.codec_id, u.bytes, dict, known)]
            }
            _ => data
                .chunks(BLOCK_BYTES)
                .enumerate()
                .map(|(i, b)| {
                    let known = known.get(i..).unwrap_or_default();
                    self.prepared(b, codec::id::RAW, b.to_vec(), None, known)
                })
                .collect(),
        }
    }

    /// Writes `data` at byte `offset`. With `fua`, returns only once the data is durable.
    pub fn write(&self, device: u32, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.check_writable()?;
        let base = self.check_range(device, offset, data.len() as u64, true)?;
        if data.is_empty() {
            return Ok(());
        }
        let _busy = crate::par::busy();
        // Cleaning ahead is an optimisation: a failure of it (a victim that does not read) must
        // not refuse a write that fits. make_space meets the same error only if the write
        // needs the space. A failed device write or sync has tripped the fence: then this
        // write fails too, before it takes effect, like every write after it.
        if let Err(e) = self.clean_ahead(data.len()) {
            tracing::warn!("cleaning ahead of a write failed: {e}");
            self.check_writable()?;
        }
        self.wait_for_queue_refill(data.len());
        let bs = BLOCK_BYTES as u64;
        let end = offset + data.len() as u64;
        let first_full = offset.div_ceil(bs);
        let end_full = end / bs;
        if first_full >= end_full {
            // Everything inside one or two partial blocks.
            self.write_partial_range(base, offset, data)?;
        } else {
            let head = (first_full * bs - offset) as usize;
            let tail_start = (end_full * bs - offset) as usize;
            if head > 0 {
                self.write_partial_range(base, offset, &data[..head])?;
            }
            self.write_full_blocks(base + first_full, &data[head..tail_start])?;
            if tail_start < data.len() {
                self.write_partial_range(base, end_full * bs, &data[tail_start..])?;
            }
        }
        let wanted = {
            let mut st = self.state.lock();
            st.counters.host_bytes_written += data.len() as u64;
            st.ckpt_wanted
        };
        self.issue_sealed()?;
        // The write itself is done: a dictionary that fails to install must not fail it, unless
        // a failed write or sync there has tripped the fence (then no write succeeds).
        if let Err(e) = self.train_if_ready() {
            tracing::warn!("trained dictionary not installed: {e}");
            self.check_writable()?;
        }
        if fua {
            self.flush()?;
        }
        if wanted {
            self.checkpoint_asked()?;
        }
        Ok(())
    }

    /// Writes whole blocks: with dedup on, blocks equal to one already stored become
    /// references (engine/dedup/inline.rs); runs of the other non-zero blocks become
    /// compression units (aligned to LBA multiples of the unit size, `unit::plan_units`), zero
    /// blocks map states.
    pub(super) fn write_full_blocks(&self, first: u64, data: &[u8]) -> Result<()> {
        let nonzero: Vec<bool> = data.chunks(BLOCK_BYTES).map(|b| !is_zero(b)).collect();
        let lookups = self.find_hits(data, &nonzero);
        let stored: Vec<bool> = (0..nonzero.len())
            .map(|i| nonzero[i] && lookups.hits[i].is_none() && lookups.earlier[i].is_none())
            .collect();
        let mut pieces: Vec<std::ops::Range<usize>> = Vec::new();
        let mut at = 0;
        for u in unit::plan_units(first, &stored, usize::from(self.unit_blocks)) {
            pieces.extend((at..u.start).map(|i| i..i + 1));
            at = u.end;
            pieces.push(u);
        }
        pieces.extend((at..nonzero.len()).map(|i| i..i + 1));
        let prep =
            |r: &std::ops::Range<usize>| match (lookups.hits[r.start], lookups.earlier[r.start]) {
                (Some(hit), _) => (r.start, vec![Piece::Ref(hit)]),
                (None, Some(j)) => (r.start, vec![Piece::Copy(j)]),
                (None, None) => {
                    let bytes = &data[r.start * BLOCK_BYTES..r.end * BLOCK_BYTES];
                    let known = &lookups.fingerprints[r.clone()];
                    let items = self.prepare_unit(bytes, known).into_iter().map(Piece::Item);
                    (r.start, items.collect())
                }
            };
        // `none` only copies and checksums: a helper's wake-up costs more than it takes over.
        let min = match self.codec {
            Codec::None => usize::MAX,
            _ => PARALLEL_ITEMS_MIN,
        };
        let prepared = crate::par::map(pieces.iter().collect(), min, prep);
        // Blocks stored (LBA, extent) and made references (LBA, the LBA named), for the index.
        let mut placed: Vec<(u64, u32)> = Vec::new();
        let mut referenced: Vec<(u64, u64)> = Vec::new();
        // The copies of earlier blocks that later blocks of the request repeat, noted as each is
        // placed, in that lock hold: a space-short round may let the lock go before the copy
        // is placed, and another writer rewrite the earlier block meanwhile (review of 2b,
        // second helper, finding 1).
        let targets: std::collections::HashSet<usize> =
            lookups.earlier.iter().flatten().copied().collect();
        let mut noted: std::collections::HashMap<usize, crate::state::Hit> = Default::default();
        let mut st = self.lock_for_write();
        let cx = self.ctx();
        for (start, ps) in prepared {
            let mut lba = first + start as u64;
            let mut todo = std::collections::VecDeque::from(ps);
            let mut below = false;
            while let Some(piece) = todo.pop_front() {
                let at = (lba - first) as usize * BLOCK_BYTES;
                let put = match &piece {
                    Piece::Item(p) if !Self::listed(&st, p) => {
                        // Compressed with a dictionary retired meanwhile: compress again (rare).
                        let again =
                            self.prepare_unit(&data[at..at + p.blocks() * BLOCK_BYTES], &[]);
                        again
                            .into_iter()
                            .rev()
                            .for_each(|q| todo.push_front(Piece::Item(q)));
                        continue;
                    }
                    Piece::Item(p) => st
                        .after_round(std::mem::take(&mut below), |st| st.put_block(&cx, lba, p))
                        .map(|()| true),
                    Piece::Ref(hit) => {
                        st.after_round(std::mem::take(&mut below), |st| st.put_ref(&cx, lba, hit))
                    }
                    // The earlier block is placed (LBA order) and its copy noted then; its
                    // bytes were compared in the request buffer: no read.
                    Piece::Copy(j) => match noted.get(j).copied() {
                        Some(hit) => st.after_round(std::mem::take(&mut below), |st| {
                            st.put_ref(&cx, lba, &hit)
                        }),
                        None => Ok(false),
                    },
                };
                match put {
                    Err(Error::SpaceShort) => {
                        // Nothing of this piece was applied: clean with the lock released, then
                        // place it again (its dictionary may have retired meanwhile).
                        drop(st);
                        below = self.space_short_round()?;
                        st = self.lock_for_write();
                        todo.push_front(piece);
                        continue;
                    }
                    Ok(false) => {
                        // The candidate changed since it was compared: stored as a miss,
                        // compressed here (rare: a reuse or an overwrite in between).
                        let p = self.prepare(&data[at..at + BLOCK_BYTES]);
                        todo.push_front(Piece::Item(p));
                        continue;
                    }
                    r => r?,
                };
                let n = match &piece {
                    Piece::Item(p) => p.blocks(),
                    Piece::Ref(hit) => {
                        referenced.push((lba, hit.src));
                        1
                    }
                    Piece::Copy(j) => {
                        referenced.push((lba, first + *j as u64));
                        1
                    }
                };
                for l in lba..lba + n as u64 {
                    let k = (l - first) as usize;
                    if targets.contains(&k) {
                        if let Some(copy) = st.stored_copy(l)? {
                            noted.insert(
                                k,
                                crate::state::Hit {
                                    src: l,
                                    copy,
                                    reuses: st.reuses,
                                },
                            );
                        }
                    }
                }
                if self.dedup.is_some() && matches!(piece, Piece::Item(Prepared::Data { .. })) {
                    placed.extend((lba..lba + n as u64).map(|l| (l, st.placed_extent)));
                }
                lba += n as u64;
            }
        }
        let aged = st.age(&cx);
        drop(st);
        self.remember(first, &lookups, &placed, &referenced);
        aged
    }

    /// Writes bytes that lie within partial blocks (read-modify-write per block).
    pub(super) fn write_partial_range(&self, base: u64, offset: u64, data: &[u8]) -> Result<()> {
        let bs = BLOCK_BYTES as u64;
        let mut pos = 0usize;
        while pos < data.len() {
            let at = offset + pos as u64;
            let lba = base + at / bs;
            let within = (at % bs) as usize;
            let n = (BLOCK_BYTES - within).min(data.len() - pos);
            self.rmw_block(lba, within, &data[pos..pos + n])?;
            pos += n;
        }
        Ok(())
    }

    /// Read-modify-write of one block, optimistic: if the block changed between our read and our
    /// update (a concurrent write to another part of it), start again so neither write is lost.
    /// Bounded: after `RMW_OPTIMISTIC_MAX` lost races the block is read, patched and stored
    /// under the state lock, which no other write can overtake.
    pub(super) fn rmw_block(&self, lba: u64, within: usize, patch: &[u8]) -> Result<()> {
        const RMW_OPTIMISTIC_MAX: usize = 8;
        let mut below = false;
        for _ in 0..RMW_OPTIMISTIC_MAX {
            let (sources, gate) = self.lookup(lba, 1, false)?;
            let seen = match &sources[0] {
                Source::Bytes { entry, .. }
                | Source::Disk { entry }
                | Source::Decoded { entry, .. } => *entry,
                Source::Zeros | Source::Damaged => MapEntry::UNMAPPED,
            };
            let stored = self.fetch(&sources, true, true).pop().unwrap_or(Ok(None));
            drop(gate);
            let mut block = match (&sources[0], stored?) {
                (Source::Zeros, _) => vec![0u8; BLOCK_BYTES],
                (Source::Damaged, _) => return Err(Error::Corrupt { lba }),
                (_, Some(bytes)) => {
                    let mut block = vec![0u8; BLOCK_BYTES];
                    self.decode_block(lba, &seen, &bytes, &mut block)?;
                    block
                }
                (_, None) => return Err(Error::Corrupt { lba }),
            };
            block[within..within + patch.len()].copy_from_slice(patch);
            let mut p = self.prepare(&block);
            let mut st = self.lock_for_write();
            let now = st.map.get(lba)?;
            let unchanged = now == seen
                || (seen.state == BlockState::Unmapped && now.state != BlockState::Data);
            if !unchanged {
                continue;
            }
            if !Self::listed(&st, &p) {
                // Compressed with a dictionary retired meanwhile: compress again (rare).
                p = self.prepare(&block);
            }
            let cx = self.ctx();
            match st.after_round(std::mem::take(&mut below), |st| st.put_block(&cx, lba, &p)) {
                Err(Error::SpaceShort) => {
                    // Nothing applied: clean with the lock released and read the block again.
                    drop(st);
                    below = self.space_short_round()?;
                }
                r => return r,
            }
        }
        self.rmw_block_locked(lba, within, patch)
    }

    /// The pessimistic read-modify-write: everything under the state lock (rare: only after
    /// repeated races on one block). Holding the lock also keeps any extent from being reused,
    /// so the storage read needs no reuse gate.
    pub(super) fn rmw_block_locked(&self, lba: u64, within: usize, patch: &[u8]) -> Result<()> {
        let mut below = false;
        loop {
            match self.rmw_block_locked_once(lba, within, patch, below) {
                Err(Error::SpaceShort) => below = self.space_short_round()?,
                r => return r,
            }
        }
    }

    fn rmw_block_locked_once(
        &self,
        lba: u64,
        within: usize,
        patch: &[u8],
        below_host_floor: bool,
    ) -> Result<()> {
        let mut st = self.lock_for_write();
        let entry = st.map.get(lba)?;
        // A shared block's bytes are its item's (bit 12).
        let entry = st.map.resolve(entry)?;
        let mut block = match entry.state {
            BlockState::Unmapped | BlockState::Zero => vec![0u8; BLOCK_BYTES],
            BlockState::Corrupt | BlockState::Shared => return Err(Error::Corrupt { lba }),
            BlockState::Data => {
                let (s, n) = (entry.offset as usize, entry.len as usize);
                let open = st.buffer.position(entry.extent).map(|i| st.buffer.get(i));
                let waiting = || self.outbox.find(entry.extent, entry.offset, n);
                let stored = match open.map(|o| o.buf[s..s + n].to_vec()).or_else(waiting) {
                    Some(bytes) => bytes,
                    None => {
                        let mut b = vec![0u8; n];
                        self.storage
                            .read_at(self.sb.extent_offset(entry.extent) + s as u64, &mut b)?;
                        b
                    }
                };
                let mut block = vec![0u8; BLOCK_BYTES];
                self.decode_block(lba, &entry, &stored, &mut block)?;
                block
            }
        };
        block[within..within + patch.len()].copy_from_slice(patch);
        let p = self.prepare(&block);
        let cx = self.ctx();
        st.after_round(below_host_floor, |st| st.put_block(&cx, lba, &p))
    }

    /// Writes zeros over a range. Whole blocks become zero-state map entries (no data stored).
    pub fn write_zeroes(&self, device: u32, offset: u64, len: u64) -> Result<()> {
        self.range_op(device, offset, len, RecordKind::Zero)
    }

    /// Discards a range: whole blocks become holes; partial blocks at the edges are zeroed so the
    /// whole range reads back as zeros.
    pub fn trim(&self, device: u32, offset: u64, len: u64) -> Result<()> {
        self.range_op(device, offset, len, RecordKind::Trim)
    }

    pub(super) fn range_op(
        &self,
        device: u32,
        offset: u64,
        len: u64,
        kind: RecordKind,
    ) -> Result<()> {
        self.check_writable()?;
        let base = self.check_range(device, offset, len, true)?;
        if len == 0 {
            return Ok(());
        }
        let bs = BLOCK_BYTES as u64;
        let end = offset + len;
        let first_full = offset.div_ceil(bs);
        let end_full = end / bs;
        if first_full >= end_full {
            return self.write_partial_range(base, offset, &vec![0u8; len as usize]);
        }
        // Whole blocks first: they free space the partial edges may need on a full volume. In
        // steps (one on v2), each in its own lock hold with its own record; a checkpoint a
        // step asked for is written between steps, outside the lock (admission's self-service,
        // in a first form: the next step's window starts from it).
        let (mut lba, end_key) = (base + first_full, base + end_full);
        let mut wanted = false;
        while lba < end_key {
            if wanted {
                self.issue_sealed()?;
                self.checkpoint_asked()?;
            }
            let mut st = self.lock_for_write();
            let cx = self.ctx();
            if kind == RecordKind::Trim {
                // A trim of blocks that are unmapped changes nothing: steps start at the next
                // mapped block, so a trim of a thin device (and a device delete, which empties
                // it so) takes time in its written blocks, not its size (a 256 TiB device with
                // two blocks took 4 million logged steps).
                match st.map.first_mapped(lba, end_key - lba)? {
                    Some(next) => lba = next,
                    None => break,
                }
            }
            let step_end = st.range_step_end(lba, end_key);
            st.put_range(&cx, kind, lba, step_end - lba)?;
            lba = step_end;
            wanted = st.ckpt_wanted;
        }
        if offset < first_full * bs {
            let head = vec![0u8; (first_full * bs - offset) as usize];
            self.write_partial_range(base, offset, &head)?;
        }
        if end > end_full * bs {
            let tail = vec![0u8; (end - end_full * bs) as usize];
            self.write_partial_range(base, end_full * bs, &tail)?;
        }
        self.issue_sealed()?;
        if wanted {
            self.checkpoint_asked()?;
        }
        Ok(())
    }

    /// Waits without the state lock for the checkpoint in flight when the write would
    /// otherwise have to wait for it under the lock, where every read waits too: the
    /// allocation queue has fewer extents left than a write of `bytes` may open (issue 9;
    /// `State::alloc` would join it), or the map's dirty pages near the bound at which a
    /// checkpoint is written under the lock (`VolumeMap::checkpoint_pressed`: that one joins
    /// the one in flight and then writes its own pages with the lock held, two checkpoints'
    /// time for every request).
    pub(super) fn wait_for_queue_refill(&self, bytes: usize) {
        let need = bytes.div_ceil(self.sb.extent_bytes as usize) + 1;
        let waiting = {
            let st = self.state.lock();
            st.inflight.is_some() && (st.queue.len() <= need || st.map.checkpoint_pressed())
        };
        if waiting {
            // The checkpoint in flight holds this from its snapshot to its commit.
            drop(self.ckpt_lock.lock());
        }
    }

    /// Issues the segments sealed under the state lock to the storage (see writeback.rs). Called
    /// after the lock is released: the storage hand-off may wake an I/O thread or wait for room
    /// in the queue, and a thread holding the state lock must not wait meanwhile.
    pub(super) fn issue_sealed(&self) -> Result<()> {
        self.outbox.issue_all(&self.storage)
    }
}
