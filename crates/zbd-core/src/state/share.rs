//! Shared items under the state lock (design.md, "Shared blocks"): promoting a direct item
//! into the shared-block table, making a block a reference to one (the offline dedup step,
//! without a record; the inline one, with a ref record), moving one, and their charges.

use super::{Ctx, State};
use crate::error::{Error, Result};
use crate::format::{
    block_key, key_device, BlockState, MapEntry, Record, RecordKind, RefPayload, SbtKey, SbtValue,
    REF_FLAG_OWNER_SHARED, REF_FLAG_UNSEEDED, REF_PAYLOAD_BYTES, SECTOR_BYTES,
    SEG_FLAG_WIDE_RECORDS,
};
use crate::meta::shared::Owner;

/// Whether `e` (a resolved entry) is block `p.index` of the item the ref payload `p` names,
/// wherever it lies now.
fn same_item(e: &MapEntry, p: &RefPayload) -> bool {
    e.state == BlockState::Data
        && e.dict == 0
        && (e.crc, u32::from(e.len), e.codec, e.unit_blocks)
            == (p.crc, p.stored_len, p.codec, p.unit_blocks)
        && u32::from(e.unit_index) == p.index
        && e.seeded == (p.flags & REF_FLAG_UNSEEDED == 0)
}

/// Which stored bytes a block reads: its item's location and checksum, and its index in it.
/// A location holds other bytes only after its extent is reused, which a checkpoint separates
/// from the lookup that named it; the checksum and index tell apart what it could hold then,
/// and an inline hit also requires no reuse at all in between ([`Hit::reuses`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredCopy {
    pub extent: u32,
    pub offset: u32,
    pub crc: u32,
    pub index: u8,
}

impl StoredCopy {
    /// The copy a resolved (data) entry names.
    pub fn of(e: &MapEntry) -> StoredCopy {
        StoredCopy {
            extent: e.extent,
            offset: e.offset,
            crc: e.crc,
            index: e.unit_index,
        }
    }
}

/// An inline dedup candidate whose bytes a writer compared with its block, outside the lock
/// (engine/write.rs): block `src` named `copy` when `State::reuses` was `reuses`, and the
/// bytes read from `copy` afterwards were the block's.
#[derive(Clone, Copy, Debug)]
pub struct Hit {
    pub src: u64,
    pub copy: StoredCopy,
    pub reuses: u64,
}

impl State {
    /// The entry of the stored bytes block `lba` reads (through the SBT for a shared entry);
    /// `None` when it has none.
    pub fn stored_entry(&mut self, lba: u64) -> Result<Option<MapEntry>> {
        let e = self.map.get(lba)?;
        Ok(match e.state {
            BlockState::Data | BlockState::Shared => Some(self.map.resolve(e)?),
            _ => None,
        })
    }

    /// The stored copy block `lba` reads; `None` when it has none.
    pub fn stored_copy(&mut self, lba: u64) -> Result<Option<StoredCopy>> {
        Ok(self.stored_entry(lba)?.map(|e| StoredCopy::of(&e)))
    }

    /// The entry of `hit.src` if it still names the copy that was compared and no extent was
    /// reused since it was noted (so the bytes read were that copy's and still are), and the
    /// item may be shared (a direct item with a trained dictionary stays direct).
    fn still_names(&mut self, hit: &Hit) -> Result<Option<MapEntry>> {
        if self.reuses != hit.reuses {
            return Ok(None);
        }
        let now = self.map.get(hit.src)?;
        let shareable = match now.state {
            BlockState::Shared => true,
            BlockState::Data => now.dict == 0,
            _ => false,
        };
        if !shareable || StoredCopy::of(&self.map.resolve(now)?) != hit.copy {
            return Ok(None);
        }
        Ok(Some(now))
    }

    /// Makes block `lba` a reference to the item `hit` compared (an inline dedup hit:
    /// design.md, "Deduplication"), with a ref record naming the item as its owner names it.
    /// Ok(false), with the map unchanged, when the candidate is no longer what was compared:
    /// the caller then stores the block as a miss. The identity is checked before anything
    /// else; what follows (promotion, room, placement) may write checkpoints, but none changes
    /// a map entry or frees a live item, so the compared item stays what it was.
    pub fn put_ref(&mut self, cx: &Ctx, lba: u64, hit: &Hit) -> Result<bool> {
        let Some(src_now) = self.still_names(hit)? else {
            return Ok(false);
        };
        if self.stored_copy(lba)? == Some(hit.copy) {
            // `lba` reads those bytes already (a block written again with its own content).
            return Ok(true);
        }
        if cx.form.flags & SEG_FLAG_WIDE_RECORDS == 0 {
            return Err(Error::Invalid(
                "references need a volume with 64-byte records (format bit 11)".into(),
            ));
        }
        let owner_shared = src_now.state == BlockState::Shared;
        if !self.shared_items_durable {
            // Bit 12 durable before the first ref record (as the units flag before the first
            // unit).
            self.shared_items = true;
            self.checkpoint(cx)?;
            self.shared_items_durable = true;
        }
        if owner_shared && self.promoted_unlogged {
            // The item may have been promoted by `share_block`, which logs nothing: replay
            // from the last checkpoint would find it direct, or dead once its birth block was
            // overwritten, and fail this ref. A checkpoint first makes the promotion durable
            // (rare: only a dedup pass running beside inline writes).
            self.checkpoint(cx)?;
            self.promoted_unlogged = false;
        }
        let index = src_now.unit_index;
        let key = match src_now.sbt_key() {
            Some(key) => key,
            None => {
                // Until the ref record below is appended, the promotion is one no record
                // carries: if anything from here on fails, it stays so (review of 2b,
                // finding 3), and a later ref to the item needs the checkpoint first.
                let before = std::mem::replace(&mut self.promoted_unlogged, true);
                let key = self.promote_item(Some(cx), hit.src, src_now)?;
                self.promoted_unlogged = before;
                key
            }
        };
        let placed = self
            .map_room(cx, lba, 1, None)
            .and_then(|()| self.place(cx, REF_PAYLOAD_BYTES, 1));
        let slot = match placed {
            Ok(slot) => slot,
            Err(e) => {
                self.promoted_unlogged |= !owner_shared;
                return Err(e);
            }
        };
        let target = self.map.resolve(MapEntry::shared(key, index))?;
        let mut flags = if owner_shared {
            REF_FLAG_OWNER_SHARED
        } else {
            0
        };
        if !target.seeded {
            flags |= REF_FLAG_UNSEEDED;
        }
        // The SBT keys items by their birth LBA alone: a direct target's device is the
        // candidate's; a shared one's may be another, which costs its owner search nothing
        // (a shared item has no direct entry, so the search goes on to the SBT).
        let payload = RefPayload {
            index: u32::from(index),
            lba: block_key(key_device(hit.src), key.birth + u64::from(index)),
            extent: target.extent,
            offset: target.offset,
            stored_len: u32::from(target.len),
            codec: target.codec,
            unit_blocks: target.unit_blocks,
            dict: target.dict,
            flags,
            crc: target.crc,
        }
        .encode();
        // The count first: if its SBT page cannot be read, nothing is logged.
        self.map.add_ref(key)?;
        let offset = self.buffer.next_offset(slot);
        let seq = self.take_seq();
        let record = Record {
            len: REF_PAYLOAD_BYTES as u32,
            offset: offset as u32,
            crc: crc32c::crc32c(&payload),
            ..Record::new(RecordKind::Ref, lba, 1, seq)
        };
        let used = self.next_seq;
        let nearly_full = self.buffer.append(slot, &payload, vec![record], used) < SECTOR_BYTES;
        self.set_entry(lba, MapEntry::shared(key, index))?;
        if nearly_full {
            self.close_open(cx, slot)?;
        }
        self.checkpoint_if_map_full(cx)?;
        Ok(true)
    }

    /// Replays a ref record (block `lba`, sequence `seq`): the owner of the item its payload
    /// names is found by owner search; a direct one is promoted; `lba` becomes a reference.
    /// No owner: the target's own record was torn with the crash when the ref was too (above
    /// `durable_seq`: the block keeps its older value), else the target is lost and the block
    /// reads as damaged, never as another block's bytes.
    pub fn replay_ref(
        &mut self,
        lba: u64,
        seq: u64,
        p: &RefPayload,
        durable_seq: u64,
    ) -> Result<()> {
        let index = p.index as u8;
        let found = match self.map.owner(p.lba, index, p.extent, p.offset)? {
            Owner::Shared(key, v) if v.crc == p.crc => Some(key),
            Owner::Direct(e) if e.crc == p.crc && e.dict == 0 => {
                Some(self.promote_item(None, p.lba, e)?)
            }
            // Not at the payload's location: a cleaner's copy the ref named may have failed
            // its checksum, its move skipped, so the item is still at its source. The block
            // at the payload's LBA naming the same item elsewhere (same checksum, length,
            // codec, unit, index) is that item (review of 2b, finding 2).
            _ => match self.map.get(p.lba)? {
                e @ MapEntry {
                    state: BlockState::Data,
                    ..
                } if same_item(&e, p) => Some(self.promote_item(None, p.lba, e)?),
                e => match e.sbt_key() {
                    Some(key) if same_item(&self.map.resolve(e)?, p) => Some(key),
                    _ => None,
                },
            },
        };
        match found {
            // A block that names the item already (a torn record between two refs to it) keeps
            // its one reference: the count would otherwise rise with no slot to match (review
            // of 2b, second helper, finding 2).
            Some(key) if self.map.get(lba)? == MapEntry::shared(key, index) => Ok(()),
            Some(key) => {
                self.map.add_ref(key)?;
                self.set_entry(lba, MapEntry::shared(key, index))
            }
            None if seq > durable_seq => Ok(()),
            None => self.set_entry(
                lba,
                MapEntry {
                    state: BlockState::Corrupt,
                    ..MapEntry::UNMAPPED
                },
            ),
        }
    }

    /// Promotes the direct item whose block `src` is `at` into the shared-block table, its
    /// blocks' accounting moving to the item's one charge; returns its key. A new SBT entry
    /// may need page ids: short of them, a live caller (`cx`) first writes the checkpoint
    /// that returns the ids freed since the last one and carves more, as for a map change
    /// (`map_room`); replay has no checkpoint to write and fails.
    fn promote_item(&mut self, cx: Option<&Ctx>, src: u64, at: MapEntry) -> Result<SbtKey> {
        let p = match (self.map.promote(src, at), cx) {
            (Err(Error::NoSpace), Some(cx)) => {
                self.checkpoint(cx)?;
                self.map.promote(src, at)?
            }
            (r, _) => r?,
        };
        for &(_, old) in &p.blocks {
            self.account_direct(old, MapEntry::shared(p.key, old.unit_index));
        }
        self.charge_item(&p.value);
        self.shared_items = true;
        match p.error {
            Some(e) => Err(e),
            None => Ok(p.key),
        }
    }

    /// A dedup step of the offline pass (design.md, build order 2a): block `lba`, holding
    /// `want`, becomes a reference to the block `src` names, holding `src_want` (the caller
    /// compared their bytes). The item `src` names is promoted first if it is direct. No record
    /// is written: the step only changes which stored copy `lba` names, and the next
    /// checkpoint makes it durable; a crash before it leaves `lba` on its own copy, intact
    /// under the reuse rule. False (nothing done) when either entry changed since the caller
    /// read it, or `lba` names that block already.
    pub fn share_block(
        &mut self,
        cx: &Ctx,
        lba: u64,
        want: MapEntry,
        src: u64,
        src_want: MapEntry,
    ) -> Result<bool> {
        if cx.form.flags & SEG_FLAG_WIDE_RECORDS == 0 {
            // Moves of shared items are 64-byte records (bit 11, which bit 12 needs).
            return Err(Error::Invalid(
                "sharing blocks needs a volume with 64-byte records (format bit 11)".into(),
            ));
        }
        if self.map.get(lba)? != want || self.map.get(src)? != src_want {
            return Ok(false);
        }
        let index = src_want.unit_index;
        let key = match src_want.sbt_key() {
            Some(key) => key,
            // An item stored with a trained dictionary stays direct: its dictionary's live
            // count follows direct blocks only, and must not reach 0 while it lives.
            None if src_want.state == BlockState::Data && src_want.dict == 0 => {
                self.promoted_unlogged = true;
                self.promote_item(Some(cx), src, src_want)?
            }
            None => return Ok(false),
        };
        let now = self.map.get(lba)?;
        if now.sbt_key() == Some(key) && now.unit_index == index {
            return Ok(false);
        }
        self.map.add_ref(key)?;
        // The same bytes from another copy: every device that shares the leaf follows.
        self.set_entry_in_place(lba, MapEntry::shared(key, index))?;
        self.checkpoint_if_map_full(cx)?;
        Ok(true)
    }

    /// Points shared item `key` at its copy at `extent`/`offset` (a cleaner move, live or
    /// replayed), its charge following it.
    pub fn move_shared_item(&mut self, key: SbtKey, extent: u32, offset: u32) -> Result<()> {
        let old = self.map.move_shared(key, extent, offset)?;
        self.uncharge_item(&old);
        self.charge_item(&SbtValue { extent, ..old });
        Ok(())
    }

    /// A shared item's whole charge (one live block of its stored length) in its extent.
    pub(crate) fn charge_item(&mut self, v: &SbtValue) {
        self.table.touch(v.extent);
        self.extents.add_block(v.extent, u32::from(v.stored_len));
    }

    /// The charge `charge_item` made leaves the item's extent.
    pub(crate) fn uncharge_item(&mut self, v: &SbtValue) {
        if v.extent < self.extents.len() as u32 {
            self.table.touch(v.extent);
        }
        self.extents.remove_block(v.extent, u32::from(v.stored_len));
    }
}
